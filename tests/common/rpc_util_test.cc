#include "common/rpc_util.h"

#include "gtest/gtest.h"

namespace psrt {
namespace {

TEST(PreferLocalSocketTest, LoopbackAddressesBecomeTheTasksUnixSocket) {
  EXPECT_EQ(PreferLocalSocket("127.0.0.1:2222"), "unix-abstract:psrt-2222");
  EXPECT_EQ(PreferLocalSocket("127.1.2.3:80"), "unix-abstract:psrt-80");
  EXPECT_EQ(PreferLocalSocket("localhost:5000"), "unix-abstract:psrt-5000");
  EXPECT_EQ(PreferLocalSocket("[::1]:7"), "unix-abstract:psrt-7");
}

TEST(PreferLocalSocketTest, OtherHostsAndOddAddressesStayAsTheyAre) {
  EXPECT_EQ(PreferLocalSocket("10.0.0.1:2222"), "10.0.0.1:2222");
  EXPECT_EQ(PreferLocalSocket("ps-0.psrt.svc:2222"), "ps-0.psrt.svc:2222");
  EXPECT_EQ(PreferLocalSocket("[fe80::1]:2222"), "[fe80::1]:2222");
  EXPECT_EQ(PreferLocalSocket("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(PreferLocalSocket("127.0.0.1:http"), "127.0.0.1:http");
  EXPECT_EQ(PreferLocalSocket("127.0.0.1:0"), "127.0.0.1:0");
}

// A task whose spec names a host this machine cannot resolve is told so,
// not that its port is in use (.invalid never resolves: RFC 6761).
TEST(WhyCannotListenTest, NamesAHostThatDoesNotResolve) {
  EXPECT_NE(WhyCannotListen("no-such-host.invalid:2222")
                .find("its host \"no-such-host.invalid\" does not resolve here"),
            std::string::npos);
  EXPECT_EQ(WhyCannotListen("127.0.0.1:2222"), "port in use, or not an address of this machine?");
}

}  // namespace
}  // namespace psrt

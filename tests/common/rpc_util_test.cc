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

}  // namespace
}  // namespace psrt

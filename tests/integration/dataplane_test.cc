// Jobs whose pushes and pulls go over the tensor data plane
// (--tensor_transport=data_plane) between real processes on 127.0.0.1: the same
// parameters as over gRPC, to the last bit, and clear errors where the tasks
// disagree.
#include <stdlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class DataPlaneTest : public ClusterFixture {};

// Sync, fixed data order, momentum: a run is deterministic, so the data
// plane, over TCP and over Unix sockets, must give exactly gRPC's
// parameters, with float32 and with bfloat16 on the wire (2 ps of 2
// stripes: 4 shards, several connections each).
TEST_F(DataPlaneTest, ASyncJobEndsWithTheParametersOfTheGrpcRun) {
  const std::string spec = MakeSpec(2, 2);
  for (const std::string wire : {"fp32", "bf16"}) {
    const std::string flags = absl::StrCat(
        "--sync_replicas --noshuffle --optimizer=momentum --learning_rate=0.05 "
        "--train_steps=150 --log_every_steps=50 --wire_dtype=",
        wire);
    std::string params[3];
    // gRPC; the data plane over TCP (the ps tasks serve no Unix socket); and
    // over the ps tasks' Unix sockets, which workers on their host take.
    const std::string runs[3] = {"grpc", "socket-tcp", "socket-unix"};
    for (int run = 0; run < 3; ++run) {
      const std::string transport = run == 0 ? "grpc" : "socket";
      const std::string local_flag = run == 1 ? " --local_data_plane=false" : "";
      const std::string logdir = absl::StrCat(dir_, "/", wire, "-", runs[run]);
      const std::string out = logdir + ".safetensors";
      CommandResult r =
          Launch(spec, logdir,
                 absl::StrCat(flags, " --tensor_transport=", transport,
                              " --final_params_out=", out),
                 absl::StrCat("--ps_flags '--tensor_transport=", transport, local_flag, "'"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      params[run] = out;
      const std::string ps_log = ReadFile(logdir + "/ps-0.log");
      const std::string chief_log = ReadFile(logdir + "/worker-0.log");
      EXPECT_EQ(ps_log.find("data plane on 127.0.0.1:") != std::string::npos, transport == "socket")
          << ps_log;
      EXPECT_EQ(chief_log.find("pushes and pulls over the data plane") != std::string::npos,
                transport == "socket")
          << chief_log;
      if (run > 0) {
        EXPECT_NE(chief_log.find(run == 1 ? "data plane over 127.0.0.1:"
                                          : "data plane over unix-abstract:psrt-data-"),
                  std::string::npos)
            << chief_log;
      }
    }
    EXPECT_EQ(MaxAbsDiff(params[0], params[1]), 0.0) << wire;
    EXPECT_EQ(MaxAbsDiff(params[0], params[2]), 0.0) << wire;
  }
}

// With the cluster's auth token, the data plane's hello carries it too (the
// ps refuses a connection without it: DataPlaneServerTest).
TEST_F(DataPlaneTest, AJobWithAnAuthTokenTrainsOverTheDataPlane) {
  const std::string spec = MakeSpec(1, 2);
  ASSERT_EQ(setenv("PSRT_AUTH_TOKEN", "a-token-for-the-data-plane", 1), 0);
  CommandResult r =
      Launch(spec, dir_ + "/logs", "--sync_replicas --train_steps=60 --tensor_transport=data_plane",
             "--ps_flags --tensor_transport=data_plane");
  unsetenv("PSRT_AUTH_TOKEN");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string chief_log = ReadFile(dir_ + "/logs/worker-0.log");
  EXPECT_NE(chief_log.find("transport security: plaintext + auth token"), std::string::npos)
      << chief_log;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief_log, &step, &accuracy)) << chief_log;
  EXPECT_EQ(step, 60);
}

// A worker told to use the data plane, with a ps that serves none: the
// worker fails at start naming the ps and the flag. Told auto (the
// default), it trains over gRPC.
TEST_F(DataPlaneTest, AWorkerOnTheDataPlaneAndAPsWithoutOneIsAClearError) {
  const std::string spec = MakeSpec(1, 1);
  CommandResult automatic =
      Launch(spec, dir_ + "/auto", "--train_steps=20", "--ps_flags --tensor_transport=grpc");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  const std::string auto_log = ReadFile(dir_ + "/auto/worker-0.log");
  EXPECT_NE(auto_log.find("a ps task serves no data plane: pushes and pulls over gRPC"),
            std::string::npos)
      << auto_log;
  CommandResult r = Launch(spec, dir_ + "/logs", "--train_steps=20 --tensor_transport=data_plane",
                           "--ps_flags --tensor_transport=grpc");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string log = ReadFile(dir_ + "/logs/worker-0.log");
  EXPECT_NE(log.find("ps/0 stripe 0 (127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("serves no data plane, and this task was started with "
                     "--tensor_transport=data_plane"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace psrt

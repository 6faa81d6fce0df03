// Operating a running cluster: the standard gRPC health service on every
// task, Prometheus metrics (--metrics_port), `psrtctl status` and
// `psrtctl shutdown`, on real psrt_ps and psrt_worker processes.

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster_spec.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/common/prometheus_scrape.h"
#include "tests/free_port.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

using grpc::health::v1::HealthCheckResponse;

// The standard health check, as any gRPC health client (a Kubernetes probe,
// grpc_health_probe) makes it: the status, or the RPC's error code.
std::string CheckHealth(const std::string& address, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return absl::StrCat("error ", status.error_code());
  return HealthCheckResponse::ServingStatus_Name(response.status());
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return true;
}

// The line of `psrtctl status` about one task ("ps/0", "worker/0").
std::string LineOf(const std::string& status, const std::string& task) {
  const size_t at = status.find(task + " ");
  if (at == std::string::npos) return "";
  return status.substr(at, status.find('\n', at) - at);
}

class OperationsTest : public ClusterFixture {
 protected:
  // Starts `command` in the background; its log goes to dir_/NAME.log and
  // its exit code, when it ends, to dir_/NAME.rc. Stopped in TearDown.
  void Start(const std::string& name, const std::string& command) {
    const std::string base = dir_ + "/" + name;
    RunCommand(absl::StrCat("sh -c '", command, " > ", base, ".log 2>&1 & echo $! > ", base,
                            ".pid; wait $!; echo $? > ", base, ".rc' > /dev/null 2>&1 &"));
    ASSERT_TRUE(WaitFor([&] { return !ReadFile(base + ".pid").empty(); }, absl::Seconds(5)));
    started_.push_back(base);
  }
  // The exit code of a task started with Start, once it has exited.
  bool WaitForExit(const std::string& name, absl::Duration timeout, int* code) {
    const std::string rc = dir_ + "/" + name + ".rc";
    if (!WaitFor([&] { return !ReadFile(rc).empty(); }, timeout)) return false;
    *code = std::stoi(ReadFile(rc));
    return true;
  }
  void TearDown() override {
    for (const std::string& base : started_) {
      RunCommand("kill $(cat " + base + ".pid) 2>/dev/null");
    }
    ClusterFixture::TearDown();
  }
  CommandResult Psrtctl(const std::string& args) {
    return RunCommand(absl::StrCat(bin_, "/psrtctl ", args));
  }

  std::vector<std::string> started_;
};

TEST_F(OperationsTest, HealthMetricsStatusAndShutdownOfARunningCluster) {
  const std::string spec_path = MakeSpec(1, 1);
  auto spec = ClusterSpec::FromFile(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string ps = spec->address("ps", 0);
  const std::string worker = spec->address("worker", 0);
  const int ps_metrics = FreePort();
  const int worker_metrics = FreePort();
  const std::string task_flags = " --cluster_spec=" + spec_path + " --task_index=0";

  // A ps alone: alive, but NOT_SERVING until the chief has made it ready.
  // Two stripes (the default, spelled out): the ps counts a call per shard.
  constexpr int kStripes = 2;
  Start("ps", absl::StrCat(bin_, "/psrt_ps --job_name=ps", task_flags, " --ps_stripes=", kStripes,
                           " --metrics_port=", ps_metrics));
  ASSERT_TRUE(WaitFor([&] { return CheckHealth(ps, "") != "error 14"; }, absl::Seconds(20)))
      << ReadFile(dir_ + "/ps.log");
  EXPECT_EQ(CheckHealth(ps, ""), "NOT_SERVING");
  EXPECT_EQ(CheckHealth(ps, "psrt.proto.ParameterServer"), "NOT_SERVING");
  EXPECT_EQ(CheckHealth(ps, "no.such.Service"), "error 5");  // NOT_FOUND.
  EXPECT_EQ(CheckHealth(ps, "psrt.liveness"), "SERVING");  // Alive, not ready.
  CommandResult status = Psrtctl("status --cluster_spec=" + spec_path);
  EXPECT_EQ(status.exit_code, 1) << status.output;  // The worker is not up.
  EXPECT_NE(LineOf(status.output, "ps/0").find("not ready"), std::string::npos) << status.output;
  EXPECT_NE(LineOf(status.output, "ps/0").find("health=NOT_SERVING"), std::string::npos);
  EXPECT_NE(LineOf(status.output, "worker/0").find("unreachable"), std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("1 of 2 tasks unreachable"), std::string::npos);
  // The one-task probe (for Kubernetes exec probes) fails until it serves.
  CommandResult probe = Psrtctl("health --address=" + ps);
  EXPECT_EQ(probe.exit_code, 1) << probe.output;
  EXPECT_NE(probe.output.find("NOT_SERVING"), std::string::npos) << probe.output;

  // A worker that trains until it is told to stop.
  Start("worker", absl::StrCat(bin_, "/psrt_worker --job_name=worker", task_flags,
                               " --train_steps=100000000 --log_every_steps=100",
                               " --metrics_port=", worker_metrics));
  ASSERT_TRUE(WaitFor(
      [&] {
        status = Psrtctl("status --cluster_spec=" + spec_path);
        return status.exit_code == 0 &&
               LineOf(status.output, "worker/0").find("training") != std::string::npos &&
               LineOf(status.output, "worker/0").find("step=0 ") == std::string::npos;
      },
      absl::Seconds(60)))
      << status.output << ReadFile(dir_ + "/worker.log");
  const std::string ps_line = LineOf(status.output, "ps/0");
  const std::string worker_line = LineOf(status.output, "worker/0");
  EXPECT_NE(ps_line.find("serving      health=SERVING"), std::string::npos) << ps_line;
  EXPECT_NE(ps_line.find("mode=ASYNC"), std::string::npos) << ps_line;
  EXPECT_EQ(ps_line.find("rss=0.0MiB"), std::string::npos) << ps_line;
  EXPECT_NE(ps_line.find("restarts=0"), std::string::npos) << ps_line;
  EXPECT_NE(worker_line.find("training     health=SERVING"), std::string::npos) << worker_line;
  EXPECT_EQ(worker_line.find("rss=0.0MiB"), std::string::npos) << worker_line;

  EXPECT_EQ(CheckHealth(ps, ""), "SERVING");
  EXPECT_EQ(CheckHealth(ps, "psrt.proto.ParameterServer"), "SERVING");
  EXPECT_EQ(CheckHealth(worker, ""), "SERVING");
  EXPECT_EQ(CheckHealth(worker, "psrt.proto.WorkerStatus"), "SERVING");
  probe = Psrtctl("health --address=" + ps);
  EXPECT_EQ(probe.exit_code, 0) << probe.output;
  EXPECT_NE(probe.output.find(ps + " SERVING"), std::string::npos) << probe.output;

  // Mid-run scrapes: the worker first, so that the ps has seen at least as
  // many pushes when it is scraped.
  const std::string w = HttpGet(worker_metrics, "/metrics");
  const std::string p = HttpGet(ps_metrics, "/metrics");
  const std::string wl = R"({job="worker",task="0")";
  const std::string pl = R"({job="ps",task="0")";
  const double local_steps = Sample(w, "psrt_worker_local_steps_total" + wl + "}");
  const double accepted = Sample(w, "psrt_worker_pushes_total" + wl + R"(,result="accepted"})");
  EXPECT_GT(local_steps, 0);
  EXPECT_NEAR(accepted, local_steps, 1);
  EXPECT_NEAR(Sample(w, "psrt_worker_examples_total" + wl + "}"), 100 * local_steps, 100);
  EXPECT_GT(Sample(w, "psrt_worker_global_step" + wl + "}"), 0);
  EXPECT_EQ(Sample(w, "psrt_worker_state" + wl + R"(,state="training"})"), 1);
  EXPECT_GT(Sample(w, "psrt_worker_examples_per_second" + wl + "}"), 0);
  EXPECT_GE(Sample(w, "psrt_worker_pull_wait_seconds_count" + wl + "}"), local_steps);
  // One worker, so every push it made reached the one shard, whole: the
  // default MLP has 407050 float parameters.
  constexpr double kModelBytes = 407050 * 4;
  // Per shard: the worker's pushes reached both stripes.
  const double ps_accepted =
      Sample(p, "psrt_ps_pushes_total" + pl + R"(,result="accepted"})") / kStripes;
  EXPECT_GE(ps_accepted, accepted);
  EXPECT_EQ(Sample(p, "psrt_ps_pushes_total" + pl + R"(,result="rejected"})"), 0);
  // Each stripe carries part of the model, and training goes on while the
  // page is scraped: a scrape can count a call whose bytes it has not yet
  // counted, so allow one model's worth in flight.
  EXPECT_GE(Sample(p, "psrt_ps_pushed_bytes_total" + pl + "}"),
            (ps_accepted - 1) * kModelBytes);
  EXPECT_GE(Sample(p, "psrt_ps_pulled_bytes_total" + pl + "}"),
            (Sample(p, "psrt_ps_pulls_total" + pl + "}") / kStripes - 1) * kModelBytes);
  // Async: one version per push. (Pushes may land between two counters of
  // one scrape, hence the tolerance.)
  EXPECT_NEAR(Sample(p, "psrt_ps_version" + pl + "}"), ps_accepted, 1);
  EXPECT_NEAR(Sample(p, "psrt_ps_push_seconds_count" + pl + "}") / kStripes, ps_accepted, 1);
  EXPECT_EQ(Sample(p, "psrt_ps_ready" + pl + "}"), 1);
  EXPECT_GT(Sample(p, "psrt_process_resident_memory_bytes" + pl + "}"), 1 << 20);

  // An operator ends training: the worker stops, evaluates, says goodbye,
  // and both exit 0.
  CommandResult shutdown = Psrtctl("shutdown --cluster_spec=" + spec_path);
  EXPECT_EQ(shutdown.exit_code, 0) << shutdown.output;
  int code = -1;
  ASSERT_TRUE(WaitForExit("worker", absl::Seconds(30), &code)) << ReadFile(dir_ + "/worker.log");
  EXPECT_EQ(code, 0) << ReadFile(dir_ + "/worker.log");
  ASSERT_TRUE(WaitForExit("ps", absl::Seconds(30), &code)) << ReadFile(dir_ + "/ps.log");
  EXPECT_EQ(code, 0) << ReadFile(dir_ + "/ps.log");
  long step = 0;
  double accuracy = 0;
  EXPECT_TRUE(ParseFinal(ReadFile(dir_ + "/worker.log"), &step, &accuracy));
  EXPECT_GE(step, ps_accepted);
  EXPECT_NE(ReadFile(dir_ + "/ps.log").find("an operator ended training"), std::string::npos);
  // Everything is gone now.
  status = Psrtctl("status --cluster_spec=" + spec_path);
  EXPECT_NE(status.output.find("2 of 2 tasks unreachable"), std::string::npos) << status.output;
}

// `psrtctl status` shows every stripe's part of each embedding table (a
// status call answers for the stripe it names): with 2 stripes on 1 ps,
// both hold rows of the DLRM table; with a row budget, what it dropped.
// The ps's metrics sum the stripes.
TEST_F(OperationsTest, StatusShowsTheTableRowsOfEveryStripe) {
  const std::string spec_path = MakeSpec(1, 1);
  CommandResult data = RunCommand(absl::StrCat(bin_, "/psrt_make_criteo --out=", dir_,
                                               "/train.gz --rows=5000 --seed=1"));
  ASSERT_EQ(data.exit_code, 0) << data.output;
  const std::string task_flags = " --cluster_spec=" + spec_path + " --task_index=0";
  const int ps_metrics = FreePort();
  Start("ps", absl::StrCat(bin_, "/psrt_ps --job_name=ps", task_flags,
                           " --ps_stripes=2 --metrics_port=", ps_metrics));
  Start("worker", absl::StrCat(bin_, "/psrt_worker --job_name=worker", task_flags,
                               " --model=dlrm --data_format=criteo --train_data=", dir_,
                               "/train.gz --test_data=", dir_, "/train.gz --embedding_dim=4",
                               " --bottom_mlp=8 --top_mlp=8 --batch_size=64",
                               " --embedding_max_rows_per_ps=1000 --train_steps=100000000",
                               " --ps_stripes=2"));
  CommandResult status;
  const std::regex table_line(
      R"(table embeddings stripe=(\d) dim=4 rows=(\d+) memory=\S+ evicted=(\d+))");
  std::map<int, long> rows, evicted;
  ASSERT_TRUE(WaitFor(
      [&] {
        status = Psrtctl("status --cluster_spec=" + spec_path);
        rows.clear();
        for (std::sregex_iterator it(status.output.begin(), status.output.end(), table_line), end;
             it != end; ++it) {
          rows[std::stoi((*it)[1])] = std::stol((*it)[2]);
          evicted[std::stoi((*it)[1])] = std::stol((*it)[3]);
        }
        return rows.size() == 2 && evicted[0] > 0 && evicted[1] > 0;
      },
      absl::Seconds(60)))
      << status.output << ReadFile(dir_ + "/worker.log");
  // Ids go to stripes by hash, each stripe kept to half the task's budget.
  for (int stripe : {0, 1}) {
    EXPECT_GT(rows[stripe], 300) << status.output;
    EXPECT_LE(rows[stripe], 500) << status.output;
  }
  const std::string p = HttpGet(ps_metrics, "/metrics");
  const std::string labels = R"({job="ps",task="0"})";
  EXPECT_GT(Sample(p, "psrt_ps_table_rows" + labels), 600) << p;
  EXPECT_LE(Sample(p, "psrt_ps_table_rows" + labels), 1000) << p;
  EXPECT_GT(Sample(p, "psrt_ps_table_bytes" + labels), 0) << p;
  EXPECT_GT(Sample(p, "psrt_ps_table_evicted_rows" + labels), 0) << p;
  EXPECT_EQ(Sample(p, "psrt_ps_table_unadmitted_gradients" + labels), 0) << p;
  CommandResult shutdown = Psrtctl("shutdown --cluster_spec=" + spec_path);
  EXPECT_EQ(shutdown.exit_code, 0) << shutdown.output;
  int code = -1;
  ASSERT_TRUE(WaitForExit("worker", absl::Seconds(30), &code)) << ReadFile(dir_ + "/worker.log");
  EXPECT_EQ(code, 0) << ReadFile(dir_ + "/worker.log");
}

TEST_F(OperationsTest, WorkerWhoseStatusPortIsTakenStillTrains) {
  const std::string spec_path = MakeSpec(1, 1);
  auto spec = ClusterSpec::FromFile(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Rewrite the spec so that the worker's port is one this test holds.
  SilentListener taken;
  std::string json = ReadFile(spec_path);
  const std::string worker = spec->address("worker", 0);
  json.replace(json.find(worker), worker.size(), absl::StrCat("127.0.0.1:", taken.port()));
  std::ofstream(spec_path) << json;

  CommandResult r = Launch(spec_path, dir_ + "/logs",
                           "--sync_replicas --train_steps=30 --log_every_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = ReadFile(dir_ + "/logs/worker-0.log");
  EXPECT_NE(log.find(absl::StrCat("worker/0 serves no status or health: cannot listen on "
                                  "127.0.0.1:", taken.port())),
            std::string::npos)
      << log;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(log, &step, &accuracy)) << log;
  EXPECT_EQ(step, 30);
}

// By default a task listens only on its own host as the spec names it
// (127.0.0.1 here: another loopback address, 127.0.0.2, does not reach it);
// --bind_host=0.0.0.0 opens every interface.
TEST_F(OperationsTest, TasksListenOnlyOnTheirSpecHostUnlessToldOtherwise) {
  const std::string spec_path = MakeSpec(1, 1);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string ps = spec->address("ps", 0);
  const std::string port = ps.substr(ps.rfind(':') + 1);
  // (No worker ever says goodbye: no grace to wait for one.)
  const std::string flags =
      " --job_name=ps --task_index=0 --shutdown_grace_secs=0 --cluster_spec=" + spec_path;
  Start("spec_host", bin_ + "/psrt_ps" + flags);
  ASSERT_TRUE(WaitFor([&] { return CheckHealth(ps, "") == "NOT_SERVING"; }, absl::Seconds(20)))
      << ReadFile(dir_ + "/spec_host.log");
  EXPECT_EQ(CheckHealth("127.0.0.2:" + port, ""), "error 14");  // UNAVAILABLE.
  EXPECT_NE(ReadFile(dir_ + "/spec_host.log").find("no TLS and no auth token"),
            std::string::npos);
  ASSERT_EQ(Psrtctl("shutdown --cluster_spec=" + spec_path).exit_code, 0);
  int code = -1;
  ASSERT_TRUE(WaitForExit("spec_host", absl::Seconds(30), &code));

  Start("everywhere", bin_ + "/psrt_ps --bind_host=0.0.0.0" + flags);
  EXPECT_TRUE(WaitFor([&] { return CheckHealth("127.0.0.2:" + port, "") == "NOT_SERVING"; },
                      absl::Seconds(20)))
      << ReadFile(dir_ + "/everywhere.log");
  ASSERT_EQ(Psrtctl("shutdown --cluster_spec=" + spec_path).exit_code, 0);
  ASSERT_TRUE(WaitForExit("everywhere", absl::Seconds(30), &code));
}

// A second ps of the same task (a job launched twice on one spec) is
// refused the port rather than sharing it with the first (gRPC's default
// SO_REUSEPORT would hand it half of the first one's connections).
TEST_F(OperationsTest, ASecondPsOnATakenPortFailsAtStart) {
  const std::string spec_path = MakeSpec(1, 1);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string ps = spec->address("ps", 0);
  const std::string command = absl::StrCat(
      bin_, "/psrt_ps --job_name=ps --task_index=0 --shutdown_grace_secs=0 --cluster_spec=",
      spec_path);
  Start("first", command);
  ASSERT_TRUE(WaitFor([&] { return CheckHealth(ps, "") == "NOT_SERVING"; }, absl::Seconds(20)))
      << ReadFile(dir_ + "/first.log");
  CommandResult second = RunCommand("timeout 30 " + command + " 2>&1");
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find(absl::StrCat("ps/0: cannot listen on ", ps,
                                            " (port in use, or not an address of this machine?)")),
            std::string::npos)
      << second.output;
  // A drain sent to the ps by mistake says what is wrong (it printed an
  // empty error).
  CommandResult drain = Psrtctl("drain --address=" + ps + " 2>&1");
  EXPECT_EQ(drain.exit_code, 1) << drain.output;
  EXPECT_NE(drain.output.find(ps + " serves no worker's status service"), std::string::npos)
      << drain.output;
  ASSERT_EQ(Psrtctl("shutdown --cluster_spec=" + spec_path).exit_code, 0);
  int code = -1;
  ASSERT_TRUE(WaitForExit("first", absl::Seconds(30), &code));
  EXPECT_EQ(code, 0) << ReadFile(dir_ + "/first.log");
}

// A shutdown that a ps refuses (the workers' token, where only the chief's
// may end training) fails, naming the ps and its reason; an operator's
// script must not believe the job ended.
TEST_F(OperationsTest, ShutdownThatAPsRefusesFailsNamingIt) {
  const std::string spec_path = MakeSpec(2, 1);
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::FromFile(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string workers = "PSRT_AUTH_TOKEN=workers-token ";
  const std::string chief = workers + "PSRT_CHIEF_TOKEN=chiefs-token ";
  for (int i = 0; i < 2; ++i) {
    Start(absl::StrCat("ps", i), absl::StrCat(chief, bin_, "/psrt_ps --job_name=ps --task_index=",
                                              i, " --cluster_spec=", spec_path));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(WaitFor(
        [&] { return CheckHealth(spec->address("ps", i), "") == "NOT_SERVING"; },
        absl::Seconds(20)))
        << ReadFile(absl::StrCat(dir_, "/ps", i, ".log"));
  }
  const std::string shutdown = bin_ + "/psrtctl shutdown --cluster_spec=" + spec_path + " 2>&1";
  CommandResult refused = RunCommand(workers + shutdown);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  // Every ps that refused is named, each with its reason.
  for (int i = 0; i < 2; ++i) {
    const std::string ps = absl::StrCat("ps/", i, " (", spec->address("ps", i), "): ");
    const size_t at = refused.output.find(ps);
    ASSERT_NE(at, std::string::npos) << ps << "\n" << refused.output;
    EXPECT_NE(refused.output.find("only the chief may call it", at), std::string::npos)
        << refused.output;
  }
  CommandResult ended = RunCommand(chief + shutdown);
  EXPECT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_NE(ended.output.find("every ps (2) ended training"), std::string::npos) << ended.output;
}

TEST_F(OperationsTest, MetricsPortInUseIsRefusedAtStart) {
  const std::string spec_path = MakeSpec(1, 1);
  SilentListener taken;
  const std::string flags = absl::StrCat(" --cluster_spec=", spec_path,
                                         " --task_index=0 --metrics_port=", taken.port());
  CommandResult ps = RunCommand(absl::StrCat("timeout 30 ", bin_, "/psrt_ps --job_name=ps", flags));
  EXPECT_EQ(ps.exit_code, 2) << ps.output;
  EXPECT_NE(ps.output.find(absl::StrCat("--metrics_port: cannot serve metrics on 127.0.0.1:",
                                        taken.port())),
            std::string::npos)
      << ps.output;
  CommandResult worker = RunCommand(
      absl::StrCat("timeout 30 ", bin_, "/psrt_worker --job_name=worker", flags));
  EXPECT_EQ(worker.exit_code, 1) << worker.output;
  EXPECT_NE(worker.output.find(absl::StrCat("--metrics_port: cannot serve metrics on 127.0.0.1:",
                                            taken.port())),
            std::string::npos)
      << worker.output;
}

}  // namespace
}  // namespace psrt

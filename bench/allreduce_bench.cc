// allreduce_bench: ring allreduce bandwidth of psrt's Collective between
// worker processes on 127.0.0.1. Run one process per rank (worker r serves
// on 127.0.0.1:base_port+r); scripts/bench_allreduce.sh starts them and
// runs PyTorch's gloo backend beside them in the same run.
//
// For each size the ranks time --rounds allreduces of a float32 buffer of
// that many MB, --runs times; rank 0 prints the median as NCCL's tests do:
//   allreduce: mb=S workers=W transport=T busbw_mb_per_s=X algbw_mb_per_s=Y
//              minor_faults_per_round=F
// (algbw = bytes / time; busbw = algbw * 2 (W - 1) / W, the bytes each
// worker sends, comparable across worker counts).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc_util.h"
#include "bench/bench_util.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "worker/ring/collective.h"

DEFINE_int32(rank, 0, "This worker's rank.");
DEFINE_int32(workers, 2, "Workers in the ring.");
DEFINE_int32(base_port, 29700, "Worker r listens on 127.0.0.1:base_port+r.");
DEFINE_string(sizes_mb, "1,13,100", "Buffer sizes in MB (10^6 bytes), comma-separated.");
DEFINE_int32(runs, 5, "Timed runs per size; the median is reported.");
DEFINE_int32(rounds, 10, "Allreduces per run.");
DEFINE_bool(unix_socket, false,
            "Reach the next worker over its abstract Unix sockets (gRPC's, and "
            "the data plane's own) instead of TCP.");
DEFINE_bool(data_plane, false,
            "Move the segments over the data plane (data_plane_ring_transport.h), not gRPC.");

using psrt::bench::Check;
using psrt::bench::Median;
using psrt::bench::MinorFaults;

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  psrt::KeepLargeAllocationsMapped();
  psrt::Collective::Options options;
  options.rank = FLAGS_rank;
  for (int r = 0; r < FLAGS_workers; ++r) {
    options.addresses.push_back(absl::StrCat("127.0.0.1:", FLAGS_base_port + r));
  }
  options.unix_socket = FLAGS_unix_socket;
  options.local_data_plane = FLAGS_unix_socket;
  options.data_plane = FLAGS_data_plane;
  psrt::Collective collective(options);
  grpc::ServerBuilder builder;
  psrt::ConfigurePsServer(&builder, int64_t{1} << 31);
  builder.AddListeningPort(options.addresses[FLAGS_rank], grpc::InsecureServerCredentials());
  if (FLAGS_unix_socket) {
    builder.AddListeningPort(psrt::LocalSocketAddress(FLAGS_base_port + FLAGS_rank),
                             grpc::InsecureServerCredentials());
  }
  builder.RegisterService(collective.service());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  CHECK(server != nullptr) << "cannot listen on " << options.addresses[FLAGS_rank];

  for (absl::string_view size : absl::StrSplit(FLAGS_sizes_mb, ',')) {
    double mb = 0;
    CHECK(absl::SimpleAtod(size, &mb)) << "--sizes_mb: " << size;
    std::vector<float> data(static_cast<size_t>(mb * 1e6 / sizeof(float)), 1.0f);
    Check(collective.AllreduceSum(absl::MakeSpan(data)));  // Warm-up, and a barrier.
    std::vector<double> seconds, faults;
    for (int run = 0; run < FLAGS_runs; ++run) {
      const int64_t faults_before = MinorFaults();
      const absl::Time start = absl::Now();
      for (int i = 0; i < FLAGS_rounds; ++i) Check(collective.AllreduceSum(absl::MakeSpan(data)));
      seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start) / FLAGS_rounds);
      faults.push_back(double(MinorFaults() - faults_before) / FLAGS_rounds);
    }
    if (FLAGS_rank != 0) continue;
    const double bytes = data.size() * sizeof(float);
    const double algbw = bytes / Median(seconds) / 1e6;
    const double busbw = algbw * 2.0 * (FLAGS_workers - 1) / FLAGS_workers;
    std::printf("allreduce: mb=%g workers=%d transport=%s busbw_mb_per_s=%.0f "
                "algbw_mb_per_s=%.0f minor_faults_per_round=%.1f\n",
                mb, FLAGS_workers,
                absl::StrCat(FLAGS_data_plane ? "socket" : "grpc",
                             FLAGS_unix_socket ? "-unix" : "-tcp")
                    .c_str(),
                busbw, algbw,
                Median(faults));
    std::fflush(stdout);
  }
  // A last op, so that no rank leaves while another still sends to it.
  std::vector<float> done(1);
  Check(collective.AllreduceSum(absl::MakeSpan(done)));
  server->Shutdown();
  return 0;
}

// One-way bandwidth of the data plane's connections (dataplane/): a child
// process sends frames of --mb megabytes, gathered from 4 pieces, and this
// process receives each straight into a buffer it reuses, as a ps receives
// a push. Prints, median of --runs runs of --frames frames:
//   frame_bench: transport=tcp|unix mb=S mb_per_s=X
// scripts/bench_dataplane.sh runs it beside UCX's ucx_perftest.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dataplane/frame_connection.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(transport, "tcp", "tcp (127.0.0.1) or unix (an abstract Unix socket)");
DEFINE_double(mb, 13, "Megabytes per frame.");
DEFINE_int32(frames, 50, "Frames per run.");
DEFINE_int32(runs, 5, "Runs; the median is printed.");

namespace {

using psrt::dataplane::FrameConnection;
using psrt::dataplane::FrameHeader;

int Run() {
  const std::string address = FLAGS_transport == "unix"
                                  ? absl::StrCat("unix-abstract:psrt-frame-bench-", getpid())
                                  : std::string("127.0.0.1:0");
  auto listener = psrt::dataplane::FrameListener::Listen(address);
  CHECK(listener.ok()) << listener.status();
  const size_t bytes = static_cast<size_t>(FLAGS_mb * 1e6);
  const int total = FLAGS_frames * FLAGS_runs + 3;  // 3 to warm up.
  const pid_t child = fork();
  CHECK_GE(child, 0);
  if (child == 0) {  // The sender.
    auto connection = FrameConnection::Connect((*listener)->address(), bytes,
                                               absl::Now() + absl::Seconds(30));
    CHECK(connection.ok()) << connection.status();
    std::vector<char> data(bytes, 1);
    const size_t quarter = bytes / 4;
    const std::vector<absl::Span<const char>> pieces = {
        {data.data(), quarter},
        {data.data() + quarter, quarter},
        {data.data() + 2 * quarter, quarter},
        {data.data() + 3 * quarter, bytes - 3 * quarter}};
    for (int i = 0; i < total; ++i) {
      const absl::Status sent = (*connection)->Send({}, "meta", pieces, absl::InfiniteFuture());
      CHECK(sent.ok()) << sent;
    }
    _exit(0);
  }
  auto connection = (*listener)->Accept(bytes);
  CHECK(connection.ok()) << connection.status();
  std::vector<char> into(bytes);
  FrameHeader header;
  std::string meta;
  auto receive = [&] {
    absl::Status s = (*connection)->ReceiveHeader(&header, &meta, absl::InfiniteFuture());
    if (s.ok()) {
      s = (*connection)->ReceiveData(absl::MakeSpan(into.data(), header.data_size),
                                     absl::InfiniteFuture());
    }
    CHECK(s.ok()) << s;
  };
  for (int i = 0; i < 3; ++i) receive();
  std::vector<double> rates;
  for (int run = 0; run < FLAGS_runs; ++run) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < FLAGS_frames; ++i) receive();
    rates.push_back(double(bytes) * FLAGS_frames / 1e6 /
                    absl::ToDoubleSeconds(absl::Now() - start));
  }
  int status = 0;
  waitpid(child, &status, 0);
  std::sort(rates.begin(), rates.end());
  std::printf("frame_bench: transport=%s mb=%g mb_per_s=%.0f\n", FLAGS_transport.c_str(),
              FLAGS_mb, rates[rates.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (FLAGS_transport != "tcp" && FLAGS_transport != "unix") {
    LOG(ERROR) << "--transport must be tcp or unix";
    return 2;
  }
  return Run();
}

// pushpull_bench: push + pull bandwidth of a model of --model_mb megabytes
// against running psrt_ps shards, beside the loopback TCP bandwidth measured
// in the same process. Run by scripts/bench_pushpull.sh, which starts the
// shards.
//
// The bench is the chief of a one-replica asynchronous job: it initializes a
// synthetic model (one large variable, partitioned over every shard, plus
// two small ones), then times rounds of Push (every gradient applied by SGD
// on the shards) + Pull. Bandwidth counts the bytes of both directions.
//
// With --device=gpu the model lives on the GPU, as a GPU worker's does: the
// tensors pushed from and pulled into are page-locked, and each round also
// copies the gradients from the device before the push and the parameters
// to the device after the pull (timed with the rest).
#include <arpa/inet.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/cluster_spec.h"
#include "common/placement.h"
#include "common/rpc_util.h"
#include "common/task_flags.h"
#include "common/wire_dtype.h"
#include "bench/bench_util.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "kernels/device.h"
#include "worker/store/ps_client.h"

DEFINE_string(cluster_spec, "", "Spec of the running ps tasks.");
DEFINE_double(model_mb, 13, "Model size in MB (10^6 bytes).");
DEFINE_int32(runs, 5, "Timed runs; the median is reported.");
DEFINE_int32(rounds, 10, "Push+pull rounds per run.");
DEFINE_bool(unix_socket, false,
            "Reach the shards' gRPC over their abstract Unix sockets "
            "(psrt_ps --unix_socket) instead of TCP (the data plane takes "
            "theirs unless psrt_ps --local_data_plane=false).");
DEFINE_string(wire_dtype, "fp32",
              "fp32 or bf16: how gradients and parameters travel (mb_per_s "
              "still counts the model's float32 bytes).");
DEFINE_string(device, "cpu",
              "cpu, or gpu: copy gradients from and parameters to GPU 0 "
              "every round, through page-locked tensors.");

using psrt::bench::Check;
using psrt::bench::Median;
using psrt::bench::MinorFaults;

namespace {

// One TCP stream over 127.0.0.1 moving `bytes` from a reused send buffer
// into a reused receive buffer; returns MB/s.
double LoopbackMbPerSec(size_t bytes) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  CHECK_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  CHECK_EQ(::listen(listener, 1), 0);
  CHECK_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  constexpr size_t kChunk = 1 << 20;
  static std::vector<char> send_buffer(kChunk, 1), receive_buffer(kChunk);
  std::thread receiver([&] {
    int fd = ::accept(listener, nullptr, nullptr);
    size_t got = 0;
    while (got < bytes) {
      ssize_t n = ::read(fd, receive_buffer.data(), kChunk);
      if (n <= 0) break;
      got += n;
    }
    char ack = 1;
    CHECK_EQ(::write(fd, &ack, 1), 1);
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  CHECK_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const absl::Time start = absl::Now();
  size_t sent = 0;
  while (sent < bytes) {
    ssize_t n = ::write(fd, send_buffer.data(), std::min(kChunk, bytes - sent));
    CHECK_GT(n, 0);
    sent += n;
  }
  char ack;
  CHECK_EQ(::read(fd, &ack, 1), 1);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  ::close(fd);
  receiver.join();
  ::close(listener);
  return bytes / 1e6 / secs;
}

int Run() {
  auto spec = psrt::ClusterSpec::FromFile(FLAGS_cluster_spec);
  if (!spec.ok()) {
    LOG(ERROR) << spec.status().message();
    return 2;
  }
  absl::StatusOr<int> stripes = psrt::PsStripesFromFlags();
  if (!stripes.ok()) {
    LOG(ERROR) << stripes.status().message();
    return 2;
  }
  const int shards = spec->num_ps() * *stripes;
  const int64_t floats = static_cast<int64_t>(FLAGS_model_mb * 1e6 / 4);
  constexpr int64_t kCols = 1024;
  const int64_t rows = std::max<int64_t>(1, (floats - 2 * kCols) / kCols);
  std::vector<psrt::VariableDef> vars = {
      {"dense/weights", {rows, kCols}}, {"dense/biases", {kCols}}, {"out/biases", {kCols}}};
  psrt::PlacementOptions placement_options;
  placement_options.partition_threshold_bytes = 1 << 20;
  auto placement = psrt::ComputePlacement(vars, shards, placement_options);
  CHECK(placement.ok()) << placement.status();

  psrt::PsClient::Options options;
  for (int k = 0; k < spec->num_ps(); ++k) options.ps_addresses.push_back(spec->address("ps", k));
  options.ps_stripes = *stripes;
  absl::StatusOr<psrt::proto::DataType> wire_dtype = psrt::ParseWireDtype(FLAGS_wire_dtype);
  if (!wire_dtype.ok()) {
    LOG(ERROR) << wire_dtype.status().message();
    return 2;
  }
  options.wire_dtype = *wire_dtype;
  options.unix_socket = FLAGS_unix_socket;
  absl::StatusOr<psrt::TensorTransport> transport = psrt::TensorTransportFromFlags();
  if (!transport.ok()) {
    LOG(ERROR) << transport.status().message();
    return 2;
  }
  // As a worker's: auto takes the data plane where every ps serves one.
  options.tensor_transport = *transport;
  psrt::PsClient client(options, *placement, vars);
  Check(client.WaitForServers(absl::Seconds(60)));

  psrt::kernels::DeviceSpec device_spec;
  if (FLAGS_device == "gpu") {
    device_spec.type = psrt::kernels::DeviceType::kGpu;
  } else if (FLAGS_device != "cpu") {
    LOG(ERROR) << "--device=" << FLAGS_device << " is not cpu or gpu";
    return 2;
  }
  auto device = psrt::kernels::NewDevice(device_spec);
  if (!device.ok()) {
    LOG(ERROR) << device.status().message();
    return 2;
  }
  psrt::kernels::Device& dev = **device;
  dev.Bind();
  std::vector<psrt::Tensor> params, grads;
  std::vector<psrt::kernels::DeviceArray<float>> device_params(vars.size()),
      device_grads(vars.size());
  size_t model_bytes = 0;
  for (size_t i = 0; i < vars.size(); ++i) {
    const psrt::VariableDef& v = vars[i];
    params.emplace_back(v.shape, dev.host_allocator());
    grads.emplace_back(v.shape, dev.host_allocator());
    device_params[i].Reserve(&dev, params.back().num_elements());
    device_grads[i].Reserve(&dev, params.back().num_elements());
    std::fill_n(grads.back().data(), grads.back().num_elements(), 1e-6f);
    model_bytes += params.back().num_bytes();
  }
  psrt::proto::TrainingConfig config;
  config.set_mode(psrt::proto::ASYNC);
  config.set_num_replicas(1);
  config.set_replicas_to_aggregate(1);
  config.set_optimizer(psrt::proto::SGD);
  config.set_learning_rate(1e-3f);
  Check(client.Init(config, params));

  const bool gpu = !dev.host_memory();
  auto round = [&] {
    if (gpu) {
      for (size_t i = 0; i < grads.size(); ++i) {
        dev.CopyToHostAfterCompute(grads[i].data(), device_grads[i].data(),
                                   grads[i].num_bytes());
      }
      Check(dev.WaitForHostCopies());
    }
    Check(client.Push(grads).status());
    Check(client.Pull(0, &params).status());
    if (gpu) {
      for (size_t i = 0; i < params.size(); ++i) {
        dev.CopyToDevice(device_params[i].data(), params[i].data(),
                         params[i].num_bytes());
      }
      Check(dev.Synchronize());
    }
  };
  if (gpu) {  // The gradients the device "computed".
    for (size_t i = 0; i < grads.size(); ++i) {
      dev.CopyToDevice(device_grads[i].data(), grads[i].data(),
                       grads[i].num_bytes());
    }
  }
  for (int i = 0; i < 3; ++i) round();  // Warm up buffers and connections.
  std::vector<double> pushpull, loopback, faults;
  for (int run = 0; run < FLAGS_runs; ++run) {
    const int64_t faults_before = MinorFaults();
    const absl::Time start = absl::Now();
    for (int i = 0; i < FLAGS_rounds; ++i) round();
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    faults.push_back(double(MinorFaults() - faults_before) / FLAGS_rounds);
    pushpull.push_back(2.0 * model_bytes * FLAGS_rounds / 1e6 / secs);
    loopback.push_back(LoopbackMbPerSec(2 * model_bytes));
    LOG(INFO) << "run " << run << ": push+pull " << pushpull.back()
              << " MB/s, loopback " << loopback.back() << " MB/s";
  }
  LOG_IF(WARNING, !client.Shutdown().ok()) << "the bench ps did not take the goodbye";
  const double x = Median(pushpull), y = Median(loopback);
  std::printf(
      "pushpull: model_mb=%g shards=%d stripes=%d wire=%s tensors=%s device=%s mb_per_s=%.0f "
      "tcp_mb_per_s=%.0f ratio_to_tcp=%.2f minor_faults_per_round=%.1f\n",
      FLAGS_model_mb, spec->num_ps(), *stripes,
      std::string(psrt::WireDtypeName(*wire_dtype)).c_str(),
      client.uses_data_plane() ? "data_plane" : "grpc", FLAGS_device.c_str(), x, y, x / y,
      Median(faults));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  psrt::KeepLargeAllocationsMapped();
  return Run();
}

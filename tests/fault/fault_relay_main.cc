// psrt_fault_relay: a TCP relay that injects network faults (see
// tests/fault/fault_relay.h), for tests and for trying psrt on a bad network
// by hand. Point the workers' cluster spec at the relay, the relay at a PS.
//
//   psrt_fault_relay --listen=127.0.0.2:2222 --target=127.0.0.1:2222 \
//       --delay_ms=5 --jitter_ms=2 --reset_every_secs=10 --seed=7
//
// Prints "listening on HOST:PORT" (the port chosen when --listen asks for 0)
// and logs every injected fault to stderr. Signals: SIGUSR1 resets every open
// connection now, SIGHUP closes them (FIN), SIGUSR2 stalls every connection
// for --stall_secs; SIGTERM or SIGINT print the totals and exit 0.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "tests/fault/fault_relay.h"

DEFINE_string(listen, "127.0.0.1:0", "host:port to accept clients on; port 0: any free port.");
DEFINE_string(target, "", "host:port to forward every connection to (required).");
DEFINE_double(delay_ms, 0, "Delay added to every chunk, each way.");
DEFINE_double(jitter_ms, 0, "Uniform +/- jitter of the delay, at most --delay_ms; never reorders.");
DEFINE_double(close_prob, 0, "Per forwarded chunk: probability of closing its connection (FIN).");
DEFINE_double(reset_prob, 0, "Per forwarded chunk: probability of resetting its connection (RST).");
DEFINE_double(reset_every_secs, 0, "Reset every open connection this often; 0: never.");
DEFINE_double(stall_every_secs, 0, "Stall every connection this often; 0: never.");
DEFINE_double(stall_secs, 3, "Length of each stall (timed or SIGUSR2).");
DEFINE_int32(max_faults, -1, "Random and timed faults injected at most; -1: no limit.");
DEFINE_uint64(seed, 1, "Seed of the random faults and the jitter.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("TCP relay that injects delays, resets, closes and stalls");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  psrt::FaultRelay::Options options;
  if (FLAGS_target.empty()) {
    LOG(ERROR) << "--target=host:port is required";
    return 2;
  }
  // SplitHostPort refuses port 0, which --listen takes as "any free port".
  const bool any_port = absl::EndsWith(FLAGS_listen, ":0");
  const std::string listen = any_port ? absl::StrCat(FLAGS_listen, "1") : FLAGS_listen;
  for (auto [flag, value, host, port] :
       {std::tuple{"--listen", listen, &options.listen_host, &options.listen_port},
        std::tuple{"--target", FLAGS_target, &options.target_host, &options.target_port}}) {
    if (absl::Status s = psrt::SplitHostPort(value, host, port); !s.ok()) {
      LOG(ERROR) << flag << ": " << s.message();
      return 2;
    }
  }
  if (any_port) options.listen_port = 0;
  options.delay = absl::Milliseconds(FLAGS_delay_ms);
  options.jitter = absl::Milliseconds(FLAGS_jitter_ms);
  options.close_probability = FLAGS_close_prob;
  options.reset_probability = FLAGS_reset_prob;
  options.reset_every = absl::Seconds(FLAGS_reset_every_secs);
  options.stall_every = absl::Seconds(FLAGS_stall_every_secs);
  options.stall_for = absl::Seconds(FLAGS_stall_secs);
  options.max_faults = FLAGS_max_faults;
  options.seed = FLAGS_seed;

  // Signals are taken by this thread alone (sigwait), never by the relay's.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGUSR1, SIGUSR2, SIGHUP, SIGTERM, SIGINT}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<psrt::FaultRelay>> relay = psrt::FaultRelay::Start(options);
  if (!relay.ok()) {
    LOG(ERROR) << relay.status().message();
    return 2;
  }
  std::printf("listening on %s:%d, forwarding to %s\n", options.listen_host.c_str(),
              (*relay)->port(), FLAGS_target.c_str());
  std::fflush(stdout);
  while (true) {
    int signal = 0;
    sigwait(&signals, &signal);
    if (signal == SIGUSR1) {
      (*relay)->InjectAll(psrt::FaultRelay::Fault::kReset);
    } else if (signal == SIGHUP) {
      (*relay)->InjectAll(psrt::FaultRelay::Fault::kClose);
    } else if (signal == SIGUSR2) {
      (*relay)->StallAll(options.stall_for);
    } else {
      break;
    }
  }
  const psrt::FaultRelay::Stats stats = (*relay)->stats();
  relay->reset();
  std::printf("totals: %lld connections, %lld bytes forwarded, %lld resets, %lld closes, "
              "%lld stalls\n",
              static_cast<long long>(stats.connections),
              static_cast<long long>(stats.bytes_forwarded),
              static_cast<long long>(stats.resets), static_cast<long long>(stats.closes),
              static_cast<long long>(stats.stalls));
  return 0;
}

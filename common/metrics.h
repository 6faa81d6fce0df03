// A task's telemetry, defined in one place: the Prometheus registry and its
// optional HTTP endpoint (Metrics), and what the ps and the workers count
// (PsMetrics, WorkerMetrics). The same numbers feed /metrics and the status
// RPCs that psrtctl reads (proto/psrt.proto's "Operations" messages), so the
// two never disagree.
//
// The modules that count see small Record* methods, never a Prometheus type:
//   ps/request_handler.cc       PsMetrics        pushes, pulls, bytes, pull
//                                                waits, apply latency,
//                                                version, readiness
//   worker/store/ps_client.cc   TransferMetrics  the worker's side of the same
//   worker/training/trainer.cc  WorkerMetrics    state, global step, local
//                                                steps, examples/sec
// Every series carries the constant labels job and task. Every registry also
// exports the process: psrt_process_start_time_seconds,
// psrt_process_resident_memory_bytes (read at each scrape) and
// psrt_task_restarts.
#ifndef PSRT_COMMON_METRICS_H_
#define PSRT_COMMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/psrt.pb.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace psrt {

// Resident set size of this process, from /proc/self/statm; 0 when unknown.
int64_t ResidentMemoryBytes();

// RateMeter: events (or bytes) per second over a sliding window, kept in
// one-second buckets. The rate covers the window's whole seconds plus the
// current partial one, or the time since construction if that is shorter,
// but never less than one second (a shorter span gives noise, not a rate).
//
// Thread safety: thread-safe.
class RateMeter {
 public:
  explicit RateMeter(absl::Duration window = absl::Seconds(10),
                     absl::Time now = absl::Now());
  void Add(double amount, absl::Time now = absl::Now());
  double PerSecond(absl::Time now = absl::Now()) const;

 private:
  const absl::Time start_;
  mutable absl::Mutex mu_;
  // buckets_[s % size] holds the amount added during unix second s, for the
  // `size` newest seconds; seconds_[i] says which second bucket i holds.
  std::vector<double> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> seconds_ ABSL_GUARDED_BY(mu_);
};

// Metrics: a task's Prometheus registry and, once Serve() is called, the
// HTTP endpoint that exposes it (GET /metrics, Prometheus text format).
//
// Thread safety: define metrics (the Add* methods, and constructing the
// Ps/Worker/TransferMetrics below) before Serve() and from one thread; the
// metrics themselves are updated from any thread, and scrapes run on the
// endpoint's own threads.
class Metrics {
 public:
  struct Options {
    std::string job;   // "ps", "worker", "chief" or "evaluator".
    int task = 0;      // Index within the job.
    int restarts = 0;  // Times the launcher restarted this task.
  };
  explicit Metrics(const Options& options);
  ~Metrics();

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Starts serving /metrics on host:port (port 0: a free port, see port()).
  // Unavailable naming the address when it cannot listen there.
  // REQUIRES: called at most once.
  absl::Status Serve(const std::string& host, int port);
  // The port /metrics is served on; 0 before Serve().
  int port() const { return port_; }

  // Each name is one family; the same name with other `labels` adds a
  // series to it. The returned metric lives as long as this object.
  prometheus::Counter& AddCounter(const std::string& name, const std::string& help,
                                  const std::map<std::string, std::string>& labels = {});
  prometheus::Gauge& AddGauge(const std::string& name, const std::string& help,
                              const std::map<std::string, std::string>& labels = {});
  prometheus::Histogram& AddHistogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& buckets);
  // A gauge whose value `read` returns at each scrape (on the endpoint's
  // thread: it must be thread-safe).
  void AddGaugeCallback(const std::string& name, const std::string& help,
                        std::function<double()> read);
  // Removes the callbacks whose names start with `prefix`; none of them runs
  // once this returns (before what they read goes away).
  void RemoveGaugeCallbacks(const std::string& prefix);

  proto::ProcessStatus process_status() const;

 private:
  class Callbacks;
  const Options options_;
  const absl::Time start_time_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Callbacks> callbacks_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// How a push ended, as the ps answered it.
enum class PushOutcome {
  kAccepted,  // Summed in (sync) or applied (async); a retry counts here too.
  kStale,     // Computed from an older version: dropped.
  kLate,      // Arrived after training ended: ignored.
  kRejected,  // Failed (invalid, unreachable, ...).
};

// What became of a push: failed (`ok` false), or as the shards answered.
inline PushOutcome OutcomeOf(bool ok, bool accepted, bool training_done) {
  if (!ok) return PushOutcome::kRejected;
  if (accepted) return PushOutcome::kAccepted;
  return training_done ? PushOutcome::kLate : PushOutcome::kStale;
}

// TransferMetrics: pushes and pulls as one side sees them: the ps that
// answers them ("psrt_ps_*") or the worker that sends them
// ("psrt_worker_*"): pushes_total{result}, pulls_total, pushed_bytes_total,
// pulled_bytes_total, push_seconds and pull_wait_seconds (histograms), and
// ten-second rates for the status RPC.
//
// Thread safety: thread-safe.
class TransferMetrics {
 public:
  enum class Side { kPs, kWorker };
  // REQUIRES: `metrics` outlives this object.
  TransferMetrics(Metrics* metrics, Side side);

  // `latency`: on a ps, the time the shard took to sum or apply the push;
  // on a worker, the round trip.
  void RecordPush(PushOutcome outcome, int64_t bytes, absl::Duration latency);
  void RecordPull(int64_t bytes);
  // On a ps, only pulls that waited (for their version, or for slower
  // replicas) are observed, so the histogram's count is the number of waits;
  // on a worker, every pull, waiting included.
  void RecordPullWait(absl::Duration wait);

  proto::TrafficStatus traffic() const;

 private:
  prometheus::Counter* pushes_[4];  // By PushOutcome.
  prometheus::Counter* pulls_;
  prometheus::Counter* pushed_bytes_;
  prometheus::Counter* pulled_bytes_;
  prometheus::Histogram* push_seconds_;
  prometheus::Histogram* pull_wait_seconds_;
  RateMeter push_rate_;
  RateMeter byte_rate_;
};

// PsMetrics: a ps task's metrics, counted by its RPC adapter: the transfers
// plus psrt_ps_version and psrt_ps_ready. A task of S stripes (psrt_ps
// --ps_stripes) counts S pushes and pulls per worker push and pull, one per
// shard, each with its part of the bytes.
//
// Thread safety: thread-safe.
class PsMetrics {
 public:
  // REQUIRES: `metrics` outlives this object.
  explicit PsMetrics(Metrics* metrics);

  const Metrics& metrics() const { return *metrics_; }
  TransferMetrics& transfers() { return transfers_; }
  const TransferMetrics& transfers() const { return transfers_; }
  void SetVersion(int64_t version);
  void SetReady(bool ready);

 private:
  const Metrics* const metrics_;
  TransferMetrics transfers_;
  prometheus::Gauge* version_;
  prometheus::Gauge* ready_;
};

// WorkerMetrics: a worker, chief or evaluator task's progress, which feeds
// /metrics and the WorkerStatus RPC: its state (psrt_worker_state{state} is 1
// for the current one), psrt_worker_global_step, psrt_worker_local_steps_total,
// psrt_worker_examples_total, psrt_worker_examples_per_second and
// psrt_worker_steps_rolled_back_total (steps a recovery from a checkpoint
// went back); plus its transfers. A listener hears every state change (the task's health).
//
// Thread safety: thread-safe. The listener runs on the thread that changed
// the state, outside any lock.
class WorkerMetrics {
 public:
  // REQUIRES: `metrics` outlives this object.
  explicit WorkerMetrics(Metrics* metrics);

  const Metrics& metrics() const { return *metrics_; }
  TransferMetrics& transfers() { return transfers_; }

  // REQUIRES: called before the state first changes.
  void SetStateListener(std::function<void(proto::WorkerState)> listener);
  void SetState(proto::WorkerState state);
  // One training step done: `examples` trained on, parameters of
  // `global_step` pulled.
  void RecordStep(int64_t global_step, int64_t examples);
  void SetGlobalStep(int64_t global_step);
  // A recovery went back `steps` global steps (0: none).
  void RecordRollback(int64_t steps);

  proto::WorkerState state() const;
  int64_t global_step() const;
  int64_t local_steps() const;
  double examples_per_sec() const { return example_rate_.PerSecond(); }

 private:
  const Metrics* const metrics_;
  TransferMetrics transfers_;
  std::map<proto::WorkerState, prometheus::Gauge*> state_gauges_;
  prometheus::Gauge* global_step_;
  prometheus::Counter* local_steps_;
  prometheus::Counter* examples_;
  prometheus::Counter* rolled_back_;
  RateMeter example_rate_;
  mutable absl::Mutex mu_;
  proto::WorkerState state_ ABSL_GUARDED_BY(mu_) = proto::WORKER_WAITING;
  std::function<void(proto::WorkerState)> listener_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_METRICS_H_

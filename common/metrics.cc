#include "common/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace psrt {
namespace {

// Latencies from 100 us to ~100 s.
const std::vector<double>& LatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
  return *buckets;
}

constexpr struct {
  PushOutcome outcome;
  const char* label;
} kPushOutcomes[] = {
    {PushOutcome::kAccepted, "accepted"},
    {PushOutcome::kStale, "stale"},
    {PushOutcome::kLate, "late"},
    {PushOutcome::kRejected, "rejected"},
};

constexpr struct {
  proto::WorkerState state;
  const char* label;
} kWorkerStates[] = {
    {proto::WORKER_WAITING, "waiting"},   {proto::WORKER_TRAINING, "training"},
    {proto::WORKER_EVALUATING, "evaluating"}, {proto::WORKER_DONE, "done"},
    {proto::WORKER_FAILED, "failed"},
};

}  // namespace

int64_t ResidentMemoryBytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  long long size_pages = 0;
  long long resident_pages = 0;
  const int read = std::fscanf(statm, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(statm);
  return read == 2 ? resident_pages * sysconf(_SC_PAGESIZE) : 0;
}

// ---------------------------------------------------------------------------
// RateMeter

RateMeter::RateMeter(absl::Duration window, absl::Time now)
    : start_(now),
      buckets_(std::max<int64_t>(1, absl::ToInt64Seconds(window)), 0.0),
      seconds_(buckets_.size(), -1) {}

void RateMeter::Add(double amount, absl::Time now) {
  const int64_t second = absl::ToUnixSeconds(now);
  const size_t i = static_cast<size_t>(second) % buckets_.size();
  absl::MutexLock lock(&mu_);
  if (seconds_[i] != second) {
    seconds_[i] = second;
    buckets_[i] = 0;
  }
  buckets_[i] += amount;
}

double RateMeter::PerSecond(absl::Time now) const {
  const int64_t second = absl::ToUnixSeconds(now);
  const int64_t oldest = second - static_cast<int64_t>(buckets_.size()) + 1;
  double sum = 0;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (seconds_[i] >= oldest && seconds_[i] <= second) sum += buckets_[i];
    }
  }
  const absl::Time from = std::max(start_, absl::FromUnixSeconds(oldest));
  return sum / std::max(1.0, absl::ToDoubleSeconds(now - from));
}

// ---------------------------------------------------------------------------
// Metrics

// The gauges read at scrape time, as one Collectable.
class Metrics::Callbacks : public prometheus::Collectable {
 public:
  explicit Callbacks(std::map<std::string, std::string> labels)
      : labels_(std::move(labels)) {}

  void Add(const std::string& name, const std::string& help,
           std::function<double()> read) {
    absl::MutexLock lock(&mu_);
    gauges_.push_back({name, help, std::move(read)});
  }

  void Remove(const std::string& prefix) {
    absl::MutexLock lock(&mu_);
    gauges_.erase(std::remove_if(gauges_.begin(), gauges_.end(),
                                 [&](const Gauge& g) { return absl::StartsWith(g.name, prefix); }),
                  gauges_.end());
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> families;
    for (const Gauge& gauge : gauges_) {
      prometheus::ClientMetric metric;
      for (const auto& [name, value] : labels_) metric.label.push_back({name, value});
      metric.gauge.value = gauge.read();
      families.push_back({gauge.name, gauge.help, prometheus::MetricType::Gauge, {metric}});
    }
    return families;
  }

 private:
  struct Gauge {
    std::string name;
    std::string help;
    std::function<double()> read;
  };
  const std::map<std::string, std::string> labels_;
  mutable absl::Mutex mu_;
  std::vector<Gauge> gauges_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics(const Options& options)
    : options_(options),
      start_time_(absl::Now()),
      registry_(std::make_shared<prometheus::Registry>()),
      callbacks_(std::make_shared<Callbacks>(std::map<std::string, std::string>{
          {"job", options.job}, {"task", absl::StrCat(options.task)}})) {
  AddGauge("psrt_process_start_time_seconds",
           "Start time of this process since the Unix epoch, in seconds.")
      .Set(absl::ToDoubleSeconds(start_time_ - absl::UnixEpoch()));
  AddGauge("psrt_task_restarts",
           "Times the launcher restarted this task (PSRT_RESTART_COUNT).")
      .Set(options.restarts);
  AddGaugeCallback("psrt_process_resident_memory_bytes",
                   "Resident memory of this process, in bytes.",
                   [] { return static_cast<double>(ResidentMemoryBytes()); });
}

Metrics::~Metrics() = default;

absl::Status Metrics::Serve(const std::string& host, int port) {
  const std::string address = absl::StrCat(
      host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", address, "num_threads", "2"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, " (port in use?): ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(callbacks_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? port : ports[0];
  return absl::OkStatus();
}

prometheus::Counter& Metrics::AddCounter(const std::string& name, const std::string& help,
                                         const std::map<std::string, std::string>& labels) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Labels({{"job", options_.job}, {"task", absl::StrCat(options_.task)}})
      .Register(*registry_)
      .Add(labels);
}

prometheus::Gauge& Metrics::AddGauge(const std::string& name, const std::string& help,
                                     const std::map<std::string, std::string>& labels) {
  return prometheus::BuildGauge()
      .Name(name)
      .Help(help)
      .Labels({{"job", options_.job}, {"task", absl::StrCat(options_.task)}})
      .Register(*registry_)
      .Add(labels);
}

prometheus::Histogram& Metrics::AddHistogram(const std::string& name,
                                             const std::string& help,
                                             const std::vector<double>& buckets) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Labels({{"job", options_.job}, {"task", absl::StrCat(options_.task)}})
      .Register(*registry_)
      .Add({}, buckets);
}

void Metrics::AddGaugeCallback(const std::string& name, const std::string& help,
                               std::function<double()> read) {
  callbacks_->Add(name, help, std::move(read));
}

void Metrics::RemoveGaugeCallbacks(const std::string& prefix) { callbacks_->Remove(prefix); }

proto::ProcessStatus Metrics::process_status() const {
  proto::ProcessStatus status;
  status.set_resident_memory_bytes(ResidentMemoryBytes());
  status.set_uptime_secs(absl::ToDoubleSeconds(absl::Now() - start_time_));
  status.set_restarts(options_.restarts);
  return status;
}

// ---------------------------------------------------------------------------
// TransferMetrics

TransferMetrics::TransferMetrics(Metrics* metrics, Side side) {
  const bool ps = side == Side::kPs;
  const std::string prefix = ps ? "psrt_ps_" : "psrt_worker_";
  for (const auto& [outcome, label] : kPushOutcomes) {
    pushes_[static_cast<int>(outcome)] = &metrics->AddCounter(
        prefix + "pushes_total",
        ps ? "Gradient pushes received, by result." : "Gradient pushes sent, by result.",
        {{"result", label}});
  }
  pulls_ = &metrics->AddCounter(prefix + "pulls_total",
                                ps ? "Pulls answered." : "Pulls completed.");
  pushed_bytes_ = &metrics->AddCounter(prefix + "pushed_bytes_total",
                                       "Bytes of push requests (gradients and header).");
  pulled_bytes_ = &metrics->AddCounter(prefix + "pulled_bytes_total",
                                       "Bytes of pull replies (parameters and header).");
  push_seconds_ = &metrics->AddHistogram(
      prefix + "push_seconds",
      ps ? "Apply latency: seconds the shard took to sum or apply one push."
         : "Seconds per push, round trip.",
      LatencyBuckets());
  pull_wait_seconds_ = &metrics->AddHistogram(
      prefix + "pull_wait_seconds",
      ps ? "Seconds a pull waited for its version or for slower replicas; "
           "only pulls that waited."
         : "Seconds per pull, waiting for the version included.",
      LatencyBuckets());
}

void TransferMetrics::RecordPush(PushOutcome outcome, int64_t bytes,
                                 absl::Duration latency) {
  pushes_[static_cast<int>(outcome)]->Increment();
  pushed_bytes_->Increment(static_cast<double>(bytes));
  push_seconds_->Observe(absl::ToDoubleSeconds(latency));
  push_rate_.Add(1);
  byte_rate_.Add(static_cast<double>(bytes));
}

void TransferMetrics::RecordPull(int64_t bytes) {
  pulls_->Increment();
  pulled_bytes_->Increment(static_cast<double>(bytes));
  byte_rate_.Add(static_cast<double>(bytes));
}

void TransferMetrics::RecordPullWait(absl::Duration wait) {
  pull_wait_seconds_->Observe(absl::ToDoubleSeconds(wait));
}

proto::TrafficStatus TransferMetrics::traffic() const {
  proto::TrafficStatus traffic;
  double pushes = 0;
  for (const prometheus::Counter* counter : pushes_) pushes += counter->Value();
  traffic.set_pushes(static_cast<int64_t>(pushes));
  traffic.set_pulls(static_cast<int64_t>(pulls_->Value()));
  traffic.set_bytes_pushed(static_cast<int64_t>(pushed_bytes_->Value()));
  traffic.set_bytes_pulled(static_cast<int64_t>(pulled_bytes_->Value()));
  traffic.set_pushes_per_sec(push_rate_.PerSecond());
  traffic.set_bytes_per_sec(byte_rate_.PerSecond());
  return traffic;
}

// ---------------------------------------------------------------------------
// PsMetrics

PsMetrics::PsMetrics(Metrics* metrics)
    : metrics_(metrics),
      transfers_(metrics, TransferMetrics::Side::kPs),
      version_(&metrics->AddGauge("psrt_ps_version",
                                  "The shard's version: its global step in sync mode, "
                                  "updates applied in async mode.")),
      ready_(&metrics->AddGauge("psrt_ps_ready",
                                "1 once the chief has made the shard ready for workers.")) {}

void PsMetrics::SetVersion(int64_t version) { version_->Set(static_cast<double>(version)); }

void PsMetrics::SetReady(bool ready) { ready_->Set(ready ? 1 : 0); }

// ---------------------------------------------------------------------------
// WorkerMetrics

WorkerMetrics::WorkerMetrics(Metrics* metrics)
    : metrics_(metrics),
      transfers_(metrics, TransferMetrics::Side::kWorker),
      global_step_(&metrics->AddGauge("psrt_worker_global_step",
                                      "Global step of the parameters last pulled.")),
      local_steps_(&metrics->AddCounter("psrt_worker_local_steps_total",
                                        "Training steps this task computed and pushed.")),
      examples_(&metrics->AddCounter("psrt_worker_examples_total",
                                     "Training examples this task computed gradients on.")),
      rolled_back_(&metrics->AddCounter(
          "psrt_worker_steps_rolled_back_total",
          "Global steps this task's recoveries went back to a checkpoint.")) {
  for (const auto& [state, label] : kWorkerStates) {
    state_gauges_[state] = &metrics->AddGauge(
        "psrt_worker_state", "1 for the task's current state, 0 for the others.",
        {{"state", label}});
  }
  state_gauges_[proto::WORKER_WAITING]->Set(1);
  metrics->AddGaugeCallback("psrt_worker_examples_per_second",
                            "Training examples per second, over the last ten seconds.",
                            [this] { return examples_per_sec(); });
}

void WorkerMetrics::RecordRollback(int64_t steps) {
  rolled_back_->Increment(static_cast<double>(steps));
}

void WorkerMetrics::SetStateListener(std::function<void(proto::WorkerState)> listener) {
  listener_ = std::move(listener);
}

void WorkerMetrics::SetState(proto::WorkerState state) {
  {
    absl::MutexLock lock(&mu_);
    if (state == state_) return;
    state_gauges_[state_]->Set(0);
    state_gauges_[state]->Set(1);
    state_ = state;
  }
  if (listener_) listener_(state);
}

void WorkerMetrics::RecordStep(int64_t global_step, int64_t examples) {
  global_step_->Set(static_cast<double>(global_step));
  local_steps_->Increment();
  examples_->Increment(static_cast<double>(examples));
  example_rate_.Add(static_cast<double>(examples));
}

void WorkerMetrics::SetGlobalStep(int64_t global_step) {
  global_step_->Set(static_cast<double>(global_step));
}

proto::WorkerState WorkerMetrics::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

int64_t WorkerMetrics::global_step() const {
  return static_cast<int64_t>(global_step_->Value());
}

int64_t WorkerMetrics::local_steps() const {
  return static_cast<int64_t>(local_steps_->Value());
}

}  // namespace psrt

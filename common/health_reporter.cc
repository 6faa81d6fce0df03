#include "common/health_reporter.h"

#include <utility>

#include "glog/logging.h"

namespace psrt {

HealthReporter::HealthReporter(std::vector<std::string> services)
    : services_(std::move(services)) {
  services_.insert(services_.begin(), "");
}

void HealthReporter::EnableHealthService() { grpc::EnableDefaultHealthCheckService(true); }

void HealthReporter::Attach(grpc::Server* server) {
  absl::MutexLock lock(&mu_);
  health_ = server->GetHealthCheckService();
  CHECK(health_ != nullptr) << "the server was built before EnableHealthService()";
  ApplyLocked();
}

void HealthReporter::Detach() {
  absl::MutexLock lock(&mu_);
  health_ = nullptr;
}

void HealthReporter::Set(bool serving) {
  absl::MutexLock lock(&mu_);
  serving_ = serving;
  ApplyLocked();
}

bool HealthReporter::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

void HealthReporter::ApplyLocked() {
  if (health_ == nullptr) return;
  for (const std::string& service : services_) health_->SetServingStatus(service, serving_);
  health_->SetServingStatus(kLivenessService, true);
}

}  // namespace psrt

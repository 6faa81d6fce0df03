// HealthReporter: the serving status a task reports through gRPC's standard
// health service (grpc.health.v1.Health, gRPC's built-in implementation):
// the overall server ("") and the task's own services together, SERVING or
// NOT_SERVING. The service "psrt.liveness" (kLivenessService) is SERVING as
// long as the process answers at all: the target of a liveness probe, which
// must not restart a task that is alive but not ready (a ps waiting for the
// chief, or being rolled back).
//
// Use: EnableHealthService() before building the server; Attach(server) once
// it started; Set() whenever readiness changes, from any thread; Detach()
// before the server is destroyed. A status set before Attach is applied by
// Attach, so the server reports NOT_SERVING from its first moments until the
// task says otherwise (gRPC itself starts "" as SERVING; Attach overrides
// that right after the server starts).
//
// Thread safety: thread-safe.
#ifndef PSRT_COMMON_HEALTH_REPORTER_H_
#define PSRT_COMMON_HEALTH_REPORTER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"

namespace psrt {

inline constexpr char kLivenessService[] = "psrt.liveness";

class HealthReporter {
 public:
  // `services`: the fully qualified names the task serves, e.g.
  // "psrt.proto.ParameterServer"; "" is always reported too.
  explicit HealthReporter(std::vector<std::string> services);

  // Makes every server built from now on serve grpc.health.v1.Health.
  static void EnableHealthService();

  // REQUIRES: the server was built after EnableHealthService().
  void Attach(grpc::Server* server);
  void Detach();
  void Set(bool serving);
  bool serving() const;

 private:
  void ApplyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<std::string> services_;
  mutable absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace psrt

#endif  // PSRT_COMMON_HEALTH_REPORTER_H_

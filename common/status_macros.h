// The project's only two macros for propagating absl::Status.
//
//   RETURN_IF_ERROR(DoThing());
//   ASSIGN_OR_RETURN(auto value, ComputeValue());
#ifndef PSRT_COMMON_STATUS_MACROS_H_
#define PSRT_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PSRT_CONCAT_INNER_(a, b) a##b
#define PSRT_CONCAT_(a, b) PSRT_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status psrt_status_ = (expr);      \
    if (!psrt_status_.ok()) return psrt_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  PSRT_ASSIGN_OR_RETURN_IMPL_(PSRT_CONCAT_(psrt_statusor_, __LINE__), lhs, expr)

#define PSRT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()

#endif  // PSRT_COMMON_STATUS_MACROS_H_

// ExampleFeatures: the features of a tf.train.Example read by name and
// type, as the data readers need them (tfrecord_dataset.h, image_records.h):
// a single int64 or a single bytes value, with errors that name the feature
// and what it holds instead, and a missing feature named beside the ones
// present.
//
// Thread safety: as the Example's (not thread-safe).
#ifndef PSRT_WORKER_INPUT_EXAMPLE_FEATURES_H_
#define PSRT_WORKER_INPUT_EXAMPLE_FEATURES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/example.pb.h"

namespace psrt {

class ExampleFeatures {
 public:
  // REQUIRES: `example` outlives this.
  explicit ExampleFeatures(tf::Example* example) : example_(example) {}

  // InvalidArgument: missing feature "NAME" (present: A, B).
  absl::Status Missing(absl::string_view name) const;

  // The single int64 value of `name`, nullopt when absent.
  // InvalidArgument when it holds another kind or another count.
  absl::StatusOr<std::optional<int64_t>> Int64(absl::string_view name) const;
  // The same, Missing when absent.
  absl::StatusOr<int64_t> RequiredInt64(absl::string_view name) const;

  // The single bytes value of `name`, in the Example (no copy); null when
  // absent. Valid until the Example changes.
  absl::StatusOr<const std::string*> Bytes(absl::string_view name) const;
  // The single bytes value moved out of the Example ("" when absent and not
  // `required`; Missing when absent and `required`).
  absl::StatusOr<std::string> TakeBytes(absl::string_view name, bool required);

 private:
  const tf::Feature* Find(absl::string_view name) const;
  // The feature, checked to hold one value of `kind`; null when absent.
  absl::StatusOr<const tf::Feature*> Single(absl::string_view name,
                                            tf::Feature::KindCase kind) const;

  tf::Example* const example_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_EXAMPLE_FEATURES_H_

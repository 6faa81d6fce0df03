#include "worker/input/example_features.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

const char* KindName(tf::Feature::KindCase kind) {
  switch (kind) {
    case tf::Feature::kBytesList: return "a bytes_list";
    case tf::Feature::kFloatList: return "a float_list";
    case tf::Feature::kInt64List: return "an int64_list";
    default: return "empty";
  }
}

int ValueCount(const tf::Feature& f) {
  switch (f.kind_case()) {
    case tf::Feature::kBytesList: return f.bytes_list().value_size();
    case tf::Feature::kFloatList: return f.float_list().value_size();
    case tf::Feature::kInt64List: return f.int64_list().value_size();
    default: return 0;
  }
}

}  // namespace

const tf::Feature* ExampleFeatures::Find(absl::string_view name) const {
  const auto& features = example_->features().feature();
  auto it = features.find(std::string(name));
  return it == features.end() ? nullptr : &it->second;
}

absl::Status ExampleFeatures::Missing(absl::string_view name) const {
  std::vector<std::string> present;
  for (const auto& [key, value] : example_->features().feature()) present.push_back(key);
  std::sort(present.begin(), present.end());
  return absl::InvalidArgumentError(
      absl::StrCat("missing feature \"", name, "\" (present: ",
                   present.empty() ? "none" : absl::StrJoin(present, ", "), ")"));
}

absl::StatusOr<const tf::Feature*> ExampleFeatures::Single(absl::string_view name,
                                                           tf::Feature::KindCase kind) const {
  const tf::Feature* f = Find(name);
  if (f == nullptr) return nullptr;
  if (f->kind_case() != kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature \"", name, "\" is ", KindName(f->kind_case()), ", expected ", KindName(kind)));
  }
  if (ValueCount(*f) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("feature \"", name, "\" has ", ValueCount(*f), " values, expected 1"));
  }
  return f;
}

absl::StatusOr<std::optional<int64_t>> ExampleFeatures::Int64(absl::string_view name) const {
  ASSIGN_OR_RETURN(const tf::Feature* f, Single(name, tf::Feature::kInt64List));
  if (f == nullptr) return std::nullopt;
  return f->int64_list().value(0);
}

absl::StatusOr<int64_t> ExampleFeatures::RequiredInt64(absl::string_view name) const {
  ASSIGN_OR_RETURN(const std::optional<int64_t> value, Int64(name));
  if (!value.has_value()) return Missing(name);
  return *value;
}

absl::StatusOr<const std::string*> ExampleFeatures::Bytes(absl::string_view name) const {
  ASSIGN_OR_RETURN(const tf::Feature* f, Single(name, tf::Feature::kBytesList));
  if (f == nullptr) return nullptr;
  return &f->bytes_list().value(0);
}

absl::StatusOr<std::string> ExampleFeatures::TakeBytes(absl::string_view name, bool required) {
  ASSIGN_OR_RETURN(const std::string* value, Bytes(name));
  if (value == nullptr) {
    if (required) return Missing(name);
    return std::string();
  }
  auto& features = *example_->mutable_features()->mutable_feature();
  return std::move(
      *features.find(std::string(name))->second.mutable_bytes_list()->mutable_value(0));
}

}  // namespace psrt

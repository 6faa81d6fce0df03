// Reading Keras's model JSON once parsed into a protobuf Struct: the two
// helpers every reader of it needs (models/keras_file*.cc).
#ifndef PSRT_MODELS_KERAS_JSON_H_
#define PSRT_MODELS_KERAS_JSON_H_

#include <string>

#include "google/protobuf/struct.pb.h"

namespace psrt {
namespace keras_json {

// A value's field, or null.
inline const google::protobuf::Value* Field(const google::protobuf::Struct& s,
                                            const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

// A missing field or JSON's null.
inline bool IsNull(const google::protobuf::Value* v) {
  return v == nullptr || v->has_null_value();
}

}  // namespace keras_json
}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_JSON_H_

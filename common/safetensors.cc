#include "common/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_system.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "zlib.h"

namespace psrt {
namespace {

constexpr char kChecksumKey[] = "psrt_crc32";
constexpr size_t kChecksumDigits = 10;

// Where the checksum's digits start in a header, or npos.
size_t ChecksumDigitsAt(const std::string& header) {
  const std::string key = absl::StrCat("\"", kChecksumKey, "\":\"");
  const size_t at = header.find(key);
  if (at == std::string::npos || at + key.size() + kChecksumDigits > header.size()) {
    return std::string::npos;
  }
  return at + key.size();
}

// Reads a header's dimension or offset: a JSON number that is an integer in
// [0, max] (anything else, cast to an integer, would be undefined behavior).
bool GetIndex(const google::protobuf::Value& v, double max, uint64_t* out) {
  const double d = v.number_value();
  if (v.kind_case() != google::protobuf::Value::kNumberValue ||
      !(d >= 0 && d <= max) || d != std::floor(d)) {
    return false;
  }
  *out = static_cast<uint64_t>(d);
  return true;
}

// zlib's crc32 takes lengths as uInt: feed it in pieces.
uLong Crc32(uLong crc, const char* data, size_t n) {
  constexpr size_t kPiece = 1 << 30;
  while (n > 0) {
    const size_t take = std::min(n, kPiece);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(take));
    data += take;
    n -= take;
  }
  return crc;
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

size_t ElementBytes(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 ? 4 : 8;
}

const char* DtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32: return "F32";
    case SafetensorsDtype::kI64: return "I64";
    case SafetensorsDtype::kU64: return "U64";
  }
  return "?";
}

// Appends a tensor's bytes to `file` and to `crc`, through a buffer when a
// producer makes them in small pieces.
absl::Status WriteTensor(const NamedTensor& t, AtomicFile* file, uLong* crc) {
  const size_t bytes = t.num_bytes();
  if (t.data != nullptr) {
    *crc = Crc32(*crc, static_cast<const char*>(t.data), bytes);
    return file->Append({static_cast<const char*>(t.data), bytes});
  }
  constexpr size_t kBuffer = size_t{1} << 20;
  std::string buffer;
  buffer.reserve(kBuffer);
  size_t made = 0;
  absl::Status status;
  auto flush = [&] {
    *crc = Crc32(*crc, buffer.data(), buffer.size());
    if (status.ok()) status = file->Append(buffer);
    buffer.clear();
  };
  if (t.produce) {
    t.produce([&](absl::string_view piece) {
      made += piece.size();
      if (!status.ok() || made > bytes) return;
      if (buffer.size() + piece.size() > kBuffer) flush();
      if (piece.size() >= kBuffer) {
        *crc = Crc32(*crc, piece.data(), piece.size());
        if (status.ok()) status = file->Append(piece);
      } else {
        buffer.append(piece.data(), piece.size());
      }
    });
  }
  flush();
  RETURN_IF_ERROR(status);
  if (made != bytes) {
    return absl::InternalError(absl::StrCat("safetensors file ", file->path(), ": tensor \"",
                                            t.name, "\" was given ", made, " bytes, its shape ",
                                            ShapeToString(t.shape), " needs ", bytes));
  }
  return absl::OkStatus();
}

}  // namespace

size_t NamedTensor::num_bytes() const { return NumElements(shape) * ElementBytes(dtype); }

absl::StatusOr<std::unique_ptr<AtomicFile>> StartSafetensors(
    const std::string& path, const std::vector<NamedTensor>& tensors,
    std::map<std::string, std::string> metadata) {
  std::vector<std::string> entries;
  std::set<absl::string_view> names;
  size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    if (!names.insert(t.name).second || t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file ", path, ": tensor name \"", t.name,
                       "\" given twice (or reserved)"));
    }
    const size_t bytes = t.num_bytes();
    entries.push_back(absl::StrCat(
        JsonQuote(t.name), ":{\"dtype\":\"", DtypeName(t.dtype), "\",\"shape\":[",
        absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",",
        offset + bytes, "]}"));
    offset += bytes;
  }
  // The checksum covers the header too: it is computed with its own ten
  // digits zeroed, then written into them once the data has been.
  metadata[kChecksumKey] = std::string(kChecksumDigits, '0');
  {
    std::vector<std::string> items;
    for (const auto& [k, v] : metadata) {
      items.push_back(absl::StrCat(JsonQuote(k), ":", JsonQuote(v)));
    }
    entries.push_back(
        absl::StrCat("\"__metadata__\":{", absl::StrJoin(items, ","), "}"));
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const size_t digits = ChecksumDigitsAt(header);
  char length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(n >> (8 * i));

  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path));
  RETURN_IF_ERROR(file->Append({length, 8}));
  RETURN_IF_ERROR(file->Append(header));
  uLong crc = Crc32(crc32(0, nullptr, 0), header.data(), header.size());
  for (const NamedTensor& t : tensors) RETURN_IF_ERROR(WriteTensor(t, file.get(), &crc));
  RETURN_IF_ERROR(file->Overwrite(8 + digits, absl::StrFormat("%010u", crc)));
  return file;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<NamedTensor>& tensors,
                              std::map<std::string, std::string> metadata) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file,
                   StartSafetensors(path, tensors, std::move(metadata)));
  return file->Commit();
}

std::vector<NamedTensor> NamedTensorsOf(const SafetensorsFile& file) {
  std::vector<NamedTensor> tensors;
  for (const auto& [name, tensor] : file.tensors) tensors.emplace_back(name, &tensor);
  for (const auto& [name, integer] : file.integers) {
    tensors.emplace_back(name, integer.shape, integer.values.data());
    tensors.back().dtype = integer.dtype;
  }
  return tensors;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, FileSystem::Default()->ReadFile(path));
  return ParseSafetensors(bytes, path);
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, ": ", what));
  };
  if (bytes.size() < 8) return bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (n > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", n, " exceeds the file size ", bytes.size()));
  }
  google::protobuf::Struct header;
  const absl::string_view header_json = bytes.substr(8, n);
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(header_json.data(), header_json.size()), &header);
  if (!parsed.ok()) return bad(absl::StrCat("malformed JSON header: ", parsed.ToString()));
  const size_t data_start = 8 + n;
  const size_t data_size = bytes.size() - data_start;

  SafetensorsFile file;
  struct Entry {
    size_t begin;
    std::string name;
    SafetensorsDtype dtype;
    Shape shape;
    size_t end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : value.struct_value().fields()) {
        file.metadata[k] = v.string_value();
      }
      continue;
    }
    const auto& fields = value.struct_value().fields();
    auto field = [&](const char* key) -> const google::protobuf::Value* {
      auto it = fields.find(key);
      return it == fields.end() ? nullptr : &it->second;
    };
    const auto* dtype = field("dtype");
    const auto* shape = field("shape");
    const auto* offsets = field("data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      return bad(absl::StrCat("tensor \"", name, "\" lacks dtype, shape or data_offsets"));
    }
    Entry e;
    e.name = name;
    if (dtype->string_value() == "F32") {
      e.dtype = SafetensorsDtype::kF32;
    } else if (dtype->string_value() == "I64") {
      e.dtype = SafetensorsDtype::kI64;
    } else if (dtype->string_value() == "U64") {
      e.dtype = SafetensorsDtype::kU64;
    } else {
      return bad(absl::StrCat("tensor \"", name, "\" has dtype \"",
                              dtype->string_value(), "\"; psrt reads F32, I64 and U64"));
    }
    if (shape->kind_case() != google::protobuf::Value::kListValue) {
      return bad(absl::StrCat("tensor \"", name, "\": shape must be a list"));
    }
    for (const auto& d : shape->list_value().values()) {
      uint64_t dim = 0;
      if (!GetIndex(d, kMaxElements, &dim)) {
        return bad(absl::StrCat("tensor \"", name, "\" has a bad dimension"));
      }
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    absl::StatusOr<int64_t> elements = CheckedNumElements(e.shape);
    if (!elements.ok()) return bad(absl::StrCat("tensor \"", name, "\": ", elements.status().message()));
    const auto& range = offsets->list_value();
    uint64_t begin = 0, end = 0;
    if (offsets->kind_case() != google::protobuf::Value::kListValue ||
        range.values_size() != 2 || !GetIndex(range.values(0), data_size, &begin) ||
        !GetIndex(range.values(1), data_size, &end)) {
      return bad(absl::StrCat("tensor \"", name, "\": data_offsets must be [begin, end] within the ",
                              data_size, " data bytes"));
    }
    e.begin = begin;
    e.end = end;
    if (e.begin > e.end || e.end > data_size ||
        e.end - e.begin != static_cast<size_t>(*elements) * ElementBytes(e.dtype)) {
      return bad(absl::StrCat("tensor \"", name, "\": data_offsets [", e.begin, ", ",
                              e.end, ") do not fit shape ", ShapeToString(e.shape),
                              " within ", data_size, " data bytes"));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  size_t expect = 0;
  for (Entry& e : entries) {
    if (e.begin != expect) return bad(absl::StrCat("tensor \"", e.name, "\" overlaps or leaves a gap"));
    expect = e.end;
    const char* from = bytes.data() + data_start + e.begin;
    if (e.dtype == SafetensorsDtype::kF32) {
      Tensor t(e.shape);
      if (t.num_bytes() > 0) std::memcpy(t.data(), from, t.num_bytes());
      file.tensors.emplace_back(e.name, std::move(t));
    } else {
      IntegerTensor t{e.dtype, e.shape, std::vector<uint64_t>(NumElements(e.shape))};
      if (!t.values.empty()) std::memcpy(t.values.data(), from, t.values.size() * 8);
      file.integers.emplace_back(e.name, std::move(t));
    }
  }
  if (expect != data_size) return bad("trailing bytes after the last tensor");
  if (auto it = file.metadata.find(kChecksumKey); it != file.metadata.end()) {
    std::string header_text(header_json);
    const size_t digits = ChecksumDigitsAt(header_text);
    if (digits == std::string::npos) return bad("malformed checksum");
    header_text.replace(digits, kChecksumDigits, std::string(kChecksumDigits, '0'));
    uLong crc = Crc32(crc32(0, nullptr, 0), header_text.data(), header_text.size());
    crc = Crc32(crc, bytes.data() + data_start, data_size);
    if (it->second != absl::StrFormat("%010u", crc)) {
      return absl::DataLossError(absl::StrCat(
          "safetensors file ", path, ": checksum mismatch (stored ", it->second,
          ", computed ", crc, "): the file is corrupt"));
    }
    file.metadata.erase(it);
    file.checksum_verified = true;
  }
  return file;
}

}  // namespace psrt

#include "common/cluster_spec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace psrt {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// Sorted, so that the list in error messages reads well.
constexpr const char* kKnownJobs[] = {"chief", "evaluator", "ps", "worker"};
// Members of the TF_CONFIG shape; "environment" is accepted and ignored.
constexpr const char* kTfConfigKeys[] = {"cluster", "environment", "task"};
constexpr const char* kTaskKeys[] = {"index", "type"};

bool IsKnownJob(absl::string_view job) {
  for (const char* known : kKnownJobs) {
    if (job == known) return true;
  }
  return false;
}

std::string KnownJobs() { return absl::StrJoin(kKnownJobs, ", "); }

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  if (source.empty()) return absl::InvalidArgumentError(message);
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

// "a number (1.5)", "a list", ... for "expected X, got Y" messages.
std::string Describe(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return absl::StrCat("the number ", v.number_value());
    case Value::kStringValue:
      return absl::StrCat("the string \"", absl::CEscape(v.string_value()),
                          "\"");
    case Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    default:
      return "nothing";
  }
}

// The protobuf parser's message is "what\n<context>\n^"; keep it on one line.
std::string OneLineParserMessage(absl::string_view message) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(message, '\n', absl::SkipWhitespace());
  if (lines.empty()) return "unknown parse error";
  std::string out(absl::StripAsciiWhitespace(lines[0]));
  if (lines.size() >= 2 && absl::StripAsciiWhitespace(lines[1]) != "^") {
    absl::StrAppend(&out, " (near \"", absl::CEscape(lines[1]), "\")");
  }
  return out;
}

// Keys of a Struct in sorted order (protobuf maps iterate in no fixed order,
// and errors should not depend on it).
std::vector<std::string> SortedKeys(const Struct& s) {
  std::vector<std::string> keys;
  keys.reserve(s.fields_size());
  for (const auto& [key, value] : s.fields()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

template <size_t N>
absl::Status CheckKeys(const Struct& s, const char* const (&allowed)[N],
                       absl::string_view source, absl::string_view where) {
  for (const std::string& key : SortedKeys(s)) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) {
      return Invalid(source, absl::StrCat("unknown field \"", absl::CEscape(key),
                                          "\" in ", where, " (allowed: ",
                                          absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

bool IsHostChar(char c, bool bracketed) {
  if (absl::ascii_isalnum(c) || c == '.' || c == '-') return true;
  if (bracketed) return c == ':' || c == '%';  // IPv6, zone id.
  return c == '_';
}

// Reads a cluster: {"ps": [...], "worker": [...], ...}.
absl::Status ParseJobs(const Struct& cluster, absl::string_view source,
                       std::map<std::string, std::vector<std::string>>* jobs) {
  for (const std::string& job : SortedKeys(cluster)) {
    const Value& value = cluster.fields().at(job);
    const std::string job_field = absl::StrCat("job \"", absl::CEscape(job), "\"");
    if (!IsKnownJob(job)) {
      return Invalid(source, absl::StrCat("unknown ", job_field,
                                          " (known jobs: ", KnownJobs(), ")"));
    }
    if (value.kind_case() == Value::kStructValue) {
      return Invalid(
          source,
          absl::StrCat(job_field,
                       " is an object (TensorFlow's {\"0\": \"host:port\"} "
                       "form); psrt needs a list of \"host:port\" strings"));
    }
    if (value.kind_case() != Value::kListValue) {
      return Invalid(source, absl::StrCat(job_field,
                                          " must be a list of \"host:port\" "
                                          "strings, got ",
                                          Describe(value)));
    }
    const ListValue& list = value.list_value();
    if (list.values_size() == 0) {
      return Invalid(source, absl::StrCat(job_field, " is empty"));
    }
    std::vector<std::string>& addresses = (*jobs)[job];
    for (int i = 0; i < list.values_size(); ++i) {
      const Value& item = list.values(i);
      const std::string task_field = absl::StrCat(job_field, " task ", i);
      if (item.kind_case() != Value::kStringValue) {
        return Invalid(source, absl::StrCat(task_field,
                                            ": expected a \"host:port\" "
                                            "string, got ",
                                            Describe(item)));
      }
      std::string host;
      int port = 0;
      absl::Status s = SplitHostPort(item.string_value(), &host, &port);
      if (!s.ok()) {
        return Invalid(source, absl::StrCat(task_field, ": ", s.message()));
      }
      addresses.push_back(item.string_value());
    }
  }

  if (jobs->count("worker") == 0 && jobs->count("chief") == 0) {
    return Invalid(source, "missing job \"worker\" (or \"chief\"): no "
                           "training replicas");
  }
  auto chief = jobs->find("chief");
  if (chief != jobs->end() && chief->second.size() > 1) {
    return Invalid(source, absl::StrCat("job \"chief\" has ",
                                        chief->second.size(),
                                        " tasks; at most one is allowed"));
  }

  std::map<std::string, TaskId> seen;
  for (const auto& [job, addresses] : *jobs) {
    for (int i = 0; i < static_cast<int>(addresses.size()); ++i) {
      TaskId id{job, i};
      auto [it, inserted] = seen.emplace(addresses[i], id);
      if (!inserted) {
        return Invalid(source, absl::StrCat("duplicate address \"",
                                            absl::CEscape(addresses[i]),
                                            "\" used by both ",
                                            it->second.ToString(), " and ",
                                            id.ToString()));
      }
    }
  }
  return absl::OkStatus();
}

// Reads a TF_CONFIG "task": {"type": "worker", "index": 0}. Range checks are
// left to ValidateTask.
absl::Status ParseTask(const Value& value, absl::string_view source,
                       TaskId* task) {
  if (value.kind_case() != Value::kStructValue) {
    return Invalid(source, absl::StrCat("\"task\" must be an object, got ",
                                        Describe(value)));
  }
  const Struct& s = value.struct_value();
  RETURN_IF_ERROR(CheckKeys(s, kTaskKeys, source, "\"task\""));

  auto type = s.fields().find("type");
  if (type == s.fields().end()) {
    return Invalid(source, "task: missing \"type\" (the job name)");
  }
  if (type->second.kind_case() != Value::kStringValue) {
    return Invalid(source, absl::StrCat("task \"type\" must be a string, got ",
                                        Describe(type->second)));
  }
  const std::string& job = type->second.string_value();
  if (!IsKnownJob(job)) {
    return Invalid(source, absl::StrCat("task \"type\": unknown job \"",
                                        absl::CEscape(job), "\" (known jobs: ",
                                        KnownJobs(), ")"));
  }

  auto index = s.fields().find("index");
  if (index == s.fields().end()) {
    return Invalid(source, "task: missing \"index\"");
  }
  const Value& iv = index->second;
  const double d = iv.number_value();
  if (iv.kind_case() != Value::kNumberValue || !(d >= 0) || d != std::floor(d) ||
      d > 2147483647.0) {
    return Invalid(source,
                   absl::StrCat("task \"index\" must be a non-negative "
                                "integer, got ",
                                Describe(iv)));
  }
  task->job = job;
  task->index = static_cast<int>(d);
  return absl::OkStatus();
}

}  // namespace

std::string TaskId::ToString() const { return absl::StrCat(job, "/", index); }

namespace {

// The line of the first comma that closes a list or an object ("[a, b,]"),
// which JSON forbids and protobuf's parser lets through; 0 when there is
// none. Strings are skipped.
int TrailingCommaLine(absl::string_view json) {
  int line = 1, comma_line = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '\n') ++line;
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      comma_line = 0;
    } else if (c == ',') {
      comma_line = line;
    } else if ((c == ']' || c == '}') && comma_line > 0) {
      return comma_line;
    } else if (!absl::ascii_isspace(static_cast<unsigned char>(c))) {
      comma_line = 0;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<ClusterSpec> ClusterSpec::Parse(absl::string_view json,
                                               absl::string_view source) {
  if (const int line = TrailingCommaLine(json); line > 0) {
    return Invalid(source, absl::StrCat("invalid JSON: a comma ends a list or an object on line ",
                                        line, " (JSON allows none there)"));
  }
  Value root;
  // Parsed as a Value rather than a Struct so that a top level which is not
  // an object gets its own message.
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    return Invalid(source,
                   absl::StrCat("invalid JSON: ",
                                OneLineParserMessage(std::string(
                                    parsed.message().data(),
                                    parsed.message().size()))));
  }
  if (root.kind_case() != Value::kStructValue) {
    return Invalid(source, absl::StrCat("top level must be a JSON object, got ",
                                        Describe(root)));
  }

  ClusterSpec spec;
  spec.source_ = std::string(source);
  const Struct& top = root.struct_value();
  const bool tf_config_shape =
      top.fields().count("cluster") > 0 || top.fields().count("task") > 0;
  if (!tf_config_shape) {
    RETURN_IF_ERROR(ParseJobs(top, source, &spec.jobs_));
    return spec;
  }

  RETURN_IF_ERROR(CheckKeys(top, kTfConfigKeys, source, "the top level"));
  auto cluster = top.fields().find("cluster");
  if (cluster == top.fields().end()) {
    return Invalid(source, "has \"task\" but no \"cluster\"");
  }
  if (cluster->second.kind_case() != Value::kStructValue) {
    return Invalid(source, absl::StrCat("\"cluster\" must be an object, got ",
                                        Describe(cluster->second)));
  }
  RETURN_IF_ERROR(
      ParseJobs(cluster->second.struct_value(), source, &spec.jobs_));

  auto task = top.fields().find("task");
  if (task != top.fields().end()) {
    TaskId id;
    RETURN_IF_ERROR(ParseTask(task->second, source, &id));
    RETURN_IF_ERROR(spec.ValidateTask(id));
    spec.task_ = std::move(id);
  }
  return spec;
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromFile(const std::string& path) {
  absl::StatusOr<std::string> text = FileSystem::Default()->ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cluster spec file ", text.status().message()));
  }
  return Parse(*text, absl::StrCat("cluster spec file ", path));
}

int ClusterSpec::num_tasks(absl::string_view job) const {
  auto it = jobs_.find(std::string(job));
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

const std::string& ClusterSpec::address(absl::string_view job,
                                        int index) const {
  CHECK_GE(index, 0) << job;
  CHECK_LT(index, num_tasks(job)) << job;
  return jobs_.find(std::string(job))->second[index];
}

absl::Status ClusterSpec::ValidateTask(const TaskId& task) const {
  const std::string where = absl::StrCat("task ", task.ToString());
  if (!IsKnownJob(task.job)) {
    return Invalid(source_, absl::StrCat(where, ": unknown job \"",
                                         absl::CEscape(task.job),
                                         "\" (known jobs: ", KnownJobs(),
                                         ")"));
  }
  const int n = num_tasks(task.job);
  if (n == 0) {
    return Invalid(source_, absl::StrCat(where, ": the cluster has no job \"",
                                         task.job, "\""));
  }
  if (task.index < 0 || task.index >= n) {
    return Invalid(source_,
                   absl::StrCat(where, ": index ", task.index,
                                " out of range for job \"", task.job,
                                "\" (valid range 0..", n - 1, ")"));
  }
  return absl::OkStatus();
}

int ClusterSpec::num_replicas() const {
  return num_tasks("chief") + num_tasks("worker");
}

int ClusterSpec::ReplicaIndex(const TaskId& task) const {
  const int chiefs = num_tasks("chief");
  if (task.job == "chief") {
    CHECK_EQ(task.index, 0);
    CHECK_EQ(chiefs, 1);
    return 0;
  }
  CHECK_EQ(task.job, "worker") << "not a training replica: " << task.ToString();
  CHECK_GE(task.index, 0);
  CHECK_LT(task.index, num_tasks("worker"));
  return chiefs + task.index;
}

const std::string& ClusterSpec::ReplicaAddress(int replica) const {
  CHECK_GE(replica, 0);
  CHECK_LT(replica, num_replicas());
  if (num_tasks("chief") > 0) {
    return replica == 0 ? address("chief", 0) : address("worker", replica - 1);
  }
  return address("worker", replica);
}

absl::StatusOr<ClusterConfig> ResolveClusterConfig(
    const std::string& cluster_spec_path, const std::string& tf_config,
    const std::string& job_name, int task_index) {
  ClusterConfig config;
  std::string source;
  if (!cluster_spec_path.empty()) {
    source = absl::StrCat("cluster spec file ", cluster_spec_path);
    ASSIGN_OR_RETURN(config.spec, ClusterSpec::FromFile(cluster_spec_path));
  } else if (!tf_config.empty()) {
    source = "TF_CONFIG";
    ASSIGN_OR_RETURN(config.spec, ClusterSpec::Parse(tf_config, source));
  } else {
    return absl::InvalidArgumentError(
        "no cluster: pass --cluster_spec=FILE or set TF_CONFIG");
  }
  if (!job_name.empty()) {
    config.task = TaskId{job_name, task_index};
  } else if (config.spec.task().has_value()) {
    config.task = *config.spec.task();
  } else {
    return Invalid(source,
                   "no task: pass --job_name and --task_index, or give "
                   "\"task\": {\"type\": ..., \"index\": ...}");
  }
  RETURN_IF_ERROR(config.spec.ValidateTask(config.task));
  return config;
}

absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           int* port) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad address \"", absl::CEscape(address), "\": ", why));
  };
  if (address.empty()) return bad("empty address");

  absl::string_view h;
  absl::string_view rest;  // ":port" or "".
  const bool bracketed = address[0] == '[';
  if (bracketed) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return bad("missing \"]\"");
    h = address.substr(1, close - 1);
    rest = address.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') {
      return bad("expected \":port\" after \"]\"");
    }
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return bad("missing port (expected \"host:port\")");
    }
    h = address.substr(0, colon);
    rest = address.substr(colon);
    if (absl::StrContains(h, ':')) {
      return bad("IPv6 addresses must be bracketed, e.g. \"[::1]:2222\"");
    }
  }
  if (h.empty()) return bad("empty host");
  for (char c : h) {
    if (!IsHostChar(c, bracketed)) {
      return bad(absl::StrCat("invalid character '", absl::CEscape({&c, 1}),
                              "' in host"));
    }
  }
  if (rest.empty() || rest == ":") {
    return bad("missing port (expected \"host:port\")");
  }
  const absl::string_view digits = rest.substr(1);
  int64_t value = 0;
  for (char c : digits) {
    if (!absl::ascii_isdigit(c)) {
      return bad(absl::StrCat("port \"", absl::CEscape(digits),
                              "\" is not a number"));
    }
    if (value <= 65535) value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 65535) return bad("port must be in 1..65535");
  *host = std::string(h);
  *port = static_cast<int>(value);
  return absl::OkStatus();
}

}  // namespace psrt

#include "common/rank_cluster.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// ["a", "b"].
std::string JsonList(const std::vector<std::string>& items) {
  return absl::StrCat("[",
                      absl::StrJoin(items, ", ",
                                    [](std::string* out, const std::string& item) {
                                      out->append(JsonString(item));
                                    }),
                      "]");
}

}  // namespace

absl::StatusOr<ClusterConfig> ClusterOfRanks(const std::vector<std::string>& addresses,
                                             int num_ps, int rank, absl::string_view source) {
  const int size = static_cast<int>(addresses.size());
  if (num_ps < 0 || num_ps >= size) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", num_ps, " ps tasks leave no ",
                                                   "worker among ", size, " tasks"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": rank ", rank, " is not in 0..", size - 1));
  }
  const std::vector<std::string> ps(addresses.begin(), addresses.begin() + num_ps);
  const std::vector<std::string> workers(addresses.begin() + num_ps, addresses.end());
  const std::string json =
      ps.empty() ? absl::StrCat("{\"worker\": ", JsonList(workers), "}")
                 : absl::StrCat("{\"ps\": ", JsonList(ps), ", \"worker\": ", JsonList(workers), "}");
  ClusterConfig config;
  ASSIGN_OR_RETURN(config.spec, ClusterSpec::Parse(json, source));
  config.task = rank < num_ps ? TaskId{"ps", rank} : TaskId{"worker", rank - num_ps};
  RETURN_IF_ERROR(config.spec.ValidateTask(config.task));
  return config;
}

std::string ToTfConfig(const ClusterConfig& config) {
  std::vector<std::string> jobs;
  for (const auto& [job, addresses] : config.spec.jobs()) {
    jobs.push_back(absl::StrCat(JsonString(job), ": ", JsonList(addresses)));
  }
  return absl::StrCat("{\"cluster\": {", absl::StrJoin(jobs, ", "), "}, \"task\": {\"type\": ",
                      JsonString(config.task.job), ", \"index\": ", config.task.index, "}}");
}

}  // namespace psrt

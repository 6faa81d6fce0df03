#include "common/slurm_cluster.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rank_cluster.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

// More hosts or nodes than any cluster has: a typo such as "n[1-99999999]"
// is refused rather than expanded.
constexpr int64_t kMaxNodes = 1 << 16;

bool IsHostChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

absl::Status HostlistError(absl::string_view hostlist, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("Slurm hostlist \"", hostlist, "\": ", why));
}

// The numbers of one bracket's text ("01-04,07"), zero-padded to the width
// of each range's first number.
absl::StatusOr<std::vector<std::string>> ExpandRanges(absl::string_view hostlist,
                                                      absl::string_view ranges) {
  std::vector<std::string> numbers;
  for (absl::string_view range : absl::StrSplit(ranges, ',')) {
    const size_t dash = range.find('-');
    const absl::string_view first = range.substr(0, dash);
    const absl::string_view last = dash == absl::string_view::npos ? first : range.substr(dash + 1);
    uint64_t lo = 0, hi = 0;
    auto digits = [](absl::string_view s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(first) || !digits(last) || !absl::SimpleAtoi(first, &lo) ||
        !absl::SimpleAtoi(last, &hi)) {
      return HostlistError(hostlist, absl::StrCat("bad range \"", range,
                                                  "\" (want N or N-M, decimal)"));
    }
    if (hi < lo) {
      return HostlistError(hostlist, absl::StrCat("range \"", range, "\" runs backwards"));
    }
    if (hi - lo + numbers.size() >= kMaxNodes) {
      return HostlistError(hostlist, absl::StrCat("more than ", kMaxNodes, " hosts"));
    }
    for (uint64_t n = lo; n <= hi; ++n) {
      std::string number = absl::StrCat(n);
      if (number.size() < first.size()) number.insert(0, first.size() - number.size(), '0');
      numbers.push_back(std::move(number));
    }
  }
  return numbers;
}

// The hosts of one name of the list ("r[1-2]-n[01-02]").
absl::Status ExpandName(absl::string_view hostlist, absl::string_view name,
                        std::vector<std::string>* hosts) {
  std::vector<std::string> expanded = {""};
  size_t i = 0;
  while (i < name.size()) {
    if (name[i] == '[') {
      const size_t close = name.find(']', i);
      if (close == absl::string_view::npos) return HostlistError(hostlist, "unclosed '['");
      ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                       ExpandRanges(hostlist, name.substr(i + 1, close - i - 1)));
      if (static_cast<int64_t>(expanded.size()) * static_cast<int64_t>(numbers.size()) +
              static_cast<int64_t>(hosts->size()) > kMaxNodes) {
        return HostlistError(hostlist, absl::StrCat("more than ", kMaxNodes, " hosts"));
      }
      std::vector<std::string> next;
      for (const std::string& prefix : expanded) {
        for (const std::string& number : numbers) next.push_back(prefix + number);
      }
      expanded = std::move(next);
      i = close + 1;
      continue;
    }
    if (!IsHostChar(name[i])) {
      return HostlistError(hostlist, absl::StrCat("unexpected character '",
                                                  absl::string_view(&name[i], 1), "'"));
    }
    for (std::string& host : expanded) host.push_back(name[i]);
    ++i;
  }
  if (expanded.front().empty()) return HostlistError(hostlist, "empty host name");
  hosts->insert(hosts->end(), expanded.begin(), expanded.end());
  return absl::OkStatus();
}

absl::StatusOr<int> IntVariable(const std::function<const char*(const char*)>& getenv,
                                const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is not set: is this task started by srun (inside sbatch or salloc)?"));
  }
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", value, "\" is not a whole number"));
  }
  return n;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(absl::string_view hostlist) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    const char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') {
      if (++depth > 1) return HostlistError(hostlist, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) return HostlistError(hostlist, "']' without '['");
    } else if (c == ',' && depth == 0) {
      const absl::string_view name = hostlist.substr(start, i - start);
      if (name.empty()) return HostlistError(hostlist, "empty host name");
      RETURN_IF_ERROR(ExpandName(hostlist, name, &hosts));
      start = i + 1;
    }
  }
  if (depth != 0) return HostlistError(hostlist, "unclosed '['");
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view counts) {
  auto error = [counts](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("Slurm tasks per node \"", counts, "\": ", why,
                     " (want counts such as \"2(x3),1\")"));
  };
  std::vector<int> per_node;
  for (absl::string_view item : absl::StrSplit(counts, ',')) {
    int tasks = 0, repeat = 1;
    const size_t paren = item.find('(');
    if (paren != absl::string_view::npos) {
      absl::string_view times = item.substr(paren);
      if (!absl::ConsumePrefix(&times, "(x") || !absl::ConsumeSuffix(&times, ")") ||
          !absl::SimpleAtoi(times, &repeat) || repeat < 1) {
        return error(absl::StrCat("bad repeat \"", item.substr(paren), "\""));
      }
      item = item.substr(0, paren);
    }
    if (!absl::SimpleAtoi(item, &tasks) || tasks < 1) {
      return error(absl::StrCat("bad count \"", item, "\""));
    }
    if (static_cast<int64_t>(per_node.size()) + repeat > kMaxNodes) {
      return error(absl::StrCat("more than ", kMaxNodes, " nodes"));
    }
    per_node.insert(per_node.end(), repeat, tasks);
  }
  return per_node;
}

absl::StatusOr<ClusterConfig> ClusterFromSlurm(
    const std::function<const char*(const char*)>& getenv, const SlurmClusterOptions& options) {
  // The step's variables only: a batch script has the job's (SLURM_JOB_NODELIST,
  // SLURM_TASKS_PER_NODE, SLURM_PROCID=0), which describe no step.
  const char* nodelist = getenv("SLURM_STEP_NODELIST");
  const char* tasks_per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
  if (nodelist == nullptr || tasks_per_node == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        nodelist == nullptr ? "SLURM_STEP_NODELIST" : "SLURM_STEP_TASKS_PER_NODE",
        " is not set: is this task started by srun (inside sbatch or salloc)?"));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> nodes, ExpandSlurmHostlist(nodelist));
  ASSIGN_OR_RETURN(const std::vector<int> per_node, ExpandSlurmTasksPerNode(tasks_per_node));
  if (nodes.size() != per_node.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_STEP_NODELIST=\"", nodelist, "\" names ", nodes.size(),
        " nodes but SLURM_STEP_TASKS_PER_NODE=\"", tasks_per_node, "\" counts ",
        per_node.size()));
  }
  const int total = std::accumulate(per_node.begin(), per_node.end(), 0);
  ASSIGN_OR_RETURN(const int rank, IntVariable(getenv, "SLURM_PROCID"));
  int num_tasks = total;
  if (getenv("SLURM_STEP_NUM_TASKS") != nullptr) {
    ASSIGN_OR_RETURN(num_tasks, IntVariable(getenv, "SLURM_STEP_NUM_TASKS"));
  }
  if (num_tasks != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_STEP_NUM_TASKS=", num_tasks, " but SLURM_STEP_TASKS_PER_NODE=\"",
        tasks_per_node, "\" adds up to ", total));
  }
  if (rank >= num_tasks) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_PROCID=", rank, " is out of range: the step has ", num_tasks,
                     " tasks"));
  }
  // srun's distribution across nodes (the part before ':'): block unless
  // SLURM_DISTRIBUTION says cyclic (sbatch's default, which the sruns in its
  // script inherit).
  bool cyclic = false;
  if (const char* distribution = getenv("SLURM_DISTRIBUTION"); distribution != nullptr) {
    const absl::string_view across_nodes =
        absl::string_view(distribution).substr(0, absl::string_view(distribution).find(':'));
    cyclic = across_nodes == "cyclic";
    if (!cyclic && across_nodes != "block") {
      return absl::InvalidArgumentError(absl::StrCat(
          "SLURM_DISTRIBUTION=", distribution, ": psrt knows the block and cyclic layouts "
          "only (pass srun --distribution=block)"));
    }
  }
  if (options.num_ps < 0 || options.num_ps >= num_tasks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ps=", options.num_ps, " leaves no worker among the step's ", num_tasks,
        " tasks (srun --ntasks)"));
  }
  // Each rank's node and rank on that node: node by node (block), or one
  // task per node in turn while a node has room (cyclic).
  std::vector<int> node_of(num_tasks), local_of(num_tasks);
  std::vector<int> placed(nodes.size(), 0);
  for (int r = 0, node = 0; r < num_tasks; node = (node + 1) % static_cast<int>(nodes.size())) {
    if (!cyclic) {
      while (placed[node] == per_node[node]) ++node;
      for (; placed[node] < per_node[node]; ++r) {
        node_of[r] = node;
        local_of[r] = placed[node]++;
      }
    } else if (placed[node] < per_node[node]) {
      node_of[r] = node;
      local_of[r++] = placed[node]++;
    }
  }
  std::vector<std::string> addresses;
  for (int r = 0; r < num_tasks; ++r) {
    const int port = options.base_port + local_of[r];
    if (port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--base_port=", options.base_port, " + local rank ", local_of[r],
          " is not a port (1..65535)"));
    }
    addresses.push_back(absl::StrCat(nodes[node_of[r]], ":", port));
  }
  const int local_rank = local_of[rank];
  if (const char* local_id = getenv("SLURM_LOCALID"); local_id != nullptr) {
    ASSIGN_OR_RETURN(const int slurm_local, IntVariable(getenv, "SLURM_LOCALID"));
    if (slurm_local != local_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SLURM_LOCALID=", slurm_local, ", but rank ", rank, " is task ", local_rank,
          " of its node in the ", cyclic ? "cyclic" : "block",
          " layout (SLURM_DISTRIBUTION): run srun with --distribution=block"));
    }
  }
  return ClusterOfRanks(addresses, options.num_ps, rank, "the cluster from Slurm's variables");
}

}  // namespace psrt

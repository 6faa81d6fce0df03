#include "worker/ring/ring_peer_rules.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"

namespace psrt {
namespace {

// Received segments are added in blocks of this many floats (64 KiB),
// read into a cache-resident scratch.
constexpr size_t kBlockFloats = 16 * 1024;

// The deadlines of a ping that asks whether a silent neighbour is busy, and
// whether the previous worker takes this worker's token (each at most the
// op's timeout).
constexpr absl::Duration kBusyPingDeadline = absl::Seconds(30);
constexpr absl::Duration kRefusalPingDeadline = absl::Seconds(5);

// The rank `offset` places along the ring from `options.rank`.
int RankAt(const RingOptions& options, int offset) {
  const int size = static_cast<int>(options.addresses.size());
  CHECK(options.rank >= 0 && options.rank < size) << options.rank << " of " << size;
  return (options.rank + offset + size) % size;
}

}  // namespace

RingPeerRules::RingPeerRules(const RingOptions& options, RingControl* control)
    : options_(options),
      control_(control),
      next_rank_(RankAt(options, +1)),
      previous_rank_(RankAt(options, -1)),
      incarnation_(NewIncarnation()) {
  CHECK(control != nullptr);
}

std::string RingPeerRules::PeerName(int rank) const {
  return absl::StrCat("worker/", rank, " (", options_.addresses[rank], ")");
}

absl::Duration RingPeerRules::Timeout(int64_t op) const {
  return op <= 1 ? std::max(options_.timeout, options_.startup_timeout) : options_.timeout;
}

proto::CollectiveHeader RingPeerRules::Header(int64_t op, int step) const {
  proto::CollectiveHeader header;
  header.set_op(op);
  header.set_step(step);
  header.set_sender(options_.rank);
  header.set_incarnation(incarnation_);
  header.set_generation(options_.generation);
  return header;
}

absl::Status RingPeerRules::SendError(const absl::Status& status) const {
  return absl::Status(
      status.code(),
      absl::StrCat("allreduce: sending to ", PeerName(next_rank_), " failed: ", status.message(),
                   absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)
                       ? " (it is down, hung or unreachable)"
                       : ""));
}

absl::Status RingPeerRules::CheckSender(const proto::CollectiveHeader& header) const {
  if (header.generation() < options_.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "allreduce: worker/", options_.rank, " is in the ring of the elastic job's list ",
        ListNumber(options_.generation), "; a message of list ", ListNumber(header.generation()),
        "'s ring comes from a ring that is gone"));
  }
  if (header.generation() > options_.generation) {
    return absl::UnavailableError(absl::StrCat(
        "allreduce: worker/", options_.rank, " has not joined the ring of list ",
        ListNumber(header.generation()), " yet (it is in list ",
        ListNumber(options_.generation), "'s)"));
  }
  const int sender = header.sender();
  if (sender == previous_rank_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "allreduce: worker/", options_.rank, " takes messages from worker/", previous_rank_,
      " only, not from worker/", sender, " (do all workers have the same cluster spec?)"));
}

RingPeerRules::Verdict RingPeerRules::Judge(const proto::CollectiveHeader& header) {
  if (previous_incarnation_ == 0) {
    if (header.op() != 1) {
      return {false,
              absl::FailedPreconditionError(
                  absl::StrCat("allreduce: ", PeerName(options_.rank),
                               " restarted and takes no message of an earlier run (op ",
                               header.op(), "): every worker must restart")),
              absl::OkStatus()};
    }
    previous_incarnation_ = header.incarnation();
  }
  if (header.incarnation() != previous_incarnation_) {
    absl::Status restarted = absl::AbortedError(absl::StrCat(
        "allreduce: ", PeerName(previous_rank_),
        " restarted (its process changed during the job); every worker must restart and resume "
        "from the last checkpoint"));
    return {false, absl::UnavailableError(restarted.message()), std::move(restarted)};
  }
  const bool taken = std::make_pair(header.op(), header.step()) <= last_taken_;
  return {!taken, absl::OkStatus(), absl::OkStatus()};
}

std::string RingPeerRules::LastTakenText() const {
  return absl::StrCat(last_taken_.first, " ", last_taken_.second, " ", previous_incarnation_);
}

bool RingPeerRules::TakenAlready(absl::string_view text, int64_t op, int step) const {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ' ');
  int64_t taken_op = 0, incarnation = 0;
  int taken_step = 0;
  return parts.size() == 3 && absl::SimpleAtoi(parts[0], &taken_op) &&
         absl::SimpleAtoi(parts[1], &taken_step) && absl::SimpleAtoi(parts[2], &incarnation) &&
         incarnation == incarnation_ &&
         std::make_pair(op, step) <= std::make_pair(taken_op, taken_step);
}

absl::Status RingPeerRules::CheckSize(int64_t op, int step, uint64_t sent,
                                      uint64_t expected) const {
  if (sent == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "allreduce: ", PeerName(previous_rank_), " sent ", sent, " bytes for step ", step, " of op ",
      op, ", this worker expected ", expected, " (do all workers train the same model?)"));
}

absl::Status RingPeerRules::TakeSegment(absl::Span<char> bytes, bool add, uint64_t* taken,
                                        ReadFn read) {
  if (!add) {
    RETURN_IF_ERROR(read(*taken, bytes.subspan(*taken)));
    *taken = bytes.size();
    return absl::OkStatus();
  }
  thread_local std::vector<float> block(kBlockFloats);
  while (*taken < bytes.size()) {
    const size_t n = std::min<size_t>(kBlockFloats * sizeof(float), bytes.size() - *taken);
    RETURN_IF_ERROR(read(*taken, {reinterpret_cast<char*>(block.data()), n}));
    kernels::Accumulate({block.data(), n / sizeof(float)},
                        {reinterpret_cast<float*>(bytes.data() + *taken), n / sizeof(float)});
    *taken += n;
  }
  return absl::OkStatus();
}

absl::Status RingPeerRules::CheckSilent(Neighbour neighbour, int64_t op, int step,
                                        absl::Duration silent) const {
  const bool previous = neighbour == Neighbour::kPrevious;
  const int rank = previous ? previous_rank_ : next_rank_;
  const absl::Duration deadline = std::min(options_.timeout, kBusyPingDeadline);
  const absl::Status alive =
      previous ? control_->PingPrevious(deadline) : control_->NextDataAddresses(deadline).status();
  const absl::Duration seconds = absl::Trunc(silent, absl::Seconds(1));
  if (alive.ok() && silent < options_.busy_timeout) {
    LOG(INFO) << "allreduce: " << PeerName(rank) << " is alive but has "
              << (previous ? "sent nothing" : "not taken a segment") << " for " << seconds
              << "; waiting (it may be evaluating or saving)";
    return absl::OkStatus();
  }
  const std::string what =
      previous ? absl::StrCat("nothing from ", PeerName(rank), " for ",
                              absl::FormatDuration(seconds), " (op ", op, ", step ", step, ")")
               : absl::StrCat(PeerName(rank), " has not taken step ", step, " of op ", op, " in ",
                              absl::FormatDuration(seconds));
  // FailedPrecondition: it answers that it left the ring (Collective).
  const std::string why =
      alive.ok() ? absl::StrCat("it answers but ", previous ? "sends" : "reads",
                                " nothing (--allreduce_busy_timeout_secs)")
      : absl::IsFailedPrecondition(alive)
          ? std::string(alive.message())
          : absl::StrCat("it died, hung or cannot ", previous ? "reach this worker" : "be reached",
                         " (", alive.message(), ")");
  return absl::DeadlineExceededError(absl::StrCat("allreduce: ", what, ": ", why));
}

bool RingPeerRules::TakeRefusal() {
  const bool pending = refusal_pending();
  refusals_checked_ = refusals_;
  return pending;
}

absl::Status RingPeerRules::CheckRefusal(absl::string_view what) const {
  const absl::Status alive =
      control_->PingPrevious(std::min(options_.timeout, kRefusalPingDeadline));
  if (alive.ok()) {
    LOG_FIRST_N(WARNING, 1) << "allreduce: this worker refused a " << what
                            << " without its auth token, not from " << PeerName(previous_rank_)
                            << ", which takes it; going on";
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      absl::StrCat("allreduce: unauthenticated: this worker refused a ", what,
                   " without its auth token, and ", PeerName(previous_rank_),
                   " does not answer this worker (", alive.message(), "): ", kTokenHint));
}

}  // namespace psrt

// ParameterShard: the state of one parameter-server task, free of any
// transport: its slice of the model's variables, the optimizer, the version
// counter and synchronous aggregation. The ps's RequestHandler
// (request_handler.h) serves its pushes and pulls to both transports.
//
// Protocol. The chief calls Init once with the variable list, the initial
// values and the TrainingConfig (a later Init with the same variables is a
// no-op; with different ones, an error). Then:
//  - Sync mode (SyncReplicas): the shard is at version t. A push tagged t
//    from a replica that has not pushed at t is summed in; when R such pushes
//    have arrived, their mean is applied once by the optimizer and the
//    version becomes t+1. A push tagged < t is stale: dropped and counted. A
//    second push from the same replica at t is a retry: acknowledged, not
//    applied again. A push tagged > t is Aborted (the shard was rolled back
//    under the sender, which must pull again).
//  - Async mode: every push is applied on arrival; the version counts the
//    pushes applied.
//  - Either mode: a push carrying the (worker_incarnation, step) of one
//    already taken from that replica is a retry: acknowledged, not applied.
//    A push holding NaN or Inf, or one whose update would make a value or an
//    optimizer slot NaN or Inf (a huge finite gradient), is refused
//    (InvalidArgument) or, with Options::skip_nonfinite_gradients (async
//    only), dropped and counted; either way nothing is applied. In sync mode
//    a mean that overflows, or whose update would, is not applied either:
//    the version is skipped and the push that completed it fails.
//    Initial values holding NaN or Inf are refused.
//  - Pull(min_version, min_clock) is answered with the values as soon as the
//    version is >= min_version and every unfinished replica has pushed at
//    least min_clock gradients (bounded staleness), or training is over; or
//    it fails with DeadlineExceeded at its deadline.
//  - Restore(step) replaces the state with a checkpoint, draws a new
//    incarnation and makes the shard not ready: waiting pulls fail with
//    Aborted, and pushes and pulls fail with Aborted until the chief
//    confirms the state with Init. Restore and Init name the chief's
//    recovery round (epoch); one from an older round than the shard has
//    taken is refused (FailedPrecondition), so a Restore delayed past a later
//    round's Restore and confirmation changes nothing. A shard that restored its checkpoint at
//    start is likewise not ready. Pushes and pulls that name another
//    incarnation than the shard's fail with Aborted at any time.
//  - Embedding tables (InitHeader.tables; ps/shard_tables.h): a push's
//    gradient rows are taken or dropped with its dense gradients, and
//    applied with them (summed per id in sync mode); a pull's rows are read
//    when it is answered. Save writes every row and slot with the dense
//    state of the same version; Restore recreates the tables from them, and
//    the chief's Init confirms them when it names the same tables.
//  - Replicas (Options::peer; psrt_ps --ps_replicas=1): the shard has two
//    copies on two ps tasks. The primary serves the workers; the backup
//    takes each update the primary makes (the sync version's mean, or an
//    async push's gradient, with the dedup state: proto ReplicateHeader)
//    before the primary answers for it: a sync version becomes visible to
//    pulls, and an async push is acknowledged, only once the backup holds
//    it. A backup that is not in step (it restarted, fell behind, or the
//    chief restored or initialized the primary) is sent the primary's whole
//    state first (FILL). A primary whose backup cannot be reached goes on
//    alone (logged), trying to fill it again every second. A request that
//    only a primary serves (Init, Push, Pull, Save, Restore) reaching the
//    backup means a worker could not reach the primary: the backup asks the
//    primary (PROBE), and if it does not answer takes over at the same
//    version, incarnation and dedup state, under a new view; else the
//    request is Unavailable, and the worker goes back. A primary whose
//    message the other copy refuses for its older view was replaced: it
//    becomes a backup to be filled, and fails its waiting pulls and the
//    request that found out with Unavailable. A copy that starts empty asks
//    the other to take it on as backup (JoinReplicas) before it restores
//    any checkpoint. Embedding tables are not replicated (Init refuses
//    them).
//  - Elastic workers (TrainingConfig.max_workers > 0, sync mode): a version
//    waits for the gradient of every worker that is a member at it
//    (SetMembers: the chief's list; the chief alone after Init or Restore),
//    instead of for R; a push from a worker that is not is dropped and
//    counted stale. A list that no longer names a worker completes the
//    current version when every remaining member has pushed to it.
//  - Shutdown(replica): a replica has finished. From the chief (replica 0) or
//    an operator (-1) it ends training: waiting pulls return at once with
//    training_done, pushes are no longer applied. An operator ends a sync
//    job in two steps (PrepareEnd, EndAt), so that shards a version apart
//    end at one version.
//
// Memory. Gradients are consumed from the request in small blocks, straight
// into the sum (sync) or the optimizer (async): no message-sized copy. A pull
// shares the current values buffer itself (no copy); an update that finds
// the buffer still shared with a pull in flight first moves to a fresh buffer
// (copy on write). A 16-bit push is decoded block by block as it is read; a
// 16-bit pull's encoding is made once per version and kind, and shared by
// the pulls that ask for it. Buffers are recycled, so steady state touches
// no new pages.
//
// Thread safety: every method is thread-safe. Pull callbacks never run under
// the shard's lock; they run on the thread of Pull, of the Push or Shutdown
// that satisfied them, or of the shard's deadline thread.
//
// Invariants: current_->values holds the variables back to back in
// variables_ order; in sync mode sum_ holds the sum of the gradients of the
// replicas in pushed_ at version_.
#ifndef PSRT_PS_PARAMETER_SHARD_H_
#define PSRT_PS_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/byte_source.h"
#include "common/tensor.h"
#include "kernels/cpu_context.h"
#include "proto/psrt.pb.h"
#include "ps/checkpoint.h"
#include "ps/optimizer.h"
#include "ps/replica_peer.h"
#include "ps/shard_tables.h"

namespace psrt {

class ParameterShard {
 public:
  struct Options {
    // Used for a pull whose request names no timeout.
    absl::Duration default_pull_timeout = absl::Seconds(60);
    // Threads that apply updates and copy buffers; 0: one per core.
    int threads = 0;
    // Where Save writes and Restore reads (ps/checkpoint.h); empty: no
    // checkpoints. shard/num_shards name this shard's files.
    std::string checkpoint_dir;
    int shard = 0;
    int num_shards = 1;
    // Pushes holding NaN or Inf: false refuses them with InvalidArgument,
    // true drops them (accepted = false) and counts them.
    bool skip_nonfinite_gradients = false;
    // Pulls that may wait at once; more are refused (ResourceExhausted), so
    // that a flood of pulls cannot grow memory or slow every push.
    int max_waiting_pulls = 1024;
    // The shard starts restoring: Init, Push, Pull and Save are Unavailable
    // until RestoreLatest (or, replicated, a JoinReplicas that joined) has
    // run (psrt_ps serves while it loads, so that a large checkpoint does not
    // outlast the probes and the workers' retries).
    bool restore_at_start = false;
    // The shard's other copy (see "Replicas" above); null: one copy.
    // starts_as_backup: this copy is the backup at start (the one on the
    // task after the shard's own), else the primary.
    std::shared_ptr<ReplicaPeer> peer;
    bool starts_as_backup = false;
  };

  // The values of every variable of the shard, back to back. A snapshot
  // handed to a pull never changes.
  struct Snapshot {
    Tensor values;
  };
  struct PullReply {
    proto::PullHeader header;
    // The reply's bytes are the first num_bytes of snapshot->values: the
    // values, or their bfloat16 encoding (PullOptions::wire_dtype); then
    // the embedding rows asked for, float32 (header.sparse), when any.
    std::shared_ptr<const Snapshot> snapshot;
    size_t num_bytes = 0;
    std::shared_ptr<const std::vector<float>> rows;
    bool waited = false;  // The pull waited (Pull had returned its id).
  };
  using PullCallback = std::function<void(absl::StatusOr<PullReply>)>;

  explicit ParameterShard(const Options& options);
  ~ParameterShard();  // Fails waiting pulls with Cancelled.

  ParameterShard(const ParameterShard&) = delete;
  ParameterShard& operator=(const ParameterShard&) = delete;

  // Returns true when this call initialized the shard, false when it already
  // held the same variables. `data` holds the initial values. Either way the
  // shard is then ready (workers wait for that, not for initialization, so
  // that a chief can first bring restored shards to one checkpoint). A
  // restored checkpoint not yet confirmed whose layout places the same
  // variables otherwise than the chief's (a job resumed with another
  // --placement or --partition_threshold_bytes) is first cut anew from the
  // checkpoint's files, as the chief's layout places this shard's slices,
  // and takes the chief's training flags (TakeChiefConfigLocked). A
  // shard may hold no variables (fewer slices than shards): it takes empty
  // pushes and moves its version with the others.
  absl::StatusOr<bool> Init(const proto::InitHeader& header, ByteSource* data);

  // `data` holds the gradients of every variable, in the shard's order.
  // Invalid input (unknown variable, wrong shape, dtype or byte length)
  // is InvalidArgument and leaves the state untouched.
  absl::StatusOr<proto::PushResponse> Push(const proto::PushHeader& header,
                                           ByteSource* data);

  struct PullOptions {
    // The incarnation the caller expects; another one fails with Aborted.
    // 0: any.
    int64_t incarnation = 0;
    int64_t min_version = 0;
    int64_t min_clock = 0;
    bool moving_average = false;  // Reply with the moving averages.
    // DT_FLOAT, or DT_BFLOAT16 / DT_HALF: the reply's values encoded so.
    proto::DataType wire_dtype = proto::DT_FLOAT;
    // The caller's replica; the chief's (0) pulls count as word from it.
    int replica = -1;
    // Embedding rows to send after the values (PullRequest.sparse); null:
    // none. sparse_only: the rows alone (no dense values).
    std::shared_ptr<const google::protobuf::RepeatedPtrField<proto::SparseIds>> sparse;
    bool sparse_only = false;
    absl::Time deadline = absl::InfiniteFuture();
  };
  // What a PullRequest asks of this shard: its timeout (the shard's default
  // when it names none) from now, but no later than `latest` (the call's own
  // deadline). InvalidArgument for a wire_dtype other than DT_FLOAT,
  // DT_BFLOAT16 or DT_HALF.
  absl::StatusOr<PullOptions> PullOptionsFor(const proto::PullRequest& request,
                                             absl::Time latest = absl::InfiniteFuture()) const;
  // Calls `done` exactly once (see the header comment). Returns an id for
  // CancelPull when the pull waits, else 0. A pull waits at most
  // kMaxPullWait, whatever its deadline.
  int64_t Pull(const PullOptions& options, PullCallback done);
  // Fails waiting pull `id` with Cancelled now (its caller has gone), and
  // frees it; nothing when it was answered already.
  void CancelPull(int64_t id);
  static constexpr absl::Duration kMaxPullWait = absl::Hours(1);

  // Allreduce mode's entries (worker/store/allreduce_store.h), for a shard
  // that holds a worker's own model. ApplyGradient applies `gradient` (every
  // variable's, in the shard's order: the workers' mean already) as one
  // optimizer step (values, slots, moving averages, version), straight from
  // the caller's memory: no aggregation, no copy. A gradient whose update
  // would make a value or an optimizer slot NaN or Inf is refused
  // (InvalidArgument naming the variable), nothing applied, the version
  // unchanged; after training has ended nothing is applied either (accepted
  // false). Aborted while a restored state waits for the chief's Init.
  // REQUIRES: gradient.size() is the shard's element count.
  absl::StatusOr<proto::PushResponse> ApplyGradient(absl::Span<const float> gradient);
  // The values (or their moving averages) and version now, as a pull that
  // does not wait gets them; Pull's errors.
  absl::StatusOr<PullReply> Read(bool moving_average);

  proto::StatusResponse GetStatus() const;
  // The tables' part of GetStatus into *tables, if the shard is not busy
  // (a restore or a save holds it for seconds): false, and nothing
  // written, when it is. For metrics scrapes, which must not wait.
  bool TryTableStatus(std::vector<proto::TableStatus>* tables) const;
  void Shutdown(int replica);
  // An operator's end of training in two phases (proto ShutdownRequest):
  // PrepareEnd holds a sync shard at its next version (pushes are taken,
  // but no later version completes) for `hold`, then the hold lapses
  // (logged), and returns that version; EndAt(E) ends training once the
  // shard is at version E, at once if it is there (a push taken for E is
  // dropped). A shard that is async, holds no model, is a backup or has
  // ended already ends training at once (Shutdown(-1)); PrepareEnd then
  // returns 0.
  int64_t PrepareEnd(absl::Duration hold);
  void EndAt(int64_t version);
  // Elastic workers: the chief's list of members (see the header comment).
  // FailedPrecondition before Init and for a job that is not elastic;
  // InvalidArgument for a list without the chief or naming a replica out
  // of range.
  absl::StatusOr<proto::MembersResponse> SetMembers(const proto::MembersRequest& request);

  // Writes checkpoint `step` if the shard is at `version` (any when -1);
  // returns the file's path. The state is captured under the lock (values
  // and averages by reference, thanks to copy on write); the file is written
  // outside it, so training goes on while it is written. Embedding rows have
  // no copy on write and are not copied (a table may be most of the ps's
  // memory): a shard with tables writes the whole file under the lock,
  // streaming the rows straight from the tables, so that rows and dense
  // values are of one version. Pushes, pulls and GetStatus of the shard
  // wait meanwhile: about the time to write the file's bytes (to the page
  // cache, usually; the fsync and rename come after the lock is released).
  // Keeps the `keep` most recently saved checkpoints and `keep_step` (the
  // newest every shard holds, from the chief; -1: none).
  absl::StatusOr<std::string> Save(int64_t step, int64_t version, int keep,
                                   int64_t keep_step = -1);
  // Loads checkpoint `step` (the shard's own file, or resharded from those
  // of a job of another number of shards: ReadCheckpointForShard),
  // replacing the state, for recovery round `recovery_epoch` (see the
  // header comment; 0 at start).
  absl::Status Restore(int64_t step, int64_t recovery_epoch = 0);
  // At start: loads the newest checkpoint that reads back intact, skipping
  // (with a warning) corrupt ones: its own, or one of a job of another
  // number of shards, resharded (ReadCheckpointForShard). OK with nothing
  // loaded when there is none; FailedPrecondition when nothing restores and
  // the directory holds files of another number of shards (not all of a
  // checkpoint's, or none that restores), naming one, or a checkpoint
  // refused with FailedPrecondition (whole, but not this shard's to
  // restore).
  // Ends the restoring state (Options::restore_at_start).
  absl::Status RestoreLatest();

  // The whole state as a backup is filled with it (values, optimizer
  // slots, moving averages, version, config, the dedup state): `state`
  // describes it, `data` holds its tensors back to back. ImportState
  // replaces this shard's state with one so exported (allreduce mode's
  // elastic regroup: worker/store/allreduce_store.h), as a fill does;
  // pulls waiting for a version of the old state are Aborted.
  // FailedPrecondition before Init, and for a shard with embedding tables
  // (their rows are not exported); ImportState: InvalidArgument for data
  // of another size than `state` names.
  absl::Status ExportState(proto::ReplicaState* state, std::string* data) const;
  absl::Status ImportState(const proto::ReplicaState& state, ByteSource* data);

  // A message from the shard's other copy (proto ReplicateHeader); see
  // "Replicas" above. FailedPrecondition for a message of an older view.
  absl::StatusOr<proto::ReplicateResponse> Replicate(const proto::ReplicateHeader& header,
                                                     ByteSource* data);
  // At start, before RestoreLatest, for a copy that starts as the primary:
  // asks the other copy whether it holds the shard (it survived this
  // copy's restart). If so this copy is now its backup, restores nothing
  // and returns true; false when the other copy holds nothing or does not
  // answer (the job's start, or both copies lost: the checkpoint path).
  bool JoinReplicas();

  // Blocks until training is over and every replica has said Shutdown, or
  // until `grace` has passed since training ended: OK. DeadlineExceeded when
  // the shard holds a model, training is not over, and the chief (replica 0)
  // has neither pushed, pulled (nor had a pull waiting) nor called Init,
  // Save or Restore for `chief_timeout`: it failed without ending training
  // and nobody restarted it.
  absl::Status WaitUntilFinished(absl::Duration grace,
                                 absl::Duration chief_timeout = absl::InfiniteDuration());

  // Random, new for each process and each Restore; never 0.
  int64_t incarnation() const;
  // How many times this copy took over as its shard's primary (replicas).
  int64_t takeovers() const { return takeovers_.load(); }
  // The most bytes a push to the shard may carry: its values as float32
  // and the most embedding rows a push may name (0 for a shard that holds
  // nothing); nullopt before Init.
  std::optional<size_t> max_push_bytes() const;

 private:
  struct Waiter {
    PullOptions options;
    PullCallback done;
    int64_t id = 0;
  };
  // Why a pull cannot be answered at all (restoring, not initialized, not
  // confirmed, another incarnation); OK otherwise.
  absl::Status CheckPullLocked(const PullOptions& options) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a pull can be answered now.
  bool ReadyLocked(const PullOptions& options) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The fewest gradients pushed by a replica that has not finished.
  int64_t MinClockLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  class SnapshotPool;
  class EncodingCache;

  absl::Status ValidateTensors(
      const google::protobuf::RepeatedPtrField<proto::VariableMeta>& metas,
      size_t data_size, absl::string_view what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Refuses what Push must not apply: Aborted when the shard is not ready or
  // the push comes from a version it has not reached; InvalidArgument for a
  // malformed push. OK otherwise.
  // Sets *dense_size to the bytes of the dense gradients (those before the
  // embedding rows).
  absl::Status CheckPushLocked(const proto::PushHeader& header, size_t data_size,
                               size_t* dense_size) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The index of the first NaN or Inf element of `data`, or -1.
  int64_t FirstNonFinite(const ByteSource& data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The index of the first element of a block whose update by `grad` (the
  // optimizer's step at version_) would make a value or an optimizer slot
  // NaN or Inf, or -1. Changes nothing.
  int64_t FirstNonFiniteUpdate(const ByteSource& grad) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The variable that holds element `index` of the shard.
  const proto::VariableMeta& VariableAt(int64_t index) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Makes *buffer safe to modify: copies it if a pull still shares it.
  void MakeWritable(std::shared_ptr<Snapshot>* buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One optimizer step: BeginUpdate, then UpdateRange over every element
  // (concurrently for disjoint ranges), then ++version_.
  void BeginUpdate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `grad` to elements [begin, begin + grad.size()) and updates their
  // moving averages: the optimizer's step, or for a moving statistic,
  // values = grad, its new value (and its average is its value).
  void UpdateRange(int64_t begin, absl::Span<const float> grad)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The element ranges of `metas` (laid out back to back) that hold moving
  // statistics, merged where adjacent.
  static std::vector<std::pair<int64_t, int64_t>> MovingStatisticRanges(
      absl::Span<const proto::VariableMeta> metas);
  // Reads `data` (float32, every element of the shard) into replica_update_
  // and applies it (UpdateRange), block by block: the update a backup is
  // sent is then the very one applied here. REQUIRES: BeginUpdate.
  void UpdateFromCopy(const ByteSource& data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads all of `data` as floats in cache-sized blocks, calling
  // fn(begin, block) with each block and the index of its first element,
  // on the shard's threads (concurrently, for disjoint blocks). A block
  // lies where `data` holds it when it can (ByteSource::InPlace), else in a
  // copy: fn must not write into `data`'s memory.
  void ForEachBlock(const ByteSource& data,
                    absl::FunctionRef<void(int64_t, absl::Span<const float>)> fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls fn(begin, end) over [0, total_elements_) on the shard's threads.
  void ParallelFor(absl::FunctionRef<void(int64_t, int64_t)> fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the reply for the current state; REQUIRES initialized_.
  absl::StatusOr<PullReply> MakeReplyLocked(const PullOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the waiters that can be answered now and pairs them with replies.
  void TakeReadyWaiters(std::vector<std::pair<PullCallback, absl::StatusOr<PullReply>>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeadlineLoop();

  // Sync mode's aggregation (parameter_shard_push.cc). Whether `replica`'s
  // gradient counts at version_ (elastic: it is a member at it).
  bool WaitsForLocked(int replica) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether the pushes' embedding rows are summed per version (else the
  // one push of a version is applied straight from its message).
  bool SumsRowsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether the pushes in pushed_ complete version_.
  bool VersionCompleteLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether an operator's end holds the shard at this version (PrepareEnd;
  // the end's code is in parameter_shard_push.cc).
  bool HeldLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return end_bound_ >= 0 && version_ >= end_bound_;
  }
  // Ends training, as an operator's Shutdown does, once the version is the
  // operator's end_version_ (EndAt).
  void EndIfReachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lifts PrepareEnd's hold (to `bound`, or -1: none) and completes the
  // held version if its pushes are in (CompleteVersionLocked's status and
  // *moved); the caller then takes the ready waiters.
  absl::Status MoveHoldLocked(int64_t bound, std::vector<Waiter>* moved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rows of the push that completes a version summing none.
  struct DirectRows {
    const ShardTables::Segments* sparse;
    const ByteSource* message;
    size_t dense_size;
  };
  // Applies the mean of sum_ over pushed_ (and of the rows: summed, or
  // `rows`), advances the version and hands it to the backup. The version's
  // fault (a mean that overflows: nothing applied, the version skipped) or
  // the backup's refusal (waiting pulls moved to *moved) as the status.
  absl::Status CompleteVersionLocked(const DirectRows* rows, std::vector<Waiter>* moved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic: the chief alone is a member (after Init and Restore).
  void ResetMembersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Init's first step: the restored state cut anew for the layout of the
  // chief's Init when it asks for another placement of the same variables
  // (see Init); OK and nothing done otherwise, and for an Init that
  // InitState refuses anyway (while the shard restores at start, or of an
  // older recovery round).
  absl::Status RecutForLayout(const proto::InitHeader& header);
  // Init's work on this copy (Init then fills the backup).
  absl::StatusOr<bool> InitState(const proto::InitHeader& header, ByteSource* data);
  // Init of a state held already (parameter_shard_checkpoint.cc): a
  // restored one (not ready_) takes the
  // chief's training flags (a job resumed with another learning rate,
  // schedule, number of workers, table policy), keeping its optimizer's
  // slots; another optimizer (dense or sparse) is refused, as is any change
  // while the state trains (ready_). Refusals change nothing.
  absl::Status TakeChiefConfigLocked(const proto::TrainingConfig& asked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Replicas (parameter_shard_replication.cc). A request only a primary
  // serves: OK at the primary; at a backup, which then asks the primary,
  // OK once it has taken over, else Unavailable.
  absl::Status AdmitAsPrimary(absl::string_view what);
  // The primary's update of the version just made (`header`: UPDATE, its
  // version and dedup state; `update`: float32 for every element, none
  // when skipped) to the backup, or the whole state when the backup is not
  // in step. OK when the backup holds it or cannot be reached; Unavailable
  // when the other copy has replaced this one (it is a backup now, and its
  // waiting pulls are in *aborted).
  absl::Status ReplicateLocked(proto::ReplicateHeader header, absl::Span<const float> update,
                               std::vector<Waiter>* aborted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the whole state (no sooner than next_fill_ unless `now`).
  absl::Status FillBackupLocked(bool now, std::vector<Waiter>* aborted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the primary does with the other copy's answer.
  absl::Status TakeReplicaAnswerLocked(const absl::StatusOr<proto::ReplicateResponse>& answer,
                                       absl::string_view what, std::vector<Waiter>* aborted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // This copy is a backup from now on, holding nothing it may serve.
  void DemoteLocked(std::vector<Waiter>* aborted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state a fill carries: `state`, and its tensors in `data` (views of
  // the shard's buffers, valid while mu_ is held and nothing changes them).
  void ExportStateLocked(proto::ReplicaState* state,
                         std::vector<absl::Span<const char>>* data) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeFillLocked(const proto::ReplicaState& state, ByteSource* data,
                      std::vector<Waiter>* aborted, absl::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "shard 3", for logs.
  std::string ShardLabel() const;

  // Unavailable while the shard restores its checkpoint at start.
  absl::Status CheckNotRestoringLocked(absl::string_view what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FailedPrecondition when `epoch` is older than the newest recovery round
  // taken; else takes it. `what` names the request for the message.
  absl::Status TakeRecoveryEpochLocked(int64_t epoch, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the state with a loaded checkpoint; moves the waiting pulls to
  // *aborted (the caller fails them with Aborted, outside the lock).
  absl::Status LoadLocked(ShardState state, std::vector<Waiter>* aborted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardCheckpointId checkpoint_id() const {
    return {options_.checkpoint_dir, options_.shard, options_.num_shards};
  }

  const Options options_;
  int64_t incarnation_ ABSL_GUARDED_BY(mu_);
  const kernels::CpuContext cpu_;
  std::shared_ptr<SnapshotPool> pool_;
  // 16-bit pull replies (snapshot_pool.h); shared with the pulls' callbacks.
  std::shared_ptr<EncodingCache> encodings_;

  mutable absl::Mutex mu_;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;  // The chief confirmed the state.
  bool restoring_ ABSL_GUARDED_BY(mu_) = false;  // Options::restore_at_start.
  proto::TrainingConfig config_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::VariableMeta> variables_ ABSL_GUARDED_BY(mu_);
  // The whole model's layout (InitHeader.layout), saved for resharding.
  proto::ModelLayout layout_ ABSL_GUARDED_BY(mu_);
  int64_t total_elements_ ABSL_GUARDED_BY(mu_) = 0;
  // The element ranges [first, second) of variables_ that are moving
  // statistics (common/tensor.h's IsMovingStatistic): UpdateRange sets them
  // to what is pushed.
  std::vector<std::pair<int64_t, int64_t>> statistics_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Snapshot> current_ ABSL_GUARDED_BY(mu_);
  // Moving averages of current_ (null when the job keeps none).
  std::shared_ptr<Snapshot> average_ ABSL_GUARDED_BY(mu_);
  float average_decay_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ShardTables> tables_ ABSL_GUARDED_BY(mu_);  // Null: none.
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  Tensor sum_ ABSL_GUARDED_BY(mu_);  // Sync mode.
  std::set<int> pushed_ ABSL_GUARDED_BY(mu_);        // Sync mode.
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t last_waiter_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stale_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t nonfinite_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Per replica: its last push taken (its gradients, or under
  // --sparse_async its rows alone), and the answer it got.
  struct LastPush {
    int64_t worker_incarnation = 0;
    int64_t step = 0;
    bool accepted = false;
  };
  std::vector<LastPush> last_push_ ABSL_GUARDED_BY(mu_);
  bool training_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time training_done_time_ ABSL_GUARDED_BY(mu_);
  // An operator's end in preparation (>= 0): no version past end_bound_
  // completes until end_bound_expiry_; and agreed: training ends at
  // end_version_.
  int64_t end_bound_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time end_bound_expiry_ ABSL_GUARDED_BY(mu_);
  int64_t end_version_ ABSL_GUARDED_BY(mu_) = -1;
  // The chief's last push, pull, Init, Save or Restore (or the shard's
  // start); a waiting pull of the chief's counts as now.
  absl::Time last_chief_contact_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::set<int> finished_replicas_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> clocks_ ABSL_GUARDED_BY(mu_);  // Pushes per replica.
  // Elastic: per replica, the first version it is a member at; -1: none.
  std::vector<int64_t> member_from_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t restored_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t recovery_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // Newest round taken.
  absl::Mutex save_mu_;  // One save at a time; taken before mu_.
  absl::CondVar changed_;  // Signalled on any state change waiters care for.

  // Replicas (Options::peer).
  bool backup_ ABSL_GUARDED_BY(mu_) = false;
  int64_t view_ ABSL_GUARDED_BY(mu_) = 1;
  bool filled_ ABSL_GUARDED_BY(mu_) = false;          // Backup: holds the primary's state.
  bool backup_in_step_ ABSL_GUARDED_BY(mu_) = false;  // Primary: the backup does.
  absl::Time next_fill_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Tensor replica_update_ ABSL_GUARDED_BY(mu_);  // Async: a push's gradient, float32.
  std::atomic<int64_t> takeovers_{0};

  std::thread deadline_thread_;
};

}  // namespace psrt

#endif  // PSRT_PS_PARAMETER_SHARD_H_

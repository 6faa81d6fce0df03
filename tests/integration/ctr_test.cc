// Multi-process tests of the sparse path: CTR models (wide_deep, dlrm) on
// Criteo-format files from psrt_make_criteo, their embedding tables on real
// psrt_ps processes, trained by psrt_worker processes through
// scripts/launch.sh.
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class CtrTest : public ClusterFixture {
 protected:
  // 20,000 training and 4,000 test lines of one planted model.
  void MakeData() {
    CommandResult r = RunCommand(absl::StrCat(
        bin_, "/psrt_make_criteo --out=", dir_, "/train.gz --rows=20000 --seed=1 && ", bin_,
        "/psrt_make_criteo --out=", dir_, "/test.gz --rows=4000 --seed=2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  std::string Flags(const std::string& model) {
    return absl::StrCat("--model=", model, " --data_format=criteo --train_data=", dir_,
                        "/train.gz --test_data=", dir_, "/test.gz --hidden_units=32 ",
                        "--bottom_mlp=32 --top_mlp=32 --embedding_dim=8 --optimizer=adagrad ",
                        "--learning_rate=0.1 --sparse_learning_rate=0.5 --batch_size=128 ",
                        "--train_steps=200 --log_every_steps=100 --intra_op_threads=1");
  }

  // The chief's "final: global_step=N test_auc=A test_logloss=L" line.
  static bool ParseCtrFinal(const std::string& log, long* step, double* auc, double* logloss) {
    std::smatch m;
    static const std::regex kFinal(
        R"(final: global_step=(\d+) test_auc=([0-9.]+) test_logloss=([0-9.]+))");
    if (!std::regex_search(log, m, kFinal)) return false;
    *step = std::stol(m[1]);
    *auc = std::stod(m[2]);
    *logloss = std::stod(m[3]);
    return true;
  }
};

// The issue's layout: 2 ps + 2 sync workers, every table sharded over both
// ps tasks; training beats chance by far (the planted model's best AUC is
// about 0.85).
TEST_F(CtrTest, WideDeepTrainsThroughTwoPsAndTwoSyncWorkers) {
  MakeData();
  CommandResult r =
      Launch(MakeSpec(2, 2), dir_ + "/logs", Flags("wide_deep") + " --sync_replicas");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string chief = ReadFile(dir_ + "/logs/worker-0.log");
  long step = 0;
  double auc = 0, logloss = 0;
  ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
  EXPECT_EQ(step, 200);
  EXPECT_GE(auc, 0.65) << chief;
  EXPECT_GT(logloss, 0);
  EXPECT_NE(chief.find("test_auc = "), std::string::npos) << chief;
  // Each ps task took the chief's model, tables included.
  for (int ps = 0; ps < 2; ++ps) {
    const std::string log = ReadFile(absl::StrCat(dir_, "/logs/ps-", ps, ".log"));
    EXPECT_NE(log.find("initialized"), std::string::npos) << log;
  }
}

// A sync run of one worker is reproducible: rows start from (seed, table,
// id) whichever shard holds them, so two runs end on the same AUC.
TEST_F(CtrTest, DlrmRunsAreReproducible) {
  MakeData();
  const std::string spec = MakeSpec(2, 1);
  std::string finals[2];
  for (int run = 0; run < 2; ++run) {
    const std::string logs = absl::StrCat(dir_, "/logs", run);
    CommandResult r = Launch(spec, logs, Flags("dlrm") + " --sync_replicas");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(chief, m, std::regex("final: [^\n]*"))) << chief;
    finals[run] = m[0];
  }
  EXPECT_EQ(finals[0], finals[1]);
  long step = 0;
  double auc = 0, logloss = 0;
  ASSERT_TRUE(ParseCtrFinal(finals[0], &step, &auc, &logloss)) << finals[0];
  EXPECT_GE(auc, 0.65);
}

// Async with 2 workers, sync with a backup worker (R = 1 of 2: stale
// pushes dropped with their rows), and the hybrid (dense sync, rows on
// arrival) all train.
TEST_F(CtrTest, AsyncBackupAndHybridWorkersTrain) {
  MakeData();
  const std::string spec = MakeSpec(1, 2);
  const std::string modes[] = {"", " --sync_replicas --replicas_to_aggregate=1",
                               " --sync_replicas --sparse_async"};
  for (int m = 0; m < 3; ++m) {
    const std::string& mode = modes[m];
    const std::string logs = absl::StrCat(dir_, "/logs_mode", m);
    CommandResult r = Launch(spec, logs, Flags("dlrm") + mode);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    long step = 0;
    double auc = 0, logloss = 0;
    ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
    EXPECT_GE(step, 200);
    EXPECT_GE(auc, 0.6) << mode << "\n" << chief;
  }
}

// Persia's split (--dense_allreduce): the dense part averaged by the ring of
// the 2 workers, the tables on the ps task with rows taken on arrival. It
// learns, saves both parts (the dense one in ckpt/dense), and a second
// launch resumes both from the step they both hold.
TEST_F(CtrTest, DenseOnTheWorkersRingTablesOnThePsAndBothResume) {
  MakeData();
  const std::string spec = MakeSpec(1, 2);
  const std::string ckpt = dir_ + "/ckpt";
  const std::string flags = Flags("dlrm") +
                            " --sync_replicas --sparse_async --dense_allreduce "
                            "--save_checkpoint_steps=1000";
  for (int steps : {100, 200}) {
    SCOPED_TRACE(absl::StrCat(steps, " steps"));
    const std::string logs = absl::StrCat(dir_, "/logs", steps);
    CommandResult r = Launch(spec, logs, absl::StrCat(flags, " --train_steps=", steps),
                             "--checkpoint_dir " + ckpt);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    long step = 0;
    double auc = 0, logloss = 0;
    ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
    EXPECT_EQ(step, steps);
    EXPECT_NE(chief.find("the dense part on a ring of the workers"), std::string::npos) << chief;
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(ckpt, "/dense/model.ckpt-", steps, ".ps-0-of-1.safetensors")));
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(ckpt, "/model.ckpt-", steps, ".ps-0-of-2.safetensors")));
    if (steps == 200) {
      EXPECT_GE(auc, 0.6) << chief;
      EXPECT_NE(chief.find("every parameter server restored checkpoint 100"), std::string::npos)
          << chief;
      for (const char* worker : {"/worker-0.log", "/worker-1.log"}) {
        const std::string log = ReadFile(logs + worker);
        EXPECT_NE(log.find("resuming at global step 100"), std::string::npos) << log;
      }
    }
  }
}

// The same split survives a ps task killed mid-run (kill -9; the launcher
// restarts failed tasks): the workers stop rather than recover in place
// (their ring could not), the launcher restarts them, and the job resumes
// both parts from the newest checkpoint and ends at its last step.
TEST_F(CtrTest, DenseOnTheWorkersRingRecoversFromAKilledPs) {
  MakeData();
  const std::string spec = MakeSpec(1, 2);
  const std::string ckpt = dir_ + "/ckpt";
  const std::string job = absl::StrCat(
      "PSRT_BIN_DIR=", bin_, " timeout 300 ", source_, "/scripts/launch.sh --cluster_spec ", spec,
      " --logdir ", dir_, "/logs --checkpoint_dir ", ckpt, " --restart_policy=OnFailure -- ",
      Flags("dlrm"), " --sync_replicas --sparse_async --dense_allreduce ",
      "--save_checkpoint_steps=20 --train_steps=600 --allreduce_timeout_secs=30 > ", dir_,
      "/job.out 2>&1; echo $? > ", dir_,
      "/job.rc");
  RunCommand("(" + job + ") > /dev/null 2>&1 &");
  // Killed once a checkpoint past step 40 is saved (the index names it).
  bool saved = false;
  static const std::regex kSaved(R"(model\.ckpt-(\d+)\.)");
  for (int i = 0; i < 1200 && !saved; ++i) {
    const std::string index = ReadFile(ckpt + "/checkpoint.ps-1-of-2");
    for (auto it = std::sregex_iterator(index.begin(), index.end(), kSaved);
         it != std::sregex_iterator(); ++it) {
      saved |= std::stol((*it)[1]) > 40;
    }
    if (!saved) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(saved) << ReadFile(dir_ + "/job.out");
  RunCommand("pkill -9 -f 'psrt_ps .*cluster_spec=" + spec + "'");
  for (int i = 0; i < 3000 && ReadFile(dir_ + "/job.rc").empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(ReadFile(dir_ + "/job.rc"), "0\n") << ReadFile(dir_ + "/job.out");
  const std::string chief = ReadFile(dir_ + "/logs/worker-0.log");
  long step = 0;
  double auc = 0, logloss = 0;
  ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
  EXPECT_EQ(step, 600);
  const std::string launcher = ReadFile(dir_ + "/job.out");
  EXPECT_NE(launcher.find("task ps/0 exited"), std::string::npos) << launcher;
  // The chief started again and resumed from a checkpoint.
  EXPECT_NE(launcher.find("task worker/0 exited"), std::string::npos) << launcher;
  // Whichever worker met the restored ps first says why it stopped; the
  // other may stop first for the ring that broke under it.
  const std::string workers = chief + ReadFile(dir_ + "/logs/worker-1.log");
  EXPECT_NE(workers.find("the workers' ring cannot be recovered in place"), std::string::npos)
      << workers;
  EXPECT_NE(chief.find("resuming at global step"), std::string::npos) << chief;
}

// The rows a checkpoint directory's step-`step` files hold, over every
// shard's file (each table's "T/ids" tensor).
int64_t RowsInCheckpoint(const std::string& dir, int step) {
  int64_t rows = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(absl::StrCat("model.ckpt-", step, ".ps-"), 0) != 0) continue;
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(entry.path().string());
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return -1;
    for (const auto& [tensor, ids] : file->integers) {
      if (absl::EndsWith(tensor, "/ids")) rows += ids.shape[0];
    }
  }
  return rows;
}

// Admission, the age limit and the row budget through real ps tasks (1 ps
// task of 2 stripes): the checkpoints hold fewer rows than without them,
// the budget's bound holds, and the job still learns.
TEST_F(CtrTest, AdmissionAndEvictionBoundTheTables) {
  MakeData();
  const std::string spec = MakeSpec(1, 1);
  const std::string policies[] = {
      "",
      " --embedding_admit_count=3 --embedding_ttl_steps=50",
      " --embedding_max_rows_per_ps=3000",
  };
  int64_t rows[3];
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(policies[i]);
    const std::string logs = absl::StrCat(dir_, "/logs_policy", i);
    const std::string ckpt = absl::StrCat(dir_, "/ckpt_policy", i);
    CommandResult r = Launch(spec, logs, Flags("dlrm") + " --sync_replicas" + policies[i],
                             "--checkpoint_dir " + ckpt);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    long step = 0;
    double auc = 0, logloss = 0;
    ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
    EXPECT_GE(auc, 0.6) << chief;
    rows[i] = RowsInCheckpoint(ckpt, 200);
  }
  std::printf("rows in the checkpoint: %lld, admitted at 3 look-ups: %lld, 3000 a ps: %lld\n",
              static_cast<long long>(rows[0]), static_cast<long long>(rows[1]),
              static_cast<long long>(rows[2]));
  EXPECT_GT(rows[0], 4000);
  EXPECT_GT(rows[1], 0);
  EXPECT_LT(rows[1], rows[0] / 2);  // Ids seen once or twice get no row.
  EXPECT_LE(rows[2], 3000);
  EXPECT_GE(rows[2], 2000);
}

// A checkpoint's dense values, merged over its shards by
// psrt_export_checkpoint, and its tables' rows by id.
struct MergedState {
  std::map<std::string, std::vector<float>> variables;
  std::map<std::string, std::map<uint64_t, std::vector<float>>> rows;  // Table -> id -> row.
};

MergedState Merge(const std::string& bin, const std::string& dir, int shards, int step) {
  MergedState merged;
  const std::string out = absl::StrCat(dir, "/merged-", step, ".safetensors");
  CommandResult r = RunCommand(absl::StrCat(bin, "/psrt_export_checkpoint --checkpoint_dir=", dir,
                                            " --num_shards=", shards, " --step=", step,
                                            " --out=", out));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return merged;
  std::map<std::string, const Tensor*> values;
  for (const auto& [name, tensor] : file->tensors) {
    if (absl::EndsWith(name, "/values")) {
      values[name.substr(0, name.size() - 7)] = &tensor;
    } else {
      merged.variables[name].assign(tensor.data(), tensor.data() + tensor.num_elements());
    }
  }
  for (const auto& [name, ids] : file->integers) {
    const std::string table = name.substr(0, name.size() - 4);  // Less "/ids".
    const Tensor* rows = values[table];
    EXPECT_NE(rows, nullptr) << table;
    if (rows == nullptr) continue;
    const int64_t dim = rows->shape()[1];
    for (size_t i = 0; i < ids.values.size(); ++i) {
      merged.rows[table][ids.values[i]].assign(rows->data() + i * dim,
                                               rows->data() + (i + 1) * dim);
    }
  }
  return merged;
}

// Resharding on restore: a job saved with 2 ps tasks (4 shards) resumes
// with 3 (6 shards), then with 1 (2 shards), and ends with exactly the
// values and rows of the job that never stopped. Sync with one worker, so
// that every sum is taken in one order; small partitions, so that dense
// variables are cut into other slices by each count.
TEST_F(CtrTest, ACheckpointRestoresOntoMoreAndFewerPsTasksExactly) {
  MakeData();
  const std::string flags = Flags("dlrm") +
                            " --sync_replicas --partition_threshold_bytes=1024 "
                            "--save_checkpoint_steps=1000";
  const std::string ckpt = dir_ + "/ckpt";
  const std::pair<int, int> legs[] = {{2, 80}, {3, 140}, {1, 200}};  // (ps tasks, last step).
  for (const auto& [ps, steps] : legs) {
    SCOPED_TRACE(absl::StrCat(ps, " ps tasks"));
    const std::string logs = absl::StrCat(dir_, "/logs_ps", ps);
    CommandResult r = Launch(MakeSpec(ps, 1, absl::StrCat("ps", ps, ".json")), logs,
                             absl::StrCat(flags, " --train_steps=", steps),
                             "--checkpoint_dir " + ckpt);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    long step = 0;
    double auc = 0, logloss = 0;
    ASSERT_TRUE(ParseCtrFinal(chief, &step, &auc, &logloss)) << chief;
    EXPECT_EQ(step, steps);
    if (ps == 2) continue;
    EXPECT_NE(chief.find("every parameter server restored checkpoint"), std::string::npos)
        << chief;
    const std::string ps_log = ReadFile(logs + "/ps-0.log");
    EXPECT_NE(ps_log.find(absl::StrCat("resharded from the files of ", ps == 3 ? 4 : 6,
                                       " shards")),
              std::string::npos)
        << ps_log;
  }
  const std::string reference = dir_ + "/reference";
  CommandResult r = Launch(MakeSpec(2, 1, "reference.json"), dir_ + "/logs_reference",
                           flags + " --train_steps=200", "--checkpoint_dir " + reference);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const MergedState resumed = Merge(bin_, ckpt, 2, 200);
  const MergedState uninterrupted = Merge(bin_, reference, 4, 200);
  ASSERT_FALSE(uninterrupted.variables.empty());
  ASSERT_FALSE(uninterrupted.rows.empty());
  EXPECT_GT(uninterrupted.variables.size(), 4u);
  EXPECT_TRUE(resumed.variables == uninterrupted.variables);
  for (const auto& [table, rows] : uninterrupted.rows) {
    auto it = resumed.rows.find(table);
    ASSERT_NE(it, resumed.rows.end()) << table;
    EXPECT_EQ(it->second.size(), rows.size()) << table;
    EXPECT_TRUE(it->second == rows) << table;
  }
}

// A malformed line stops the worker that reads it, naming file and line;
// the model without Criteo input is refused at start.
TEST_F(CtrTest, BadInputIsNamed) {
  MakeData();
  CommandResult r = RunCommand(absl::StrCat("cd ", dir_, " && zcat train.gz | head -300 > bad.txt",
                                            " && printf '1\\tx\\n' >> bad.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string spec = MakeSpec(1, 1);
  r = Launch(spec, dir_ + "/logs_bad",
             absl::StrCat(Flags("dlrm"), " --train_data=", dir_, "/bad.txt --batch_size=100"));
  EXPECT_NE(r.exit_code, 0);
  const std::string chief = ReadFile(dir_ + "/logs_bad/worker-0.log");
  EXPECT_NE(chief.find("bad.txt:301"), std::string::npos) << chief;
  r = Launch(spec, dir_ + "/logs_flags", "--model=dlrm --train_steps=10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(ReadFile(dir_ + "/logs_flags/worker-0.log").find("--data_format=criteo"),
            std::string::npos);
  r = Launch(spec, dir_ + "/logs_hybrid", Flags("dlrm") + " --sparse_async");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(ReadFile(dir_ + "/logs_hybrid/worker-0.log").find("--sparse_async goes with"),
            std::string::npos);
  r = Launch(spec, dir_ + "/logs_ring", Flags("dlrm") + " --sync_replicas --dense_allreduce");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(ReadFile(dir_ + "/logs_ring/worker-0.log")
                .find("--dense_allreduce goes with --sync_replicas --sparse_async"),
            std::string::npos);
  r = Launch(spec, dir_ + "/logs_dense",
             "--model=mlp --sync_replicas --sparse_async --dense_allreduce --train_steps=10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(ReadFile(dir_ + "/logs_dense/worker-0.log").find("--mode=allreduce"),
            std::string::npos);
}

}  // namespace
}  // namespace psrt

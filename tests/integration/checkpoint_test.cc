// Checkpoints end to end, with real clusters on 127.0.0.1: kill a running
// cluster, launch it again with the same flags, and check that training
// resumes at the saved step and ends exactly where an uninterrupted run
// ends; corrupt the newest checkpoint and check the fallback.
#include <sys/stat.h>

#include <algorithm>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

// Sync, fixed data order, momentum (so optimizer slots must be restored too).
constexpr char kFlags[] =
    "--sync_replicas --noshuffle --optimizer=momentum --learning_rate=0.01 "
    "--hidden_units=64 --partition_threshold_bytes=100000 --batch_size=50 "
    "--save_checkpoint_steps=20 --log_every_steps=20";

class CheckpointTest : public ClusterFixture {
 protected:
  // An uninterrupted run of `steps`; returns its final parameters' path.
  std::string Reference(const std::string& spec, int steps) {
    const std::string out = dir_ + "/reference.safetensors";
    CommandResult r = Launch(spec, dir_ + "/reference",
                             absl::StrCat(kFlags, " --train_steps=", steps,
                                          " --final_params_out=", out));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }
};

TEST_F(CheckpointTest, KilledClusterResumesAndMatchesAnUninterruptedRun) {
  const std::string spec = MakeSpec(2, 2);
  const std::string ckpt = dir_ + "/ckpt";
  // The last shard's index: two ps tasks of two stripes (the default) are
  // four shards.
  const std::string index = ckpt + "/checkpoint.ps-3-of-4";
  // A run far longer than we let it live; kill it once it has saved step 40.
  const std::string long_run = absl::StrCat(
      "PSRT_BIN_DIR=", bin_, " ", source_, "/scripts/launch.sh --cluster_spec ", spec,
      " --logdir ", dir_, "/killed --checkpoint_dir ", ckpt, " -- ", kFlags,
      " --train_steps=1000000 > ", dir_, "/killed.out 2>&1 & echo $!");
  const std::string launcher = RunCommand(long_run).output;
  bool saved = false;
  for (int i = 0; i < 600 && !saved; ++i) {
    saved = ReadFile(index).find("model.ckpt-40.") != std::string::npos;
    if (!saved) absl::SleepFor(absl::Milliseconds(100));
  }
  // kill -9 every task (not the launcher first: no clean shutdown at all).
  RunCommand("pkill -9 -f 'cluster_spec=" + spec + "'");
  RunCommand("kill " + launcher + " 2>/dev/null; sleep 0.5");
  ASSERT_TRUE(saved) << ReadFile(dir_ + "/killed.out");
  // The run may have gone on a while before the kill landed (a fast step, a
  // busy machine): the resumed run and the reference train 60 steps past
  // the newest checkpoint saved, and at least 100.
  long newest = 0;
  const std::string saved_steps = ReadFile(index);
  static const std::regex kSaved(R"(model\.ckpt-(\d+)\.)");
  for (auto it = std::sregex_iterator(saved_steps.begin(), saved_steps.end(), kSaved);
       it != std::sregex_iterator(); ++it) {
    newest = std::max(newest, std::stol((*it)[1]));
  }
  const long steps = std::max(100L, newest + 60);

  const std::string resumed = dir_ + "/resumed.safetensors";
  CommandResult r = Launch(
      spec, dir_ + "/resumed",
      absl::StrCat(kFlags, " --train_steps=", steps, " --final_params_out=", resumed),
      "--checkpoint_dir " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string chief = ReadFile(dir_ + "/resumed/worker-0.log");
  // Every shard restored the same step, or (a kill that landed between the
  // shards' saves of one step) the chief brought them all to the newest
  // step they all hold; either way the run resumes from one state.
  EXPECT_TRUE(chief.find("every parameter server restored checkpoint") != std::string::npos ||
              chief.find("all of them now hold checkpoint") != std::string::npos)
      << chief;
  EXPECT_NE(chief.find("resuming at global step"), std::string::npos) << chief;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy));
  EXPECT_EQ(step, steps);

  const std::string reference = Reference(MakeSpec(2, 2, "reference.json"), steps);
  const double diff = MaxAbsDiff(resumed, reference);
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

TEST_F(CheckpointTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  const std::string spec = MakeSpec(2, 2);
  const std::string ckpt = dir_ + "/ckpt";
  CommandResult first = Launch(spec, dir_ + "/first", absl::StrCat(kFlags, " --train_steps=40"),
                               "--checkpoint_dir " + ckpt);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Flip one byte in the middle of shard 0's newest file (step 40): ps/0's
  // first stripe (two tasks of two stripes: four shards).
  const std::string newest = ckpt + "/model.ckpt-40.ps-0-of-4.safetensors";
  struct stat st;
  ASSERT_EQ(stat(newest.c_str(), &st), 0);
  RunCommand(absl::StrCat("printf '\\xff' | dd of=", newest, " bs=1 seek=", st.st_size / 2,
                          " conv=notrunc 2>/dev/null"));

  const std::string resumed = dir_ + "/resumed.safetensors";
  CommandResult r = Launch(spec, dir_ + "/resumed",
                           absl::StrCat(kFlags, " --train_steps=60 --final_params_out=", resumed),
                           "--checkpoint_dir " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ps0 = ReadFile(dir_ + "/resumed/ps-0.log");
  EXPECT_NE(ps0.find("skipping checkpoint 40"), std::string::npos) << ps0;
  EXPECT_NE(ps0.find("corrupt"), std::string::npos) << ps0;
  const std::string chief = ReadFile(dir_ + "/resumed/worker-0.log");
  EXPECT_NE(chief.find("all of them now hold checkpoint 20"), std::string::npos) << chief;
  EXPECT_NE(chief.find("resuming at global step 20"), std::string::npos) << chief;

  const double diff = MaxAbsDiff(resumed, Reference(MakeSpec(2, 2, "reference.json"), 60));
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

// A job resumed with more stripes and another placement, then with the same
// count and another placement again, ends where the job that never stopped
// ends. Only the ps tasks are given --ps_stripes; the workers ask them. The
// second and third legs hold 6 slices on 16 shards: 10 shards hold nothing
// and still move with the others. The ps tasks restore the files' layout
// and cut it anew for the chief's at its Init.
TEST_F(CheckpointTest, ResumesWithMoreStripesAndAnotherPlacementExactly) {
  const std::string spec = MakeSpec(2, 2);
  const std::string ckpt = dir_ + "/ckpt";
  struct Leg {
    int stripes;
    const char* placement;
    int steps;
    const char* recut;  // What each ps's log says of the restored checkpoint.
  };
  const Leg legs[] = {{2, "contiguous", 40, ""},
                      {8, "prioritized", 80, "cut checkpoint 40 anew as the chief places"},
                      {8, "contiguous", 120, "cut checkpoint 80 anew as the chief places"}};
  const std::string resumed = dir_ + "/resumed.safetensors";
  for (const Leg& leg : legs) {
    SCOPED_TRACE(absl::StrCat(leg.stripes, " stripes, ", leg.placement));
    const std::string logs = absl::StrCat(dir_, "/leg", leg.steps);
    CommandResult r = Launch(
        spec, logs,
        absl::StrCat(kFlags, " --train_steps=", leg.steps, " --placement=", leg.placement,
                     " --final_params_out=", resumed),
        absl::StrCat("--checkpoint_dir ", ckpt, " --ps_flags --ps_stripes=", leg.stripes));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string chief = ReadFile(logs + "/worker-0.log");
    long step = 0;
    double accuracy = 0;
    ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
    EXPECT_EQ(step, leg.steps);
    // The workers, not given --ps_stripes, take the ps tasks'.
    EXPECT_NE(chief.find(absl::StrCat("the ps tasks serve ", leg.stripes, " stripes each")),
              std::string::npos)
        << chief;
    if (*leg.recut == '\0') continue;
    EXPECT_NE(chief.find(absl::StrCat("resuming at global step ", leg.steps - 40)),
              std::string::npos)
        << chief;
    for (const char* ps : {"/ps-0.log", "/ps-1.log"}) {
      const std::string log = ReadFile(logs + ps);
      EXPECT_NE(log.find(leg.recut), std::string::npos) << log;
    }
  }
  const double diff = MaxAbsDiff(resumed, Reference(MakeSpec(2, 2, "reference.json"), 120));
  EXPECT_GE(diff, 0);
  EXPECT_LE(diff, 1e-5);
}

}  // namespace
}  // namespace psrt

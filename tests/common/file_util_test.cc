#include "common/file_util.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace {

std::string NewDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/file_util_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Names in `dir` other than `keep`.
std::vector<std::string> Others(const std::string& dir, const std::string& keep) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != keep) names.push_back(entry.path().filename());
  }
  return names;
}

TEST(FileUtilTest, WritesThePiecesPrivatelyAndLeavesNoTemporaryFile) {
  const std::string dir = NewDir("pieces");
  const std::string path = dir + "/model.ckpt";
  ASSERT_TRUE(WriteFileAtomically(path, {"abc", "", "defg"}).ok());
  EXPECT_EQ(Read(path), "abcdefg");
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(WriteFileAtomically(path, "replaced").ok());
  EXPECT_EQ(Read(path), "replaced");
  EXPECT_TRUE(Others(dir, "model.ckpt").empty());
}

// Two writers of one path (two processes serving one shard) never mix their
// bytes: the file is one writer's whole contents.
TEST(FileUtilTest, ConcurrentWritersOfOnePathNeverMix) {
  const std::string dir = NewDir("concurrent");
  const std::string path = dir + "/index";
  const std::string a(1 << 20, 'a'), b(1 << 20, 'b');
  for (int round = 0; round < 20; ++round) {
    std::thread writer([&] { EXPECT_TRUE(WriteFileAtomically(path, a).ok()); });
    EXPECT_TRUE(WriteFileAtomically(path, b).ok());
    writer.join();
    const std::string got = Read(path);
    EXPECT_TRUE(got == a || got == b) << "round " << round << ": mixed bytes";
  }
  EXPECT_TRUE(Others(dir, "index").empty());
}

// A full disk (here: a file size limit, which fails write() the same way)
// is an error naming the file; the old contents and no temporary file stay.
TEST(FileUtilTest, AFailedWriteKeepsTheOldFileAndNamesTheTemporaryOne) {
  const std::string dir = NewDir("full");
  const std::string path = dir + "/model.ckpt";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status status = WriteFileAtomically(path, std::string(1 << 16, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("write " + dir + "/.model.ckpt.tmp."), std::string::npos)
      << status;
  EXPECT_EQ(Read(path), "old");
  EXPECT_TRUE(Others(dir, "model.ckpt").empty());
}

TEST(FileUtilTest, AMissingDirectoryIsNamed) {
  const absl::Status status = WriteFileAtomically("/nonexistent_psrt_dir/x", "y");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("/nonexistent_psrt_dir/.x.tmp."), std::string::npos) << status;
}

// A file written a piece at a time: patched in place before Commit, and
// gone without a trace when abandoned.
TEST(FileUtilTest, AnAtomicFileIsPatchedInPlaceAndLeavesNothingWhenAbandoned) {
  const std::string dir = NewDir("atomic_file");
  const std::string path = dir + "/shard.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append("header:????;").ok());
    ASSERT_TRUE((*file)->Append("data").ok());
    EXPECT_EQ((*file)->size(), 16u);
    EXPECT_EQ(Read(path), "old");  // Not yet committed.
  }
  EXPECT_EQ(Read(path), "old");
  EXPECT_TRUE(Others(dir, "shard.safetensors").empty());

  absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Create(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Append("header:????;").ok());
  ASSERT_TRUE((*file)->Append("data").ok());
  ASSERT_TRUE((*file)->Overwrite(7, "1234").ok());
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_EQ(Read(path), "header:1234;data");
  file->reset();
  EXPECT_EQ(Read(path), "header:1234;data");
  EXPECT_TRUE(Others(dir, "shard.safetensors").empty());
}

}  // namespace
}  // namespace psrt

// keras.applications' CNNs as Keras writes them (tests/data/keras/apps/,
// scripts/gen_keras_fixtures.py): all 23 build with Keras's own counts
// (count_params(), moving statistics included, and the trainable weights').
#include <zlib.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/keras_model.h"
#include "models/model.h"

namespace psrt {
namespace {

std::string AppsDir() { return absl::StrCat(PSRT_SOURCE_DIR, "/tests/data/keras/apps/"); }

// NAME.json.gz, whole.
std::string ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return "";
  std::string text;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(f, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  EXPECT_EQ(n, 0) << path;
  gzclose(f);
  return text;
}

// NAME -> (count_params(), trainable), as Keras counted them.
std::map<std::string, std::pair<int64_t, int64_t>> KerasCounts() {
  std::map<std::string, std::pair<int64_t, int64_t>> counts;
  std::ifstream in(AppsDir() + "counts.txt");
  std::string name;
  int64_t total = 0, trainable = 0;
  while (in >> name >> total >> trainable) counts[name] = {total, trainable};
  return counts;
}

absl::StatusOr<std::unique_ptr<Model>> LoadApp(const std::string& name) {
  ModelOptions options;
  options.intra_op_threads = 1;
  return NewKerasModel(ReadGzip(AppsDir() + name + ".json.gz"), name + ".json", options);
}

TEST(KerasApplicationsTest, ReadAppsBuildWithKerassCounts) {
  const auto counts = KerasCounts();
  ASSERT_EQ(counts.size(), 23u) << "counts.txt";
  for (const auto& [name, count] : counts) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<Model>> model = LoadApp(name);
    ASSERT_TRUE(model.ok()) << model.status();
    const ParameterCount params = CountParameters(**model);
    EXPECT_EQ(params.trainable, count.second);
    EXPECT_EQ(params.all, count.first);
  }
}

}  // namespace
}  // namespace psrt

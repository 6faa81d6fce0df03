// A main() for the fuzz targets where libFuzzer is not available (GCC): runs
// LLVMFuzzerTestOneInput over every corpus file, then over a fixed number of
// deterministic mutations of each (bit flips, byte sets, truncations,
// insertions, erasures, duplicated chunks), the same ones on every run. It
// checks nothing itself: a crash, a failed CHECK or a sanitizer report ends
// the process, which is what makes the ctest fail.
//
//   fuzz_idx [--mutations=N] [--seed=S] CORPUS_DIR_OR_FILE...
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"

namespace {

std::vector<std::string> CorpusFiles(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "%s: no such file or directory\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> files;
  DIR* d = ::opendir(path.c_str());
  while (dirent* e = d != nullptr ? ::readdir(d) : nullptr) {
    if (e->d_name[0] == '.') continue;
    const std::string file = path + "/" + e->d_name;
    if (::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(file);
  }
  if (d != nullptr) ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// One to four random edits of `input`.
std::string Mutate(const std::string& input, std::mt19937_64* rng) {
  std::string s = input;
  auto below = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>((*rng)() % n); };
  static const uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '-', '"', ':', '9'};
  const int edits = 1 + static_cast<int>(below(4));
  for (int i = 0; i < edits; ++i) {
    switch (below(7)) {
      case 0:  // Flip a bit.
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 << below(8));
        break;
      case 1:  // Set a byte to an interesting value.
        if (!s.empty()) {
          s[below(s.size())] = static_cast<char>(kInteresting[below(sizeof(kInteresting))]);
        }
        break;
      case 2:  // Truncate.
        s.resize(below(s.size() + 1));
        break;
      case 3: {  // Insert random bytes.
        std::string bytes(1 + below(8), '\0');
        for (char& c : bytes) c = static_cast<char>((*rng)());
        s.insert(below(s.size() + 1), bytes);
        break;
      }
      case 4: {  // Erase a range.
        const size_t at = below(s.size() + 1);
        s.erase(at, below(s.size() - at + 1));
        break;
      }
      case 5: {  // Duplicate a range.
        const size_t at = below(s.size() + 1);
        const std::string chunk = s.substr(at, below(s.size() - at + 1));
        s.insert(below(s.size() + 1), chunk);
        break;
      }
      default:  // Randomize a byte.
        if (!s.empty()) s[below(s.size())] = static_cast<char>((*rng)());
        break;
    }
  }
  return s;
}

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 1000;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--mutations=", 0) == 0) {
      mutations = std::strtol(arg.c_str() + 12, nullptr, 10);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
    } else {
      const std::vector<std::string> more = CorpusFiles(arg);
      files.insert(files.end(), more.begin(), more.end());
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations=N] [--seed=S] CORPUS...\n"
                         "(no corpus files given)\n", argv[0]);
    return 2;
  }
  long runs = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string input = ReadFile(files[f]);
    Run(input);
    ++runs;
    std::mt19937_64 rng(seed * 1000003 + f);
    for (long m = 0; m < mutations; ++m) {
      Run(Mutate(input, &rng));
      ++runs;
    }
  }
  std::printf("%s: %ld inputs from %zu corpus files, no crash\n", argv[0], runs,
              files.size());
  return 0;
}

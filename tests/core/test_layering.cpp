// The layering rule of docs/architecture.md, checked on every quoted #include of the tree:
//   src/<module>/      the public API (dsv41kv/...), the foundation (core/..., formats/...) and
//                      its own module's headers;
//   tools/<tool>/      the public API, its own folder's headers (quoted without a path) and the
//                      benchmark library it drives (bench/...);
//   bench/             the public API, the foundation and bench's own headers;
//   tests/<module>/    the public API, the foundation, the shared helpers (support/...) and the
//                      private headers of the module it tests;
//   tests/support/     the public API, the foundation and support's own headers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/paths.hpp"

namespace dsv41kv::test {
namespace {

namespace fs = std::filesystem;

bool allowed(const std::vector<std::string>& parts, const std::string& inc) {
  if (inc.rfind("dsv41kv/", 0) == 0) return true;
  const std::string top = parts[0];
  const std::string first = inc.substr(0, inc.find('/'));
  const bool local = inc.find('/') == std::string::npos;
  if (top == "src") return first == "core" || first == "formats" || first == parts[1];
  if (top == "tools") return local || first == "bench";
  if (top == "bench") return local || first == "bench" || first == "core" || first == "formats";
  if (top == "tests") return first == "support" || first == "core" || first == "formats" || first == parts[1];
  return true;
}

TEST(Layering, NoIncludeCrossesAModuleBoundary) {
  const fs::path root = source_dir();
  const std::regex include(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<std::string> bad;
  int64_t files = 0;
  for (const char* top : {"src", "tools", "bench", "tests"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
      ++files;
      const fs::path rel = fs::relative(e.path(), root);
      std::vector<std::string> parts;
      for (const auto& p : rel) parts.push_back(p.string());
      std::ifstream in(e.path());
      std::string line;
      while (std::getline(in, line)) {
        std::smatch m;
        if (std::regex_search(line, m, include) && !allowed(parts, m[1].str()))
          bad.push_back(rel.string() + ": #include \"" + m[1].str() + "\"");
      }
    }
  }
  EXPECT_GT(files, 100) << "the tree was not found under " << root;
  std::ostringstream msg;
  for (const auto& b : bad) msg << "\n  " << b;
  EXPECT_TRUE(bad.empty()) << bad.size() << " include(s) cross a module boundary (docs/architecture.md):" << msg.str();
}

// The rule itself: a private header of another module is refused, the foundation is not.
TEST(Layering, TheRuleRefusesAnotherModulesPrivateHeader) {
  EXPECT_FALSE(allowed({"src", "pcp", "link.cpp"}, "compressor/backend.hpp"));
  EXPECT_TRUE(allowed({"src", "pcp", "link.cpp"}, "core/validate.hpp"));
  EXPECT_TRUE(allowed({"src", "pcp", "link.cpp"}, "pcp/layer_step_common.hpp"));
  EXPECT_FALSE(allowed({"tools", "dsv41kv", "run.cpp"}, "comm/rendezvous.hpp"));
  EXPECT_FALSE(allowed({"tests", "tools", "t.cpp"}, "pipeline/x.hpp"));
  EXPECT_TRUE(allowed({"tests", "comm", "t.cpp"}, "comm/rendezvous.hpp"));
}

}  // namespace
}  // namespace dsv41kv::test

#include "support/cli.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/paths.hpp"

namespace dsv41kv::test {
namespace fs = std::filesystem;

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path = fs::temp_directory_path() /
         ("dsv41kv_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string CliRun::last_line() const {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const auto nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CliRun run_cli(const std::string& args, const TempDir& tmp) { return run_program(cli_path(), args, tmp); }

CliRun run_program(const std::string& program, const std::string& args, const TempDir& tmp) {
  const std::string out = tmp / "stdout.txt", err = tmp / "stderr.txt";
  const std::string cmd = "'" + program + "' " + args + " > '" + out + "' 2> '" + err + "'";
  const int st = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace dsv41kv::test

// Running the dsv41kv tool from tests: exit status, stdout and stderr of one invocation, in a
// private temporary directory that is removed afterwards.
#pragma once

#include <filesystem>
#include <string>

namespace dsv41kv::test {

struct TempDir {
  std::filesystem::path path;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct CliRun {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
  std::string last_line() const;  // last non-empty line of stdout
};

std::string slurp(const std::string& path);

// Runs `<program> <args>` through the shell (args are pasted verbatim: quote paths yourself).
CliRun run_program(const std::string& program, const std::string& args, const TempDir& tmp);
// run_program of the dsv41kv tool.
CliRun run_cli(const std::string& args, const TempDir& tmp);

}  // namespace dsv41kv::test

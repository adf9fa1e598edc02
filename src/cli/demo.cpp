#include "cli/commands.hpp"
namespace dsv41kv::cli {
void add_demo(CLI::App& app, int& exit_code) {
  app.add_subcommand("demo", "built-in multi-step workload (in progress)")->callback([&exit_code] { exit_code = 1; });
}
}  // namespace dsv41kv::cli

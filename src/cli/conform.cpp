#include "cli/commands.hpp"
namespace dsv41kv::cli {
void add_conform(CLI::App& app, int& exit_code) {
  app.add_subcommand("conform", "run conformance files (in progress)")->callback([&exit_code] { exit_code = 1; });
}
}  // namespace dsv41kv::cli

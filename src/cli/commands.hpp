// Subcommands of the dsv41kv tool. Each add_* registers one subcommand on the app; the
// callback returns the process exit code through `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace dsv41kv::cli {

void add_info(CLI::App& app, int& exit_code);
void add_demo(CLI::App& app, int& exit_code);
void add_conform(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);
void add_nccl_check(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);

}  // namespace dsv41kv::cli

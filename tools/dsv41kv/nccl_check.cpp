// `dsv41kv nccl-check`: starts P worker processes (one per GPU) that rendezvous, create the
// NCCL communicator and verify all-gathers byte for byte, eagerly and inside a CUDA graph, with
// time per call and bus bandwidth. --kill-rank K makes rank K die mid-run: every other rank must
// then end with an error naming itself within the timeout, and the launcher names rank K.
// Exit codes: 0 every rank verified, 1 a rank failed (or was killed), 2 bad flags, no NCCL in
// this build or fewer GPUs than ranks.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/launcher.hpp"
#include "dsv41kv/nccl_selftest.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/nccl_comm.hpp"

namespace dsv41kv::cli {
namespace {

struct NcclCheckFlags {
  int ranks = 1;
  std::string launch = "local";
  std::string rendezvous = "tcp";
  double timeout_s = 60;
  double max_runtime_s = 600;
  int64_t bytes = int64_t{4} << 20;
  int iters = 20;
  int kill_rank = -1;
  int kill_after = 5;
  bool host_only = false;
};

comm::NcclCheckOptions rank_options(const NcclCheckFlags& f) {
  comm::NcclCheckOptions o;
  o.bytes = f.bytes;
  o.iters = f.iters;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  o.kill_rank = f.kill_rank;
  o.kill_after = f.kill_after;
  o.host_only = f.host_only;
  return o;
}

int run_nccl_check(const NcclCheckFlags& f) {
  if (f.kill_rank >= f.ranks)
    invalid_argument(fmt::format("--kill-rank {}: outside [0, {})", f.kill_rank, f.ranks));
  if (f.kill_after >= f.iters && f.kill_rank >= 0 && !f.host_only)
    invalid_argument(fmt::format("--kill-after {}: must be below --iters {}", f.kill_after, f.iters));
  const comm::NcclCheckOptions o = rank_options(f);

  // A worker started by the launcher (or by mpirun): run this rank only.
  if (auto env = comm::worker_env_from_environment()) {
    if (env->world != f.ranks)
      invalid_argument(fmt::format("--ranks {} but the environment says world size {} ({})", f.ranks, env->world,
                                   env->source));
    return comm::run_nccl_check_rank(*env, o);
  }

  if (!f.host_only) {
    if (!nccl_available()) {
      std::fprintf(stderr, "dsv41kv: nccl-check: this build has no NCCL (%s): configure with CUDA and NCCL "
                           "(DSV41KV_NCCL=ON); --host-only checks the launcher and rendezvous alone\n",
                   nccl_version_string().c_str());
      return 2;
    }
    std::string why;
    const int gpus = comm::visible_cuda_devices(&why);
    if (gpus < f.ranks) {
      std::fprintf(stderr, "dsv41kv: nccl-check: --ranks %d needs %d GPUs, %d visible%s%s\n", f.ranks, f.ranks,
                   gpus, why.empty() ? "" : ": ", why.c_str());
      return 2;
    }
  }

  if (f.launch == "none") {
    if (f.ranks != 1)
      invalid_argument(fmt::format("--launch none with --ranks {}: start the ranks yourself (mpirun, or "
                                   "DSV41KV_RANK/DSV41KV_WORLD/DSV41KV_RDZV per process), or use --launch local",
                                   f.ranks));
    comm::WorkerEnv env;
    env.source = "direct";
    return comm::run_nccl_check_rank(env, o);
  }

  comm::LaunchOptions lo;
  lo.world = f.ranks;
  lo.rendezvous = f.rendezvous;
  // The workers detect a dead peer within their own timeout; give them that plus slack.
  lo.failure_grace = o.timeout + std::chrono::seconds(10);
  lo.max_runtime = std::chrono::milliseconds(static_cast<int64_t>(f.max_runtime_s * 1000));
  lo.argv = {comm::self_executable(), "nccl-check",  "--ranks", std::to_string(f.ranks),
             "--launch",              "local",       "--timeout", fmt::format("{}", f.timeout_s),
             "--bytes",               std::to_string(f.bytes), "--iters", std::to_string(f.iters),
             "--kill-rank",           std::to_string(f.kill_rank), "--kill-after", std::to_string(f.kill_after)};
  if (f.host_only) lo.argv.push_back("--host-only");
  std::printf("nccl-check: launching %d rank(s) (%s), rendezvous %s, timeout %g s%s\n", f.ranks,
              f.host_only ? "host only" : "one GPU each", f.rendezvous.c_str(), f.timeout_s,
              f.kill_rank >= 0 ? fmt::format(", rank {} will be killed", f.kill_rank).c_str() : "");
  std::fflush(stdout);
  const comm::LaunchResult r = comm::launch_local(lo);
  std::printf("nccl-check: %s\n%s\n", r.exit_code == 0 ? "PASS" : "FAIL", r.summary().c_str());
  return r.exit_code;
}

}  // namespace

void add_nccl_check(CLI::App& app, int& exit_code) {
  static NcclCheckFlags f;
  auto* cmd = app.add_subcommand("nccl-check", "start P ranks (one per GPU) and verify NCCL all-gathers (eager, "
                                               "in place, CUDA graph), with time and bus bandwidth");
  cmd->add_option("--ranks", f.ranks, "number of ranks (GPUs)")->check(CLI::Range(1, 64));
  cmd->add_option("--launch", f.launch, "local: start the ranks here; none: this process is one rank (set up "
                                        "by mpirun or DSV41KV_* variables, or --ranks 1)")
      ->check(CLI::IsMember({"local", "none"}));
  cmd->add_option("--rendezvous", f.rendezvous, "how rank 0 shares the NCCL unique id: tcp (127.0.0.1) or file")
      ->check(CLI::IsMember({"tcp", "file"}));
  cmd->add_option("--timeout", f.timeout_s, "seconds any rank waits for the others before failing")
      ->check(finite_range(0.1, 3600.0));
  cmd->add_option("--max-runtime", f.max_runtime_s, "seconds after which the launcher ends the whole run")
      ->check(finite_range(1.0, 86400.0));
  cmd->add_option("--bytes", f.bytes, "bytes per rank per all-gather")->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  cmd->add_option("--iters", f.iters, "timed all-gathers (eager and graph each)")->check(CLI::Range(1, 1000000));
  cmd->add_option("--kill-rank", f.kill_rank, "this rank kills itself mid-run (failure-handling check)")
      ->check(CLI::Range(-1, 63));
  cmd->add_option("--kill-after", f.kill_after, "... before this timed eager all-gather")->check(CLI::Range(0, 1000000));
  cmd->add_flag("--host-only", f.host_only, "no GPU, no NCCL: launcher and rendezvous only (for tests)");
  cmd->callback([&exit_code] { exit_code = run_nccl_check(f); });
}

}  // namespace dsv41kv::cli

// Local multi-process launcher: starts P worker processes of one program on this host (one per
// GPU), hands each its rank through the environment and supervises them so that a dead worker
// never leaves the others hanging.
//
// Worker environment:
//   DSV41KV_RANK    0..P-1
//   DSV41KV_WORLD   P
//   DSV41KV_RDZV    tcp://127.0.0.1:PORT (default) or file:/tmp/dsv41kv-rdzv-XXXXXX/unique_id
//   DSV41KV_DEVICE  the CUDA device ordinal the worker should use (= rank)
// The rest of the parent's environment is passed on unchanged (NCCL_* included).
//
// Supervision: the launcher polls its workers (waitpid, 10 ms). When one dies (non-zero exit
// or a signal) it records that rank as the first failure and gives the others
// `failure_grace` to end on their own (they should: NCCL errors or communicator timeouts);
// whoever is still alive then gets SIGTERM, then SIGKILL 2 s later. `max_runtime` bounds the
// whole run the same way. Nothing waits unboundedly.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dsv41kv::comm {

struct LaunchOptions {
  int world = 1;
  std::vector<std::string> argv;  // argv[0]: path of the program (no PATH search)
  std::string rendezvous = "tcp"; // "tcp" or "file"
  std::chrono::milliseconds failure_grace{60000};
  std::chrono::milliseconds max_runtime{std::chrono::hours(1)};
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every worker
  bool verbose = true;  // launcher notes on stderr ("launcher: rank 1 ... died ...")
};

struct RankOutcome {
  int rank = -1;
  pid_t pid = -1;
  bool exited = false;             // exited normally (exit_code valid)
  int exit_code = 0;
  int signal = 0;                  // killed by this signal
  bool killed_by_launcher = false; // the signal came from the launcher's clean-up
  double seconds = 0;              // since the launch
  bool ok() const { return exited && exit_code == 0; }
  std::string describe() const;    // "rank 1 (pid 123) killed by signal 9 (SIGKILL) after 0.31 s"
};

struct LaunchResult {
  int exit_code = 0;             // 0: every rank exited 0; 1 otherwise
  int first_failed_rank = -1;
  std::string first_failure;     // RankOutcome::describe() of the first failure
  std::string rendezvous;        // the DSV41KV_RDZV given to the workers
  bool timed_out = false;        // max_runtime ran out
  std::vector<RankOutcome> ranks;
  std::string summary() const;   // one line per rank plus the verdict
};

// Starts the workers and returns when every one has ended (or was ended). Throws Error(kComm)
// only when the launch itself fails (fork, temp dir); worker failures are in the result.
LaunchResult launch_local(const LaunchOptions& options);

// The worker side: rank, world, device and rendezvous address from DSV41KV_* (set by the
// launcher), else from mpirun's variables (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK or
// PMI_RANK/PMI_SIZE) with DSV41KV_RDZV required; nullopt when none is set. E8 on malformed or
// inconsistent values.
struct WorkerEnv {
  int rank = 0;
  int world = 1;
  int device = 0;
  std::string rendezvous;
  std::string source;  // "launcher", "mpi"
};
std::optional<WorkerEnv> worker_env_from_environment();

// Path of the running executable (/proc/self/exe), for re-executing oneself as a worker.
std::string self_executable();

}  // namespace dsv41kv::comm

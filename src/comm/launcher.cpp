// Local launcher (see launcher.hpp): fork/execve P workers, poll them, contain failures.
#include "dsv41kv/launcher.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/rendezvous.hpp"
#include "dsv41kv/common.hpp"

extern char** environ;

namespace dsv41kv::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGINT: return "SIGINT";
    case SIGPIPE: return "SIGPIPE";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

int parse_env_int(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < 0 || v > 1 << 20)
    invalid_argument(fmt::format("environment {}='{}': not a non-negative integer", name, value));
  return static_cast<int>(v);
}

const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

std::string RankOutcome::describe() const {
  if (exited)
    return fmt::format("rank {} (pid {}) exited with code {} after {:.2f} s", rank, pid, exit_code, seconds);
  if (signal != 0)
    return fmt::format("rank {} (pid {}) killed by signal {} ({}){} after {:.2f} s", rank, pid, signal,
                       signal_name(signal), killed_by_launcher ? " from the launcher" : "", seconds);
  return fmt::format("rank {} (pid {}) still running", rank, pid);
}

std::string LaunchResult::summary() const {
  std::string s;
  for (const RankOutcome& r : ranks) s += "  " + r.describe() + "\n";
  if (exit_code == 0) s += fmt::format("all {} ranks succeeded", ranks.size());
  else if (first_failed_rank >= 0) s += "first failure: " + first_failure;
  else if (timed_out) s += "the run exceeded its maximum runtime";
  else s += "failed";
  return s;
}

std::string self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail(ErrorCode::kIo, fmt::format("cannot read /proc/self/exe: {}", ec.message()));
  return p.string();
}

std::optional<WorkerEnv> worker_env_from_environment() {
  WorkerEnv w;
  const char* r = getenv_nonempty("DSV41KV_RANK");
  const char* n = getenv_nonempty("DSV41KV_WORLD");
  if (r || n) {
    if (!r || !n) invalid_argument("environment: DSV41KV_RANK and DSV41KV_WORLD must be set together");
    w.rank = parse_env_int("DSV41KV_RANK", r);
    w.world = parse_env_int("DSV41KV_WORLD", n);
    const char* d = getenv_nonempty("DSV41KV_DEVICE");
    w.device = d ? parse_env_int("DSV41KV_DEVICE", d) : w.rank;
    w.source = "launcher";
  } else if (getenv_nonempty("OMPI_COMM_WORLD_RANK") || getenv_nonempty("PMI_RANK")) {
    const bool ompi = getenv_nonempty("OMPI_COMM_WORLD_RANK") != nullptr;
    const char* rn = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
    const char* sn = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    const char* sv = getenv_nonempty(sn);
    if (!sv) invalid_argument(fmt::format("environment: {} is set but {} is not", rn, sn));
    w.rank = parse_env_int(rn, getenv_nonempty(rn));
    w.world = parse_env_int(sn, sv);
    const char* lr = getenv_nonempty(ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID");
    const char* d = getenv_nonempty("DSV41KV_DEVICE");
    w.device = d ? parse_env_int("DSV41KV_DEVICE", d) : lr ? parse_env_int("local rank", lr) : w.rank;
    w.source = "mpi";
  } else {
    return std::nullopt;
  }
  if (w.world < 1 || w.rank >= w.world)
    invalid_argument(fmt::format("environment: rank {} outside world size {}", w.rank, w.world));
  const char* z = getenv_nonempty("DSV41KV_RDZV");
  if (!z && w.world > 1)
    invalid_argument(fmt::format("environment: DSV41KV_RDZV is not set (rank {} of {}); give "
                                 "file:/shared/path or tcp://127.0.0.1:PORT", w.rank, w.world));
  w.rendezvous = z ? z : "";
  return w;
}

LaunchResult launch_local(const LaunchOptions& o) {
  if (o.world < 1 || o.world > 1024)
    invalid_argument(fmt::format("launch_local: world size {} out of range [1, 1024]", o.world));
  if (o.argv.empty() || o.argv[0].empty()) invalid_argument("launch_local: empty argv");
  if (o.rendezvous != "tcp" && o.rendezvous != "file")
    invalid_argument(fmt::format("launch_local: rendezvous '{}': expected tcp or file", o.rendezvous));

  LaunchResult res;
  std::string tmpdir;
  if (o.rendezvous == "tcp") {
    res.rendezvous = fmt::format("tcp://127.0.0.1:{}", pick_free_loopback_port());
  } else {
    const char* base = getenv_nonempty("TMPDIR");
    std::string templ = fmt::format("{}/dsv41kv-rdzv-XXXXXX", base ? base : "/tmp");
    if (!::mkdtemp(templ.data()))
      fail(ErrorCode::kComm, fmt::format("launch_local: mkdtemp({}) failed: {}", templ, std::strerror(errno)));
    tmpdir = templ;
    res.rendezvous = "file:" + tmpdir + "/unique_id";
  }

  // Everything execve needs is built before fork (the child only calls async-signal-safe
  // functions).
  auto ours = [](const std::string& kv) {
    for (const char* k : {"DSV41KV_RANK=", "DSV41KV_WORLD=", "DSV41KV_RDZV=", "DSV41KV_DEVICE="})
      if (kv.rfind(k, 0) == 0) return true;
    return false;
  };
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e)
    if (!ours(*e)) base_env.emplace_back(*e);
  for (const auto& [k, v] : o.env) {
    const std::string prefix = k + "=";
    base_env.erase(std::remove_if(base_env.begin(), base_env.end(),
                                  [&](const std::string& s) { return s.rfind(prefix, 0) == 0; }),
                   base_env.end());
    base_env.push_back(prefix + v);
  }
  std::vector<char*> args;
  for (const std::string& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  res.ranks.resize(static_cast<size_t>(o.world));
  std::vector<char> done(static_cast<size_t>(o.world), 0);
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(o.world));
  std::fflush(stdout);
  std::fflush(stderr);

  auto kill_alive = [&](int sig) {
    for (int k = 0; k < o.world; ++k) {
      RankOutcome& r = res.ranks[static_cast<size_t>(k)];
      if (!done[static_cast<size_t>(k)] && r.pid > 0) {
        ::kill(r.pid, sig);
        r.killed_by_launcher = true;
      }
    }
  };
  // Reaps whatever has ended; returns the ranks that ended in this round.
  auto reap = [&]() {
    std::vector<int> ended;
    for (int k = 0; k < o.world; ++k) {
      RankOutcome& r = res.ranks[static_cast<size_t>(k)];
      if (done[static_cast<size_t>(k)] || r.pid <= 0) continue;
      int status = 0;
      const pid_t p = ::waitpid(r.pid, &status, WNOHANG);
      if (p == 0) continue;
      if (p < 0 && errno == EINTR) continue;
      done[static_cast<size_t>(k)] = 1;
      r.seconds = since();
      if (p < 0) {  // not our child any more (should not happen): count as failed
        r.exited = true;
        r.exit_code = 255;
      } else if (WIFEXITED(status)) {
        r.exited = true;
        r.exit_code = WEXITSTATUS(status);
        r.killed_by_launcher = false;
      } else if (WIFSIGNALED(status)) {
        r.signal = WTERMSIG(status);
      }
      ended.push_back(k);
    }
    return ended;
  };
  auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](char c) { return c != 0; }); };

  for (int k = 0; k < o.world; ++k) {
    std::vector<std::string>& env = envs[static_cast<size_t>(k)];
    env = base_env;
    env.push_back(fmt::format("DSV41KV_RANK={}", k));
    env.push_back(fmt::format("DSV41KV_WORLD={}", o.world));
    env.push_back(fmt::format("DSV41KV_RDZV={}", res.rendezvous));
    env.push_back(fmt::format("DSV41KV_DEVICE={}", k));
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string exec_fail = fmt::format("launcher: rank {}: execve({}) failed\n", k, o.argv[0]);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(args[0], args.data(), envp.data());
      const ssize_t ignored = ::write(2, exec_fail.data(), exec_fail.size());
      (void)ignored;
      ::_exit(127);
    }
    if (pid < 0) {
      const int e = errno;
      kill_alive(SIGKILL);
      for (int j = 0; j < k; ++j) ::waitpid(res.ranks[static_cast<size_t>(j)].pid, nullptr, 0);
      if (!tmpdir.empty()) std::filesystem::remove_all(tmpdir);
      fail(ErrorCode::kComm, fmt::format("launch_local: fork for rank {} failed: {}", k, std::strerror(e)));
    }
    res.ranks[static_cast<size_t>(k)].rank = k;
    res.ranks[static_cast<size_t>(k)].pid = pid;
  }

  const auto run_deadline = t0 + o.max_runtime;
  std::optional<Clock::time_point> grace_deadline;
  for (;;) {
    std::vector<int> ended = reap();
    if (res.first_failed_rank < 0) {
      // Among ranks that ended in the same round a signal death is the more likely cause.
      std::stable_sort(ended.begin(), ended.end(), [&](int a, int b) {
        return res.ranks[static_cast<size_t>(a)].signal != 0 && res.ranks[static_cast<size_t>(b)].signal == 0;
      });
      for (int k : ended) {
        const RankOutcome& r = res.ranks[static_cast<size_t>(k)];
        if (r.ok()) continue;
        res.first_failed_rank = k;
        res.first_failure = r.describe();
        grace_deadline = Clock::now() + o.failure_grace;
        if (o.verbose && !all_done())
          std::fprintf(stderr, "launcher: %s; giving the other ranks up to %.1f s to end on their own\n",
                       res.first_failure.c_str(), std::chrono::duration<double>(o.failure_grace).count());
        break;
      }
    }
    if (all_done()) break;
    const auto now = Clock::now();
    const bool grace_over = grace_deadline && now >= *grace_deadline;
    const bool run_over = now >= run_deadline;
    if (grace_over || run_over) {
      if (run_over && !grace_over) res.timed_out = true;
      if (o.verbose) {
        std::string alive;
        for (int k = 0; k < o.world; ++k)
          if (!done[static_cast<size_t>(k)]) alive += fmt::format("{}{}", alive.empty() ? "" : ",", k);
        std::fprintf(stderr, "launcher: %s; terminating rank(s) %s\n",
                     grace_over ? "ranks still alive after the failure grace period"
                                : "maximum runtime exceeded",
                     alive.c_str());
      }
      kill_alive(SIGTERM);
      const auto term_deadline = Clock::now() + std::chrono::seconds(2);
      while (!all_done() && Clock::now() < term_deadline) {
        reap();
        std::this_thread::sleep_for(milliseconds(10));
      }
      kill_alive(SIGKILL);
      const auto kill_deadline = Clock::now() + std::chrono::seconds(10);
      while (!all_done() && Clock::now() < kill_deadline) {
        reap();
        std::this_thread::sleep_for(milliseconds(10));
      }
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  if (!tmpdir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tmpdir, ec);
  }
  bool ok = !res.timed_out;
  for (const RankOutcome& r : res.ranks) ok = ok && r.ok();
  res.exit_code = ok ? 0 : 1;
  if (!ok && res.first_failed_rank < 0 && res.timed_out) res.first_failure = "maximum runtime exceeded";
  return res;
}

}  // namespace dsv41kv::comm

// Local launcher: environment of the workers, success, a worker killed by a signal or failing
// (first failure named, the others given the grace period, then ended), max runtime, exec
// failure; the worker-side environment parser. Workers are /bin/sh scripts: no GPU needed.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "dsv41kv/launcher.hpp"
#include "dsv41kv/common.hpp"
#include "support/cli.hpp"

using namespace dsv41kv;
using namespace dsv41kv::comm;
using dsv41kv::test::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

LaunchOptions sh(int world, const std::string& script) {
  LaunchOptions o;
  o.world = world;
  o.argv = {"/bin/sh", "-c", script};
  o.verbose = false;
  return o;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Sets environment variables for one scope (the tests run single-threaded).
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& k, const char* v) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    if (v) ::setenv(k.c_str(), v, 1);
    else ::unsetenv(k.c_str());
  }
  ~ScopedEnv() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
};

}  // namespace

TEST(Launcher, EveryRankGetsItsEnvironment) {
  TempDir d;
  auto o = sh(4, "echo \"$DSV41KV_RANK $DSV41KV_WORLD $DSV41KV_DEVICE $DSV41KV_RDZV $EXTRA\" > " + (d / "out.$DSV41KV_RANK"));
  o.env = {{"EXTRA", "x=1"}};
  const LaunchResult r = launch_local(o);
  ASSERT_EQ(r.exit_code, 0) << r.summary();
  EXPECT_EQ(r.first_failed_rank, -1);
  EXPECT_EQ(r.rendezvous.rfind("tcp://127.0.0.1:", 0), 0u) << r.rendezvous;
  for (int k = 0; k < 4; ++k) {
    std::ifstream f(d / ("out." + std::to_string(k)));
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, fmt::format("{} 4 {} {} x=1", k, k, r.rendezvous));
    EXPECT_TRUE(r.ranks[static_cast<size_t>(k)].ok());
  }
}

TEST(Launcher, FileRendezvousDirectoryIsCreatedAndRemoved) {
  auto o = sh(2, "d=${DSV41KV_RDZV#file:}; test -d \"$(dirname \"$d\")\"");
  o.rendezvous = "file";
  const LaunchResult r = launch_local(o);
  ASSERT_EQ(r.exit_code, 0) << r.summary();
  ASSERT_EQ(r.rendezvous.rfind("file:/", 0), 0u) << r.rendezvous;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(r.rendezvous.substr(5)).parent_path()));
}

TEST(Launcher, ASignalDeathIsNamedAndHangingPeersAreEndedAfterTheGrace) {
  // Rank 1 kills itself; the others would sleep for 60 s.
  auto o = sh(3, "if [ \"$DSV41KV_RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 60");
  o.failure_grace = 500ms;
  const auto t0 = Clock::now();
  const LaunchResult r = launch_local(o);
  const double s = seconds_since(t0);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.first_failed_rank, 1);
  EXPECT_NE(r.first_failure.find("rank 1"), std::string::npos) << r.first_failure;
  EXPECT_NE(r.first_failure.find("SIGKILL"), std::string::npos) << r.first_failure;
  EXPECT_FALSE(r.ranks[1].killed_by_launcher);
  for (int k : {0, 2}) {
    EXPECT_TRUE(r.ranks[static_cast<size_t>(k)].killed_by_launcher) << r.summary();
    EXPECT_EQ(r.ranks[static_cast<size_t>(k)].signal, SIGTERM) << r.summary();
  }
  EXPECT_LT(s, 5.0) << "launcher took " << s << " s";
  EXPECT_NE(r.summary().find("first failure: rank 1"), std::string::npos) << r.summary();
}

TEST(Launcher, PeersThatFailOnTheirOwnAreNotKilled) {
  // Rank 2 exits 3 at once; the others notice "within their timeout" (0.3 s) and exit 1.
  auto o = sh(4, "if [ \"$DSV41KV_RANK\" = 2 ]; then exit 3; fi; sleep 0.3; exit 1");
  o.failure_grace = 10s;
  const auto t0 = Clock::now();
  const LaunchResult r = launch_local(o);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.first_failed_rank, 2) << r.summary();
  EXPECT_NE(r.first_failure.find("exited with code 3"), std::string::npos) << r.first_failure;
  for (const auto& k : r.ranks) {
    EXPECT_FALSE(k.killed_by_launcher) << k.describe();
    EXPECT_TRUE(k.exited);
  }
}

TEST(Launcher, PeersThatIgnoreSigtermGetSigkill) {
  auto o = sh(2, "if [ \"$DSV41KV_RANK\" = 0 ]; then exit 5; fi; trap '' TERM; while :; do sleep 0.1; done");
  o.failure_grace = 200ms;
  const auto t0 = Clock::now();
  const LaunchResult r = launch_local(o);
  EXPECT_LT(seconds_since(t0), 8.0);
  EXPECT_EQ(r.first_failed_rank, 0);
  EXPECT_EQ(r.ranks[1].signal, SIGKILL) << r.summary();
  EXPECT_TRUE(r.ranks[1].killed_by_launcher);
}

TEST(Launcher, MaxRuntimeBoundsAHealthyButEndlessRun) {
  auto o = sh(2, "exec sleep 60");
  o.max_runtime = 400ms;
  const auto t0 = Clock::now();
  const LaunchResult r = launch_local(o);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.first_failed_rank, -1);
  EXPECT_NE(r.summary().find("maximum runtime"), std::string::npos) << r.summary();
}

TEST(Launcher, ExecFailureIsAFailedRank) {
  LaunchOptions o;
  o.world = 2;
  o.argv = {"/nonexistent/dsv41kv-worker"};
  o.failure_grace = 2s;
  o.verbose = false;
  const LaunchResult r = launch_local(o);
  EXPECT_EQ(r.exit_code, 1);
  for (const auto& k : r.ranks) EXPECT_EQ(k.exit_code, 127) << k.describe();
}

TEST(Launcher, BadOptionsAreE8) {
  LaunchOptions o;
  o.world = 0;
  o.argv = {"/bin/true"};
  EXPECT_THROW(launch_local(o), Error);
  o.world = 1;
  o.argv = {};
  EXPECT_THROW(launch_local(o), Error);
  o.argv = {"/bin/true"};
  o.rendezvous = "udp";
  EXPECT_THROW(launch_local(o), Error);
}

TEST(WorkerEnv, FromLauncherVariables) {
  ScopedEnv e;
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "DSV41KV_DEVICE"}) e.set(k, nullptr);
  e.set("DSV41KV_RANK", nullptr);
  e.set("DSV41KV_WORLD", nullptr);
  EXPECT_FALSE(worker_env_from_environment().has_value());
  e.set("DSV41KV_RANK", "2");
  e.set("DSV41KV_WORLD", "4");
  e.set("DSV41KV_RDZV", "tcp://127.0.0.1:1234");
  auto w = worker_env_from_environment();
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->rank, 2);
  EXPECT_EQ(w->world, 4);
  EXPECT_EQ(w->device, 2);
  EXPECT_EQ(w->rendezvous, "tcp://127.0.0.1:1234");
  EXPECT_EQ(w->source, "launcher");
  e.set("DSV41KV_DEVICE", "0");
  EXPECT_EQ(worker_env_from_environment()->device, 0);
  e.set("DSV41KV_RANK", "4");
  EXPECT_THROW(worker_env_from_environment(), Error);
  e.set("DSV41KV_RANK", "x");
  EXPECT_THROW(worker_env_from_environment(), Error);
  e.set("DSV41KV_RANK", "1");
  e.set("DSV41KV_RDZV", nullptr);
  EXPECT_THROW(worker_env_from_environment(), Error);
}

TEST(WorkerEnv, FromMpirunVariables) {
  ScopedEnv e;
  for (const char* k : {"DSV41KV_RANK", "DSV41KV_WORLD", "DSV41KV_DEVICE", "PMI_RANK"}) e.set(k, nullptr);
  e.set("OMPI_COMM_WORLD_RANK", "3");
  e.set("OMPI_COMM_WORLD_SIZE", "8");
  e.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  e.set("DSV41KV_RDZV", "file:/shared/id");
  auto w = worker_env_from_environment();
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->rank, 3);
  EXPECT_EQ(w->world, 8);
  EXPECT_EQ(w->device, 1);
  EXPECT_EQ(w->source, "mpi");
  e.set("OMPI_COMM_WORLD_SIZE", nullptr);
  EXPECT_THROW(worker_env_from_environment(), Error);
}

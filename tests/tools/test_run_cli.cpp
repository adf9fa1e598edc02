// `dsv41kv run`: exit codes 0/1/2, the default --verify run, JSON output, E6, the hidden
// mutation switch that makes --verify exit 1 with the first difference, and the library's worker
// loop that --launch local runs in each process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv41kv/comm.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/test_seam.hpp"
#include "support/cli.hpp"

namespace {

using dsv41kv::test::CliRun;

// `dsv41kv run <args>` in a private temporary directory (the shared runner of tests/support).
CliRun run(const std::string& args) {
  const dsv41kv::test::TempDir tmp;
  return dsv41kv::test::run_cli("run " + args, tmp);
}

}  // namespace

// The default workload (8 query heads to keep the debug builds quick): the write path and the read
// path identical to P = 1 for every P, a line each.
TEST(CliRun, DefaultVerifyIsIdenticalAndPrintsCommunication) {
  const CliRun r = run("--pcp 2,3,4,8 --verify --heads 8");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int P : {2, 3, 4, 8}) {
    const std::string p = std::to_string(P);
    EXPECT_NE(r.out.find("P = " + p), std::string::npos);
    EXPECT_NE(r.out.find("verify P=" + p + ": identical"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("verify P=" + p + " attention: identical to P=1 at all 14 steps"), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("read path: 8 heads, compressed cache v4_584, SWA cache v4_584"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read path over all ranks:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("swa kv"), std::string::npos);
  EXPECT_NE(r.out.find("kv all-gath"), std::string::npos);
  EXPECT_NE(r.out.find("ratio-2 linking"), std::string::npos);
}

// The model's 64 heads (the default), always scored, ratio 1, and the read path turned off.
TEST(CliRun, ReadPathOptions) {
  const CliRun r = run("--pcp 2 --verify --requests 3 --prompt-len 3:30 --ratio 1 --topk scored");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("read path: 64 heads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-k always scored"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-k from the shortcut at 0 of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verify P=2 attention: identical"), std::string::npos) << r.out;
  const CliRun off = run("--pcp 2 --verify --steps 2 --read-path off");
  ASSERT_EQ(off.code, 0) << off.out << off.err;
  EXPECT_NE(off.out.find("read path: not run (--read-path off)"), std::string::npos) << off.out;
  EXPECT_NE(off.out.find("verify P=2 attention: not checked (--read-path off)"), std::string::npos) << off.out;
  EXPECT_NE(off.out.find("verify P=2: identical"), std::string::npos) << off.out;
  for (const std::string bad : {"--heads 12", "--topk best", "--read-path maybe", "--read-path off --mutation perturb-attention"}) {
    const CliRun b = run("--pcp 2 --steps 1 " + bad);
    EXPECT_EQ(b.code, 2) << bad << "\n" << b.out << b.err;
  }
}

TEST(CliRun, JsonCarriesPerRankBytesThatMatchTheCommunicator) {
  const CliRun r = run("--pcp 3 --verify --json --requests 5 --prompt-len 3:40 --decode-placement owner --heads 8");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_TRUE(j["workload"]["read_path"].get<bool>());
  const auto& run0 = j["runs"][0];
  EXPECT_EQ(run0["P"], 3);
  EXPECT_TRUE(run0["verify"]["identical"].get<bool>());
  const auto& attn = run0["verify"]["attention"];
  EXPECT_TRUE(attn["checked"].get<bool>());
  EXPECT_TRUE(attn["identical"].get<bool>());
  ASSERT_GT(run0["steps"].size(), 0u);
  uint64_t rows = 0;
  for (const auto& s : run0["steps"]) {
    ASSERT_EQ(s["ranks"].size(), 3u);
    for (const auto& rk : s["ranks"]) {
      EXPECT_EQ(rk["received"], rk["measured_received"]);
      EXPECT_EQ(rk["sent"], rk["measured_sent"]);
      EXPECT_EQ(rk["replaced_allgather_received"].get<uint64_t>(), 3u * s["padded"].get<uint64_t>() * 4096u);
      EXPECT_EQ(rk["swa_kv_received"].get<uint64_t>(), 3u * s["padded"].get<uint64_t>() * 1024u);
    }
    uint64_t step_rows = 0;
    for (const auto& n : s["tokens_per_rank"]) step_rows += n.get<uint64_t>();
    rows += step_rows;
    EXPECT_EQ(s["read_path"]["decode_rows"].get<uint64_t>() + s["read_path"]["prefill_rows"].get<uint64_t>(), step_rows);
  }
  // every row of every rank compared: its top-k row, 8 x 512 outputs and 8 lse
  EXPECT_EQ(attn["token_rows"].get<uint64_t>(), rows);
  EXPECT_EQ(attn["output_elements"].get<uint64_t>(), rows * 8 * 512);
  EXPECT_EQ(attn["lse_elements"].get<uint64_t>(), rows * 8);
  EXPECT_EQ(attn["topk_entries"].get<uint64_t>(), rows * 512);
  EXPECT_EQ(attn["output_mismatched"].get<uint64_t>(), 0u);
  EXPECT_GT(attn["read_cache_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(run0["read_path"]["swa_keys"].get<int64_t>(), 0);
}

TEST(CliRun, RatioOneAndFormatsAndStepLimit) {
  const CliRun r = run("--pcp 2,3 --verify --ratio 1 --format v4_584,bf16 --steps 3 --seed 9 --heads 8");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("identical to P=1 at all 3 steps"), std::string::npos) << r.out;
}

TEST(CliRun, AMutationMakesVerifyExit1WithTheFirstDifference) {
  const CliRun r = run("--pcp 2 --verify --heads 8 --mutation drop-gathered-predecessors");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("DIFFERENCE at step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensor latent index"), std::string::npos) << r.out;
  const CliRun s = run("--pcp 4 --verify --heads 8 --mutation skip-save-ring-rows");
  EXPECT_EQ(s.code, 1);
  EXPECT_NE(s.out.find("tensor ring"), std::string::npos) << s.out;
}

// The read path's seam: one bf16 element of the last rank's output off by one ulp, and the SWA
// insert of each rank's own rows only; both make --verify exit 1 naming the tensor and the rank.
TEST(CliRun, AWrongAttentionOutputOnOneRankMakesVerifyExit1) {
  const CliRun r = run("--pcp 2,3 --verify --heads 8 --mutation perturb-attention");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("verify P=2: DIFFERENCE at step 0 rank 1 tensor attention.out"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verify P=3: DIFFERENCE at step 0 rank 2 tensor attention.out"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verify P=2 attention: 1 of"), std::string::npos) << r.out;
  const CliRun s = run("--pcp 2 --verify --heads 8 --mutation local-swa-insert --json");
  EXPECT_EQ(s.code, 1) << s.out << s.err;
  const auto j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["runs"][0]["verify"]["first_difference"]["tensor"], "read.swa_cache");
  EXPECT_FALSE(j["runs"][0]["verify"]["attention"]["identical"].get<bool>());
  EXPECT_GT(j["runs"][0]["verify"]["attention"]["output_mismatched"].get<uint64_t>(), 0u);
}

TEST(CliRun, BadFlagsExit2AndSpecWithPcpIsE6) {
  EXPECT_EQ(run("--pcp 0").code, 2);
  EXPECT_EQ(run("--pcp 2,x").code, 2);
  EXPECT_EQ(run("--prompt-len 9").code, 2);
  EXPECT_EQ(run("--prompt-len 9:3").code, 2);
  EXPECT_EQ(run("--decode-placement everywhere").code, 2);
  EXPECT_EQ(run("--ratio 4").code, 2);
  EXPECT_EQ(run("--format v9").code, 2);
  EXPECT_EQ(run("--no-such-flag").code, 2);
  // sizes: out of range is exit 2 naming the flag, before anything is allocated (these used to
  // end in std::bad_alloc, exit 3)
  for (const std::string flag : {"--graph-pad 99999999999", "--states-per-page 99999999999",
                                 "--num-speculative-tokens 99999999999999999999", "--steps abc",
                                 "--steps -3", "--seed -1", "--seed 18446744073709551616",
                                 "--timeout nan", "--max-runtime nan", "--null-fraction inf"}) {
    const CliRun r = run(flag);
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.err;
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos) << flag << ": " << r.err;
  }
  // in range, but more than any machine's memory (a 2048-row ring for each of 100000 requests,
  // ~800 GiB, and a 65536-state page per request and format, ~16 TiB): rejected by the
  // simulation's estimate
  const CliRun big = run("--pcp 1 --requests 100000 --num-speculative-tokens 1024 --states-per-page 65536 --steps 1");
  EXPECT_EQ(big.code, 2) << big.err;
  EXPECT_NE(big.err.find("needs about"), std::string::npos) << big.err;
  EXPECT_NE(big.err.find("capacity 2048"), std::string::npos) << big.err;
  const CliRun e6 = run("--pcp 2 --num-speculative-tokens 1");
  EXPECT_EQ(e6.code, 2);
  EXPECT_NE(e6.err.find("E6:"), std::string::npos) << e6.err;
  EXPECT_NE(e6.err.find("speculative decoding"), std::string::npos) << e6.err;
  // the largest seed is taken as written (CLI11 alone wrapped -1 and saturated 2^64 to it)
  const CliRun top = run("--pcp 1 --steps 1 --heads 8 --seed 18446744073709551615");
  EXPECT_EQ(top.code, 0) << top.err;
  EXPECT_NE(top.out.find("seed 18446744073709551615,"), std::string::npos) << top.out;
  // P = 1 with speculative tokens is no PCP: allowed.
  EXPECT_EQ(run("--pcp 1 --num-speculative-tokens 1 --steps 2 --heads 8").code, 0);
}

// The worker loop behind `run --launch local` (pcp::run_worker_rank) with P ranks as threads on
// the CPU: every step of every rank verified against the CPU run of all ranks, the communicator's
// bytes equal to SPEC 7.7, and a broken step (the test seam) reported as the first difference.
TEST(CliRun, WorkerLoopVerifiesEveryRank) {
  using namespace dsv41kv;
  pcp::WorkloadConfig wc;
  wc.seed = 5;
  wc.num_requests = 5;
  wc.prompt_max = 40;
  const pcp::Workload w = pcp::generate_workload(wc);
  for (const bool broken : {false, true}) {
    pcp::SimConfig sc;
    if (broken) sc.fault = seam::PcpFault::kDropGatheredPredecessors;
    constexpr int P = 2;
    ThreadGroup group(P);
    std::vector<pcp::WorkerResult> res(P);
    std::vector<int64_t> seen(P, 0), started(P, 0);
    group.run([&](Communicator& comm) {
      const auto k = static_cast<size_t>(comm.rank());
      pcp::WorkerOptions o;
      o.verify = true;
      o.at_step_start = [&, k](int64_t) { ++started[k]; };
      o.on_step = [&, k](const pcp::WorkerStep& st) {
        ++seen[k];
        EXPECT_EQ(st.rank, static_cast<int>(k));
      };
      res[k] = pcp::run_worker_rank(sc, w, comm, o);
    });
    for (size_t k = 0; k < P; ++k) {
      SCOPED_TRACE("rank " + std::to_string(k) + (broken ? " broken" : ""));
      EXPECT_EQ(res[k].rank, static_cast<int>(k));
      EXPECT_EQ(seen[k], res[k].steps_run);
      EXPECT_EQ(started[k], res[k].steps_run);
      EXPECT_EQ(res[k].sent, res[k].expected.sent());
      EXPECT_EQ(res[k].received, res[k].expected.received());
      if (!broken) {
        EXPECT_FALSE(res[k].first_mismatch) << res[k].first_mismatch->to_string();
        EXPECT_EQ(res[k].steps_run, static_cast<int64_t>(w.steps.size()));
        EXPECT_GT(res[k].rank_vs_cpu.cache_bytes, 0u);
        EXPECT_GT(res[k].cpu_vs_references.latent_elements, 0u);
      } else {
        ASSERT_TRUE(res[k].first_mismatch);
        EXPECT_EQ(res[k].first_mismatch->tensor, "latent") << res[k].first_mismatch->to_string();
      }
    }
  }
}

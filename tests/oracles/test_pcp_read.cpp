// The read path under PCP (SPEC 7.6 steps 2-4, 7.8, 7.9): every rank inserts the step's gathered
// kv rows into its SWA cache and the gathered latents into its index-K cache, then attends its own
// query rows; every token's top-k row, attention output (after the inverse RoPE) and lse, on every
// rank that holds it, and every byte of the read path's caches must equal the single-rank layer's
// (pcp::SimConfig::read_path). The seam's read-path faults show that the comparison fails when one
// element of one rank's output is wrong and when the SWA rows are not gathered.
// GCC 12 reports a false -Wmaybe-uninitialized inside SimConfig's default formats list here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "dsv41kv/comm.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/test_seam.hpp"
#include "oracles/pcp_workloads.hpp"
#include "support/errors.hpp"

namespace dsv41kv::pcp {
namespace {

using test_workloads::random_config;

constexpr int kHeads = 8;
constexpr RecordFormat kFormats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288,
                                     RecordFormat::PLAIN_BF16, RecordFormat::PLAIN_FP8};

SimConfig read_config(int ratio) {
  SimConfig sc;
  sc.ratio = ratio;
  sc.states_per_page = ratio == 2 ? 4 : 8;
  sc.read_path = true;
  sc.num_heads = kHeads;
  return sc;
}

// Every real row of every rank over the steps (the rows the check must have compared).
uint64_t rank_rows(const RunResult& res) {
  uint64_t n = 0;
  for (const StepReport& s : res.steps)
    for (int64_t t : s.tokens_per_rank) n += static_cast<uint64_t>(t);
  return n;
}

struct ReadCoverage {
  int64_t decode_rows = 0, prefill_rows = 0, prefill_chunks = 0, shortcut_steps = 0, scored_steps = 0;
  int64_t null_block_tokens = 0, padded_rows = 0, continued = 0, odd_continued = 0, topk_entries = 0, swa_keys = 0;
  bool owner = false, replicated = false;
};

class PcpReadPath : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Random workloads for P = 1..8 and both ratios; per workload the placement (replicated, owner),
// the top-k branch (the shortcut these short sequences take, or always scored) and the record
// format the attention reads rotate.
TEST_P(PcpReadPath, AttentionIsBitIdenticalToOneRankOnEveryRank) {
  const auto [P, ratio] = GetParam();
  ReadCoverage cov;
  const int n = test_workloads::sweep(4);
  for (int i = 0; i < n; ++i) {
    const uint64_t seed = 7000 + static_cast<uint64_t>(100 * P + 10 * ratio + i);
    const Workload w = generate_workload(random_config(seed));
    SimConfig sc = read_config(ratio);
    sc.placement = i % 2 ? DecodePlacement::kOwner : DecodePlacement::kReplicated;
    sc.scored_topk = (i / 2) % 2 == 1;
    sc.formats = {kFormats[static_cast<size_t>(i + P) % 5]};
    const RunResult res = run_simulation(sc, w, P, /*verify=*/true);
    ASSERT_FALSE(res.first_mismatch) << "P " << P << " ratio " << ratio << " seed " << seed << " placement "
                                     << placement_name(sc.placement) << " format "
                                     << record_info(sc.formats[0]).name << ": " << res.first_mismatch->to_string();
    ASSERT_EQ(res.steps.size(), w.steps.size());
    const CheckStats& st = res.stats;
    const uint64_t rows = rank_rows(res);
    EXPECT_EQ(st.attention_rows, rows);
    EXPECT_EQ(st.output_elements, rows * kHeads * kLatentDim);
    EXPECT_EQ(st.lse_elements, rows * kHeads);
    EXPECT_EQ(st.topk_entries, rows * kIndexTopk);
    EXPECT_GT(st.read_cache_bytes, 0u);
    EXPECT_GT(st.cache_bytes, 0u);
    (sc.placement == DecodePlacement::kOwner ? cov.owner : cov.replicated) = true;
    for (size_t j = 0; j < res.steps.size(); ++j) {
      const StepReport& s = res.steps[j];
      cov.decode_rows += s.read.decode_rows;
      cov.prefill_rows += s.read.prefill_rows;
      cov.prefill_chunks += s.read.prefill_chunks;
      cov.topk_entries += s.read.topk_entries;
      cov.swa_keys += s.read.swa_keys;
      (s.read.shortcut_steps ? cov.shortcut_steps : cov.scored_steps) += 1;
      cov.null_block_tokens += s.null_block_tokens;
      for (int64_t t : s.tokens_per_rank) cov.padded_rows += s.padded - t;
      for (const auto& r : w.steps[j]) {
        cov.continued += r.req.is_prefilling && r.req.num_computed > 0;
        cov.odd_continued += r.req.is_prefilling && r.req.num_computed % 2 == 1;
      }
      EXPECT_EQ(s.read.decode_rows + s.read.prefill_rows, std::accumulate(s.tokens_per_rank.begin(), s.tokens_per_rank.end(),
                                                                int64_t{0}));
      // The communicator moved SPEC 7.7's volume, the SWA kv rows of the read path included.
      const int64_t link_rows = ratio == 2 ? std::min(s.padded, 2 * w.config.max_num_seqs) : 0;
      const CommVolume ev = expected_comm_volume(P, s.padded, link_rows, ratio, /*swa_kv=*/true);
      for (int k = 0; k < P; ++k) {
        ASSERT_EQ(s.measured_received[static_cast<size_t>(k)], ev.received()) << "step " << j << " rank " << k;
        ASSERT_EQ(s.measured_sent[static_cast<size_t>(k)], ev.sent()) << "step " << j << " rank " << k;
        ASSERT_EQ(s.volume[static_cast<size_t>(k)].swa_kv_received, ev.swa_kv_received);
      }
    }
  }
  // The workloads exercised what SPEC 7.6 / 7.9 and 10.6 list for the read path.
  EXPECT_GT(cov.decode_rows, 0);
  EXPECT_GT(cov.prefill_rows, 0);
  EXPECT_GT(cov.prefill_chunks, 0);
  EXPECT_GT(cov.topk_entries, 0);  // keys were attended: compressed entries and window tokens
  EXPECT_GT(cov.swa_keys, 0);
  EXPECT_GT(cov.null_block_tokens, 0);
  EXPECT_GT(cov.continued, 0);
  EXPECT_GT(cov.odd_continued, 0);  // prefills resumed at odd positions (the local chunks start anywhere)
  EXPECT_GT(cov.padded_rows, 0);
  if (n >= 4) {
    EXPECT_GT(cov.shortcut_steps, 0);
    EXPECT_GT(cov.scored_steps, 0);
    EXPECT_TRUE(cov.owner && cov.replicated);
  }
}

INSTANTIATE_TEST_SUITE_P(Workloads, PcpReadPath,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(2, 1)),
                         [](const auto& info) {
                           std::string name = "P";  // appended, not concatenated: GCC 12's -Wrestrict false positive
                           name += std::to_string(std::get<0>(info.param));
                           name += "_r";
                           name += std::to_string(std::get<1>(info.param));
                           return name;
                         });

// Requests admitted beyond 512 visible compressed entries: the scores select a strict subset of
// the entries (the longest top-k is full, 512 entries), over the keys of the prefix that was
// computed before the simulation, and still every rank equals the single-rank run.
TEST(PcpReadPathLong, TheScoredTopKSelectsOverALongPrefix) {
  for (const int ratio : {1, 2}) {
    WorkloadConfig wc;
    wc.seed = 31 + static_cast<uint64_t>(ratio);
    wc.num_requests = 2;
    wc.prompt_min = 12;
    wc.prompt_max = 16;
    wc.start_min = ratio == 2 ? 1031 : 517;  // n_c = (p + 1) / ratio > 512 at every position
    wc.start_max = wc.start_min + 20;
    wc.decode_steps = 1;
    wc.chunk_budget = 16;
    wc.max_num_seqs = 2;
    wc.null_block_fraction = 0.0;
    const Workload w = generate_workload(wc);
    {  // one P per ratio: the scores over > 512 entries per token are the slow part of the debug builds
      const int P = ratio + 1;
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " P " + std::to_string(P));
      const RunResult res = run_simulation(read_config(ratio), w, P, /*verify=*/true);
      ASSERT_FALSE(res.first_mismatch) << res.first_mismatch->to_string();
      EXPECT_EQ(res.stats.attention_rows, rank_rows(res));
      int64_t scored = 0, longest = 0, decode = 0, prefill = 0;
      for (const StepReport& s : res.steps) {
        scored += 1 - s.read.shortcut_steps;
        longest = std::max(longest, s.read.topk_max);
        decode += s.read.decode_rows;
        prefill += s.read.prefill_rows;
      }
      EXPECT_EQ(scored, static_cast<int64_t>(res.steps.size())) << "max seq_len / ratio > 512: never the shortcut";
      EXPECT_EQ(longest, kIndexTopk);
      EXPECT_GT(decode, 0);
      EXPECT_GT(prefill, 0);
    }
  }
}

// The seam's doctored output: one bf16 element of the last rank's last token off by one ulp at
// every step. The check names that rank and tensor first and counts exactly one element per step
// in which the rank had a token; nothing else differs.
TEST(PcpReadPathMutation, AWrongOutputOnOneRankIsCaught) {
  const Workload w = generate_workload(random_config(91));
  for (const int P : {2, 4}) {
    SimConfig sc = read_config(2);
    sc.fault = seam::PcpFault::kPerturbAttention;
    const RunResult res = run_simulation(sc, w, P, /*verify=*/true, /*keep_going=*/true);
    ASSERT_TRUE(res.first_mismatch) << "P " << P << ": the perturbed output went unnoticed";
    EXPECT_EQ(res.first_mismatch->tensor, "attention.out") << res.first_mismatch->to_string();
    EXPECT_EQ(res.first_mismatch->rank, P - 1);
    uint64_t steps_with_tokens = 0;
    for (const StepReport& s : res.steps) steps_with_tokens += s.tokens_per_rank.back() > 0;
    const CheckStats& st = res.stats;
    EXPECT_GT(steps_with_tokens, 0u);
    EXPECT_EQ(st.output_mismatched, steps_with_tokens);
    EXPECT_EQ(st.lse_mismatched, 0u);
    EXPECT_EQ(st.topk_mismatched, 0u);
    EXPECT_EQ(st.read_cache_mismatched, 0u);
    EXPECT_EQ(st.latent_mismatched + st.cache_mismatched + st.ring_mismatched + st.link_mismatched, 0u);
  }
}

// The SWA insert of each rank's own rows only (SPEC 7.6 step 3 without the gather): the SWA caches
// differ first, and the attention outputs of tokens whose window holds another rank's rows
// follow; the top-k, which does not read the SWA cache, does not change. With one rank every row
// is its own, and nothing differs.
TEST(PcpReadPathMutation, AnUngatheredSwaInsertIsCaught) {
  const Workload w = generate_workload(random_config(92));
  for (const int P : {1, 2, 3}) {
    SimConfig sc = read_config(2);
    sc.fault = seam::PcpFault::kLocalSwaInsert;
    const RunResult res = run_simulation(sc, w, P, /*verify=*/true, /*keep_going=*/true);
    if (P == 1) {
      EXPECT_FALSE(res.first_mismatch) << res.first_mismatch->to_string();
      continue;
    }
    ASSERT_TRUE(res.first_mismatch) << "P " << P;
    EXPECT_EQ(res.first_mismatch->tensor, "read.swa_cache") << res.first_mismatch->to_string();
    EXPECT_GT(res.stats.read_cache_mismatched, 0u);
    EXPECT_GT(res.stats.output_mismatched, 0u);
    EXPECT_GT(res.stats.lse_mismatched, 0u);
    EXPECT_EQ(res.stats.topk_mismatched, 0u);
  }
}

// The one-rank mode (each rank in its own Simulation over a communicator, as a `--launch local`
// worker runs it) with the read path equals the same rank of the all-rank run (compare_rank), and
// the comparison catches the doctored output on the last rank only.
TEST(PcpReadPathOneRank, EachRankAloneEqualsTheAllRankRun) {
  constexpr int P = 3;
  WorkloadConfig wc = random_config(93);
  const Workload w = generate_workload(wc);
  for (const bool broken : {false, true}) {
    SimConfig mine_cfg = read_config(2);
    if (broken) mine_cfg.fault = seam::PcpFault::kPerturbAttention;
    ThreadGroup g(P);
    std::mutex mu;
    std::vector<std::optional<Mismatch>> first(P);
    std::vector<CheckStats> stats(P);
    g.run([&](Communicator& c) {
      Simulation mine(mine_cfg, w, P, false, &c);
      Simulation all(read_config(2), w, P, true);
      const auto k = static_cast<size_t>(c.rank());
      for (int64_t i = 0; i < mine.num_steps(); ++i) {
        mine.run_step(i);
        all.run_step(i);
        CheckStats st;
        auto spec = all.check_step();
        auto mm = mine.compare_rank(all, &st);
        std::lock_guard<std::mutex> lk(mu);
        if (spec && !first[k]) first[k] = spec;
        if (mm && !first[k]) first[k] = mm;
        stats[k] += st;
      }
    });
    for (int k = 0; k < P; ++k) {
      SCOPED_TRACE("rank " + std::to_string(k) + (broken ? " broken" : ""));
      EXPECT_GT(stats[static_cast<size_t>(k)].attention_rows, 0u);
      EXPECT_GT(stats[static_cast<size_t>(k)].read_cache_bytes, 0u);
      if (!broken || k != P - 1) {
        EXPECT_FALSE(first[static_cast<size_t>(k)]) << first[static_cast<size_t>(k)]->to_string();
      } else {
        ASSERT_TRUE(first[static_cast<size_t>(k)]);
        EXPECT_EQ(first[static_cast<size_t>(k)]->tensor, "attention.out");
        EXPECT_GT(stats[static_cast<size_t>(k)].output_mismatched, 0u);
      }
    }
  }
}

TEST(PcpReadPathErrors, BadConfigurationsAreE8BeforeAnyWork) {
  const Workload w = generate_workload(random_config(94));
  SimConfig cuda = read_config(2);
  cuda.device = Device::CUDA;
  test::expect_error([&] { Simulation(cuda, w, 2, true); }, ErrorCode::kInvalidArgument,
                     {"read_path on cuda", "runs on the CPU only"});
  SimConfig off = read_config(2);
  off.read_path = false;
  off.fault = seam::PcpFault::kPerturbAttention;
  test::expect_error([&] { Simulation(off, w, 2, true); }, ErrorCode::kInvalidArgument,
                     {"fault perturb-attention", "expected read_path = true"});
  SimConfig heads = read_config(2);
  heads.num_heads = 12;
  test::expect_error([&] { Simulation(heads, w, 2, true); }, ErrorCode::kInvalidArgument, {"num_heads", "12"});
  // compare_rank between a run with the read path and one without
  SimConfig plain = read_config(2);
  plain.read_path = false;
  Simulation a(read_config(2), w, 1, false), b(plain, w, 1, false);
  a.run_step(0);
  b.run_step(0);
  test::expect_error([&] { a.compare_rank(b); }, ErrorCode::kInvalidArgument, {"compare_rank", "read path"});
  // the read path's layers are part of the host-memory estimate
  SimConfig small = read_config(2);
  small.max_host_bytes = 64 * 1024;
  test::expect_error([&] { Simulation(small, w, 2, true); }, ErrorCode::kInvalidArgument,
                     {"max_host_bytes", "read-path layer", "8 heads"});
}

}  // namespace
}  // namespace dsv41kv::pcp

// DualChunkSwap planner: SPEC 10.4 oracles (vLLM test_gpu_pcp_manager.py), the local batches of
// SPEC 10.5, ordering rules of SPEC 7.2, owner placement (SPEC 7.9), E6, E8, E9.
#include <gtest/gtest.h>

#include "dsv41kv/pcp.hpp"
#include "support/errors.hpp"

using namespace dsv41kv;
using namespace dsv41kv::pcp;
using dsv41kv::test::code_of;

namespace {

std::vector<GlobalRequest> reqs(std::initializer_list<int64_t> q, std::initializer_list<bool> prefilling,
                                std::initializer_list<int64_t> computed = {}) {
  std::vector<GlobalRequest> out;
  auto qi = q.begin();
  auto pi = prefilling.begin();
  auto ci = computed.begin();
  for (; qi != q.end(); ++qi, ++pi) {
    GlobalRequest r;
    r.query_len = *qi;
    r.is_prefilling = *pi;
    r.num_computed = ci != computed.end() ? *ci++ : 0;
    out.push_back(r);
  }
  return out;
}

StepPlan plan(const std::vector<GlobalRequest>& r, int P, int64_t pad = 0,
              DecodePlacement pl = DecodePlacement::kReplicated, int64_t step = 0) {
  PlanOptions o;
  o.P = P;
  o.graph_padding = pad;
  o.placement = pl;
  o.step = step;
  return plan_pcp_step(r, o);
}

}  // namespace

TEST(PcpPlanner, ReplicatedDecodesOracle) {
  // P = 2, three 1-token decodes, graph padding 4 (SPEC 10.4).
  const StepPlan p = plan(reqs({1, 1, 1}, {false, false, false}, {5, 9, 2}), 2, 4);
  EXPECT_EQ(p.tokens_per_rank(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(p.padded, 4);
  for (int k = 0; k < 2; ++k)
    EXPECT_EQ(p.ranks[static_cast<size_t>(k)].local_to_global_req, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.gathered_source, (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(p.gathered_kv_write, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p.restore_index, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(p.ranks[1].positions, (std::vector<int64_t>{5, 9, 2, 0}));
}

TEST(PcpPlanner, LargestRankTokenCountOracle) {
  struct Case {
    int P;
    std::vector<GlobalRequest> r;
    int64_t want;
  };
  const std::vector<Case> cases = {
      {2, reqs({8}, {true}), 4},
      {2, reqs({7}, {true}), 4},
      {2, reqs({3}, {false}), 3},
      {2, reqs({3, 8}, {false, true}), 7},
      {4, reqs({2, 9}, {false, true}), 5},
  };
  for (const auto& c : cases) {
    const StepPlan p = plan(c.r, c.P);
    EXPECT_EQ(p.largest_rank_tokens, c.want) << "P " << c.P;
    EXPECT_EQ(p.padded, c.want);
  }
}

TEST(PcpPlanner, GraphPaddingBelowLargestRankIsE9) {
  EXPECT_EQ(code_of([] { plan(reqs({3, 8}, {false, true}), 2, 6); }), ErrorCode::kPcpPadding);
  EXPECT_EQ(plan(reqs({3, 8}, {false, true}), 2, 7).padded, 7);
  EXPECT_EQ(plan(reqs({3, 8}, {false, true}), 2, 16).padded, 16);
}

TEST(PcpPlanner, GraphPadMultipleRoundsTheLargestRankUp) {
  const auto r = reqs({3, 8}, {false, true});  // largest rank: 7 tokens
  PlanOptions o;
  o.P = 2;
  for (const auto& [mult, want] : std::vector<std::pair<int64_t, int64_t>>{{4, 8}, {7, 7}, {16, 16}, {1, 7}}) {
    o.graph_pad_multiple = mult;
    const StepPlan p = plan_pcp_step(r, o);
    EXPECT_EQ(p.padded, want) << "multiple " << mult;
    EXPECT_EQ(p.largest_rank_tokens, 7);
    EXPECT_EQ(static_cast<int64_t>(p.gathered_source.size()), 2 * want);
  }
  o.graph_pad_multiple = 4;
  EXPECT_EQ(plan_pcp_step(reqs({0}, {true}), o).padded, 4);  // no tokens: still one multiple
  o.graph_pad_multiple = -1;
  EXPECT_EQ(code_of([&] { plan_pcp_step(r, o); }), ErrorCode::kInvalidArgument);
}

TEST(PcpPlanner, SpeculativeDecodingIsE6) {
  PlanOptions o;
  o.P = 2;
  o.num_speculative_tokens = 1;
  const auto r = reqs({1}, {false});
  EXPECT_EQ(code_of([&] { plan_pcp_step(r, o); }), ErrorCode::kPcpWithSpec);
  o.P = 1;  // no PCP: allowed
  EXPECT_NO_THROW(plan_pcp_step(r, o));
}

TEST(PcpPlanner, BadInputsAreE8) {
  EXPECT_EQ(code_of([] { plan(reqs({4, 1}, {true, false}), 2); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { plan(reqs({-1}, {true}), 2); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { plan(reqs({1}, {true}), 0); }), ErrorCode::kInvalidArgument);
}

TEST(PcpPlanner, WorkedExampleLocalBatches) {
  // SPEC 10.5: B = decode at 20, A = continued prefill of 13 tokens at 3..15.
  const StepPlan p = plan(reqs({1, 13}, {false, true}, {20, 3}), 2);
  ASSERT_EQ(p.padded, 9);
  EXPECT_EQ(p.ranks[0].qsl, (std::vector<int32_t>{0, 1, 5, 6}));
  EXPECT_EQ(p.ranks[1].qsl, (std::vector<int32_t>{0, 1, 5, 9}));
  EXPECT_EQ(p.ranks[0].positions, (std::vector<int64_t>{20, 3, 4, 5, 6, 15, 0, 0, 0}));
  EXPECT_EQ(p.ranks[1].positions, (std::vector<int64_t>{20, 7, 8, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(p.ranks[0].segments[2].chunk_offset, 12);
  EXPECT_EQ(p.ranks[1].segments[2].chunk_offset, 8);
  // Every global token is written by exactly one gathered row.
  std::vector<int> writers(14, 0);
  for (size_t g = 0; g < p.gathered_kv_write.size(); ++g)
    if (p.gathered_kv_write[g]) ++writers[static_cast<size_t>(p.gathered_source[g])];
  for (int w : writers) EXPECT_EQ(w, 1);
}

TEST(PcpPlanner, DualChunkSwapAssignmentAndFreshPromptsLast) {
  // P = 4: rank k takes chunks k and 7 - k; fresh prompts' first chunk sorts last.
  const StepPlan p = plan(reqs({16, 16}, {true, true}, {0, 5}), 4);
  for (int k = 0; k < 4; ++k) {
    const auto& segs = p.ranks[static_cast<size_t>(k)].segments;
    ASSERT_EQ(segs.size(), 4u);
    // request 0 is fresh: only its chunk 0 (on rank 0) is "pure" and must be last there.
    if (k == 0) {
      EXPECT_EQ(segs[0].global_req, 0);
      EXPECT_EQ(segs[0].chunk_offset, 14);  // chunk 7
      EXPECT_EQ(segs[1].global_req, 1);
      EXPECT_EQ(segs[2].global_req, 1);
      EXPECT_EQ(segs[3].global_req, 0);
      EXPECT_EQ(segs[3].chunk_offset, 0);   // chunk 0, moved last
    } else {
      EXPECT_EQ(segs[0].chunk_offset, 2 * k);
      EXPECT_EQ(segs[1].chunk_offset, 2 * (7 - k));
      EXPECT_EQ(segs[2].chunk_offset, 2 * k);
      EXPECT_EQ(segs[3].chunk_offset, 2 * (7 - k));
    }
  }
  // Empty chunks are skipped; a rank without segments gets one empty request.
  const StepPlan q = plan(reqs({3}, {true}, {4}), 4);
  EXPECT_EQ(q.tokens_per_rank(), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(q.ranks[3].segments.size(), 1u);
  EXPECT_EQ(q.ranks[3].segments[0].global_req, -1);
  EXPECT_EQ(q.ranks[3].qsl, (std::vector<int32_t>{0, 0}));
}

TEST(PcpPlanner, OwnerPlacementRotates) {
  const auto r = reqs({1, 1, 1, 5}, {false, false, false, true}, {7, 8, 9, 0});
  for (int64_t step = 0; step < 4; ++step) {
    const StepPlan p = plan(r, 3, 0, DecodePlacement::kOwner, step);
    for (int g = 0; g < 3; ++g) {
      const int owner = static_cast<int>((g + step) % 3);
      for (int k = 0; k < 3; ++k) {
        const auto& l2g = p.ranks[static_cast<size_t>(k)].local_to_global_req;
        const bool has = std::find(l2g.begin(), l2g.end(), g) != l2g.end();
        EXPECT_EQ(has, k == owner) << "step " << step << " decode " << g << " rank " << k;
      }
      // The owner's copy writes and restores.
      const int64_t row = p.restore_index[static_cast<size_t>(g)];
      EXPECT_EQ(row / p.padded, owner);
      EXPECT_TRUE(p.gathered_kv_write[static_cast<size_t>(row)]);
    }
  }
  EXPECT_EQ(parse_placement("owner"), DecodePlacement::kOwner);
  EXPECT_EQ(code_of([] { parse_placement("both"); }), ErrorCode::kInvalidArgument);
}

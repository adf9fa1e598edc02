// DualChunkSwap chunking of a global step (SPEC 7.2), the gathered layout (SPEC 7.3) and the
// decode placement modes (SPEC 7.9). Every rank runs this on the host with the same inputs and
// gets the same plan.
#include <fmt/format.h>

#include <algorithm>

#include "dsv41kv/pcp.hpp"

namespace dsv41kv::pcp {

const char* placement_name(DecodePlacement p) {
  return p == DecodePlacement::kOwner ? "owner" : "replicated";
}

DecodePlacement parse_placement(const std::string& name) {
  if (name == "replicated") return DecodePlacement::kReplicated;
  if (name == "owner") return DecodePlacement::kOwner;
  invalid_argument(fmt::format("decode placement '{}' (expected replicated or owner)", name));
}

std::vector<int64_t> StepPlan::tokens_per_rank() const {
  std::vector<int64_t> n;
  for (const auto& r : ranks) n.push_back(r.num_tokens);
  return n;
}

void check_pcp_speculation(const char* op, int P, int64_t num_speculative_tokens) {
  if (num_speculative_tokens < 0)
    invalid_argument(fmt::format("{}: num_speculative_tokens = {} (expected >= 0)", op,
                                 num_speculative_tokens));
  if (P > 1 && num_speculative_tokens > 0)
    fail(ErrorCode::kPcpWithSpec,
         fmt::format("pcp_size = {} with num_speculative_tokens = {}: PCP cannot be combined with "
                     "speculative decoding: under PCP the ring keeps only the open row",
                     P, num_speculative_tokens));
}

StepPlan plan_pcp_step(std::span<const GlobalRequest> requests, const PlanOptions& opt) {
  const int P = opt.P;
  if (P < 1 || P > 1024) invalid_argument(fmt::format("pcp: P = {} (expected 1..1024)", P));
  check_pcp_speculation("pcp", P, opt.num_speculative_tokens);
  if (opt.graph_padding < 0)
    invalid_argument(fmt::format("pcp: graph_padding = {} (expected >= 0)", opt.graph_padding));
  if (opt.graph_pad_multiple < 0)
    invalid_argument(fmt::format("pcp: graph_pad_multiple = {} (expected >= 0)", opt.graph_pad_multiple));
  if (opt.step < 0) invalid_argument(fmt::format("pcp: step = {} (expected >= 0)", opt.step));

  StepPlan plan;
  plan.P = P;
  const int64_t G = static_cast<int64_t>(requests.size());
  plan.global_qsl.assign(static_cast<size_t>(G + 1), 0);
  bool seen_prefill = false;
  for (int64_t g = 0; g < G; ++g) {
    const GlobalRequest& r = requests[static_cast<size_t>(g)];
    if (r.query_len < 0 || r.num_computed < 0)
      invalid_argument(fmt::format("pcp: request {}: query_len {} num_computed {} (expected >= 0)",
                                   g, r.query_len, r.num_computed));
    if (!r.is_prefilling && seen_prefill)
      invalid_argument(fmt::format(
          "pcp: request {} is a decode after a prefill (expected decodes first, SPEC 6.1)", g));
    seen_prefill = seen_prefill || r.is_prefilling;
    const int64_t next = plan.global_qsl[static_cast<size_t>(g)] + r.query_len;
    if (next > INT32_MAX)
      invalid_argument(fmt::format("pcp: step has more than 2^31 - 1 tokens at request {}", g));
    plan.global_qsl[static_cast<size_t>(g + 1)] = static_cast<int32_t>(next);
  }
  plan.num_global_tokens = plan.global_qsl.back();

  plan.ranks.resize(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k) {
    RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    std::vector<LocalSegment> segs;
    std::vector<uint8_t> pure;  // pure prefill segment (first chunk of a fresh prompt)
    for (int64_t g = 0; g < G; ++g) {
      const GlobalRequest& r = requests[static_cast<size_t>(g)];
      const int64_t q = r.query_len;
      if (q == 0) continue;
      if (!r.is_prefilling) {
        if (opt.placement == DecodePlacement::kReplicated) {
          segs.push_back({static_cast<int32_t>(g), 0, q, k == 0});
          pure.push_back(0);
        } else if ((g + opt.step) % P == k) {
          segs.push_back({static_cast<int32_t>(g), 0, q, true});
          pure.push_back(0);
        }
        continue;
      }
      const int64_t cs = (q + 2 * P - 1) / (2 * P);
      for (int64_t c : {static_cast<int64_t>(k), static_cast<int64_t>(2 * P - 1 - k)}) {
        const int64_t off = c * cs;
        const int64_t end = std::min(off + cs, q);
        if (off >= end) continue;
        segs.push_back({static_cast<int32_t>(g), off, end - off, true});
        pure.push_back(r.num_computed + off == 0 ? 1 : 0);
      }
    }
    // Stable: everything else in global order, then the pure prefill segments.
    for (size_t i = 0; i < segs.size(); ++i)
      if (!pure[i]) rb.segments.push_back(segs[i]);
    for (size_t i = 0; i < segs.size(); ++i)
      if (pure[i]) rb.segments.push_back(segs[i]);
    if (rb.segments.empty()) rb.segments.push_back({-1, 0, 0, false});
    rb.qsl.assign(1, 0);
    for (const auto& s : rb.segments) {
      rb.qsl.push_back(static_cast<int32_t>(rb.qsl.back() + s.len));
      rb.local_to_global_req.push_back(s.global_req);
    }
    rb.num_tokens = rb.qsl.back();
    plan.largest_rank_tokens = std::max(plan.largest_rank_tokens, rb.num_tokens);
  }
  plan.padded = plan.largest_rank_tokens;
  if (opt.graph_pad_multiple > 0) {
    const int64_t m = opt.graph_pad_multiple;
    plan.padded = std::max<int64_t>((plan.largest_rank_tokens + m - 1) / m * m, m);
  }
  if (opt.graph_padding > 0) {
    if (opt.graph_padding < plan.largest_rank_tokens)
      fail(ErrorCode::kPcpPadding,
           fmt::format("pcp: graph padding {} is smaller than the largest rank's token count {} "
                       "(expected >= {})",
                       opt.graph_padding, plan.largest_rank_tokens, plan.largest_rank_tokens));
    plan.padded = opt.graph_padding;
  }

  const int64_t padded = plan.padded;
  const size_t rows = static_cast<size_t>(P) * static_cast<size_t>(padded);
  plan.gathered_source.assign(rows, 0);
  plan.gathered_kv_write.assign(rows, 0);
  plan.gathered_req.assign(rows, 0);
  plan.gathered_positions.assign(rows, 0);
  plan.restore_index.assign(static_cast<size_t>(plan.num_global_tokens), -1);
  for (int k = 0; k < P; ++k) {
    RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    rb.positions.assign(static_cast<size_t>(padded), 0);
    for (int64_t j = 0; j < rb.num_reqs(); ++j) {
      const LocalSegment& s = rb.segments[static_cast<size_t>(j)];
      if (s.global_req < 0) continue;
      const GlobalRequest& r = requests[static_cast<size_t>(s.global_req)];
      const int64_t local_start = r.num_computed + s.chunk_offset;
      for (int64_t i = 0; i < s.len; ++i) {
        const int64_t t = rb.qsl[static_cast<size_t>(j)] + i;
        rb.positions[static_cast<size_t>(t)] = local_start + i;
        const size_t row = static_cast<size_t>(k * padded + t);
        const int64_t src = plan.global_qsl[static_cast<size_t>(s.global_req)] + s.chunk_offset + i;
        plan.gathered_source[row] = src;
        plan.gathered_kv_write[row] = s.writes_kv ? 1 : 0;
        plan.gathered_req[row] = s.global_req;
        plan.gathered_positions[row] = local_start + i;
        if (s.writes_kv) plan.restore_index[static_cast<size_t>(src)] = static_cast<int64_t>(row);
      }
    }
  }
  return plan;
}

}  // namespace dsv41kv::pcp

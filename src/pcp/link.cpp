// The link of SPEC 7.4 (`_link_pcp_chunks`): every rank publishes one key per local request
// (ring block, position of its last token); after the all-gather every rank sorts the same
// P * num_rows keys with the same tie-break and derives the ring write slots (each request's
// newest row when its group is still open) and the gathered row holding each chunk's
// predecessor.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/validate.hpp"
#include "dsv41kv/pcp.hpp"
#include "pcp/layer_step_common.hpp"

namespace dsv41kv::pcp {

int64_t link_num_rows(int64_t N, int64_t max_num_seqs) {
  if (N < 0 || max_num_seqs < 1)
    invalid_argument(fmt::format("link: N = {}, max_num_seqs = {} (expected N >= 0, max_num_seqs >= 1)",
                                 N, max_num_seqs));
  return std::min(N, 2 * max_num_seqs);
}

int64_t link_key(int64_t slot, int64_t pos, int64_t cap) {
  if (slot < 0 || pos < 0) return -1;
  return ((slot / cap) << 32) | pos;
}

LinkLocal link_local_keys(const LinkInput& in) {
  const int64_t N = static_cast<int64_t>(in.ring_slots.size());
  if (in.cap < 1) invalid_argument(fmt::format("link: cap = {} (expected >= 1)", in.cap));
  if (static_cast<int64_t>(in.positions.size()) < N)
    invalid_argument(fmt::format("link: positions has {} entries (expected >= N = {})",
                                 in.positions.size(), N));
  detail::check_qsl("link", "qsl", in.qsl, N);
  const int64_t num_reqs = static_cast<int64_t>(in.qsl.size()) - 1;
  for (int64_t t = 0; t < N; ++t) {
    const int64_t p = in.positions[static_cast<size_t>(t)];
    if (p >= (int64_t{1} << 31) || p < 0)
      invalid_argument(fmt::format("link: positions[{}] = {} (expected 0 <= p < 2^31)", t, p));
    const int64_t s = in.ring_slots[static_cast<size_t>(t)];
    if (s >= 0 && s / in.cap >= (int64_t{1} << 31))
      invalid_argument(fmt::format("link: ring_slots[{}] = {}: ring block {} (expected < 2^31)", t,
                                   s, s / in.cap));
  }

  LinkLocal out;
  out.num_rows = link_num_rows(N, in.max_num_seqs);
  out.R = std::min(num_reqs, out.num_rows);
  for (int64_t j = out.num_rows; j < num_reqs; ++j)
    if (in.qsl[static_cast<size_t>(j + 1)] > in.qsl[static_cast<size_t>(j)])
      fail(ErrorCode::kPcpOverflow,
           fmt::format("link: local request {} is non-empty ({} tokens) but num_rows = min(N = {}, "
                       "2 * max_num_seqs = {}) = {} (expected every non-empty request below num_rows)",
                       j, in.qsl[static_cast<size_t>(j + 1)] - in.qsl[static_cast<size_t>(j)], N,
                       2 * in.max_num_seqs, out.num_rows));
  out.local_keys.assign(static_cast<size_t>(out.num_rows), -1);
  out.gather_tokens.assign(static_cast<size_t>(out.num_rows), 0);
  for (int64_t j = 0; j < out.R; ++j) {
    const int64_t s = in.qsl[static_cast<size_t>(j)], e = in.qsl[static_cast<size_t>(j + 1)];
    const int64_t last = std::max<int64_t>(e - 1, 0);
    out.gather_tokens[static_cast<size_t>(j)] = last;
    if (e > s)
      out.local_keys[static_cast<size_t>(j)] =
          link_key(in.ring_slots[static_cast<size_t>(last)], in.positions[static_cast<size_t>(last)], in.cap);
  }
  return out;
}

namespace {

LinkResult resolve(const LinkInput& in, const LinkLocal& local, std::span<const int64_t> all_keys, int P,
                   bool reversed_ties) {
  if (P < 1) invalid_argument(fmt::format("link: P = {} (expected >= 1)", P));
  const int64_t G = static_cast<int64_t>(P) * local.num_rows;
  if (static_cast<int64_t>(all_keys.size()) != G)
    invalid_argument(fmt::format("link: all_keys has {} entries (expected P * num_rows = {} * {})",
                                 all_keys.size(), P, local.num_rows));
  const int64_t N = static_cast<int64_t>(in.ring_slots.size());
  LinkResult r;
  r.num_rows = local.num_rows;
  r.R = local.R;
  r.gather_tokens = local.gather_tokens;
  r.order.resize(static_cast<size_t>(G));
  std::iota(r.order.begin(), r.order.end(), int64_t{0});
  if (!reversed_ties) {
    std::stable_sort(r.order.begin(), r.order.end(), [&](int64_t a, int64_t b) {
      return all_keys[static_cast<size_t>(a)] < all_keys[static_cast<size_t>(b)];
    });
  } else {
    std::sort(r.order.begin(), r.order.end(), [&](int64_t a, int64_t b) {
      const int64_t ka = all_keys[static_cast<size_t>(a)], kb = all_keys[static_cast<size_t>(b)];
      return ka != kb ? ka < kb : a > b;
    });
  }
  r.sorted_keys.resize(static_cast<size_t>(G));
  for (int64_t i = 0; i < G; ++i)
    r.sorted_keys[static_cast<size_t>(i)] = all_keys[static_cast<size_t>(r.order[static_cast<size_t>(i)])];

  r.ring_write_slots.assign(static_cast<size_t>(G), -1);
  for (int64_t i = 0; i < G; ++i) {
    const int64_t k = r.sorted_keys[static_cast<size_t>(i)];
    const int64_t blk = k >> 32;
    const int64_t pos = k & 0xFFFFFFFF;
    const bool newest = i == G - 1 || blk != (r.sorted_keys[static_cast<size_t>(i + 1)] >> 32);
    if (k >= 0 && newest && !closes_group(pos, 2))
      r.ring_write_slots[static_cast<size_t>(r.order[static_cast<size_t>(i)])] = blk * in.cap + pos % in.cap;
  }

  r.prev_row_indices.assign(static_cast<size_t>(r.R), -1);
  for (int64_t j = 0; j < r.R; ++j) {
    const int64_t s = in.qsl[static_cast<size_t>(j)], e = in.qsl[static_cast<size_t>(j + 1)];
    const int64_t start = std::min<int64_t>(s, N - 1);
    const int64_t fp = in.positions[static_cast<size_t>(start)];
    const int64_t wanted = link_key(in.ring_slots[static_cast<size_t>(start)], fp - 1, in.cap);
    const int64_t lb = std::lower_bound(r.sorted_keys.begin(), r.sorted_keys.end(), wanted) -
                       r.sorted_keys.begin();
    const int64_t f = std::min(lb, G - 1);
    const bool has_prev = e > s && wanted >= 0 && closes_group(fp, 2) &&
                          r.sorted_keys[static_cast<size_t>(f)] == wanted;
    r.prev_row_indices[static_cast<size_t>(j)] = has_prev ? r.order[static_cast<size_t>(f)] : -1;
  }
  return r;
}

}  // namespace

LinkResult link_resolve(const LinkInput& in, const LinkLocal& local, std::span<const int64_t> all_keys, int P) {
  return resolve(in, local, all_keys, P, false);
}

// The second half with ties by ascending (DECISION 13) or, for the test seam, descending index.
LinkResult link_resolve_ties(const LinkInput& in, const LinkLocal& local, std::span<const int64_t> all_keys, int P,
                             bool reversed_ties) {
  return resolve(in, local, all_keys, P, reversed_ties);
}
// Both halves over `comm`, ties likewise (layer_step.cpp).
LinkResult link_pcp_chunks_ties(const LinkInput& in, Communicator& comm, bool reversed_ties) {
  const LinkLocal local = link_local_keys(in);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()) * static_cast<size_t>(local.num_rows));
  comm.all_gather(local.local_keys.data(), local.local_keys.size() * sizeof(int64_t), all.data());
  return resolve(in, local, all, comm.size(), reversed_ties);
}

LinkResult link_pcp_chunks(const LinkInput& in, Communicator& comm) {
  return link_pcp_chunks_ties(in, comm, false);
}

}  // namespace dsv41kv::pcp

#if defined(DSV41KV_TEST_SEAMS)
#include "dsv41kv/test_seam.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::seam {

const char* fault_name(PcpFault f) {
  switch (f) {
    case PcpFault::kNone: return "none";
    case PcpFault::kDropGatheredPredecessors: return "drop-gathered-predecessors";
    case PcpFault::kReverseTieBreak: return "reverse-tie-break";
    case PcpFault::kSkipSaveRingRows: return "skip-save-ring-rows";
    case PcpFault::kLocalSwaInsert: return "local-swa-insert";
    case PcpFault::kPerturbAttention: return "perturb-attention";
  }
  return "?";
}

PcpFault parse_fault(const std::string& name) {
  for (PcpFault f : {PcpFault::kNone, PcpFault::kDropGatheredPredecessors, PcpFault::kReverseTieBreak,
                     PcpFault::kSkipSaveRingRows, PcpFault::kLocalSwaInsert, PcpFault::kPerturbAttention})
    if (name == fault_name(f)) return f;
  invalid_argument("fault '" + name +
                   "': expected none, drop-gathered-predecessors, reverse-tie-break, skip-save-ring-rows, "
                   "local-swa-insert or perturb-attention");
}

pcp::LinkResult link_resolve_reversed_ties(const pcp::LinkInput& in, const pcp::LinkLocal& local,
                                           std::span<const int64_t> all_keys, int P) {
  return pcp::link_resolve_ties(in, local, all_keys, P, true);
}

}  // namespace dsv41kv::seam
#endif

// The read-path bench's workloads and counts (read_path_model.hpp).
#include "bench/read_path_model.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/indexer.hpp"

namespace dsv41kv::bench {
namespace {

// Deterministic generator of the builders (splitmix64).
struct Rng {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9E3779B97F4A7C15ull); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

// `k` distinct values of [0, n) (Floyd's selection), sorted ascending.
std::vector<int64_t> distinct_sorted(Rng& r, int64_t n, int64_t k) {
  std::set<int64_t> s;
  for (int64_t j = n - k; j < n; ++j) {
    const int64_t v = r.below(j + 1);
    if (!s.insert(v).second) s.insert(j);
  }
  return {s.begin(), s.end()};
}

// A shuffled table of `per_req` pages for each of `batch` requests: a permutation of all pages.
std::vector<int64_t> shuffled_pages(Rng& r, int64_t batch, int64_t per_req) {
  std::vector<int64_t> p(static_cast<size_t>(batch * per_req));
  std::iota(p.begin(), p.end(), 0);
  for (size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[static_cast<size_t>(r.below(static_cast<int64_t>(i)))]);
  return p;
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double attention_flops(int64_t heads, int64_t tokens, int64_t keys_per_token) {
  return 2.0 * static_cast<double>(heads) * static_cast<double>(tokens) * static_cast<double>(keys_per_token) *
         (kReadDqk + kReadDv);
}

int64_t decode_bytes(int64_t unique_swa, int swa_record_bytes, int64_t unique_cmp, int cmp_record_bytes,
                     int64_t heads, int64_t tokens) {
  return unique_swa * swa_record_bytes + unique_cmp * cmp_record_bytes + 2 * tokens * heads * kReadDqk +
         2 * tokens * heads * kReadDv;
}

int64_t prefill_bytes(int64_t valid_indices, int64_t heads, int64_t tokens) {
  return valid_indices * kReadDqk * 2 + tokens * heads * (kReadDqk + kReadDv) * 2;
}

double indexer_flops(int64_t entries_scored) {
  return 2.0 * kIndexHeads * kIndexHeadDim * static_cast<double>(entries_scored);
}

int64_t indexer_bytes(int64_t unique_entries) {
  return unique_entries * index_k_record_bytes(IndexKFormat::FP8_132);
}

DecodeWorkload make_decode_workload(int64_t batch, int cmp_keys, uint64_t seed) {
  DecodeWorkload w;
  w.batch = batch;
  w.tokens = batch * kReadSq;
  w.cmp_keys = cmp_keys;
  const int64_t swa_per_req = kSwaSlotsPerReq / kSwaStatesPerPage, cmp_per_req = kCmpEntriesPerReq / kCmpStatesPerPage;
  w.swa_pages = batch * swa_per_req;
  w.cmp_pages = batch * cmp_per_req;
  Rng r{seed};
  const std::vector<int64_t> swa_tab = shuffled_pages(r, batch, swa_per_req);
  const std::vector<int64_t> cmp_tab = shuffled_pages(r, batch, cmp_per_req);
  w.swa_idx.assign(static_cast<size_t>(w.tokens * kSwaWindow), -1);
  w.cmp_idx.assign(static_cast<size_t>(w.tokens * kIndexTopk), -1);
  w.swa_len.assign(static_cast<size_t>(w.tokens), kSwaWindow);
  w.cmp_len.assign(static_cast<size_t>(w.tokens), cmp_keys);
  auto slot = [](const std::vector<int64_t>& tab, int64_t b, int64_t per_req, int64_t S, int64_t x) {
    return static_cast<int32_t>(tab[static_cast<size_t>(b * per_req + x / S)] * S + x % S);
  };
  for (int64_t b = 0; b < batch; ++b) {
    std::set<int32_t> swa_u, cmp_u;
    for (int64_t j = 0; j < kReadSq; ++j) {
      const int64_t t = b * kReadSq + j, end = kSwaWindow + j;
      for (int64_t k = 0; k < kSwaWindow; ++k) {
        const int32_t s = slot(swa_tab, b, swa_per_req, kSwaStatesPerPage, end - (kSwaWindow - 1) + k);
        w.swa_idx[static_cast<size_t>(t * kSwaWindow + k)] = s;
        swa_u.insert(s);
      }
      const std::vector<int64_t> e = distinct_sorted(r, kCmpEntriesPerReq, cmp_keys);
      for (int64_t k = 0; k < cmp_keys; ++k) {
        const int32_t s = slot(cmp_tab, b, cmp_per_req, kCmpStatesPerPage, e[static_cast<size_t>(k)]);
        w.cmp_idx[static_cast<size_t>(t * kIndexTopk + k)] = s;
        cmp_u.insert(s);
      }
    }
    w.unique_swa += static_cast<int64_t>(swa_u.size());
    w.unique_cmp += static_cast<int64_t>(cmp_u.size());
  }
  return w;
}

IndexerWorkload make_indexer_workload(int64_t batch, int64_t n_c, bool consumer, uint64_t seed) {
  IndexerWorkload w;
  w.batch = batch;
  w.tokens = batch * kReadSq;
  w.n_c = n_c;
  w.consumer = consumer;
  w.pages_per_req = (n_c + kIndexStatesPerPage - 1) / kIndexStatesPerPage;
  w.block_table.resize(static_cast<size_t>(batch * w.pages_per_req));
  std::iota(w.block_table.begin(), w.block_table.end(), 0);
  Rng r{seed};
  if (consumer) w.candidates.assign(static_cast<size_t>(w.tokens * kCandidateTopkBlocks), -1);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t union_entries = 0;
    std::vector<std::vector<int64_t>> per_token;
    for (int64_t j = 0; j < kReadSq; ++j) {
      const int64_t t = b * kReadSq + j, pos = 2 * n_c - 2 + j, n = (pos + 1) / 2;
      w.positions.push_back(pos);
      w.token_to_req.push_back(static_cast<int32_t>(b));
      if (!consumer) {
        w.entries_scored += n;
        union_entries = std::max(union_entries, n);
        continue;
      }
      const int64_t nb = (n + kCandidateBlockSize - 1) / kCandidateBlockSize;
      const std::vector<int64_t> bl = distinct_sorted(r, nb, std::min<int64_t>(kCandidateTopkBlocks, nb));
      for (size_t k = 0; k < bl.size(); ++k) {
        w.candidates[static_cast<size_t>(t * kCandidateTopkBlocks) + k] = static_cast<int32_t>(bl[k]);
        w.entries_scored += std::min<int64_t>(kCandidateBlockSize, n - bl[k] * kCandidateBlockSize);
      }
      per_token.push_back(bl);
    }
    if (consumer) {
      // the union of the tokens' scored entries: the blocks of either token, each holding the
      // entries visible to the token that sees most of it
      std::map<int64_t, int64_t> seen;  // block -> the largest visible count of a token choosing it
      for (int64_t j = 0; j < kReadSq; ++j) {
        const int64_t n = (2 * n_c - 2 + j + 1) / 2;
        for (int64_t blk : per_token[static_cast<size_t>(j)]) seen[blk] = std::max(seen[blk], n);
      }
      for (const auto& [blk, n] : seen) union_entries += std::min<int64_t>(kCandidateBlockSize, n - blk * kCandidateBlockSize);
    }
    w.unique_entries += union_entries;
  }
  return w;
}

PrefillWorkload make_prefill_workload(int64_t tokens, int64_t s_kv, uint64_t seed) {
  PrefillWorkload w;
  w.tokens = tokens;
  w.s_kv = s_kv;
  w.indices.resize(static_cast<size_t>(tokens * kPrefillKeys));
  Rng r{seed};
  // row t: (a + k * step) mod s_kv for k < 640, a random, step random and coprime to s_kv: 640
  // distinct rows spread over the workspace, drawn in O(1) each (128K tokens)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t a = r.below(s_kv);
    int64_t step = 1;
    do step = 1 + r.below(s_kv - 1); while (std::gcd(step, s_kv) != 1);
    for (int64_t k = 0; k < kPrefillKeys; ++k)
      w.indices[static_cast<size_t>(t * kPrefillKeys + k)] = static_cast<int32_t>((a + k * step) % s_kv);
  }
  return w;
}

std::vector<int64_t> sample_requests(int64_t batch, int n) {
  std::vector<int64_t> s;
  if (batch <= 0 || n <= 0) return s;
  if (n == 1 || batch == 1) return {0};
  for (int i = 0; i < n; ++i) {
    const int64_t b = static_cast<int64_t>(i) * (batch - 1) / (n - 1);
    if (s.empty() || s.back() != b) s.push_back(b);
  }
  return s;
}

}  // namespace dsv41kv::bench

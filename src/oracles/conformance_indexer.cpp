// Conformance runner of op `indexer_topk` (shared/conformance/README.md; SPEC 8.2-8.5, 8.7, 8.8):
// runs indexer_prepare_q and indexer_topk on each case's inputs and checks, one report line each,
//   q8          byte for byte against q8_ref (SPEC 8.2 is exact);
//   w           bit for bit against w_ref;
//   topk        every row a sorted valid prefix of topk_ref's length whose set equals topk_ref's
//               except entries whose reference score lies within the SPEC 8.8 tolerance of the
//               selection boundary (topk_agreement);
//   candidates  (candidate source) the same for the candidate blocks, a block's score being the
//               max of its entries' reference scores, the newest block +inf.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/reference.hpp"
#include "oracles/conformance_file.hpp"

namespace dsv41kv::conformance {

// The agreement of one output row (top-k entries or candidate blocks) with the reference row:
// `ours` a strictly ascending prefix of non-negative ids, then -1; the same prefix length as `ref`;
// the same set except ids whose reference score lies within tolerance of the selection boundary,
// the smallest reference score of the reference's set. Both scores carry their own SPEC 8.8
// tolerance, so a id is admitted when |score(id) - boundary| <= tol(id) + tol(boundary id).
// `score(id)` and `tol(id)` are the reference's; ids with a non-finite reference score other than
// the boundary's never agree by tolerance. Returns "" when the row agrees, else the reason.
std::string topk_row_agreement(const int32_t* ours, const int32_t* ref, int64_t width,
                               const std::function<double(int64_t)>& score, const std::function<double(int64_t)>& tol,
                               int64_t& differing) {
  int64_t n_ours = 0, n_ref = 0;
  while (n_ours < width && ours[n_ours] >= 0) ++n_ours;
  while (n_ref < width && ref[n_ref] >= 0) ++n_ref;
  for (int64_t j = n_ours; j < width; ++j)
    if (ours[j] != -1) return fmt::format("entry {} = {} after the valid prefix of {}, expected -1", j, ours[j], n_ours);
  for (int64_t j = 1; j < n_ours; ++j)
    if (ours[j] <= ours[j - 1])
      return fmt::format("entry {} = {} after {}, expected a strictly ascending prefix", j, ours[j], ours[j - 1]);
  if (n_ours != n_ref) return fmt::format("valid prefix of {} entries, reference {}", n_ours, n_ref);
  const std::set<int32_t> a(ours, ours + n_ours), b(ref, ref + n_ref);
  std::vector<int32_t> diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  differing += static_cast<int64_t>(diff.size());
  if (diff.empty()) return "";
  int32_t boundary = ref[0];
  for (int64_t j = 1; j < n_ref; ++j)
    if (score(ref[j]) < score(boundary)) boundary = ref[j];
  const double v = score(boundary), tv = tol(boundary);
  for (int32_t id : diff) {
    const double s = score(id);
    const double bound = std::isfinite(s) ? tol(id) + tv : 0.0;
    if (!(std::fabs(s - v) <= bound) && !(s == v))
      return fmt::format("{} {} {} the reference's set: reference score {} vs the boundary {} (id {}), beyond the "
                         "tolerance {}",
                         a.count(id) ? "selects" : "misses", id, a.count(id) ? "outside" : "of", s, v, boundary,
                         bound);
  }
  return "";
}

}  // namespace dsv41kv::conformance

namespace dsv41kv::conformance::detail {
namespace {

using st::SafetensorsFile;
using st::StDType;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct IndexerCase {
  std::string name;
  int ratio = 1;
  int64_t T = 0, num_reqs = 0, S = 0, page_stride = 0, num_pages = 0;
  IndexerRole role = IndexerRole::kPlain;
};

IndexerCase parse_case(const json& c, size_t i, const std::string& path) {
  const std::string where = fmt::format("cases[{}].", i);
  IndexerCase m;
  const json& nm = need(c, "name", path, where);
  m.name = nm.is_string() ? nm.get<std::string>() : nm.dump();
  m.ratio = static_cast<int>(need_int(c, "compress_ratio", path, where, 1, 2));
  m.T = need_int(c, "num_tokens", path, where, 0, 1 << 24);
  m.num_reqs = need_int(c, "num_reqs", path, where, 0, 1 << 24);
  m.S = need_int(c, "states_per_page", path, where, 1, 1 << 20);
  m.page_stride = need_int(c, "page_stride", path, where, m.S * IndexerKFp8Layout::kRecordBytes, int64_t{1} << 40);
  m.num_pages = need_int(c, "num_pages", path, where, 1, 1 << 28);
  const json& role = need(c, "role", path, where);
  bool known = false;
  for (IndexerRole r : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer})
    if (role.is_string() && role.get<std::string>() == indexer_role_name(r)) {
      m.role = r;
      known = true;
    }
  if (!known)
    bad_file(path, fmt::format("metadata {}'role' is {}, expected \"plain\", \"candidate_source\" or "
                               "\"candidate_consumer\"",
                               where, role.dump()));
  return m;
}

// The reference's view of one token: its scores, and the tolerance of an entry (SPEC 8.8) from the
// reference query (q8_ref, w_ref) and the key in the case's cache.
struct TokenRef {
  const float* scores = nullptr;  // scores_ref[t], `cols` entries
  int64_t cols = 0, nc = 0;
  const uint8_t* q8 = nullptr;    // q8_ref[t]
  const float* w = nullptr;       // w_ref[t]
  const uint8_t* k_cache = nullptr;
  const int32_t* pages = nullptr;  // the request's block-table row
  int64_t S = 0, page_stride = 0;

  float score(int64_t i) const { return i >= 0 && i < std::min(cols, nc) ? scores[i] : -kInf; }
  double tolerance(int64_t i) const {
    const uint8_t* page = k_cache + static_cast<int64_t>(pages[i / S]) * page_stride;
    return reference::kIndexerScoreRtol *
           reference::indexer_score_magnitude(q8, w, rec::index_k_fp8_codes(page, S, i % S),
                                              rec::read_index_k_fp8_scale(page, S, i % S));
  }
};

std::string mismatch(int64_t count, int64_t first, double ours, double ref) {
  return fmt::format("{} differ (first at {}: {} vs reference {})", count, first, ours, ref);
}

}  // namespace

FileResult run_indexer_topk(const SafetensorsFile& f, const json& j, const Options& opt) {
  const std::string& path = f.source();
  FileResult res;
  res.op = "indexer_topk";
  res.path = path;
  need_int(j, "index_n_heads", path, "", kIndexHeads, kIndexHeads);
  need_int(j, "index_head_dim", path, "", kIndexHeadDim, kIndexHeadDim);
  need_int(j, "index_topk", path, "", kIndexTopk, kIndexTopk);
  need_int(j, "candidate_block_size", path, "", kCandidateBlockSize, kCandidateBlockSize);
  need_int(j, "candidate_topk_blocks", path, "", kCandidateTopkBlocks, kCandidateTopkBlocks);
  need_tensor(f, "cos_sin", StDType::F32, {-1, kRopeDim});
  const json& cases = need_cases(j, path);
  const ExecContext ctx{nullptr, opt.num_threads};
  Dump dump(opt, f);

  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const IndexerCase m = parse_case(cases[ci], ci, path);
    const std::string p = fmt::format("c{}.", ci);
    const int64_t T = m.T;
    const int64_t HD = int64_t{kIndexHeads} * kIndexHeadDim;
    need_tensor(f, p + "q", StDType::BF16, {T, kIndexHeads, kIndexHeadDim});
    need_tensor(f, p + "w_raw", StDType::BF16, {T, kIndexHeads});
    need_tensor(f, p + "positions", StDType::I64, {T});
    need_tensor(f, p + "token_to_req", StDType::I32, {T});
    need_tensor(f, p + "token_valid", StDType::I32, {T});
    need_tensor(f, p + "block_table", StDType::I32, {m.num_reqs, -1});
    need_tensor(f, p + "k_cache", StDType::U8, {m.num_pages * m.page_stride});
    need_tensor(f, p + "q8_ref", StDType::U8, {T, kIndexHeads, kIndexHeadDim});
    need_tensor(f, p + "w_ref", StDType::F32, {T, kIndexHeads});
    if (!f.has(p + "scores_ref")) bad_file(path, fmt::format("has no tensor '{}scores_ref'", p));
    const st::TensorInfo& si = f.info(p + "scores_ref");
    if (si.dtype != StDType::F32 || si.shape.size() != 2 || si.shape[0] != T)
      bad_file(path, fmt::format("tensor '{}scores_ref' is {}, expected F32[{}, max n_c]", p, si.describe(), T));
    const int64_t cols = si.shape[1];
    need_tensor(f, p + "topk_ref", StDType::I32, {T, kIndexTopk});
    if (m.role == IndexerRole::kCandidateConsumer)
      need_tensor(f, p + "candidates", StDType::I32, {T, kCandidateTopkBlocks});
    if (m.role == IndexerRole::kCandidateSource)
      need_tensor(f, p + "candidates_ref", StDType::I32, {T, kCandidateTopkBlocks});

    ReadCaseResult cr;
    cr.index = static_cast<int>(ci);
    cr.name = m.name;

    // ---- the project's outputs, canary-filled (every row of the step is written whole)
    std::vector<uint8_t> q8(static_cast<size_t>(T * HD), 0xA5);
    std::vector<float> w(static_cast<size_t>(T * kIndexHeads), std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> topk(static_cast<size_t>(T * kIndexTopk), -7);
    std::vector<int32_t> cand;
    std::vector<float> scores(static_cast<size_t>(T * cols), std::numeric_limits<float>::quiet_NaN());
    const std::vector<int32_t> cand_in =
        m.role == IndexerRole::kCandidateConsumer ? f.copy_as<int32_t>(p + "candidates") : std::vector<int32_t>{};
    if (m.role == IndexerRole::kCandidateSource) cand.assign(static_cast<size_t>(T * kCandidateTopkBlocks), -7);
    if (m.role == IndexerRole::kCandidateConsumer) cand = cand_in;

    // inputs as aligned host copies (a file's tensors need not be aligned to their elements)
    const auto q_in = f.copy_as<uint16_t>(p + "q");
    const auto w_raw_in = f.copy_as<uint16_t>(p + "w_raw");
    const auto pos_in = f.copy_as<int64_t>(p + "positions");
    const auto req_in = f.copy_as<int32_t>(p + "token_to_req");
    const auto valid_in = f.copy_as<int32_t>(p + "token_valid");
    const auto bt_in = f.copy_as<int32_t>(p + "block_table");
    const int64_t bt_cols = f.info(p + "block_table").shape[1];
    const auto table_in = f.copy_as<float>("cos_sin");
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pt = pos_in[static_cast<size_t>(t)];
      if (valid_in[static_cast<size_t>(t)] && pt >= 0 && (pt + 1) / m.ratio > cols)
        bad_file(path, fmt::format("tensor '{}scores_ref' has {} columns, fewer than n_c = {} of token {}", p, cols,
                                   (pt + 1) / m.ratio, t));
    }
    Staging stg(opt.device);
    auto in = [&](const auto& v, DType dt, std::initializer_list<int64_t> shape) {
      return stg.view(TensorView::contiguous(const_cast<void*>(static_cast<const void*>(v.data())), dt, shape));
    };
    IndexQPrepArgs qa;
    qa.q = in(q_in, DType::BF16, {T, kIndexHeads, kIndexHeadDim});
    qa.w_raw = in(w_raw_in, DType::BF16, {T, kIndexHeads});
    qa.positions = in(pos_in, DType::I64, {T});
    qa.rope_table = in(table_in, DType::F32, {static_cast<int64_t>(table_in.size()) / kRopeDim, kRopeDim});
    qa.q8 = stg.view(TensorView::contiguous(q8.data(), DType::U8, {T, kIndexHeads, kIndexHeadDim}), true);
    qa.w = stg.view(TensorView::contiguous(w.data(), DType::F32, {T, kIndexHeads}), true);
    IndexerTopkArgs ta;
    ta.ratio = m.ratio;
    ta.role = m.role;
    ta.q8 = qa.q8;
    ta.w = qa.w;
    ta.positions = qa.positions;
    ta.token_to_req = in(req_in, DType::I32, {T});
    ta.token_valid = in(valid_in, DType::I32, {T});
    ta.block_table = in(bt_in, DType::I32, {m.num_reqs, bt_cols});
    const auto k_bytes = f.bytes(p + "k_cache");
    ta.k_cache.base = stg.put(k_bytes.data(), k_bytes.size(), false);
    ta.k_cache.num_pages = m.num_pages;
    ta.k_cache.states_per_page = m.S;
    ta.k_cache.page_stride = m.page_stride;
    ta.k_cache.device = opt.device;
    ta.topk = stg.view(TensorView::contiguous(topk.data(), DType::I32, {T, kIndexTopk}), true);
    if (!cand.empty())
      ta.candidates =
          stg.view(TensorView::contiguous(cand.data(), DType::I32, {T, kCandidateTopkBlocks}),
                   m.role == IndexerRole::kCandidateSource);
    if (cols > 0) ta.scores = stg.view(TensorView::contiguous(scores.data(), DType::F32, {T, cols}), true);
    // CUDA: the top-k's caller-owned workspace (cudaMalloc'd by the staging: aligned)
    std::vector<uint8_t> ws(opt.device == Device::CPU ? 0
                                                      : static_cast<size_t>(indexer_topk_workspace_bytes(
                                                            T, bt_cols, m.S, m.role)));
    if (!ws.empty())
      ta.workspace = stg.view(TensorView::contiguous(ws.data(), DType::U8, {static_cast<int64_t>(ws.size())}));
    try {
      indexer_prepare_q(qa, ctx);
      indexer_topk(ta, ctx);
    } catch (const Error& e) {
      cr.error = fmt::format("the indexer threw: {}", e.what());
    }
    stg.download();

    if (cr.error.empty()) {
      // ---- q8 and w: exact
      const auto q8_ref = f.copy_as<uint8_t>(p + "q8_ref");
      const auto w_ref = f.copy_as<float>(p + "w_ref");
      {
        ReadCheck c{"q8", true, "", ""};
        int64_t n = 0, first = -1;
        for (size_t i = 0; i < q8.size(); ++i) {
          if (q8[i] == q8_ref[i]) continue;
          if (n++ == 0) first = static_cast<int64_t>(i);
        }
        c.pass = n == 0;
        c.summary = fmt::format("{} e4m3 codes of {} tokens x 32 heads {}", q8.size(), T,
                                c.pass ? "byte-identical" : fmt::format("({} differ)", n));
        if (!c.pass) c.detail = mismatch(n, first, q8[static_cast<size_t>(first)], q8_ref[static_cast<size_t>(first)]);
        cr.checks.push_back(std::move(c));
      }
      {
        ReadCheck c{"w", true, "", ""};
        int64_t n = 0, first = -1;
        for (size_t i = 0; i < w.size(); ++i) {
          if (num::f2u(w[i]) == num::f2u(w_ref[i])) continue;
          if (n++ == 0) first = static_cast<int64_t>(i);
        }
        c.pass = n == 0;
        c.summary = fmt::format("{} folded weights {}", w.size(), c.pass ? "bit-identical" : fmt::format("({} differ)", n));
        if (!c.pass) c.detail = mismatch(n, first, w[static_cast<size_t>(first)], w_ref[static_cast<size_t>(first)]);
        cr.checks.push_back(std::move(c));
      }

      // ---- top-k and candidates: sets with the SPEC 8.8 boundary tolerance
      const auto& pos = pos_in;
      const auto& req = req_in;
      const auto& valid = valid_in;
      const auto& bt = bt_in;
      const auto scores_ref = f.copy_as<float>(p + "scores_ref");
      const auto topk_ref = f.copy_as<int32_t>(p + "topk_ref");
      const auto cand_ref = m.role == IndexerRole::kCandidateSource ? f.copy_as<int32_t>(p + "candidates_ref")
                                                                    : std::vector<int32_t>{};
      ReadCheck tc{"topk", true, "", ""}, cc{"candidates", true, "", ""};
      int64_t t_diff = 0, c_diff = 0, score_diff = 0, rows_identical = 0;
      double max_score_err = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t nc = valid[static_cast<size_t>(t)] ? (pos[static_cast<size_t>(t)] + 1) / m.ratio : 0;
        TokenRef r;
        r.scores = scores_ref.data() + t * cols;
        r.cols = cols;
        r.nc = nc;
        r.q8 = q8_ref.data() + t * HD;
        r.w = w_ref.data() + t * kIndexHeads;
        r.k_cache = k_bytes.data();
        r.pages = bt.data() + static_cast<int64_t>(req[static_cast<size_t>(t)]) * bt_cols;
        r.S = m.S;
        r.page_stride = m.page_stride;
        for (int64_t i = 0; i < cols; ++i) {
          const float a = scores[static_cast<size_t>(t * cols + i)], b = scores_ref[static_cast<size_t>(t * cols + i)];
          if (num::f2u(a) == num::f2u(b)) continue;
          ++score_diff;
          const double tol = std::isfinite(a) && std::isfinite(b) ? r.tolerance(i) : 0.0;
          if (tol > 0.0) max_score_err = std::max(max_score_err, std::fabs(double{a} - b) / tol);
        }
        const int32_t* ours = topk.data() + t * kIndexTopk;
        const int32_t* ref = topk_ref.data() + t * kIndexTopk;
        rows_identical += std::equal(ours, ours + kIndexTopk, ref);
        const std::string why =
            topk_row_agreement(ours, ref, kIndexTopk, [&](int64_t i) { return double{r.score(i)}; },
                          [&](int64_t i) { return i < nc ? r.tolerance(i) : 0.0; }, t_diff);
        if (!why.empty() && tc.pass) {
          tc.pass = false;
          tc.detail = fmt::format("token {}: {}", t, why);
        }
        if (m.role != IndexerRole::kCandidateSource) continue;
        // block scores of the reference: the max of its entries, the newest block +inf; a block's
        // tolerance that of the entry holding the max
        const int64_t nb = (nc + kCandidateBlockSize - 1) / kCandidateBlockSize;
        auto arg_max = [&](int64_t b) {
          int64_t best = b * kCandidateBlockSize;
          for (int64_t i = best + 1; i < std::min(nc, (b + 1) * kCandidateBlockSize); ++i)
            if (r.score(i) > r.score(best)) best = i;
          return best;
        };
        auto block_score = [&](int64_t b) {
          if (b < 0 || b >= nb) return -double{kInf};
          return b == nb - 1 ? double{kInf} : double{r.score(arg_max(b))};
        };
        auto block_tol = [&](int64_t b) { return b >= 0 && b < nb - 1 ? r.tolerance(arg_max(b)) : 0.0; };
        const std::string cwhy =
            topk_row_agreement(cand.data() + t * kCandidateTopkBlocks, cand_ref.data() + t * kCandidateTopkBlocks,
                          kCandidateTopkBlocks, block_score, block_tol, c_diff);
        if (!cwhy.empty() && cc.pass) {
          cc.pass = false;
          cc.detail = fmt::format("token {}: {}", t, cwhy);
        }
      }
      tc.summary = fmt::format("{}/{} rows identical, {} entries differ{}; scores: {} differ from scores_ref{}", rows_identical,
                               T, t_diff, t_diff ? " (within the SPEC 8.8 tolerance of the boundary)" : "", score_diff,
                               score_diff ? fmt::format(", by at most {:.3g} of the SPEC 8.8 tolerance", max_score_err) : "");
      cr.checks.push_back(std::move(tc));
      if (m.role == IndexerRole::kCandidateSource) {
        cc.summary = fmt::format("{} rows of 2048 blocks, {} blocks differ{}", T, c_diff,
                                 c_diff ? " (within the SPEC 8.8 tolerance of the boundary)" : "");
        cr.checks.push_back(std::move(cc));
      }
    }
    if (dump.on()) {
      dump.add(p + "q8", StDType::U8, {T, kIndexHeads, kIndexHeadDim}, q8);
      dump.add(p + "w", StDType::F32, {T, kIndexHeads}, w);
      dump.add(p + "topk", StDType::I32, {T, kIndexTopk}, topk);
      if (m.role == IndexerRole::kCandidateSource) dump.add(p + "candidates", StDType::I32, {T, kCandidateTopkBlocks}, cand);
    }
    res.read_cases.push_back(std::move(cr));
  }
  res.dump_path = dump.finish();
  return res;
}

}  // namespace dsv41kv::conformance::detail

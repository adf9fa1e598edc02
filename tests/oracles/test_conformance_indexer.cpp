// The conformance runner of op indexer_topk (shared/conformance/README.md): the shipped file passes
// every check; doctored references fail where the agreement rule says they must (one top-k entry
// beyond the SPEC 8.8 tolerance of the boundary, one candidate block) and pass where it admits a
// difference (an entry within the tolerance of the boundary); `--dump` writes the outputs; and a
// file with candidate-source and candidate-consumer cases (built here from the library's own
// outputs, since the shipped file has none) exercises the candidates check.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/reference.hpp"
#include "dsv41kv/rng.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/cli.hpp"
#include "support/paths.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

using st::SafetensorsFile;
using st::SafetensorsWriter;
using st::StDType;

std::string shipped_indexer() { return conformance_dir() + "/indexer_shared.safetensors.gz"; }

#define SKIP_WITHOUT_SHIPPED_FILE()                                                             \
  if (!std::filesystem::exists(shipped_indexer())) GTEST_SKIP() << "no conformance file " << shipped_indexer()

const conformance::ReadCheck* find_check(const conformance::ReadCaseResult& c, const std::string& what) {
  for (const auto& k : c.checks)
    if (k.what == what) return &k;
  return nullptr;
}

// A copy of `src` at `dst` with tensor `name` (of element type T) edited.
template <class T>
void write_doctored(const SafetensorsFile& f, const std::string& dst, const std::string& name,
                    const std::function<void(std::vector<T>&)>& edit) {
  SafetensorsWriter w;
  for (const auto& t : f.names()) {
    if (t != name) {
      w.add_from(f, t);
      continue;
    }
    std::vector<T> v = f.copy_as<T>(t);
    edit(v);
    w.add(t, f.info(t).dtype, f.info(t).shape,
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)));
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  w.write(dst);
}

TEST(IndexerConformance, ShippedFileAgrees) {
  SKIP_WITHOUT_SHIPPED_FILE();
  const conformance::FileResult r = conformance::run_file(shipped_indexer());
  EXPECT_EQ(r.op, "indexer_topk");
  ASSERT_EQ(r.read_cases.size(), 2u);
  EXPECT_EQ(r.checks(), 6);  // q8, w, topk per case (no candidate source among them)
  EXPECT_EQ(r.failed(), 0);
  for (const auto& c : r.read_cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(c.pass()) << c.error;
    for (const char* what : {"q8", "w", "topk"}) {
      const auto* k = find_check(c, what);
      ASSERT_NE(k, nullptr) << what;
      EXPECT_TRUE(k->pass) << what << ": " << k->summary << "; " << k->detail;
    }
  }
  const auto lines = conformance::report(r);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines[0].find("indexer_topk c0 idx_r2"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("PASS"), std::string::npos) << lines[0];
  // the acceptance criterion as a user runs it
  TempDir tmp;
  const CliRun cli = run_cli("conform '" + shipped_indexer() + "'", tmp);
  EXPECT_EQ(cli.code, 0) << cli.out << cli.err;
  EXPECT_EQ(cli.last_line(), "6 passed, 0 failed") << cli.out;
}

// The reference row of c0 token 6 (n_c = 1501: a real selection) and what the tolerance needs.
struct Row {
  SafetensorsFile f;
  int64_t t = 6, nc = 0, cols = 0, S = 0, page_stride = 0;
  std::vector<float> scores;      // scores_ref[t]
  std::vector<int32_t> topk;      // topk_ref[t]
  std::vector<int32_t> by_score;  // entries < n_c, by reference score descending
  double tol(int64_t i) const {
    const auto q8 = f.copy_as<uint8_t>("c0.q8_ref");
    const auto w = f.copy_as<float>("c0.w_ref");
    const auto bt = f.copy_as<int32_t>("c0.block_table");
    const auto req = f.copy_as<int32_t>("c0.token_to_req");
    const int64_t bt_cols = f.info("c0.block_table").shape[1];
    const auto k = f.bytes("c0.k_cache");
    const uint8_t* page = k.data() + int64_t{bt[static_cast<size_t>(req[static_cast<size_t>(t)] * bt_cols + i / S)]} * page_stride;
    return reference::kIndexerScoreRtol *
           reference::indexer_score_magnitude(q8.data() + t * 32 * 128, w.data() + t * 32,
                                              rec::index_k_fp8_codes(page, S, i % S), rec::read_index_k_fp8_scale(page, S, i % S));
  }
};

Row load_row() {
  Row r;
  r.f = SafetensorsFile::load(shipped_indexer());
  const auto meta = nlohmann::json::parse(r.f.metadata("dsv41"));
  r.S = meta.at("cases")[0].at("states_per_page");
  r.page_stride = meta.at("cases")[0].at("page_stride");
  r.nc = (r.f.copy_as<int64_t>("c0.positions")[static_cast<size_t>(r.t)] + 1) / 2;
  r.cols = r.f.info("c0.scores_ref").shape[1];
  const auto all = r.f.copy_as<float>("c0.scores_ref");
  r.scores.assign(all.begin() + r.t * r.cols, all.begin() + (r.t + 1) * r.cols);
  const auto tk = r.f.copy_as<int32_t>("c0.topk_ref");
  r.topk.assign(tk.begin() + r.t * 512, tk.begin() + (r.t + 1) * 512);
  r.by_score.resize(static_cast<size_t>(r.nc));
  std::iota(r.by_score.begin(), r.by_score.end(), 0);
  std::sort(r.by_score.begin(), r.by_score.end(), [&](int32_t a, int32_t b) {
    return r.scores[static_cast<size_t>(a)] != r.scores[static_cast<size_t>(b)] ? r.scores[static_cast<size_t>(a)] > r.scores[static_cast<size_t>(b)] : a < b;
  });
  return r;
}

// topk_ref[t] with entry `out` replaced by `in`, sorted again.
void replace_entry(std::vector<int32_t>& all, int64_t t, int32_t out, int32_t in) {
  int32_t* row = all.data() + t * 512;
  std::replace(row, row + 512, out, in);
  std::sort(row, row + 512, [](int32_t a, int32_t b) { return (a < 0) != (b < 0) ? a >= 0 : a < b; });
}

// One top-k entry far below the boundary in place of the best one: the topk check of c0 fails,
// naming the token, and every other check passes.
TEST(IndexerConformance, DoctoredTopkEntryBeyondToleranceFails) {
  SKIP_WITHOUT_SHIPPED_FILE();
  const Row r = load_row();
  ASSERT_EQ(r.nc, 1501);
  const int32_t best = r.by_score.front(), worst = r.by_score.back();
  TempDir tmp;
  const std::string path = tmp / "doctored.safetensors";
  write_doctored<int32_t>(r.f, path, "c0.topk_ref", [&](std::vector<int32_t>& v) { replace_entry(v, r.t, best, worst); });
  const conformance::FileResult res = conformance::run_file(path);
  EXPECT_EQ(res.failed(), 1);
  const auto* k = find_check(res.read_cases.at(0), "topk");
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE(k->pass);
  EXPECT_NE(k->detail.find("token 6:"), std::string::npos) << k->detail;
  EXPECT_NE(k->detail.find("beyond the tolerance"), std::string::npos) << k->detail;
  EXPECT_TRUE(res.read_cases.at(1).pass());
  // and the CLI says so with exit status 1
  const CliRun cli = run_cli("conform '" + path + "'", tmp);
  EXPECT_EQ(cli.code, 1) << cli.out << cli.err;
  EXPECT_EQ(cli.last_line(), "5 passed, 1 failed") << cli.out;
}

// SPEC 8.8's exception: the reference takes the (K+1)-th entry c instead of the K-th entry b, and
// its scores say c lies below b by `gap`. The runner admits the difference when the gap is within
// the two entries' tolerances and rejects it beyond.
TEST(IndexerConformance, BoundaryDifferenceWithinTheToleranceIsAdmitted) {
  SKIP_WITHOUT_SHIPPED_FILE();
  const Row r = load_row();
  const int32_t b = r.by_score[511], c = r.by_score[512];
  const double bound = r.tol(b) + r.tol(c);
  ASSERT_GT(bound, 0.0);
  for (const auto& [factor, pass] : {std::pair{0.5, true}, std::pair{3.0, false}}) {
    SCOPED_TRACE("gap " + std::to_string(factor) + " x the tolerance");
    TempDir tmp;
    const std::string p1 = tmp / "a.safetensors", p2 = tmp / "b.safetensors";
    write_doctored<int32_t>(r.f, p1, "c0.topk_ref", [&](std::vector<int32_t>& v) { replace_entry(v, r.t, b, c); });
    const SafetensorsFile f1 = SafetensorsFile::load(p1);
    write_doctored<float>(f1, p2, "c0.scores_ref", [&](std::vector<float>& v) {
      v[static_cast<size_t>(r.t * r.cols + c)] = static_cast<float>(r.scores[static_cast<size_t>(b)] - factor * bound);
    });
    const conformance::FileResult res = conformance::run_file(p2);
    const auto* k = find_check(res.read_cases.at(0), "topk");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->pass, pass) << k->summary << "; " << k->detail;
    EXPECT_NE(k->summary.find("2 entries differ"), std::string::npos) << k->summary;
  }
}

TEST(IndexerConformance, DumpWritesTheOutputs) {
  SKIP_WITHOUT_SHIPPED_FILE();
  TempDir tmp;
  conformance::Options opt;
  opt.dump_dir = tmp / "dump";
  const conformance::FileResult r = conformance::run_file(shipped_indexer(), opt);
  ASSERT_EQ(r.dump_path, tmp / "dump/indexer_shared.safetensors");
  const SafetensorsFile in = SafetensorsFile::load(shipped_indexer());
  const SafetensorsFile d = SafetensorsFile::load(r.dump_path);
  for (int c = 0; c < 2; ++c) {
    const std::string p = fmt::format("c{}.", c);
    ASSERT_TRUE(d.has(p + "q8") && d.has(p + "w") && d.has(p + "topk")) << p;
    EXPECT_FALSE(d.has(p + "candidates"));
    EXPECT_EQ(d.copy_as<uint8_t>(p + "q8"), in.copy_as<uint8_t>(p + "q8_ref"));
    EXPECT_EQ(d.copy_as<int32_t>(p + "topk"), in.copy_as<int32_t>(p + "topk_ref"));
    const auto w = d.copy_as<float>(p + "w"), wr = in.copy_as<float>(p + "w_ref");
    ASSERT_EQ(w.size(), wr.size());
    EXPECT_EQ(std::memcmp(w.data(), wr.data(), w.size() * 4), 0);
    EXPECT_EQ(d.info(p + "topk").shape, (std::vector<int64_t>{in.info(p + "topk_ref").shape}));
  }
}

// ---------------------------------------------------------------- candidate roles

// A file of the README's format with a candidate-source case and a candidate-consumer case over
// one random step (n_c 17001, more than 2048 blocks, and 901), its references the library's outputs.
std::string write_candidate_file(const TempDir& tmp) {
  Rng rng(17);
  const int64_t T = 2, S = 64, num_reqs = 2, bt_cols = 270, num_pages = 2 * 268 + 2, table_rows = 17100;
  const int64_t stride = IndexerKFp8Layout::default_page_stride(S);
  std::vector<int64_t> pos = {17000, 900};
  std::vector<int32_t> req = {0, 1}, valid = {1, 1};
  std::vector<int32_t> bt(static_cast<size_t>(num_reqs * bt_cols), 0);
  std::vector<int32_t> perm(static_cast<size_t>(num_pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  rng.shuffle(perm);
  for (int64_t i = 0; i < num_reqs * 268; ++i) bt[static_cast<size_t>((i / 268) * bt_cols + i % 268)] = perm[static_cast<size_t>(i)];
  std::vector<uint8_t> k(static_cast<size_t>(num_pages * stride), 165);
  for (int64_t p = 0; p < num_pages; ++p)
    for (int64_t s = 0; s < S; ++s) {
      uint8_t* page = k.data() + p * stride;
      for (int d = 0; d < 128; ++d) {  // random finite codes
        const auto c = static_cast<uint8_t>(rng.next() & 0xFF);
        page[s * 128 + d] = (c & 0x7F) == 0x7F ? 0x7E : c;
      }
      const float sc = std::ldexp(1.0f, static_cast<int>(rng.integer(-6, 6)));
      std::memcpy(page + IndexerKFp8Layout::scale_offset(S, s), &sc, 4);
    }
  const auto table = random_rope_table(table_rows, rng);
  SafetensorsWriter w;
  w.add<float>("cos_sin", {table_rows, 64}, std::span<const float>(table));
  nlohmann::json cases = nlohmann::json::array();
  std::vector<int32_t> source_cand;
  for (int ci = 0; ci < 2; ++ci) {
    const IndexerRole role = ci == 0 ? IndexerRole::kCandidateSource : IndexerRole::kCandidateConsumer;
    const auto q = random_bf16(static_cast<size_t>(T * 32 * 128), rng);
    const auto w_raw = random_bf16(static_cast<size_t>(T * 32), rng);
    std::vector<uint8_t> q8(static_cast<size_t>(T * 32 * 128));
    std::vector<float> wf(static_cast<size_t>(T * 32)), scores(static_cast<size_t>(T * 17001));
    std::vector<int32_t> topk(static_cast<size_t>(T * 512)), cand(static_cast<size_t>(T * 2048));
    IndexQPrepArgs qa;
    qa.q = TensorView::contiguous(const_cast<uint16_t*>(q.data()), DType::BF16, {T, 32, 128});
    qa.w_raw = TensorView::contiguous(const_cast<uint16_t*>(w_raw.data()), DType::BF16, {T, 32});
    qa.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    qa.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {table_rows, 64});
    qa.q8 = TensorView::contiguous(q8.data(), DType::U8, {T, 32, 128});
    qa.w = TensorView::contiguous(wf.data(), DType::F32, {T, 32});
    indexer_prepare_q(qa);
    if (role == IndexerRole::kCandidateConsumer) cand = source_cand;
    IndexerTopkArgs ta;
    ta.ratio = 1;
    ta.role = role;
    ta.q8 = qa.q8;
    ta.w = qa.w;
    ta.positions = qa.positions;
    ta.token_to_req = TensorView::contiguous(req.data(), DType::I32, {T});
    ta.token_valid = TensorView::contiguous(valid.data(), DType::I32, {T});
    ta.block_table = TensorView::contiguous(bt.data(), DType::I32, {num_reqs, bt_cols});
    ta.k_cache = IndexKCacheView{k.data(), IndexKFormat::FP8_132, num_pages, S, stride};
    ta.topk = TensorView::contiguous(topk.data(), DType::I32, {T, 512});
    ta.candidates = TensorView::contiguous(cand.data(), DType::I32, {T, 2048});
    ta.scores = TensorView::contiguous(scores.data(), DType::F32, {T, 17001});
    indexer_topk(ta);
    const std::string p = fmt::format("c{}.", ci);
    w.add(p + "q", StDType::BF16, {T, 32, 128}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(q.data()), q.size() * 2));
    w.add(p + "w_raw", StDType::BF16, {T, 32}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(w_raw.data()), w_raw.size() * 2));
    w.add<int64_t>(p + "positions", {T}, std::span<const int64_t>(pos));
    w.add<int32_t>(p + "token_to_req", {T}, std::span<const int32_t>(req));
    w.add<int32_t>(p + "token_valid", {T}, std::span<const int32_t>(valid));
    w.add<int32_t>(p + "block_table", {num_reqs, bt_cols}, std::span<const int32_t>(bt));
    w.add<uint8_t>(p + "k_cache", {num_pages * stride}, std::span<const uint8_t>(k));
    w.add<uint8_t>(p + "q8_ref", {T, 32, 128}, std::span<const uint8_t>(q8));
    w.add<float>(p + "w_ref", {T, 32}, std::span<const float>(wf));
    w.add<float>(p + "scores_ref", {T, 17001}, std::span<const float>(scores));
    w.add<int32_t>(p + "topk_ref", {T, 512}, std::span<const int32_t>(topk));
    if (role == IndexerRole::kCandidateSource) {
      source_cand = cand;
      w.add<int32_t>(p + "candidates_ref", {T, 2048}, std::span<const int32_t>(cand));
    } else {
      w.add<int32_t>(p + "candidates", {T, 2048}, std::span<const int32_t>(cand));
    }
    cases.push_back({{"name", ci == 0 ? "source" : "consumer"}, {"compress_ratio", 1}, {"num_tokens", T},
                     {"num_reqs", num_reqs}, {"states_per_page", S}, {"page_stride", stride}, {"num_pages", num_pages},
                     {"role", indexer_role_name(role)}});
  }
  const nlohmann::json meta = {{"op", "indexer_topk"}, {"index_n_heads", 32}, {"index_head_dim", 128},
                               {"index_topk", 512}, {"candidate_block_size", 8}, {"candidate_topk_blocks", 2048},
                               {"cases", cases}};
  w.set_metadata("dsv41", meta.dump());
  const std::string path = tmp / "candidates.safetensors";
  w.write(path);
  return path;
}

TEST(IndexerConformance, CandidateRolesAgreeAndADoctoredBlockFails) {
  TempDir tmp;
  const std::string path = write_candidate_file(tmp);
  {
    conformance::Options opt;
    opt.dump_dir = tmp / "dump";
    const conformance::FileResult r = conformance::run_file(path, opt);
    ASSERT_EQ(r.read_cases.size(), 2u);
    EXPECT_EQ(r.checks(), 7);  // q8, w, topk, candidates | q8, w, topk
    EXPECT_EQ(r.failed(), 0);
    ASSERT_NE(find_check(r.read_cases[0], "candidates"), nullptr);
    EXPECT_TRUE(find_check(r.read_cases[0], "candidates")->pass);
    EXPECT_EQ(find_check(r.read_cases[1], "candidates"), nullptr);
    const SafetensorsFile d = SafetensorsFile::load(r.dump_path);
    EXPECT_TRUE(d.has("c0.candidates"));
  }
  // token 0 (n_c = 17001, 2126 blocks): the reference drops one of the kept blocks far above the
  // boundary for one that was dropped
  const std::string doctored = tmp / "doctored.safetensors";
  write_doctored<int32_t>(SafetensorsFile::load(path), doctored, "c0.candidates_ref", [](std::vector<int32_t>& c) {
    std::vector<int32_t> row(c.begin(), c.begin() + 2048);
    int32_t missing = 0;
    while (std::binary_search(row.begin(), row.end(), missing)) ++missing;
    row[1000] = missing;
    std::sort(row.begin(), row.end());
    std::copy(row.begin(), row.end(), c.begin());
  });
  const conformance::FileResult bad = conformance::run_file(doctored);
  EXPECT_EQ(bad.failed(), 1);
  const auto* k = find_check(bad.read_cases.at(0), "candidates");
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE(k->pass);
  EXPECT_NE(k->detail.find("token 0:"), std::string::npos) << k->detail;
}

}  // namespace
}  // namespace dsv41kv::test

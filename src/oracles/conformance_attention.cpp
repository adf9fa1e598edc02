// The read-path conformance runners of the attention ops (shared/conformance/README.md, ops
// `sparse_decode` and `sparse_prefill`): every case runs dsv41kv::sparse_decode /
// sparse_prefill on the file's inputs (outputs canary-filled) and is judged by the README's
// agreement rule (check_attention_out, check_attention_lse: SPEC 9.7) against the file's
// binary64 references. `--dump DIR` writes c{i}.out (bf16 [T, H, 512]) and c{i}.lse (f32 [T, H]).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/conformance.hpp"
#include "dsv41kv/numerics.hpp"
#include "oracles/conformance_file.hpp"

namespace dsv41kv::conformance {

ReadCheck check_attention_out(const uint16_t* out, const double* ref, int64_t rows, int rotated_from) {
  ReadCheck c;
  c.what = "out";
  int64_t bad = 0, zero_rows = 0, bad_rows = 0;
  double max_abs = 0, max_rel = 0, min_cos = 1;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* o = out + r * kLatentDim;
    const double* e = ref + r * kLatentDim;
    bool ref_zero = true, row_bad = false;
    double dot = 0, no = 0, ne = 0;
    for (int d = 0; d < kLatentDim; ++d) {
      const double a = num::bf16_decode(o[d]), b = e[d];
      ref_zero = ref_zero && b == 0.0;
      bool ok;
      if (!std::isfinite(b)) {
        ok = std::isnan(b) ? std::isnan(a) : a == b;
      } else {
        const double err = std::fabs(a - b);
        const double mag = d >= rotated_from && std::isfinite(e[d ^ 1]) ? std::max(std::fabs(b), std::fabs(e[d ^ 1]))
                                                                        : std::fabs(b);
        ok = err <= kAttnAtol + kAttnRtol * mag;
        if (std::isfinite(err)) {
          max_abs = std::max(max_abs, err);
          if (std::fabs(b) > kAttnAtol) max_rel = std::max(max_rel, err / std::fabs(b));
        }
        dot += a * b;
        no += a * a;
        ne += b * b;
      }
      if (!ok) {
        ++bad;
        row_bad = true;
        if (c.detail.empty()) c.detail = fmt::format("row {} dim {}: {} vs reference {}", r, d, a, b);
      }
    }
    if (ref_zero) {
      ++zero_rows;
      for (int d = 0; d < kLatentDim && !row_bad; ++d)
        if (num::bf16_decode(o[d]) != 0.0) {
          row_bad = true;
          if (c.detail.empty())
            c.detail = fmt::format("row {} is 0 in the reference, but dim {} is {}", r, d, num::bf16_decode(o[d]));
        }
    } else {
      const double cosv = (no > 0 && ne > 0) ? dot / (std::sqrt(no) * std::sqrt(ne)) : 0.0;
      min_cos = std::min(min_cos, cosv);
      if (!(cosv >= 1.0 - kAttnCosineGap)) {
        row_bad = true;
        if (c.detail.empty()) c.detail = fmt::format("row {}: cosine similarity 1 - {:.3e}", r, 1.0 - cosv);
      }
    }
    bad_rows += row_bad;
  }
  c.pass = bad == 0 && bad_rows == 0;
  c.summary = fmt::format("rows {} ({} zero): elements within {} + {} |ref| ({} beyond), max abs err {:.2e}, max rel "
                          "err {:.2e}, min cosine 1 - {:.2e}{}",
                          rows, zero_rows, kAttnAtol, kAttnRtol, bad, max_abs, max_rel, 1.0 - min_cos,
                          bad_rows ? fmt::format(", {} rows fail", bad_rows) : std::string());
  return c;
}

ReadCheck check_attention_lse(const float* lse, const double* ref, int64_t rows) {
  ReadCheck c;
  c.what = "lse";
  int64_t bad = 0, inf_rows = 0;
  double max_abs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double a = lse[r], b = ref[r];
    bool ok;
    if (!std::isfinite(b)) {
      inf_rows += b == std::numeric_limits<double>::infinity();
      ok = std::isnan(b) ? std::isnan(a) : a == b;
    } else {
      const double err = std::fabs(a - b);
      ok = err <= kLseAtol + kLseRtol * std::fabs(b);
      if (std::isfinite(err)) max_abs = std::max(max_abs, err);
    }
    if (!ok) {
      ++bad;
      if (c.detail.empty()) c.detail = fmt::format("row {}: {} vs reference {}", r, a, b);
    }
  }
  c.pass = bad == 0;
  c.summary = fmt::format("rows {} ({} +inf): within {} + {} |ref| ({} beyond), max abs err {:.2e}", rows, inf_rows,
                          kLseAtol, kLseRtol, bad, max_abs);
  return c;
}

namespace detail {
namespace {

using st::SafetensorsFile;
using st::StDType;

constexpr uint16_t kOutCanary = 0x7FC0;  // bf16 NaN: outputs before the op

// A case's record format by its README name; `null` for an absent compressed cache.
RecordFormat record_of(const std::string& path, const json& v, const std::string& where) {
  if (!v.is_string()) bad_file(path, fmt::format("metadata {} is {}, expected a record name", where, v.dump()));
  const std::string name = v.get<std::string>();
  for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288, RecordFormat::PLAIN_BF16})
    if (name == record_info(f).name) return f;
  bad_file(path, fmt::format("metadata {} is \"{}\", expected v4_584, mxfp8_528, nvfp4_288 or bf16", where, name));
}

// The cache of one case: the file's backing as a read-only view (the op only reads it).
CacheView case_cache(const SafetensorsFile& f, const std::string& tensor, RecordFormat fm, int64_t S, int64_t stride,
                     int64_t pages) {
  const RecordInfo& ri = record_info(fm);
  need_tensor(f, tensor, ri.packed ? StDType::U8 : StDType::BF16, {pages * stride});
  CacheView c;
  c.base = const_cast<uint8_t*>(f.bytes(tensor).data());
  c.format = fm;
  c.num_pages = pages;
  c.states_per_page = S;
  c.page_stride = stride;
  c.row_stride = kLatentDim;
  return c;
}

// The outputs of one case, canary-filled, the two checks and the dump.
struct CaseOutputs {
  int64_t T = 0, H = 0;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  CaseOutputs(int64_t T_, int64_t H_)
      : T(T_), H(H_), out(static_cast<size_t>(T_ * H_ * kLatentDim), kOutCanary),
        lse(static_cast<size_t>(T_ * H_), std::numeric_limits<float>::quiet_NaN()) {}
  TensorView out_view() { return TensorView::contiguous(out.data(), DType::BF16, {T, H, kLatentDim}); }
  TensorView lse_view() { return TensorView::contiguous(lse.data(), DType::F32, {T, H}); }

  void judge(const SafetensorsFile& f, const std::string& p, ReadCaseResult& cr, Dump& dump) {
    if (cr.error.empty()) {
      const auto out_ref = f.copy_as<float>(p + "out_ref");
      const auto lse_ref = f.copy_as<float>(p + "lse_ref");
      const std::vector<double> o(out_ref.begin(), out_ref.end()), l(lse_ref.begin(), lse_ref.end());
      cr.checks.push_back(check_attention_out(out.data(), o.data(), T * H));
      cr.checks.push_back(check_attention_lse(lse.data(), l.data(), T * H));
    }
    dump.add(p + "out", StDType::BF16, {T, H, kLatentDim}, out);
    dump.add(p + "lse", StDType::F32, {T, H}, lse);
  }
};

// The views every attention op takes from a case: q, sink, the scale, the outputs.
template <class Args>
void stage_heads(Args& a, const SafetensorsFile& f, const std::string& p, float scale, CaseOutputs& outs,
                 Staging& stg) {
  a.q = stg.view(f.view(p + "q"));
  a.sink = stg.view(f.view(p + "sink"));
  a.softmax_scale = scale;
  a.out = stg.view(outs.out_view(), true);
  a.lse = stg.view(outs.lse_view(), true);
}

// The case loop of both runners: each case's name, T, H and softmax scale, the tensors every case
// has, canary-filled outputs, then `prepare` (the op's own file checks: a malformed file throws
// out of the runner) returns the op call; an Error from the call is the case's error; then the
// checks and the dump.
using CaseCall = std::function<void()>;
template <class Prepare>
FileResult run_cases(const SafetensorsFile& f, const json& j, const Options& opt, const char* op, Prepare&& prepare) {
  const std::string& path = f.source();
  FileResult res;
  res.op = op;
  res.path = path;
  const json& cases = need_cases(j, path);
  Dump dump(opt, f);
  const ExecContext ctx{nullptr, opt.num_threads};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const json& c = cases[ci];
    const std::string where = fmt::format("cases[{}].", ci), p = fmt::format("c{}.", ci);
    ReadCaseResult cr;
    cr.index = static_cast<int>(ci);
    const json& nm = need(c, "name", path, where);
    cr.name = nm.is_string() ? nm.get<std::string>() : nm.dump();
    const int64_t T = need_int(c, "num_tokens", path, where, 0, 1 << 24);
    const int64_t H = need_int(c, "num_heads", path, where, 1, 1 << 16);
    const auto scale = static_cast<float>(need_num(c, "softmax_scale", path));
    need_tensor(f, p + "q", StDType::BF16, {T, H, kLatentDim});
    need_tensor(f, p + "sink", StDType::F32, {H});
    need_tensor(f, p + "out_ref", StDType::F32, {T, H, kLatentDim});
    need_tensor(f, p + "lse_ref", StDType::F32, {T, H});
    CaseOutputs outs(T, H);
    Staging stg(opt.device);
    const CaseCall call = prepare(c, where, p, T, H, scale, outs, stg, ctx);
    try {
      call();
      stg.download();
    } catch (const Error& e) {
      cr.error = fmt::format("{} threw: {}", op, e.what());
    }
    outs.judge(f, p, cr, dump);
    res.read_cases.push_back(std::move(cr));
  }
  res.dump_path = dump.finish();
  return res;
}

}  // namespace

FileResult run_sparse_decode(const SafetensorsFile& f, const json& j, const Options& opt) {
  const std::string& path = f.source();
  return run_cases(f, j, opt, "sparse_decode",
                   [&](const json& c, const std::string& where, const std::string& p, int64_t T, int64_t H, float scale,
                       CaseOutputs& outs, Staging& stg, const ExecContext& ctx) -> CaseCall {
    const RecordFormat swa_f = record_of(path, need(c, "swa_record", path, where), where + "swa_record");
    const CacheView swa = case_cache(f, p + "swa_cache", swa_f, need_int(c, "swa_states_per_page", path, where, 1),
                                     need_int(c, "swa_page_stride", path, where, 1),
                                     need_int(c, "swa_pages", path, where, 1));
    need_tensor(f, p + "swa_indices", StDType::I32, {T, kSwaWindow});
    need_tensor(f, p + "swa_lens", StDType::I32, {T});
    const bool with_cmp = c.contains("cmp_record") && !c["cmp_record"].is_null();
    CacheView cmp;
    if (with_cmp) {
      const RecordFormat cmp_f = record_of(path, c["cmp_record"], where + "cmp_record");
      cmp = case_cache(f, p + "cmp_cache", cmp_f, need_int(c, "cmp_states_per_page", path, where, 1),
                       need_int(c, "cmp_page_stride", path, where, 1), need_int(c, "cmp_pages", path, where, 1));
      need_tensor(f, p + "cmp_indices", StDType::I32, {T, kIndexTopk});
      need_tensor(f, p + "cmp_lens", StDType::I32, {T});
    }
    return [&f, &outs, &stg, &ctx, dev = opt.device, p, T, H, scale, swa, cmp, with_cmp] {
      // The file does not name the layer's ratio; the CPU schedule depends only on the key
      // widths, so a c1a schedule whose block size is the cache's page serves c1a and c2a cases.
      DecodeScheduleArgs sa;
      sa.layer = with_cmp ? LayerType::kC1A : LayerType::kSwaOnly;
      sa.num_tokens = T;
      sa.num_heads = static_cast<int>(H);
      sa.block_size = with_cmp ? cmp.states_per_page : 64;
      sa.device = dev;
      const DecodeSchedule sched = plan_decode_schedule(sa, ctx);
      SparseDecodeArgs a;
      a.schedule = &sched;
      stage_heads(a, f, p, scale, outs, stg);
      a.swa_cache = swa;
      a.swa_cache.device = dev;
      a.swa_cache.base = stg.put(swa.base, f.bytes(p + "swa_cache").size(), false);
      a.swa_indices = stg.view(f.view(p + "swa_indices"));
      a.swa_lens = stg.view(f.view(p + "swa_lens"));
      if (with_cmp) {
        a.cmp_cache = cmp;
        a.cmp_cache.device = dev;
        a.cmp_cache.base = stg.put(cmp.base, f.bytes(p + "cmp_cache").size(), false);
        a.cmp_indices = stg.view(f.view(p + "cmp_indices"));
        a.cmp_lens = stg.view(f.view(p + "cmp_lens"));
      }
      // the split-K partials of the CUDA path (the CPU keeps its own)
      std::vector<float> ws(dev == Device::CUDA ? static_cast<size_t>(sparse_decode_workspace_floats(sched)) : 0);
      if (!ws.empty())
        a.workspace = stg.view(TensorView::contiguous(ws.data(), DType::F32, {static_cast<int64_t>(ws.size())}));
      sparse_decode(a, ctx);
    };
  });
}

FileResult run_sparse_prefill(const SafetensorsFile& f, const json& j, const Options& opt) {
  const std::string& path = f.source();
  return run_cases(f, j, opt, "sparse_prefill",
                   [&](const json& c, const std::string& where, const std::string& p, int64_t T, int64_t, float scale,
                       CaseOutputs& outs, Staging& stg, const ExecContext& ctx) -> CaseCall {
    const int64_t s_kv = need_int(c, "s_kv", path, where, 0, int64_t{1} << 31);
    const int64_t topk = need_int(c, "topk", path, where, 1, 1 << 20);
    need_tensor(f, p + "kv", StDType::BF16, {s_kv, kLatentDim});
    need_tensor(f, p + "indices", StDType::I32, {T, topk});
    need_tensor(f, p + "topk_length", StDType::I32, {T});
    return [&f, &outs, &stg, &ctx, p, scale] {
      SparsePrefillArgs a;
      stage_heads(a, f, p, scale, outs, stg);
      a.kv = stg.view(f.view(p + "kv"));
      a.indices = stg.view(f.view(p + "indices"));
      a.topk_length = stg.view(f.view(p + "topk_length"));
      sparse_prefill(a, ctx);
    };
  });
}

}  // namespace detail
}  // namespace dsv41kv::conformance

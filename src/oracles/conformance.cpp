// Conformance runner (include/dsv41kv/conformance.hpp, SPEC 10.3, shared/conformance/README.md).
#include "dsv41kv/conformance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "dsv41kv/compressor.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/safetensors.hpp"
#include "oracles/conformance_file.hpp"

namespace dsv41kv::conformance {
namespace {

using detail::bad_file;
using detail::json;
using detail::need;
using detail::need_int;
using detail::need_num;
using detail::need_tensor;
using detail::Staging;
using st::SafetensorsFile;
using st::StDType;

constexpr uint16_t kLatentCanary = 0x7FC0;  // bf16 NaN: latents before the step

// element_agrees's bound as the report and failure details name it.
std::string latent_rule() { return fmt::format("{} + max({} |ref|, 1 bf16 ulp)", kLatentAtol, kLatentRtol); }

// ---------------------------------------------------------------- metadata

struct CaseMeta {
  std::string name;
  int64_t num_reqs = 0, num_tokens = 0, num_pages = 0, ring_blocks = 0, ring_block_stride = 0;
};

struct FileMeta {
  int ratio = 0;
  double eps = 0.0;
  int64_t cap = 0;
  int64_t S = 0;
  uint8_t canary = 0;
  uint16_t bf16_canary = 0;
  int64_t plain_row_stride = 0, plain_page_stride = 0;
  int64_t align[kNumRecordFormats] = {};
  std::vector<CaseMeta> cases;
};

FileMeta parse_meta(const SafetensorsFile& f, const json& j) {
  const std::string& path = f.source();
  FileMeta m;
  m.ratio = static_cast<int>(need_int(j, "compress_ratio", path, "", 1, 2));
  m.eps = need_num(j, "rms_norm_eps", path);
  // compress takes eps >= 0 (finite); a file saying otherwise is malformed (exit 2), not a case
  // that fails against its reference
  if (!(std::isfinite(m.eps) && m.eps >= 0.0))
    bad_file(path, fmt::format("metadata 'rms_norm_eps' is {}, expected a finite value >= 0", m.eps));
  m.cap = need_int(j, "ring_capacity", path, "", 1, 1 << 20);
  m.S = need_int(j, "states_per_page", path, "", 1, 1 << 20);
  m.canary = static_cast<uint8_t>(need_int(j, "canary", path, "", 0, 255));
  m.bf16_canary = num::bf16_encode(static_cast<float>(need_num(j, "bf16_canary", path)));
  m.plain_row_stride = need_int(j, "plain_row_stride", path, "", kLatentDim, 1 << 24);
  m.plain_page_stride = need_int(j, "plain_page_stride", path, "", 1, int64_t{1} << 40);
  const json& al = need(j, "record_page_align", path, "");
  for (RecordFormat fm : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288})
    m.align[static_cast<int>(fm)] = need_int(al, record_info(fm).name, path, "record_page_align.", 1, 1 << 24);
  const json& cases = detail::need_cases(j, path);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const std::string where = fmt::format("cases[{}].", i);
    CaseMeta cm;
    const json& nm = need(c, "name", path, where);
    cm.name = nm.is_string() ? nm.get<std::string>() : nm.dump();
    cm.num_reqs = need_int(c, "num_reqs", path, where, 0, 1 << 24);
    cm.num_tokens = need_int(c, "num_tokens", path, where, 0, 1 << 28);
    cm.num_pages = need_int(c, "num_pages", path, where, 0, 1 << 28);
    cm.ring_blocks = need_int(c, "ring_blocks", path, where, 0, 1 << 28);
    cm.ring_block_stride = need_int(c, "ring_block_stride", path, where, 0, 1 << 28);
    m.cases.push_back(std::move(cm));
  }
  return m;
}

int64_t page_stride_of(const FileMeta& m, RecordFormat f) {
  const RecordInfo& ri = record_info(f);
  if (!ri.packed) return m.plain_page_stride;
  return round_up(m.S * ri.record_bytes, m.align[static_cast<int>(f)]);
}

}  // namespace

bool element_agrees(double a, double b) {
  if (a == b || (std::isnan(a) && std::isnan(b))) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  return std::fabs(a - b) <= kLatentAtol + std::max(kLatentRtol * std::fabs(b), rec::bf16_spacing(b));
}


bool CaseResult::pass() const {
  if (!error.empty() || !latent.pass) return false;
  for (const auto& f : formats)
    if (!f.pass) return false;
  return formats.size() == static_cast<size_t>(kNumRecordFormats);
}

bool ReadCaseResult::pass() const {
  if (!error.empty() || checks.empty()) return false;
  for (const auto& c : checks)
    if (!c.pass) return false;
  return true;
}

int64_t FileResult::checks() const {
  int64_t n = static_cast<int64_t>(cases.size()) * (1 + kNumRecordFormats);
  for (const auto& c : read_cases) n += c.error.empty() ? static_cast<int64_t>(c.checks.size()) : 1;
  return n;
}
int64_t FileResult::failed() const {
  int64_t n = 0;
  for (const auto& c : read_cases) {
    if (!c.error.empty()) {
      ++n;
      continue;
    }
    for (const auto& k : c.checks) n += !k.pass;
  }
  for (const auto& c : cases) {
    n += !(c.error.empty() && c.latent.pass);
    for (int i = 0; i < kNumRecordFormats; ++i)
      n += !(c.error.empty() && static_cast<size_t>(i) < c.formats.size() && c.formats[static_cast<size_t>(i)].pass);
  }
  return n;
}

namespace {

// The element byte pattern of the canary of format f.
uint8_t canary_byte(const FileMeta& m, RecordFormat f, size_t offset) {
  if (f == RecordFormat::PLAIN_BF16) return static_cast<uint8_t>(m.bf16_canary >> (8 * (offset % 2)));
  return m.canary;
}

struct Span {
  size_t begin, bytes;
};
// Byte ranges of the state at `slot` (values then scales; one range for plain rows).
std::vector<Span> record_spans(const FileMeta& m, RecordFormat f, int64_t slot) {
  const RecordInfo& ri = record_info(f);
  const int64_t page = slot / m.S, r = slot % m.S, ps = page_stride_of(m, f);
  if (ri.packed) {
    const auto base = static_cast<size_t>(page * ps);
    return {{base + static_cast<size_t>(r * ri.value_bytes), static_cast<size_t>(ri.value_bytes)},
            {base + static_cast<size_t>(m.S * ri.value_bytes + r * ri.scale_bytes), static_cast<size_t>(ri.scale_bytes)}};
  }
  const size_t es = dtype_size(ri.element);
  return {{static_cast<size_t>((page * ps + r * m.plain_row_stride)) * es, kLatentDim * es}};
}

void check_format(const FileMeta& m, RecordFormat f, const std::vector<int64_t>& slots, const uint8_t* ours,
                  std::span<const uint8_t> ref, float fp8_scale, FormatCheck& out) {
  const RecordInfo& ri = record_info(f);
  const size_t n = ref.size();
  std::vector<uint8_t> written(n, 0);
  out.records = static_cast<int64_t>(slots.size());
  const int64_t ps = page_stride_of(m, f);
  const size_t es = dtype_size(ri.element);
  for (int64_t slot : slots) {
    const auto spans = record_spans(m, f, slot);
    bool same = true;
    for (const Span& s : spans) {
      std::memset(written.data() + s.begin, 1, s.bytes);
      same = same && std::memcmp(ours + s.begin, ref.data() + s.begin, s.bytes) == 0;
    }
    out.identical += same;
    if (same) continue;
    // decode and compare: the plain bf16 rows hold the latent's values, so the latent rule
    // applies to them; every other format agrees within one quantization step
    const int64_t page = slot / m.S, r = slot % m.S;
    const uint8_t* op = ours + static_cast<size_t>(page * ps) * es;
    const uint8_t* rp = ref.data() + static_cast<size_t>(page * ps) * es;
    if (!ri.packed) {
      op += static_cast<size_t>(r * m.plain_row_stride) * es;
      rp += static_cast<size_t>(r * m.plain_row_stride) * es;
    }
    bool beyond = false;
    for (int d = 0; d < kLatentDim && !beyond; ++d) {
      const rec::DecodedValue a = rec::decode_with_step(f, op, m.S, r, d, fp8_scale);
      const rec::DecodedValue b = rec::decode_with_step(f, rp, m.S, r, d, fp8_scale);
      if (f == RecordFormat::PLAIN_BF16) {
        beyond = !element_agrees(a.value, b.value);
        if (beyond && out.detail.empty())
          out.detail = fmt::format("slot {} dim {}: decoded {} vs reference {} (beyond {})", slot, d, a.value,
                                   b.value, latent_rule());
        continue;
      }
      const bool both_nan = std::isnan(a.value) && std::isnan(b.value);
      const double tol = std::max(a.step, b.step);
      if (both_nan) continue;
      if (!(std::fabs(a.value - b.value) <= tol)) {
        beyond = true;
        if (out.detail.empty())
          out.detail = fmt::format("slot {} dim {}: decoded {} vs reference {} (one step = {})", slot, d, a.value,
                                   b.value, tol);
      }
    }
    out.beyond_tolerance += beyond;
  }
  size_t first_stray = n;
  for (size_t o = 0; o < n; ++o) {
    if (written[o]) continue;
    const uint8_t c = canary_byte(m, f, o);
    if (ours[o] != c || ref[o] != c) {
      if (first_stray == n) first_stray = o;
      ++out.stray_bytes;
    }
  }
  if (out.stray_bytes && out.detail.empty())
    out.detail = fmt::format("{} bytes outside the written records are not the canary (first at byte {}: ours {}, "
                             "reference {}, canary {})", out.stray_bytes, first_stray, ours[first_stray],
                             ref[first_stray], canary_byte(m, f, first_stray));
}

std::string percent(int64_t a, int64_t b) { return b == 0 ? "n/a" : fmt::format("{:.1f}%", 100.0 * a / b); }

// op compress_insert (SPEC 10.3).
FileResult run_compress_insert(const SafetensorsFile& f, const json& j, const Options& opt) {
  const std::string& path = f.source();
  const FileMeta m = parse_meta(f, j);
  FileResult res;
  res.op = "compress_insert";
  res.path = path;
  res.ratio = m.ratio;
  const int R = m.ratio;
  need_tensor(f, "norm_weight", StDType::BF16, {kLatentDim});
  need_tensor(f, "cos_sin", StDType::F32, {-1, kRopeDim});
  need_tensor(f, "fp8_scale", StDType::F32, {1});
  const float fp8_scale = f.copy_as<float>("fp8_scale")[0];
  const ExecContext ctx{nullptr, opt.num_threads};

  detail::Dump dump(opt, f);
  const bool dumping = dump.on();

  for (size_t ci = 0; ci < m.cases.size(); ++ci) {
    const CaseMeta& cm = m.cases[ci];
    const std::string p = fmt::format("c{}.", ci);
    const int64_t N = cm.num_tokens;
    CaseResult cr;
    cr.index = static_cast<int>(ci);
    cr.name = cm.name;
    cr.ratio = R;
    cr.num_tokens = N;

    // ---- inputs and reference outputs (shapes checked: a mismatch is a malformed file)
    const st::TensorInfo kvi = need_tensor(f, p + "kv_score", StDType::F32, {-N, kLatentDim * R});
    const int64_t rows = kvi.shape[0];
    need_tensor(f, p + "positions", StDType::I64, {-N});
    need_tensor(f, p + "cache_slots", StDType::I64, {N});
    need_tensor(f, p + "latent_out", StDType::BF16, {rows, kLatentDim});
    const int64_t ring_floats = cm.ring_blocks * cm.ring_block_stride;
    need_tensor(f, p + "ring_in", StDType::F32, {ring_floats});
    need_tensor(f, p + "ring_out", StDType::F32, {ring_floats});
    if (R == 2) {
      need_tensor(f, p + "ring_slots", StDType::I64, {N});
      need_tensor(f, p + "qsl", StDType::I32, {cm.num_reqs + 1});
      need_tensor(f, p + "token_to_req", StDType::I32, {N});
      if (cm.ring_block_stride < m.cap * kRingRowFloats)
        bad_file(path, fmt::format("case {} ring_block_stride {} is below capacity {} * 1024", ci,
                                   cm.ring_block_stride, m.cap));
    }
    for (int fi = 0; fi < kNumRecordFormats; ++fi) {
      const auto fm = static_cast<RecordFormat>(fi);
      const RecordInfo& ri = record_info(fm);
      need_tensor(f, p + "cache_" + ri.name,
                  st::from_dtype(ri.element), {cm.num_pages * page_stride_of(m, fm)});
    }
    if (m.plain_page_stride < (m.S - 1) * m.plain_row_stride + kLatentDim)
      bad_file(path, fmt::format("plain_page_stride {} is below the payload of {} rows of stride {}",
                                 m.plain_page_stride, m.S, m.plain_row_stride));

    const auto positions = f.copy_as<int64_t>(p + "positions");
    const auto cache_slots = f.copy_as<int64_t>(p + "cache_slots");
    // The records the reference wrote: closing tokens with a slot (SPEC 5.1).
    std::set<int64_t> slot_set;
    for (int64_t t = 0; t < N; ++t) {
      const int64_t s = cache_slots[static_cast<size_t>(t)];
      if (s < 0 || (positions[static_cast<size_t>(t)] + 1) % R != 0) continue;
      if (s >= cm.num_pages * m.S)
        bad_file(path, fmt::format("{}cache_slots[{}] = {} is beyond the cache of {} pages * {} states", p, t, s,
                                   cm.num_pages, m.S));
      slot_set.insert(s);
    }
    const std::vector<int64_t> slots(slot_set.begin(), slot_set.end());

    // ---- the project's outputs, canary-filled
    std::vector<uint16_t> latent(static_cast<size_t>(rows * kLatentDim), kLatentCanary);
    const auto ring_in = f.bytes(p + "ring_in");
    std::vector<float> ring(static_cast<size_t>(ring_floats));
    if (!ring.empty()) std::memcpy(ring.data(), ring_in.data(), ring_in.size());

    Staging stg(opt.device);
    auto in = [&](const std::string& name) { return stg.view(f.view(name)); };
    const TensorView table = in("cos_sin");
    const TensorView pos_v = in(p + "positions");
    const TensorView cslots_v = in(p + "cache_slots");
    TensorView latent_v = stg.view(TensorView::contiguous(latent.data(), DType::BF16, {rows, kLatentDim}), true);

    CompressArgs ca;
    ca.ratio = R;
    ca.kv_score = in(p + "kv_score");
    ca.positions = pos_v;
    ca.norm_weight = in("norm_weight");
    ca.eps = static_cast<float>(m.eps);
    ca.latent_out = latent_v;
    if (R == 2) {
      ca.slot_mapping = in(p + "ring_slots");
      ca.qsl = in(p + "qsl");
      ca.token_to_req = in(p + "token_to_req");
      ca.ring = stg.view(TensorView::strided(ring.data(), DType::F32, {cm.ring_blocks, m.cap, kRingRowFloats},
                                             {cm.ring_block_stride, kRingRowFloats, 1}),
                         true);
    } else {
      ca.slot_mapping = cslots_v;
    }
    try {
      compress(ca, ctx);
    } catch (const Error& e) {
      cr.error = fmt::format("compress threw: {}", e.what());
    }

    // ---- inserts: the project's latent and the reference latent, into every format
    const TensorView ref_latent_v = in(p + "latent_out");
    std::vector<std::vector<uint8_t>> ours(kNumRecordFormats), from_ref(kNumRecordFormats);
    std::vector<std::string> insert_err(kNumRecordFormats), ref_insert_err(kNumRecordFormats);
    for (int fi = 0; fi < kNumRecordFormats; ++fi) {
      const auto fm = static_cast<RecordFormat>(fi);
      const RecordInfo& ri = record_info(fm);
      const int64_t ps = page_stride_of(m, fm);
      const size_t nbytes = static_cast<size_t>(cm.num_pages * ps) * dtype_size(ri.element);
      for (auto* buf : {&ours[static_cast<size_t>(fi)], &from_ref[static_cast<size_t>(fi)]}) {
        buf->resize(nbytes);
        for (size_t o = 0; o < nbytes; ++o) (*buf)[o] = canary_byte(m, fm, o);
      }
      auto make_cache = [&](std::vector<uint8_t>& host) {
        CacheView c;
        c.format = fm;
        c.num_pages = cm.num_pages;
        c.states_per_page = m.S;
        c.page_stride = ps;
        c.row_stride = ri.packed ? kLatentDim : m.plain_row_stride;
        c.fp8_scale = fp8_scale;
        c.device = opt.device;
        c.base = stg.put(host.data(), host.size(), true);
        return c;
      };
      InsertArgs ia;
      ia.ratio = R;
      ia.positions = pos_v;
      ia.rope_table = table;
      ia.slots = cslots_v;
      if (cr.error.empty()) {
        ia.latent = latent_v;
        ia.cache = make_cache(ours[static_cast<size_t>(fi)]);
        try {
          insert(ia, ctx);
        } catch (const Error& e) {
          insert_err[static_cast<size_t>(fi)] = fmt::format("insert threw: {}", e.what());
        }
      }
      ia.latent = ref_latent_v;
      ia.cache = make_cache(from_ref[static_cast<size_t>(fi)]);
      try {
        insert(ia, ctx);
      } catch (const Error& e) {
        ref_insert_err[static_cast<size_t>(fi)] = fmt::format("insert of the reference latent threw: {}", e.what());
      }
    }
    stg.download();

    // ---- latent and ring
    {
      LatentCheck& lc = cr.latent;
      const auto ref = f.copy_as<uint16_t>(p + "latent_out");
      lc.rows = rows;
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* rr = ref.data() + r * kLatentDim;
        const uint16_t* orow = latent.data() + r * kLatentDim;
        bool all_nan = true;
        for (int d = 0; d < kLatentDim; ++d) all_nan = all_nan && num::is_nan(num::bf16_decode(rr[d]));
        if (all_nan) {
          bool touched = false;
          for (int d = 0; d < kLatentDim; ++d) touched = touched || orow[d] != kLatentCanary;
          if (touched) {
            ++lc.touched_nan_rows;
            if (lc.detail.empty()) lc.detail = fmt::format("latent row {} is NaN in the reference but was written", r);
          }
          continue;
        }
        ++lc.written_rows;
        for (int d = 0; d < kLatentDim; ++d) {
          const double a = num::bf16_decode(orow[d]), b = num::bf16_decode(rr[d]);
          if (std::isnan(a) && std::isnan(b)) continue;
          lc.differing_elements += orow[d] != rr[d];
          const double err = std::fabs(a - b);
          if (std::isfinite(err)) {
            // ulp distance of two finite bf16 values on the ordered integer line
            auto ord = [](uint16_t b) { return (b & 0x8000) ? -static_cast<int64_t>(b & 0x7FFF) : static_cast<int64_t>(b); };
            lc.max_ulp = std::max(lc.max_ulp, std::abs(ord(orow[d]) - ord(rr[d])));
            lc.max_abs_err = std::max(lc.max_abs_err, err);
            if (std::fabs(b) > kLatentAtol) lc.max_rel_err = std::max(lc.max_rel_err, err / std::fabs(b));
          }
          if (!element_agrees(a, b)) {
            ++lc.bad_elements;
            if (lc.detail.empty())
              lc.detail = fmt::format("latent row {} dim {}: {} vs reference {} (beyond {})", r, d, a, b, latent_rule());
          }
        }
      }
      const auto ring_ref = f.copy_as<float>(p + "ring_out");
      int64_t first = -1;
      for (size_t i = 0; i < ring_ref.size(); ++i) {
        if (num::f2u(ring_ref[i]) != num::f2u(ring[i])) {
          if (first < 0) first = static_cast<int64_t>(i);
          ++lc.ring_diff_floats;
        }
      }
      lc.ring_pass = lc.ring_diff_floats == 0;
      if (!lc.ring_pass && lc.detail.empty())
        lc.detail = fmt::format("ring_out: {} floats differ (first at float {}: {} vs reference {})",
                                lc.ring_diff_floats, first, ring[static_cast<size_t>(first)],
                                ring_ref[static_cast<size_t>(first)]);
      lc.pass = cr.error.empty() && lc.touched_nan_rows == 0 && lc.bad_elements == 0 && lc.ring_pass;
      if (!cr.error.empty()) lc.detail = cr.error;
    }

    // ---- caches
    for (int fi = 0; fi < kNumRecordFormats; ++fi) {
      const auto fm = static_cast<RecordFormat>(fi);
      const auto ufi = static_cast<size_t>(fi);
      const std::string tname = p + "cache_" + record_info(fm).name;
      const auto ref = f.bytes(tname);
      FormatCheck fc;
      fc.format = fm;
      if (cr.error.empty() && insert_err[ufi].empty()) {
        check_format(m, fm, slots, ours[ufi].data(), ref, fp8_scale, fc);
      } else {
        fc.records = static_cast<int64_t>(slots.size());
        fc.detail = !cr.error.empty() ? cr.error : insert_err[ufi];
      }
      if (ref_insert_err[ufi].empty()) {
        const auto& fr = from_ref[ufi];
        int64_t first = -1;
        for (size_t o = 0; o < fr.size(); ++o) {
          if (fr[o] != ref[o]) {
            if (first < 0) first = static_cast<int64_t>(o);
            ++fc.from_reference_diff_bytes;
          }
        }
        fc.from_reference_identical = fc.from_reference_diff_bytes == 0;
        if (!fc.from_reference_identical && fc.detail.empty())
          fc.detail = fmt::format("from-reference-latent: first differing byte {} (ours {}, reference {})", first,
                                  fr[static_cast<size_t>(first)], ref[static_cast<size_t>(first)]);
      } else if (fc.detail.empty()) {
        fc.detail = ref_insert_err[ufi];
      }
      fc.pass = cr.error.empty() && insert_err[ufi].empty() && fc.beyond_tolerance == 0 && fc.stray_bytes == 0 &&
                fc.from_reference_identical;
      if (dumping) {
        dump.add(tname, st::from_dtype(record_info(fm).element), f.info(tname).shape, ours[ufi]);
      }
      cr.formats.push_back(std::move(fc));
    }
    if (dumping) {
      dump.add(p + "latent_out", StDType::BF16, {rows, kLatentDim},
               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(latent.data()), latent.size() * 2));
      dump.add(p + "ring_out", StDType::F32, {ring_floats},
               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(ring.data()), ring.size() * 4));
    }
    res.cases.push_back(std::move(cr));
  }

  res.dump_path = dump.finish();
  return res;
}

}  // namespace

namespace detail {
// The read-path runners (conformance_attention.cpp).
FileResult run_sparse_decode(const SafetensorsFile& f, const json& j, const Options& opt);
FileResult run_sparse_prefill(const SafetensorsFile& f, const json& j, const Options& opt);

// The runner of each op a conformance file may name.
struct OpRunner {
  const char* op;
  FileResult (*run)(const SafetensorsFile&, const json&, const Options&);
};
constexpr OpRunner kRunners[] = {
    {"compress_insert", run_compress_insert},
    {"indexer_topk", run_indexer_topk},
    {"sparse_decode", run_sparse_decode},
    {"sparse_prefill", run_sparse_prefill},
};
}  // namespace detail

FileResult run_file(const std::string& path, const Options& opt) {
  const SafetensorsFile f = SafetensorsFile::load(path);
  const json j = detail::dsv41_metadata(f);
  const json& op = need(j, "op", path, "");
  std::string names;
  for (const detail::OpRunner& r : detail::kRunners) {
    if (op.is_string() && op.get<std::string>() == r.op) {
      FileResult res = r.run(f, j, opt);
      res.path = path;
      return res;
    }
    names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", r.op);
  }
  bad_file(path, fmt::format("metadata 'op' is {}, expected one of {}", op.dump(), names));
}

std::vector<std::string> report(const FileResult& r) {
  std::vector<std::string> lines;
  for (const ReadCaseResult& c : r.read_cases) {
    const std::string prefix = fmt::format("{} c{} {:<16}", r.op, c.index, c.name);
    if (!c.error.empty()) {
      lines.push_back(fmt::format("{} {:<10} FAIL  {}", prefix, "error", c.error));
      continue;
    }
    for (const ReadCheck& k : c.checks) {
      std::string t = fmt::format("{} {:<10} {}  {}", prefix, k.what, k.pass ? "PASS" : "FAIL", k.summary);
      if (!k.pass && !k.detail.empty()) t += "; first: " + k.detail;
      lines.push_back(std::move(t));
    }
  }
  for (const CaseResult& c : r.cases) {
    const std::string prefix = fmt::format("r{} c{} {:<16}", c.ratio, c.index, c.name);
    const LatentCheck& l = c.latent;
    std::string text = fmt::format("{} {:<10} {}  latent rows {}/{} written within {} ({} elements differ, by at most {} "
                                   "bf16 ulp; max rel err {:.2e}), NaN rows untouched{}; ring_out {}",
                                   prefix, "latent", l.pass ? "PASS" : "FAIL", l.written_rows, l.rows, latent_rule(),
                                   l.differing_elements, l.max_ulp, l.max_rel_err, l.touched_nan_rows ? " NOT" : "",
                                   l.ring_pass ? "bit-exact" : fmt::format("{} floats differ", l.ring_diff_floats));
    if (l.bad_elements) text += fmt::format("; {} elements beyond tolerance", l.bad_elements);
    if (!l.pass) text += "; first: " + l.detail;
    lines.push_back(std::move(text));
    for (const FormatCheck& fc : c.formats) {
      std::string t = fmt::format("{} {:<10} {}  records {}/{} byte-identical ({}), from-reference-latent: {}", prefix,
                                  record_info(fc.format).name, fc.pass ? "PASS" : "FAIL", fc.identical, fc.records,
                                  percent(fc.identical, fc.records),
                                  fc.from_reference_identical
                                      ? std::string("identical")
                                      : fmt::format("{} bytes differ", fc.from_reference_diff_bytes));
      if (fc.beyond_tolerance)
        t += fmt::format("; {} records beyond {}", fc.beyond_tolerance,
                         fc.format == RecordFormat::PLAIN_BF16 ? "the latent tolerance" : "one quantization step");
      if (fc.stray_bytes) t += fmt::format("; {} stray bytes", fc.stray_bytes);
      if (!fc.pass && !fc.detail.empty()) t += "; " + fc.detail;
      lines.push_back(std::move(t));
    }
  }
  return lines;
}

}  // namespace dsv41kv::conformance

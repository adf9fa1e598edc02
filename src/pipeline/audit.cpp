// The read-back rule and WriteAudit (pipeline.hpp). The quantization step of a stored value is the
// formats layer's rec::decode_with_step (records.hpp).
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/validate.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/pipeline.hpp"

namespace dsv41kv::pipeline {

bool reads_back(RecordFormat f, const uint8_t* page, int64_t S, int64_t r, int d, float fp8_scale, uint16_t read,
                float expected) {
  const char* op = "reads_back";
  const RecordInfo& ri = record_info(f);
  if (page == nullptr) detail::bad_arg(op, "page", "null, expected the record's page (packed) or row (plain)");
  if (d < 0 || d >= kLatentDim) detail::bad_arg(op, "d", fmt::format("{}, expected 0..{}", d, kLatentDim - 1));
  if (ri.packed && (S < 1 || r < 0 || r >= S))
    detail::bad_arg(op, "r", fmt::format("state {} of a page of {} states, expected 0 <= r < S", r, S));
  const bool stores_bf16 = f == RecordFormat::PLAIN_BF16 || (f == RecordFormat::V4_584 && d >= kNopeDim);
  if (stores_bf16) return read == num::bf16_encode(expected);
  const rec::DecodedValue v = rec::decode_with_step(f, page, S, r, d, fp8_scale);
  return std::fabs(static_cast<double>(num::bf16_decode(read)) - static_cast<double>(expected)) <= v.step;
}

int64_t StepWrites::bad_records() const {
  int64_t n = 0;
  for (const FormatReadback& f : formats) n += f.bad_records;
  return n;
}

namespace {
constexpr uint16_t kUnwritten = 0xFFFF;  // bf16 NaN, byte-fillable
}  // namespace

struct WriteAudit::Impl {
  KvSourceLayer& layer;
  std::vector<float> ring_before;
  Buffer gathered;  // bf16 [max_tokens, 512] on the layer's device
  std::vector<uint16_t> latent, back;
  std::vector<int64_t> slots;
  std::vector<float> ring_now;
  std::vector<uint8_t> cache;
  explicit Impl(KvSourceLayer& l) : layer(l) {}
};

WriteAudit::WriteAudit(KvSourceLayer& layer) : impl_(std::make_unique<Impl>(layer)) {
  const ServingConfig& c = layer.config();
  impl_->gathered = Buffer(c.device, static_cast<size_t>(c.max_tokens) * kLatentDim * sizeof(uint16_t));
  const Buffer& ring = layer.ring();
  ring.download(impl_->ring_before, ring.size() / sizeof(float), c.exec);
}

WriteAudit::~WriteAudit() = default;

void WriteAudit::before_step() { impl_->layer.latent().fill(0xFF, 0, SIZE_MAX, impl_->layer.config().exec); }

StepWrites WriteAudit::after_step(const StepMetadata& meta) {
  Impl& m = *impl_;
  KvSourceLayer& L = m.layer;
  const ServingConfig& c = L.config();
  const ExecContext& ctx = c.exec;
  const int64_t N = meta.num_rows();
  if (N > c.max_tokens || meta.config().device != c.device)
    detail::bad_arg("WriteAudit::after_step", "meta",
                    fmt::format("{} rows on {}, expected at most {} on {} (the metadata of the layer's step)", N,
                                device_name(meta.config().device), c.max_tokens, device_name(c.device)));
  StepWrites out;
  L.latent().download(m.latent, static_cast<size_t>(N * kLatentDim), ctx);
  for (int64_t t = 0; t < N; ++t) {
    const uint16_t* row = m.latent.data() + t * kLatentDim;
    for (int d = 0; d < kLatentDim; ++d)
      if (row[d] != kUnwritten) {
        ++out.latents;
        break;
      }
  }
  if (L.ratio() == 2) {
    L.ring().download(m.ring_now, m.ring_before.size(), ctx);
    for (size_t o = 0; o < m.ring_now.size(); o += kRingRowFloats)
      out.ring_rows += std::memcmp(&m.ring_now[o], &m.ring_before[o], kRingRowFloats * sizeof(float)) != 0;
    std::swap(m.ring_before, m.ring_now);
  }
  const TensorView slot_view = meta.compressed_slots(L.ratio());
  m.slots.resize(static_cast<size_t>(N));
  download_view(slot_view, m.slots.data(), ctx);
  for (int64_t s : m.slots) out.records += s >= 0;

  const TensorView back_view = m.gathered.view(DType::BF16, {N, kLatentDim});
  for (size_t i = 0; i < L.num_caches(); ++i) {
    const CacheView& cv = L.cache(i);
    const RecordInfo& ri = record_info(cv.format);
    FormatReadback fr;
    fr.format = cv.format;
    fr.records = out.records;
    gather({cv, slot_view, back_view}, ctx);
    m.gathered.download(m.back, static_cast<size_t>(N * kLatentDim), ctx);
    const Buffer& cb = L.cache_buffer(i);
    cb.download(m.cache, cb.size(), ctx);
    const size_t es = dtype_size(ri.element);
    for (int64_t t = 0; t < N; ++t) {
      const int64_t slot = m.slots[static_cast<size_t>(t)];
      if (slot < 0) continue;
      const int64_t page = slot / cv.states_per_page, r = slot % cv.states_per_page;
      const uint8_t* base = m.cache.data() + static_cast<size_t>(page * cv.page_stride +
                                                                 (ri.packed ? 0 : r * cv.row_stride)) * es;
      for (int d = 0; d < kNopeDim; ++d) {
        float expected = num::bf16_decode(m.latent[static_cast<size_t>(t * kLatentDim + d)]);
#if defined(DSV41KV_TEST_SEAMS)
        if (seam_negate_expected) expected = -expected;
#endif
        const uint16_t read = m.back[static_cast<size_t>(t * kLatentDim + d)];
        if (reads_back(cv.format, base, cv.states_per_page, r, d, cv.fp8_scale, read, expected)) continue;
        if (fr.first_bad.empty())
          fr.first_bad = fmt::format("{}: token {} slot {} dim {}: read back {} for the latent's {}", ri.name, t, slot, d,
                                     num::bf16_decode(read), expected);
        ++fr.bad_records;
        break;
      }
    }
    out.formats.push_back(std::move(fr));
  }
  return out;
}

}  // namespace dsv41kv::pipeline

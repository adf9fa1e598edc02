#include "dsv41kv/records.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace dsv41kv {
namespace {
constexpr RecordInfo kInfos[kNumRecordFormats] = {
    {RecordFormat::V4_584, "v4_584", true, V4Layout::kValueBytes, V4Layout::kScaleBytes,
     V4Layout::kRecordBytes, V4Layout::kPageAlign, DType::U8},
    {RecordFormat::MXFP8_528, "mxfp8_528", true, Mxfp8Layout::kValueBytes,
     Mxfp8Layout::kScaleBytes, Mxfp8Layout::kRecordBytes, Mxfp8Layout::kPageAlign, DType::U8},
    {RecordFormat::NVFP4_288, "nvfp4_288", true, Nvfp4Layout::kValueBytes,
     Nvfp4Layout::kScaleBytes, Nvfp4Layout::kRecordBytes, Nvfp4Layout::kPageAlign, DType::U8},
    {RecordFormat::PLAIN_BF16, "bf16", false, 0, 0, 2 * kLatentDim, 1, DType::BF16},
    {RecordFormat::PLAIN_FP8, "fp8", false, 0, 0, kLatentDim, 1, DType::U8},
};
}  // namespace

const RecordInfo& record_info(RecordFormat f) {
  const auto i = static_cast<size_t>(f);
  if (i >= kNumRecordFormats) invalid_argument(fmt::format("record format: unknown value {}", i));
  return kInfos[i];
}

RecordFormat parse_record_format(const char* name) {
  const std::string s = name ? name : "";
  if (s == "v4_584" || s == "584") return RecordFormat::V4_584;
  if (s == "mxfp8_528" || s == "528") return RecordFormat::MXFP8_528;
  if (s == "nvfp4_288" || s == "288") return RecordFormat::NVFP4_288;
  if (s == "bf16") return RecordFormat::PLAIN_BF16;
  if (s == "fp8") return RecordFormat::PLAIN_FP8;
  invalid_argument(fmt::format(
      "record format: got '{}', expected one of v4_584 (584), mxfp8_528 (528), nvfp4_288 (288), "
      "bf16, fp8",
      s));
}

int64_t CacheView::payload_elements() const {
  const RecordInfo& ri = record_info(format);
  if (ri.packed) return states_per_page * ri.record_bytes;
  return (states_per_page - 1) * row_stride + kLatentDim;
}

size_t CacheView::backing_bytes() const {
  return static_cast<size_t>(backing_elements()) * dtype_size(record_info(format).element);
}

CacheView CacheView::with_default_strides(void* base, RecordFormat f, int64_t num_pages,
                                          int64_t states_per_page, Device device) {
  const RecordInfo& ri = record_info(f);
  CacheView c;
  c.base = base;
  c.format = f;
  c.num_pages = num_pages;
  c.states_per_page = states_per_page;
  c.device = device;
  c.row_stride = kLatentDim;
  c.page_stride = ri.packed ? round_up(states_per_page * ri.record_bytes, ri.page_align)
                            : states_per_page * kLatentDim;
  return c;
}

void validate_cache(const CacheView& c, const char* arg) {
  const RecordInfo& ri = record_info(c.format);
  if (c.base == nullptr) invalid_argument(fmt::format("{}: base pointer is null", arg));
  if (c.num_pages <= 0)
    invalid_argument(fmt::format("{}: num_pages = {}, expected > 0", arg, c.num_pages));
  if (c.states_per_page <= 0)
    invalid_argument(fmt::format("{}: states_per_page = {}, expected > 0", arg, c.states_per_page));
  if (!ri.packed && c.row_stride < kLatentDim)
    invalid_argument(fmt::format("{}: row_stride = {} elements, expected >= 512", arg, c.row_stride));
  // sizes whose products overflow describe no allocation, and the index arithmetic on them
  // (payload, page * page_stride, num_pages * states_per_page) would overflow int64
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t payload = 0, backing = 0, capacity = 0;
  const bool payload_ok =
      ri.packed ? !__builtin_mul_overflow(c.states_per_page, int64_t{ri.record_bytes}, &payload)
                : !__builtin_mul_overflow(c.states_per_page - 1, c.row_stride, &payload) &&
                      !__builtin_add_overflow(payload, int64_t{kLatentDim}, &payload);
  if (!payload_ok || payload > kLimit ||
      __builtin_mul_overflow(c.num_pages, c.page_stride, &backing) ||
      __builtin_mul_overflow(backing, static_cast<int64_t>(dtype_size(ri.element)), &backing) || backing > kLimit ||
      __builtin_mul_overflow(c.num_pages, c.states_per_page, &capacity))
    invalid_argument(fmt::format("{}: {} pages of {} states, page stride {}{} span more than 2^62 bytes, expected "
                                 "the view of an allocation",
                                 arg, c.num_pages, c.states_per_page, c.page_stride,
                                 ri.packed ? std::string() : fmt::format(", row stride {}", c.row_stride)));
  if (c.page_stride < payload)
    invalid_argument(fmt::format("{}: page_stride = {} elements for {} states of {}, expected >= {}",
                                 arg, c.page_stride, c.states_per_page, ri.name,
                                 payload));
  if (c.format == RecordFormat::PLAIN_FP8 && !(c.fp8_scale > 0.0f && num::is_finite(c.fp8_scale)))
    invalid_argument(fmt::format("{}: fp8_scale = {}, expected a finite value > 0", arg, c.fp8_scale));
}

namespace rec {
namespace {

double e4m3_ulp(uint8_t q) {
  const int e = (q >> 3) & 0xF;
  return e == 0 ? std::ldexp(1.0, -9) : std::ldexp(1.0, e - 10);
}
// (bf16 spacing: 8 significant bits, 2^-133 below 2^-126)
double bf16_spacing_of(double x) {
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  if (std::fabs(x) < 0x1p-126) return 0x1p-133;
  int e = 0;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}
double e2m1_step(uint8_t nib) {
  const int m = nib & 7;
  return m <= 3 ? 0.5 : (m <= 5 ? 1.0 : 2.0);
}
double ue8m0(uint8_t s) { return s == 255 ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, s - 127); }

}  // namespace

double bf16_spacing(double x) { return bf16_spacing_of(x); }

DecodedValue decode_with_step(RecordFormat f, const uint8_t* page, int64_t S, int64_t r, int d, float fp8_scale) {
  DecodedValue out;
  switch (f) {
    case RecordFormat::V4_584: {
      const uint8_t* val = page + V4Layout::value_offset(S, r);
      if (d >= kNopeDim) {
        const int i = d - kNopeDim;
        const auto b = static_cast<uint16_t>(val[kNopeDim + 2 * i] | (val[kNopeDim + 2 * i + 1] << 8));
        out.value = num::bf16_decode(b);
        out.step = bf16_spacing(out.value);
      } else {
        const double sc = ue8m0(page[V4Layout::scale_offset(S, r) + d / 64]);
        out.value = num::e4m3_decode(val[d]) * sc;
        out.step = e4m3_ulp(val[d]) * sc;
      }
      break;
    }
    case RecordFormat::MXFP8_528: {
      const uint8_t q = page[Mxfp8Layout::value_offset(S, r) + d];
      const double sc = ue8m0(page[Mxfp8Layout::scale_offset(S, r) + d / 32]);
      out.value = num::e4m3_decode(q) * sc;
      out.step = e4m3_ulp(q) * sc;
      break;
    }
    case RecordFormat::NVFP4_288: {
      const uint8_t b = page[Nvfp4Layout::value_offset(S, r) + d / 2];
      const uint8_t nib = (d & 1) ? (b >> 4) : (b & 0xF);
      const double sc = num::e4m3_decode(page[Nvfp4Layout::scale_offset(S, r) + d / 16]);
      out.value = num::e2m1_decode(nib) * sc;
      out.step = e2m1_step(nib) * sc;
      break;
    }
    case RecordFormat::PLAIN_BF16: {
      const auto b = static_cast<uint16_t>(page[2 * d] | (page[2 * d + 1] << 8));
      out.value = num::bf16_decode(b);
      out.step = bf16_spacing(out.value);
      break;
    }
    case RecordFormat::PLAIN_FP8: {
      const uint8_t q = page[d];
      out.value = static_cast<double>(num::e4m3_decode(q)) * fp8_scale;
      out.step = e4m3_ulp(q) * fp8_scale;
      break;
    }
  }
  return out;
}

}  // namespace rec
}  // namespace dsv41kv

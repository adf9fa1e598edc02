// dsv41kv: compressed-cache record formats (SPEC section 3.3) as compile-time byte math with a
// runtime twin, and the per-state writers/readers shared by the CPU and CUDA paths.
//
// Every packed format is page-segregated: the value bytes of all S states of a page, then the
// scale bytes of all S states, then padding up to the page stride.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"
#include "dsv41kv/numerics.hpp"

namespace dsv41kv {

inline constexpr int kLatentDim = 512;  // head_dim: 448 NoPE + 64 RoPE
inline constexpr int kNopeDim = 448;
inline constexpr int kRopeDim = 64;
inline constexpr int kRingRowFloats = 1024;  // [kv(512) | score(512)]

enum class RecordFormat : uint8_t {
  V4_584 = 0,     // fp8_ds_mla on SM90/CPU: 448 e4m3 NoPE + 64 bf16 RoPE, 7 UE8M0 scales + pad
  MXFP8_528 = 1,  // fp8_ds_mla on SM100: 512 e4m3, 16 UE8M0 scales (tiles of 32)
  NVFP4_288 = 2,  // nvfp4_ds_mla: 512 e2m1, 32 e4m3 scales (tiles of 16)
  PLAIN_BF16 = 3, // kernel-level plain rows: 512 bf16
  PLAIN_FP8 = 4,  // kernel-level plain rows: 512 e4m3 with a per-tensor scale
};
inline constexpr int kNumRecordFormats = 5;
// Every format, and the packed ones (page-segregated records), in enum order: the one list that
// tools, oracles and tests iterate over.
inline constexpr RecordFormat kAllRecordFormats[kNumRecordFormats] = {
    RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288, RecordFormat::PLAIN_BF16,
    RecordFormat::PLAIN_FP8};
inline constexpr RecordFormat kPackedRecordFormats[3] = {RecordFormat::V4_584, RecordFormat::MXFP8_528,
                                                         RecordFormat::NVFP4_288};

// ---------------------------------------------------------------- groups (SPEC 0.3, 5.1, 6.5)

// A token at position p closes its group of r positions when p is the group's last position;
// only closing tokens produce a latent and a compressed record. Its state (compressed entry) is
// p / r, and its record is rotated at the group's start position (p / r) * r.
// (Templates, so that each caller's integer types and evaluation order stay its own: a position
// is int64, a ratio int or int64.)
template <class P, class R>
DSV41KV_HD constexpr bool closes_group(P p, R r) {
  return (p + 1) % r == 0;
}
template <class P, class R>
DSV41KV_HD constexpr P group_state(P p, R r) {
  return p / r;
}
template <class P, class R>
DSV41KV_HD constexpr P rope_row(P p, R r) {
  return (p / r) * r;
}
static_assert(closes_group(int64_t{5}, 2) && !closes_group(int64_t{4}, 2) && closes_group(int64_t{0}, 1) &&
              rope_row(int64_t{13}, 2) == 12 && group_state(int64_t{13}, 2) == 6);
// The complete groups of r positions among the first n positions of a request: its compressed
// entries after n tokens (SPEC 9.5: N_b = seq_len / r), and with n = p + 1 the entries visible to
// a query at position p (SPEC 8.4: n_c(p) = (p + 1) / r).
template <class N, class R>
DSV41KV_HD constexpr N closed_groups(N n, R r) {
  return n / r;
}
static_assert(closed_groups(int64_t{13} + 1, 2) == 7 && closed_groups(int64_t{13}, 2) == 6 &&
              closed_groups(int64_t{5}, 1) == 5);

// The sliding window (SPEC 1.1 sliding_window, 9.1): a query at position p attends to the SWA
// tokens max(0, p - 127) .. p of its request, the query token included.
inline constexpr int kSwaWindow = 128;
template <class P>
DSV41KV_HD constexpr P swa_window_start(P p) {
  return p > kSwaWindow - 1 ? p - (kSwaWindow - 1) : P{0};
}
static_assert(swa_window_start(int64_t{127}) == 0 && swa_window_start(int64_t{128}) == 1 &&
              swa_window_start(int64_t{5}) == 0);

constexpr int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Compile-time layout of a packed record.
template <int ValueBytes, int ScaleBytes, int PageAlign>
struct PackedLayout {
  static constexpr int kValueBytes = ValueBytes;
  static constexpr int kScaleBytes = ScaleBytes;
  static constexpr int kRecordBytes = ValueBytes + ScaleBytes;
  static constexpr int kPageAlign = PageAlign;
  // byte offset of state r's values / scales within a page of S states
  static constexpr int64_t value_offset(int64_t /*S*/, int64_t r) { return r * kValueBytes; }
  static constexpr int64_t scale_offset(int64_t S, int64_t r) {
    return S * kValueBytes + r * kScaleBytes;
  }
  static constexpr int64_t payload_bytes(int64_t S) { return S * kRecordBytes; }
  static constexpr int64_t default_page_stride(int64_t S) {
    return round_up(S * kRecordBytes, kPageAlign);
  }
};

using V4Layout = PackedLayout<576, 8, 576>;     // 448 e4m3 + 128 B of bf16 RoPE | 7 scales + 0
using Mxfp8Layout = PackedLayout<512, 16, 512>;
using Nvfp4Layout = PackedLayout<256, 32, 512>;

static_assert(V4Layout::kRecordBytes == 584);
static_assert(Mxfp8Layout::kRecordBytes == 528);
static_assert(Nvfp4Layout::kRecordBytes == 288);
static_assert(kNopeDim + 2 * kRopeDim == V4Layout::kValueBytes);  // 448 fp8 + 64 bf16
// SPEC 3.6 default page strides
static_assert(V4Layout::default_page_stride(32) == 19008);
static_assert(V4Layout::default_page_stride(64) == 37440);
static_assert(Mxfp8Layout::default_page_stride(64) == 33792);
static_assert(Mxfp8Layout::default_page_stride(32) == 16896);
static_assert(Nvfp4Layout::default_page_stride(64) == 18432);
static_assert(Nvfp4Layout::default_page_stride(32) == 9216);

// Indexer-K cache (SPEC 3.5): one 128-dim index key per compressed state, page-segregated like the
// records (the S_r states' values, then their scales), sharing the kv source's block table and
// states per page. FP8 (the default; the only SM90 format): e4m3 values at s*128 + d, then one
// fp32 scale 2^e per state at S*128 + s*4. MXFP4 (opt-in): e2m1 pairs at s*64 + j, then one UE8M0
// byte per 32-dim block at S*64 + s*4 + k.
inline constexpr int kIndexHeadDim = 128;
inline constexpr int kIndexTopk = 512;  // index_topk (SPEC 1.1): entries of a top-k row
template <int ValueBytes, int ScaleBytes, int PageAlign>
struct IndexerKLayout : PackedLayout<ValueBytes, ScaleBytes, PageAlign> {};
using IndexerKFp8Layout = IndexerKLayout<kIndexHeadDim, 4, 576>;
using IndexerKMxfp4Layout = IndexerKLayout<kIndexHeadDim / 2, 4, 512>;
static_assert(IndexerKFp8Layout::kRecordBytes == 132 && IndexerKMxfp4Layout::kRecordBytes == 68);
static_assert(IndexerKFp8Layout::scale_offset(64, 3) == 64 * 128 + 3 * 4);
static_assert(IndexerKMxfp4Layout::scale_offset(32, 5) == 32 * 64 + 5 * 4);
// SPEC 3.6 default page strides of the FP8 keys (C1A / C2A)
static_assert(IndexerKFp8Layout::default_page_stride(64) == 8640 && IndexerKFp8Layout::default_page_stride(32) == 4608);

// Runtime description of a record format.
struct RecordInfo {
  RecordFormat format;
  const char* name;       // "v4_584", "mxfp8_528", "nvfp4_288", "bf16", "fp8"
  bool packed;            // page-segregated record (false: plain rows)
  int value_bytes;        // packed: value bytes per state
  int scale_bytes;        // packed: scale bytes per state
  int record_bytes;       // packed: value + scale; plain: 512 * element size
  int page_align;         // packed: default page alignment; plain: 1
  DType element;          // U8 for packed and fp8 rows, BF16 for bf16 rows
};
const RecordInfo& record_info(RecordFormat f);
// Parses "v4_584"/"584", "mxfp8_528"/"528", "nvfp4_288"/"288", "bf16", "fp8"; throws E8.
RecordFormat parse_record_format(const char* name);

// A paged cache of one record format in caller-owned memory.
// Packed formats: state r of page p lives at base + p*page_stride (+ the layout's offsets).
// Plain rows: element d of state r of page p at base + p*page_stride + r*row_stride + d.
// Strides are in elements of `record_info(format).element` (bytes for U8).
struct CacheView {
  void* base = nullptr;      // page 0, element 0
  RecordFormat format = RecordFormat::V4_584;
  int64_t num_pages = 0;     // pages addressable through base
  int64_t states_per_page = 0;  // S
  int64_t page_stride = 0;   // elements; >= payload
  int64_t row_stride = kLatentDim;  // plain rows only; >= 512
  float fp8_scale = 1.0f;    // plain fp8 only: per-tensor scale sigma
  Device device = Device::CPU;

  int64_t payload_elements() const;      // elements of one page that records occupy
  int64_t backing_elements() const { return num_pages * page_stride; }
  size_t backing_bytes() const;
  // A cache with the library's default page stride (SPEC 3.1/3.6); plain rows: row stride 512,
  // page stride S*512.
  static CacheView with_default_strides(void* base, RecordFormat f, int64_t num_pages,
                                        int64_t states_per_page, Device device = Device::CPU);
};

// Validation shared by every op that takes a cache: names `arg` in the message.
void validate_cache(const CacheView& c, const char* arg);

// ---------------------------------------------------------------- per-state writers

namespace rec {

// x: the exact latent values (bf16 widened) [512]; y: x with forward RoPE applied to dims
// 448..511 in fp32 (dims 0..447 equal x) [512]. `page` is the page base, `r` the offset.
DSV41KV_HD void write_v4_584(uint8_t* page, int64_t S, int64_t r, const float* x,
                             const float* y) {
  uint8_t* val = page + V4Layout::value_offset(S, r);
  uint8_t* sc = page + V4Layout::scale_offset(S, r);
  for (int k = 0; k < 7; ++k) sc[k] = num::ue8m0_quantize_tile(x + 64 * k, 64, val + 64 * k);
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t b = num::bf16_encode(y[kNopeDim + i]);
    val[kNopeDim + 2 * i] = static_cast<uint8_t>(b & 0xFF);
    val[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  sc[7] = 0;
}

DSV41KV_HD void write_mxfp8_528(uint8_t* page, int64_t S, int64_t r, const float* y) {
  uint8_t* val = page + Mxfp8Layout::value_offset(S, r);
  uint8_t* sc = page + Mxfp8Layout::scale_offset(S, r);
  for (int k = 0; k < 16; ++k) sc[k] = num::ue8m0_quantize_tile(y + 32 * k, 32, val + 32 * k);
}

DSV41KV_HD void write_nvfp4_288(uint8_t* page, int64_t S, int64_t r, const float* y) {
  uint8_t* val = page + Nvfp4Layout::value_offset(S, r);
  uint8_t* sc = page + Nvfp4Layout::scale_offset(S, r);
  for (int k = 0; k < 32; ++k) sc[k] = num::nvfp4_quantize_tile(y + 16 * k, val + 8 * k);
}

DSV41KV_HD void write_plain_bf16(uint16_t* row, const float* y) {
  for (int d = 0; d < kLatentDim; ++d) row[d] = num::bf16_encode(y[d]);
}

// inv = fp32(1/sigma) computed once by IEEE division. Double rounding fp32 -> bf16 -> scaled.
DSV41KV_HD uint8_t plain_fp8_encode(float y, float inv) {
  float v = num::mul_rn(num::bf16_round(y), inv);
  if (!num::is_nan(v)) v = v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v);
  return num::e4m3_encode(v);
}
DSV41KV_HD void write_plain_fp8(uint8_t* row, const float* y, float inv) {
  for (int d = 0; d < kLatentDim; ++d) row[d] = plain_fp8_encode(y[d], inv);
}

}  // namespace rec

// ---------------------------------------------------------------- index keys and queries (SPEC 2.4, 3.5, 8.1, 8.2)

// The FP8 quantization of one 128-dim index vector, the same rule for a key (SPEC 8.1) and for each
// query head (SPEC 8.2): SPEC 2.4's UE8M0 tile over all 128 values, e = ceil_log2(max(amax, 1e-4) *
// fp32(1/448)), q[d] = e4m3(v[d] * 2^-e). Returns the scale as the fp32 value 2^e (SPEC 3.5); a
// vector holding NaN or Inf is poisoned as every UE8M0 tile is (SPEC 2.6: byte 255, i.e. the scale
// 2^128 = +Inf, and every code 0x7F).
DSV41KV_HD float index_fp8_quantize(const float* v, uint8_t* q) {
  return num::ue8m0_scale(num::ue8m0_quantize_tile(v, kIndexHeadDim, q));
}

// The MXFP4 key block of SPEC 3.5: 32 values, amax = max(max|x|, 6 * 2^-126),
// e = clamp(ceil_log2(amax * fp32(1/6)), -127, 127), values e2m1(x * 2^-e) packed two per byte
// (even element in the low nibble) into packed[0..16); returns the UE8M0 byte e + 127. For finite
// values amax * fp32(1/6) lies in [2^-126, 2^126], so e is in [-126, 126] and 2^-e a normal fp32.
// A block holding NaN or Inf is poisoned (DECISION, docs/design.md): byte 255 and every code 0, so
// that it decodes to NaN as the poisoned NVFP4 tile does (SPEC 2.6).
inline constexpr int kIndexMxfp4Block = 32;
inline constexpr uint32_t kMxfp4AmaxFloorBits = 0x01C00000u;  // 6 * 2^-126
DSV41KV_HD uint8_t index_mxfp4_quantize_block(const float* v, uint8_t* packed) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < kIndexMxfp4Block; ++i) {
    finite = finite && num::is_finite(v[i]);
    amax = num::max_f(amax, num::abs_f(v[i]));
  }
  if (!finite) {
    for (int i = 0; i < kIndexMxfp4Block / 2; ++i) packed[i] = 0;
    return 255;
  }
  amax = num::max_f(amax, num::u2f(kMxfp4AmaxFloorBits));
  int e = num::ceil_log2(num::mul_rn(amax, num::u2f(num::kInv6Bits)));
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  const float inv = num::exp2i(-e);
  for (int j = 0; j < kIndexMxfp4Block / 2; ++j) {
    const uint8_t a = num::e2m1_encode(num::mul_rn(v[2 * j], inv));
    const uint8_t b = num::e2m1_encode(num::mul_rn(v[2 * j + 1], inv));
    packed[j] = static_cast<uint8_t>(a | (b << 4));
  }
  return static_cast<uint8_t>(e + 127);
}

namespace rec {

// The index key k[0..128) of state r of a page (SPEC 3.5). FP8: 128 e4m3 codes at r*128, the fp32
// scale 2^e little-endian at S*128 + r*4. MXFP4: 64 bytes of e2m1 pairs at r*64, four UE8M0 bytes
// at S*64 + r*4. Each touches exactly its value and scale bytes.
DSV41KV_HD void write_index_k_fp8(uint8_t* page, int64_t S, int64_t r, const float* k) {
  const uint32_t u = num::f2u(index_fp8_quantize(k, page + IndexerKFp8Layout::value_offset(S, r)));
  uint8_t* sc = page + IndexerKFp8Layout::scale_offset(S, r);
  for (int b = 0; b < 4; ++b) sc[b] = static_cast<uint8_t>(u >> (8 * b));
}
DSV41KV_HD void write_index_k_mxfp4(uint8_t* page, int64_t S, int64_t r, const float* k) {
  uint8_t* val = page + IndexerKMxfp4Layout::value_offset(S, r);
  uint8_t* sc = page + IndexerKMxfp4Layout::scale_offset(S, r);
  for (int b = 0; b < kIndexHeadDim / kIndexMxfp4Block; ++b)
    sc[b] = index_mxfp4_quantize_block(k + kIndexMxfp4Block * b, val + kIndexMxfp4Block / 2 * b);
}

// Readers: the e4m3 codes and the fp32 scale of an FP8 key (SPEC 8.3 scores them apart), and the
// decoded value of dim d (exact in fp32: a 4-bit or 2-bit significand times a power of two).
DSV41KV_HD const uint8_t* index_k_fp8_codes(const uint8_t* page, int64_t S, int64_t r) {
  return page + IndexerKFp8Layout::value_offset(S, r);
}
DSV41KV_HD float read_index_k_fp8_scale(const uint8_t* page, int64_t S, int64_t r) {
  const uint8_t* sc = page + IndexerKFp8Layout::scale_offset(S, r);
  return num::u2f(static_cast<uint32_t>(sc[0]) | (static_cast<uint32_t>(sc[1]) << 8) |
                  (static_cast<uint32_t>(sc[2]) << 16) | (static_cast<uint32_t>(sc[3]) << 24));
}
DSV41KV_HD float read_index_k_fp8(const uint8_t* page, int64_t S, int64_t r, int d) {
  return num::mul_rn(num::e4m3_decode(index_k_fp8_codes(page, S, r)[d]), read_index_k_fp8_scale(page, S, r));
}
DSV41KV_HD float read_index_k_mxfp4(const uint8_t* page, int64_t S, int64_t r, int d) {
  const uint8_t b = page[IndexerKMxfp4Layout::value_offset(S, r) + d / 2];
  const uint8_t nib = (d & 1) ? (b >> 4) : (b & 0xF);
  const uint8_t s = page[IndexerKMxfp4Layout::scale_offset(S, r) + d / kIndexMxfp4Block];
  return num::mul_rn(num::e2m1_decode(nib), num::ue8m0_scale(s));
}

}  // namespace rec

namespace rec {

// ---------------------------------------------------------------- per-state readers (SPEC 5.3)

// Decodes dimension d of state r into bf16 bits.
DSV41KV_HD uint16_t read_v4_584(const uint8_t* page, int64_t S, int64_t r, int d) {
  const uint8_t* val = page + V4Layout::value_offset(S, r);
  if (d >= kNopeDim) {
    const int i = d - kNopeDim;
    return static_cast<uint16_t>(val[kNopeDim + 2 * i] | (val[kNopeDim + 2 * i + 1] << 8));
  }
  const uint8_t s = page[V4Layout::scale_offset(S, r) + d / 64];
  return num::bf16_encode(num::mul_rn(num::e4m3_decode(val[d]), num::ue8m0_scale(s)));
}
DSV41KV_HD uint16_t read_mxfp8_528(const uint8_t* page, int64_t S, int64_t r, int d) {
  const uint8_t q = page[Mxfp8Layout::value_offset(S, r) + d];
  const uint8_t s = page[Mxfp8Layout::scale_offset(S, r) + d / 32];
  return num::bf16_encode(num::mul_rn(num::e4m3_decode(q), num::ue8m0_scale(s)));
}
DSV41KV_HD uint16_t read_nvfp4_288(const uint8_t* page, int64_t S, int64_t r, int d) {
  const uint8_t b = page[Nvfp4Layout::value_offset(S, r) + d / 2];
  const uint8_t nib = (d & 1) ? (b >> 4) : (b & 0xF);
  const uint8_t s = page[Nvfp4Layout::scale_offset(S, r) + d / 16];
  return num::bf16_encode(num::mul_rn(num::e2m1_decode(nib), num::e4m3_decode(s)));
}
DSV41KV_HD uint16_t read_plain_fp8(const uint8_t* row, int d, float sigma) {
  return num::bf16_encode(num::mul_rn(num::e4m3_decode(row[d]), sigma));
}

// ---------------------------------------------------------------- decoded values with their step (host)

// The spacing of bf16 values at |x| (8 significant bits; 2^-133 below 2^-126), NaN for non-finite x.
double bf16_spacing(double x);
// The value of dimension d of state r (exactly, in binary64) and one quantization step of its
// format there: the unit in the last place of its e4m3 or e2m1 code times the tile scale, or the
// bf16 spacing for bf16-stored values. `page` is the page base (packed formats) or the row
// (plain formats); fp8_scale: sigma of plain fp8 rows. The tests and oracles judge records with it.
struct DecodedValue {
  double value = 0.0;
  double step = 0.0;
};
DecodedValue decode_with_step(RecordFormat f, const uint8_t* page, int64_t S, int64_t r, int d, float fp8_scale);

}  // namespace rec
}  // namespace dsv41kv

// The read path's metadata builders (SPEC 6.2, 6.6, 6.7): the decode/prefill split, the decode
// window rows and top-k key lists, the prefill gather lengths and the sparse-MLA metadata of a
// layer type. The decode step's builders (window rows, top-k slots, validity, masked lengths) also
// take device views (the CUDA builders of backend.hpp) with the split the host made; the others
// take host views only (views on CUDA: E8).
//
// Order inside every builder, as in metadata.cpp: (1) structural checks of every view and scalar,
// (2) the split (reads qsl) and the value checks, (3) the writes. Nothing is written before (1)
// and (2) have passed. Messages read "<op>: <argument>: <what was found>, expected <what is
// required>".
#include <fmt/format.h>

#include <limits>
#include <span>
#include <string>

#include "core/dispatch.hpp"
#include "core/validate.hpp"
#include "dsv41kv/metadata.hpp"
#include "metadata/backend.hpp"
#include "formats/window.hpp"
#include "metadata/host.hpp"
#include "metadata/slots.hpp"

namespace dsv41kv {
namespace {

using detail::bad_arg;
using detail::need_device;
using detail::need_vector;
using detail::table_at;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

using NamedViews = std::initializer_list<std::pair<const TensorView*, const char*>>;

// The head of every read-path builder: the exec context and qsl.
void need_head(const char* op, const ExecContext& ctx, const TensorView& qsl) {
  detail::check_exec_context(ctx, op);
  need_vector(op, qsl, "qsl", DType::I32, "i32 [num_reqs + 1]", 1);
}

// After the structural checks: every view on qsl's device, that device the host, then the split,
// which reads qsl.
DecodeSplit host_split(const char* op, const TensorView& qsl, int64_t num_spec, NamedViews views) {
  for (const auto& [v, name] : views) need_device(op, *v, name, qsl.device, "qsl");
  if (qsl.device != Device::CPU) detail::no_cuda_backend(op);
  return split_decode_prefill(qsl, num_spec, op);
}

bool same_split(const DecodeSplit& a, const DecodeSplit& b) {
  return a.num_reqs == b.num_reqs && a.num_decodes == b.num_decodes && a.num_decode_tokens == b.num_decode_tokens &&
         a.num_prefills == b.num_prefills && a.num_prefill_tokens == b.num_prefill_tokens;
}

std::string describe_split(const DecodeSplit& s) {
  return fmt::format("{{num_reqs {}, num_decodes {}, num_decode_tokens {}, num_prefills {}, num_prefill_tokens {}}}",
                     s.num_reqs, s.num_decodes, s.num_decode_tokens, s.num_prefills, s.num_prefill_tokens);
}

// The split of a builder that also takes device views: host views compute it (and check `given`
// against it); device views take `given`, checked for consistency with qsl's shape only.
DecodeSplit step_split(const char* op, const TensorView& qsl, int64_t num_spec, const DecodeSplit* given,
                       NamedViews views) {
  for (const auto& [v, name] : views) need_device(op, *v, name, qsl.device, "qsl");
  if (qsl.device == Device::CPU) {
    const DecodeSplit sp = split_decode_prefill(qsl, num_spec, op);
    if (given != nullptr && !same_split(*given, sp))
      bad_arg(op, "split", fmt::format("{}, expected the split of qsl {}", describe_split(*given), describe_split(sp)));
    return sp;
  }
  if (num_spec < 0) bad_arg(op, "num_speculative_tokens", fmt::format("{}, expected >= 0", num_spec));
  if (given == nullptr)
    bad_arg(op, "split", "null with device views, expected the split the host made of its copy of qsl");
  const DecodeSplit& s = *given;
  const int64_t nr = qsl.shape[0] - 1;
  if (s.num_reqs != nr || s.num_decodes < 0 || s.num_decodes > nr || s.num_prefills != nr - s.num_decodes ||
      s.num_decode_tokens < 0 || s.num_prefill_tokens < 0 ||
      s.num_decode_tokens > s.num_decodes * (1 + num_spec) || (s.num_decodes == 0 && s.num_decode_tokens != 0))
    bad_arg(op, "split",
            fmt::format("{}, expected a split of {} requests with num_decode_tokens <= num_decodes * {} "
                        "(1 + num_speculative_tokens)",
                        describe_split(s), nr, 1 + num_spec));
  return s;
}

// A block table with a row for every decode request.
void need_decode_rows(const char* op, const TensorView& table, const DecodeSplit& sp) {
  if (table.shape[0] < sp.num_decodes)
    bad_arg(op, "block_table",
            fmt::format("{} rows, expected at least num_decodes = {}", table.shape[0], sp.num_decodes));
}

// A persistent output pair: i32 rows [max_tokens, cols] and i32 lengths [max_tokens]; returns
// max_tokens. cols <= 0: any width >= 1.
int64_t need_row_outputs(const char* op, const TensorView& rows, const TensorView& lengths, int64_t cols,
                         const char* rows_what) {
  detail::need_matrix(op, rows, "indices", DType::I32, rows_what);
  if (cols > 0 ? rows.shape[1] != cols : rows.shape[1] < 1)
    bad_arg(op, "indices",
            fmt::format("shape[1] = {}, expected {} ({})", rows.shape[1],
                        cols > 0 ? std::to_string(cols) : std::string("K >= 1"), rows.describe()));
  const int64_t max_tokens = need_vector(op, lengths, "lengths", DType::I32, "i32 [max_tokens] output");
  if (rows.shape[0] != max_tokens)
    bad_arg(op, "indices",
            fmt::format("{} rows, expected max_tokens = {} (the length of lengths)", rows.shape[0], max_tokens));
  return max_tokens;
}

// Sizes that depend on the split, checked once it is known.
void need_at_least(const char* op, const char* arg, int64_t have, int64_t need, const char* what) {
  if (have < need) bad_arg(op, arg, fmt::format("{} {}, expected at least {} ({})", have, "entries", need, what));
}

// Calls f(j, t) for every decode token t of decode request j, in token order.
template <class F>
void for_decode_tokens(std::span<const int32_t> qsl, const DecodeSplit& sp, F&& f) {
  for (int64_t j = 0; j < sp.num_decodes; ++j)
    for (int64_t t = qsl[static_cast<size_t>(j)]; t < qsl[static_cast<size_t>(j + 1)]; ++t) f(j, t);
}

// One entry u (a position, or a compressed-entry index) of request j looked up in a block table of
// `per_page` entries per page: the checks (logical page inside the row, page id below num_pages,
// the slot inside i32) with `what()` naming the entry, and the slot (-1 for the null page).
struct PagedLookup {
  const char* op;
  const TensorView& table;
  int64_t per_page;
  int64_t num_pages;

  template <class What>
  void check(int64_t j, int64_t u, What&& what) const {
    const int64_t lp = u / per_page, cols = table.shape[1];
    if (lp >= cols)
      bad_arg(
          op, "block_table",
          fmt::format("{} lies in logical page {} ({} per page), expected < {} columns", what(), lp, per_page, cols));
    const int64_t pg = table_at(table, j, lp);
    if (num_pages >= 0 && pg >= num_pages)
      bad_arg(op, "block_table",
              fmt::format("block_table[{}][{}] = {} ({}), expected a page id < num_pages = {}", j, lp, pg, what(),
                          num_pages));
    if (detail::slot_in_page(pg, per_page, u % per_page) > kI32Max)
      bad_arg(op, "block_table",
              fmt::format("block_table[{}][{}] = {} ({}) gives slot {}, expected a slot < 2^31 (i32 index rows)", j, lp,
                          pg, what(), pg * per_page + u % per_page));
  }
  int32_t slot(int64_t j, int64_t u) const {
    return detail::row_entry(table_at(table, j, u / per_page), per_page, u % per_page, num_pages);
  }
};

// The window of SPEC 6.6 of a valid decode token at position p: lengths and entries.
void write_window_row(const PagedLookup& lk, int64_t j, int64_t p, int32_t* row, int32_t& len) {
  const int64_t start = swa_window_start(p), n = detail::window_len(p);
  for (int64_t k = 0; k < kSwaWindow; ++k) row[k] = k < n ? lk.slot(j, start + k) : -1;
  len = static_cast<int32_t>(n);
}

}  // namespace

// ------------------------------------------------------------------------------ split (6.2)

DecodeSplit split_decode_prefill(const TensorView& qsl, int64_t num_speculative_tokens, const char* op) {
  need_vector(op, qsl, "qsl", DType::I32, "i32 [num_reqs + 1]", 1);
  if (qsl.device != Device::CPU)
    bad_arg(
        op, "qsl",
        fmt::format("on {}, expected a host (cpu) view: the split is decided on the host", device_name(qsl.device)));
  if (num_speculative_tokens < 0)
    bad_arg(op, "num_speculative_tokens", fmt::format("{}, expected >= 0", num_speculative_tokens));
  const std::span<const int32_t> q(qsl.ptr<const int32_t>(), static_cast<size_t>(qsl.shape[0]));
  const int64_t nr = qsl.shape[0] - 1;
  detail::check_qsl(op, "qsl", q, q[static_cast<size_t>(nr)]);
  DecodeSplit sp;
  sp.num_reqs = nr;
  sp.num_decodes = detail::decode_prefix(
      nr, num_speculative_tokens, [&](int64_t j) { return q[static_cast<size_t>(j + 1)] - q[static_cast<size_t>(j)]; });
  sp.num_decode_tokens = q[static_cast<size_t>(sp.num_decodes)];
  sp.num_prefills = nr - sp.num_decodes;
  sp.num_prefill_tokens = q[static_cast<size_t>(nr)] - sp.num_decode_tokens;
  return sp;
}

// ------------------------------------------------------------------------------ window rows (6.6)

DecodeSplit build_swa_window(const SwaWindowArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_swa_window";
  need_head(op, ctx, a.qsl);
  const int64_t npos = need_vector(op, a.positions, "positions", DType::I64, "i64 [>= num_decode_tokens]");
  const int64_t nslot = need_vector(op, a.slot_swa, "slot_swa", DType::I64, "i64 [>= num_decode_tokens]");
  detail::need_block_table(op, a.block_table, "block_table", "i32 [num_reqs, max_pages] SWA pages");
  const int64_t max_tokens = need_row_outputs(op, a.indices, a.lengths, kSwaWindow, "i32 [max_tokens, 128] output");
  if (a.page < 1 || a.page > kI32Max)
    bad_arg(op, "page", fmt::format("{}, expected 0 < tokens per page < 2^31", a.page));
  detail::need_optional_count(op, "num_pages", a.num_pages);
  const DecodeSplit sp = step_split(op, a.qsl, a.num_speculative_tokens, a.split,
                                    {{&a.positions, "positions"},
                                     {&a.slot_swa, "slot_swa"},
                                     {&a.block_table, "block_table"},
                                     {&a.indices, "indices"},
                                     {&a.lengths, "lengths"}});
  const int64_t T = sp.num_decode_tokens;
  need_at_least(op, "lengths", max_tokens, T, "num_decode_tokens");
  need_at_least(op, "positions", npos, T, "num_decode_tokens");
  need_at_least(op, "slot_swa", nslot, T, "num_decode_tokens");
  need_decode_rows(op, a.block_table, sp);
  if (a.qsl.device != Device::CPU) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_swa_window(a, sp, ctx);
#else
    detail::no_cuda(op);
#endif
    return sp;
  }
  const std::span<const int32_t> q(a.qsl.ptr<const int32_t>(), static_cast<size_t>(a.qsl.shape[0]));
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* slot = a.slot_swa.ptr<const int64_t>();
  const PagedLookup lk{op, a.block_table, a.page, a.num_pages};
  for_decode_tokens(q, sp, [&](int64_t j, int64_t t) {
    if (slot[t] < 0) return;
    const int64_t p = pos[t];
    if (p < 0) bad_arg(op, "positions", fmt::format("positions[{}] = {} (request {}), expected >= 0", t, p, j));
    for (int64_t u = swa_window_start(p); u <= p; ++u)
      lk.check(j, u, [&] { return fmt::format("token {} (request {}, position {}): window position {}", t, j, p, u); });
  });

  auto* idx = a.indices.ptr<int32_t>();
  auto* len = a.lengths.ptr<int32_t>();
  const int64_t rs = a.indices.stride[0];
  for_decode_tokens(q, sp, [&](int64_t j, int64_t t) {
    int32_t* row = idx + t * rs;
    if (slot[t] >= 0) {
      write_window_row(lk, j, pos[t], row, len[t]);
    } else {
      for (int64_t k = 0; k < kSwaWindow; ++k) row[k] = -1;
      len[t] = 0;
    }
  });
  for (int64_t t = T; t < max_tokens; ++t) len[t] = 0;
  return sp;
}

// ------------------------------------------------------------------------------ prefill gather (6.6)

DecodeSplit build_prefill_gather(const PrefillGatherArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_prefill_gather";
  need_head(op, ctx, a.qsl);
  const int64_t nseq = need_vector(op, a.seq_lens, "seq_lens", DType::I64, "i64 [>= num_reqs]");
  const int64_t n = need_vector(op, a.gather_lens, "gather_lens", DType::I64, "i64 [>= num_prefills] output");
  const int64_t ns = need_vector(op, a.gather_starts, "gather_starts", DType::I64, "i64 [>= num_prefills] output");
  if (ns != n) bad_arg(op, "gather_starts", fmt::format("{} entries, expected {} (the length of gather_lens)", ns, n));
  const DecodeSplit sp =
      host_split(op, a.qsl, a.num_speculative_tokens,
                 {{&a.seq_lens, "seq_lens"}, {&a.gather_lens, "gather_lens"}, {&a.gather_starts, "gather_starts"}});
  need_at_least(op, "seq_lens", nseq, sp.num_reqs, "num_reqs");
  need_at_least(op, "gather_lens", n, sp.num_prefills, "num_prefills");
  const auto* q = a.qsl.ptr<const int32_t>();
  const auto* sl = a.seq_lens.ptr<const int64_t>();
  for (int64_t b = sp.num_decodes; b < sp.num_reqs; ++b)
    if (sl[b] < q[b + 1] - q[b])
      bad_arg(op, "seq_lens",
              fmt::format("seq_lens[{}] = {} < query_len = {} (prefill request {}), expected seq_len = num_computed + "
                          "query_len >= query_len",
                          b, sl[b], q[b + 1] - q[b], b));

  auto* g = a.gather_lens.ptr<int64_t>();
  auto* gs = a.gather_starts.ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = sp.num_decodes + i;
    g[i] = i < sp.num_prefills ? detail::prefill_gather_len(sl[b], q[b + 1] - q[b]) : 0;
    gs[i] = i < sp.num_prefills ? detail::prefill_gather_start(sl[b], q[b + 1] - q[b]) : 0;
  }
  return sp;
}

// ------------------------------------------------------------------------------ top-k slots (6.6)

DecodeSplit build_decode_topk_slots(const DecodeTopkSlotArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_decode_topk_slots";
  need_head(op, ctx, a.qsl);
  const int64_t nslot = need_vector(op, a.slot_swa, "slot_swa", DType::I64, "i64 [>= num_decode_tokens]");
  detail::need_matrix(op, a.topk, "topk", DType::I32, "i32 [>= num_decode_tokens, K] compressed-entry indices");
  if (a.topk.shape[1] < 1) bad_arg(op, "topk", fmt::format("shape[1] = {}, expected K >= 1", a.topk.shape[1]));
  detail::need_block_table(op, a.block_table, "block_table", "i32 [num_reqs, max_pages] compressed pages");
  const int64_t K = a.topk.shape[1];
  const int64_t max_tokens = need_row_outputs(op, a.indices, a.lengths, K, "i32 [max_tokens, K] output");
  if (a.states_per_page < 1 || a.states_per_page > kI32Max)
    bad_arg(op, "states_per_page", fmt::format("{}, expected 0 < states per page < 2^31", a.states_per_page));
  detail::need_optional_count(op, "num_pages", a.num_pages);
  const DecodeSplit sp = step_split(op, a.qsl, a.num_speculative_tokens, a.split,
                                    {{&a.slot_swa, "slot_swa"},
                                     {&a.topk, "topk"},
                                     {&a.block_table, "block_table"},
                                     {&a.indices, "indices"},
                                     {&a.lengths, "lengths"}});
  const int64_t T = sp.num_decode_tokens;
  need_at_least(op, "lengths", max_tokens, T, "num_decode_tokens");
  need_at_least(op, "slot_swa", nslot, T, "num_decode_tokens");
  need_at_least(op, "topk", a.topk.shape[0], T, "num_decode_tokens rows");
  need_decode_rows(op, a.block_table, sp);
  if (a.qsl.device != Device::CPU) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_decode_topk_slots(a, sp, ctx);
#else
    detail::no_cuda(op);
#endif
    return sp;
  }
  const std::span<const int32_t> q(a.qsl.ptr<const int32_t>(), static_cast<size_t>(a.qsl.shape[0]));
  const auto* slot = a.slot_swa.ptr<const int64_t>();
  const auto* topk = a.topk.ptr<const int32_t>();
  const int64_t ts = a.topk.stride[0];
  const PagedLookup lk{op, a.block_table, a.states_per_page, a.num_pages};
  for_decode_tokens(q, sp, [&](int64_t j, int64_t t) {
    if (slot[t] < 0) return;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = topk[t * ts + k];
      if (i >= 0)
        lk.check(j, i, [&] { return fmt::format("token {} (request {}): topk[{}][{}] = {}", t, j, t, k, i); });
    }
  });

  auto* idx = a.indices.ptr<int32_t>();
  auto* len = a.lengths.ptr<int32_t>();
  const int64_t rs = a.indices.stride[0];
  for_decode_tokens(q, sp, [&](int64_t j, int64_t t) {
    int32_t* row = idx + t * rs;
    int32_t n = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = slot[t] >= 0 ? topk[t * ts + k] : -1;
      row[k] = i >= 0 ? lk.slot(j, i) : -1;
      n += row[k] >= 0 ? 1 : 0;
    }
    len[t] = n;
  });
  for (int64_t t = T; t < max_tokens; ++t) len[t] = 0;
  return sp;
}

// ------------------------------------------------------------------------------ validity (6.1, 9.3)

void build_token_valid(const TensorView& slot_swa, const TensorView& token_valid, const ExecContext& ctx) {
  static constexpr const char* op = "build_token_valid";
  detail::check_exec_context(ctx, op);
  const int64_t N = need_vector(op, slot_swa, "slot_swa", DType::I64, "i64 [N]");
  const int64_t n = need_vector(op, token_valid, "token_valid", DType::I32, "i32 [N] output");
  if (n != N) bad_arg(op, "token_valid", fmt::format("{} entries, expected N = {} (the length of slot_swa)", n, N));
  need_device(op, token_valid, "token_valid", slot_swa.device, "slot_swa");
  detail::dispatch(
      op, slot_swa.device, N == 0, [] {},
      [&] {
        const auto* s = slot_swa.ptr<const int64_t>();
        auto* v = token_valid.ptr<int32_t>();
        for (int64_t t = 0; t < N; ++t) v[t] = s[t] >= 0 ? 1 : 0;
      },
      [&] { detail::cuda::build_token_valid(slot_swa, token_valid, ctx); });
}

void mask_invalid_lengths(const TensorView& token_valid, const TensorView& lengths, const ExecContext& ctx) {
  static constexpr const char* op = "mask_invalid_lengths";
  detail::check_exec_context(ctx, op);
  const int64_t N = need_vector(op, token_valid, "token_valid", DType::I32, "i32 [>= T]");
  const int64_t T = need_vector(op, lengths, "lengths", DType::I32, "i32 [T]");
  if (T > N) bad_arg(op, "lengths", fmt::format("{} entries, expected at most {} (the length of token_valid)", T, N));
  need_device(op, lengths, "lengths", token_valid.device, "token_valid");
  detail::dispatch(
      op, token_valid.device, T == 0, [] {},
      [&] {
        const auto* v = token_valid.ptr<const int32_t>();
        auto* len = lengths.ptr<int32_t>();
        for (int64_t t = 0; t < T; ++t)
          if (v[t] == 0) len[t] = 0;
      },
      [&] { detail::cuda::mask_invalid_lengths(token_valid, lengths, ctx); });
}

// ------------------------------------------------------------------------------ sparse-MLA metadata (6.7)

ComputeDevice ComputeDevice::cpu(bool sm100_profile) {
  ComputeDevice d;
  d.sm100_profile = sm100_profile;
  return d;
}

ComputeDevice ComputeDevice::cuda(int major, int minor) {
  ComputeDevice d;
  d.kind = Device::CUDA;
  d.major = major;
  d.minor = minor;
  return d;
}

bool ComputeDevice::sm90_profile() const { return kind == Device::CPU ? !sm100_profile : major == 9; }

std::string ComputeDevice::describe() const {
  if (kind == Device::CPU) return sm100_profile ? "cpu (SM100 profile)" : "cpu";
  return fmt::format("cuda sm_{}{}", major, minor);
}

int64_t kernel_block_size(const ComputeDevice& device) { return device.sm90_profile() ? 64 : 128; }

SparseMlaMetadata build_sparse_mla_metadata(const SparseMlaMetadataArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_sparse_mla_metadata";
  need_head(op, ctx, a.qsl);
  const int t = static_cast<int>(a.type);
  if (t < 0 || t > 2) bad_arg(op, "type", fmt::format("unknown layer type {}, expected swaonly, c1a or c2a", t));
  const int r = t;  // SPEC 6.7: the layer type of ratio r
  need_vector(op, a.positions, "positions", DType::I64, "i64 [>= N]");
  const int64_t N = need_vector(op, a.req_id_per_token, "req_id_per_token", DType::I32, "i32 [N] token_to_req");
  if (r == 0) {
    for (const auto& [v, name] : {std::pair{&a.block_table, "block_table"},
                                  {&a.token_slots, "token_slots"},
                                  {&a.compressed_slots, "compressed_slots"}})
      if (v->present()) bad_arg(op, name, "present, expected absent for swaonly layers (no compressed cache)");
  } else {
    need_vector(op, a.compressed_slots, "compressed_slots", DType::I64, "i64 [N] output");
  }
  if (a.device.kind != Device::CPU && a.device.kind != Device::CUDA)
    bad_arg(op, "device", fmt::format("unknown device kind {}", static_cast<int>(a.device.kind)));
  if (a.states_per_page < 0)
    bad_arg(op, "states_per_page", fmt::format("{}, expected > 0, or 0 for kernel_block_size / r", a.states_per_page));

  SparseMlaMetadata m;
  m.type = a.type;
  m.ratio = r;
  m.split = host_split(op, a.qsl, a.num_speculative_tokens,
                       {{&a.positions, "positions"},
                        {&a.req_id_per_token, "req_id_per_token"},
                        {&a.block_table, "block_table"},
                        {&a.token_slots, "token_slots"},
                        {&a.compressed_slots, "compressed_slots"}});
  const auto* q = a.qsl.ptr<const int32_t>();
  m.num_actual_tokens = q[m.split.num_reqs];
  m.num_tokens = N;
  if (m.num_actual_tokens > N)
    bad_arg(op, "req_id_per_token",
            fmt::format("{} entries, expected N >= num_actual_tokens = qsl[num_reqs] = {}", N, m.num_actual_tokens));
  // req_id_per_token is the step's token_to_req (SPEC 6.1): checked against qsl, not rebuilt.
  const auto* req = a.req_id_per_token.ptr<const int32_t>();
  for (int64_t j = 0; j < m.split.num_reqs; ++j)
    for (int64_t tk = q[j]; tk < q[j + 1]; ++tk)
      if (req[tk] != j)
        bad_arg(
            op, "req_id_per_token",
            fmt::format("req_id_per_token[{}] = {}, expected {} (the request of token {} by qsl)", tk, req[tk], j, tk));
  for (int64_t tk = m.num_actual_tokens; tk < N; ++tk)
    if (req[tk] != 0)
      bad_arg(op, "req_id_per_token",
              fmt::format("req_id_per_token[{}] = {} (padding row), expected 0 (SPEC 6.1)", tk, req[tk]));
  m.kernel_block_size = kernel_block_size(a.device);
  m.req_id_per_token = a.req_id_per_token;
  if (r == 0) return m;

  m.topk_tokens = kIndexTopk;
  m.states_per_page = a.states_per_page > 0 ? a.states_per_page : m.kernel_block_size / r;
  m.compressed_slots = a.compressed_slots;
  CompressedSlotArgs c;
  c.ratio = r;
  c.token_to_req = a.req_id_per_token;
  c.positions = a.positions;
  c.block_table = a.block_table;
  c.token_slots = a.token_slots;
  c.num_actual_tokens = m.num_actual_tokens;
  c.states_per_page = m.states_per_page;
  c.slots = a.compressed_slots;
  c.num_pages = a.num_pages;
  build_compressed_slots(c, ctx);  // every check of its own before its one write
  return m;
}

}  // namespace dsv41kv

// Per-step metadata builders (SPEC 6): validation on the host, then the CPU builders for host
// views or the CUDA builders (src/metadata/backend.hpp) for device views.
//
// Order inside every builder: (1) structural checks of every view and scalar (valid for device
// views), (2) value checks that read index data (host views only), (3) the computation. Nothing
// is written before (1) and (2) have passed, so a failing call leaves every output untouched.
// Messages read "<op>: <argument>: <what was found>, expected <what is required>".
#include <fmt/format.h>

#include <span>
#include <string>

#include "dsv41kv/metadata.hpp"
#include "dsv41kv/records.hpp"
#include "core/validate.hpp"
#include "metadata/backend.hpp"
#include "metadata/host.hpp"
#include "metadata/slots.hpp"

namespace dsv41kv {
namespace {

using detail::bad_arg;
using detail::need_device;
using detail::need_vector;

void need_table(const char* op, const TensorView& v, const char* arg, const char* what) {
  detail::need_block_table(op, v, arg, what);
}

void need_threads(const char* op, const ExecContext& ctx) { detail::check_exec_context(ctx, op); }

void need_num_actual(const char* op, int64_t num_actual, int64_t N) {
  if (num_actual < 0 || num_actual > N)
    bad_arg(op, "num_actual_tokens",
        fmt::format("{}, expected 0 <= num_actual_tokens <= N = {} (rows of the output)",
                    num_actual, N));
}

using detail::need_optional_count;
using detail::table_at;

// Shared structure of the three slot builders: token_to_req [N], positions [>= N], a block
// table, an i64 output [N]; returns N.
struct SlotViews {
  const TensorView* token_to_req;
  const TensorView* positions;
  const TensorView* table;
  const char* table_name;
  const char* table_what;
  const TensorView* out;
  const char* out_name;
};
int64_t need_slot_views(const char* op, const SlotViews& s) {
  const int64_t N = need_vector(op, *s.token_to_req, "token_to_req", DType::I32, "i32 [N]");
  need_vector(op, *s.positions, "positions", DType::I64, "i64 [>= N]", N);
  need_table(op, *s.table, s.table_name, s.table_what);
  const int64_t n_out = need_vector(op, *s.out, s.out_name, DType::I64, "i64 [N] output");
  if (n_out != N)
    bad_arg(op, s.out_name, fmt::format("{} entries, expected N = {} (the length of token_to_req)",
                                    n_out, N));
  const Device dev = s.token_to_req->device;
  need_device(op, *s.positions, "positions", dev, "token_to_req");
  need_device(op, *s.table, s.table_name, dev, "token_to_req");
  need_device(op, *s.out, s.out_name, dev, "token_to_req");
  return N;
}

// Host value checks shared by the slot builders: request index and position of real tokens.
void check_tokens(const char* op, const TensorView& token_to_req, const TensorView& positions,
                  const TensorView& table, const char* table_name, int64_t num_actual) {
  const auto* t2r = token_to_req.ptr<const int32_t>();
  const auto* pos = positions.ptr<const int64_t>();
  const int64_t num_reqs = table.shape[0];
  for (int64_t t = 0; t < num_actual; ++t) {
    if (t2r[t] < 0 || t2r[t] >= num_reqs)
      bad_arg(op, "token_to_req",
          fmt::format("token_to_req[{}] = {}, expected a request index in [0, {}) (rows of {})",
                      t, t2r[t], num_reqs, table_name));
    if (pos[t] < 0)
      bad_arg(op, "positions", fmt::format("positions[{}] = {} (request {}), expected >= 0", t,
                                       pos[t], t2r[t]));
  }
}

}  // namespace

// ------------------------------------------------------------------------------ scalars

int64_t ring_capacity(int64_t num_speculative_tokens) {
  if (num_speculative_tokens < 0)
    invalid_argument(fmt::format("ring_capacity: num_speculative_tokens = {}, expected >= 0",
                                 num_speculative_tokens));
  if (num_speculative_tokens > (int64_t{1} << 40))
    invalid_argument(fmt::format("ring_capacity: num_speculative_tokens = {}, expected <= 2^40",
                                 num_speculative_tokens));
  // next_pow2(n) = 1 << bit_length(n - 1), n = spec + 2 >= 2
  const uint64_t m = static_cast<uint64_t>(num_speculative_tokens + 1);  // n - 1 >= 1
  int bits = 0;
  while ((m >> bits) != 0) ++bits;
  const int64_t p2 = int64_t{1} << bits;
  return p2 < 8 ? 8 : p2;
}

int64_t num_decode_requests(const int32_t* query_lens, int64_t num_reqs,
                            int64_t num_speculative_tokens) {
  if (num_reqs < 0)
    invalid_argument(fmt::format("num_decode_requests: num_reqs = {}, expected >= 0", num_reqs));
  if (num_speculative_tokens < 0)
    invalid_argument(fmt::format(
        "num_decode_requests: num_speculative_tokens = {}, expected >= 0", num_speculative_tokens));
  if (num_reqs > 0 && query_lens == nullptr)
    invalid_argument(fmt::format(
        "num_decode_requests: query_lens: null pointer for num_reqs = {}, expected {} lengths",
        num_reqs, num_reqs));
  return detail::decode_prefix(num_reqs, num_speculative_tokens, [&](int64_t j) { return query_lens[j]; });
}

void validate_qsl(const TensorView& qsl, int64_t num_actual_tokens, int64_t N, const char* arg) {
  const std::string a = arg ? arg : "qsl";
  const std::string::size_type colon = a.rfind(": ");
  const std::string op = colon == std::string::npos ? "validate_qsl" : a.substr(0, colon);
  const std::string name = colon == std::string::npos ? a : a.substr(colon + 2);
  need_vector(op.c_str(), qsl, name.c_str(), DType::I32, "i32 [num_reqs + 1]", 1);
  if (qsl.device != Device::CPU)
    bad_arg(op.c_str(), name.c_str(),
            fmt::format("on {}, expected a host (cpu) view to check values", device_name(qsl.device)));
  if (N < 0) bad_arg(op.c_str(), name.c_str(), fmt::format("N = {}, expected >= 0", N));
  if (num_actual_tokens < 0 || num_actual_tokens > N)
    bad_arg(op.c_str(), name.c_str(),
            fmt::format("num_actual_tokens = {}, expected 0 <= num_actual_tokens <= N = {}", num_actual_tokens, N));
  detail::check_qsl(op.c_str(), name.c_str(),
                    std::span(qsl.ptr<const int32_t>(), static_cast<size_t>(qsl.shape[0])), N, num_actual_tokens);
}

// ------------------------------------------------------------------------------ token_to_req

void build_token_to_req(const TokenToReqArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_token_to_req";
  need_threads(op, ctx);
  const int64_t nq = need_vector(op, a.qsl, "qsl", DType::I32, "i32 [num_reqs + 1]", 1);
  (void)nq;
  const int64_t N = need_vector(op, a.token_to_req, "token_to_req", DType::I32, "i32 [N] output");
  need_device(op, a.token_to_req, "token_to_req", a.qsl.device, "qsl");
  if (a.num_actual_tokens < -1 || a.num_actual_tokens > N)
    bad_arg(op, "num_actual_tokens",
        fmt::format("{}, expected -1 (= qsl[num_reqs]) or 0 <= num_actual_tokens <= N = {}",
                    a.num_actual_tokens, N));
  if (a.qsl.device == Device::CUDA) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_token_to_req(a, ctx);
    return;
#else
    detail::no_cuda(op);
#endif
  }
  const auto* q = a.qsl.ptr<const int32_t>();
  const int64_t nr = a.qsl.shape[0] - 1;
  const int64_t num_actual = a.num_actual_tokens >= 0 ? a.num_actual_tokens : q[nr];
  if (a.num_actual_tokens < 0 && (num_actual < 0 || num_actual > N))
    bad_arg(op, "qsl", fmt::format("qsl[num_reqs = {}] = {}, expected <= N = {} (rows of token_to_req)",
                               nr, num_actual, N));
  validate_qsl(a.qsl, num_actual, N, "build_token_to_req: qsl");

  auto* out = a.token_to_req.ptr<int32_t>();
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t t = q[j]; t < q[j + 1]; ++t) out[t] = static_cast<int32_t>(j);
  for (int64_t t = num_actual; t < N; ++t) out[t] = 0;
}

// ------------------------------------------------------------------------------ ring slots (6.3)

void build_ring_slots(const RingSlotArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_ring_slots";
  need_threads(op, ctx);
  const int64_t N = need_slot_views(op, {&a.token_to_req, &a.positions, &a.ring_block_table,
                                         "ring_block_table", "i32 [num_reqs, >= 1] ring blocks",
                                         &a.ring_slots, "ring_slots"});
  need_num_actual(op, a.num_actual_tokens, N);
  if (a.cap < 1) bad_arg(op, "cap", fmt::format("{}, expected > 0 ring rows per block", a.cap));
  need_optional_count(op, "num_ring_blocks", a.num_ring_blocks);
  if (a.token_to_req.device == Device::CUDA) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_ring_slots(a, ctx);
    return;
#else
    detail::no_cuda(op);
#endif
  }
  const auto* t2r = a.token_to_req.ptr<const int32_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  check_tokens(op, a.token_to_req, a.positions, a.ring_block_table, "ring_block_table",
               a.num_actual_tokens);
  if (a.num_ring_blocks >= 0)
    for (int64_t t = 0; t < a.num_actual_tokens; ++t) {
      const int32_t b = table_at(a.ring_block_table, t2r[t], 0);
      if (b >= a.num_ring_blocks)
        bad_arg(op, "ring_block_table",
            fmt::format("ring_block_table[{}][0] = {} (request of token {}), expected a ring "
                        "block id < num_ring_blocks = {}",
                        t2r[t], b, t, a.num_ring_blocks));
    }

  auto* out = a.ring_slots.ptr<int64_t>();
  for (int64_t t = 0; t < N; ++t) {
    if (t >= a.num_actual_tokens) {
      out[t] = -1;
      continue;
    }
    const int64_t b = table_at(a.ring_block_table, t2r[t], 0);
    out[t] = detail::slot_in_page(b, a.cap, pos[t] % a.cap);
  }
}

// ------------------------------------------------------------------------------ token slots (6.4)

void build_token_slots(const TokenSlotArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_token_slots";
  need_threads(op, ctx);
  const int64_t N = need_slot_views(op, {&a.token_to_req, &a.positions, &a.block_table,
                                         "block_table", "i32 [num_reqs, max_pages]", &a.slots,
                                         "slots"});
  need_num_actual(op, a.num_actual_tokens, N);
  if (a.page < 1) bad_arg(op, "page", fmt::format("{}, expected > 0 tokens per page", a.page));
  need_optional_count(op, "num_pages", a.num_pages);
  if (a.token_to_req.device == Device::CUDA) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_token_slots(a, ctx);
    return;
#else
    detail::no_cuda(op);
#endif
  }
  const auto* t2r = a.token_to_req.ptr<const int32_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  check_tokens(op, a.token_to_req, a.positions, a.block_table, "block_table", a.num_actual_tokens);
  const int64_t cols = a.block_table.shape[1];
  for (int64_t t = 0; t < a.num_actual_tokens; ++t) {
    const int64_t lp = pos[t] / a.page;
    if (lp >= cols)
      bad_arg(op, "block_table",
          fmt::format("token {} (request {}, position {}) needs logical page {} (page size {}), "
                      "expected < {} columns",
                      t, t2r[t], pos[t], lp, a.page, cols));
    const int32_t pg = table_at(a.block_table, t2r[t], lp);
    if (a.num_pages >= 0 && pg >= a.num_pages)
      bad_arg(op, "block_table",
          fmt::format("block_table[{}][{}] = {} (token {}, position {}), expected a page id < "
                      "num_pages = {}",
                      t2r[t], lp, pg, t, pos[t], a.num_pages));
  }

  auto* out = a.slots.ptr<int64_t>();
  for (int64_t t = 0; t < N; ++t) {
    if (t >= a.num_actual_tokens) {
      out[t] = -1;
      continue;
    }
    const int64_t pg = table_at(a.block_table, t2r[t], pos[t] / a.page);
    out[t] = detail::slot_in_page(pg, a.page, pos[t] % a.page);
  }
}

// ------------------------------------------------------------------------------ compressed (6.5)

void build_compressed_slots(const CompressedSlotArgs& a, const ExecContext& ctx) {
  static constexpr const char* op = "build_compressed_slots";
  if (a.ratio != 1 && a.ratio != 2)
    fail(ErrorCode::kMetadataRatio,
         fmt::format("{}: ratio = {}, expected 1 or 2 (only kv-source caches of ratio 1/2 have a "
                     "compressed cache)",
                     op, a.ratio));
  need_threads(op, ctx);
  const int64_t N = need_slot_views(op, {&a.token_to_req, &a.positions, &a.block_table,
                                         "block_table", "i32 [num_reqs, max_pages]", &a.slots,
                                         "slots"});
  if (a.token_slots.present()) {
    need_vector(op, a.token_slots, "token_slots", DType::I64, "i64 [>= N] token slots or absent",
                N);
    need_device(op, a.token_slots, "token_slots", a.token_to_req.device, "token_to_req");
  }
  need_num_actual(op, a.num_actual_tokens, N);
  if (a.states_per_page < 1)
    bad_arg(op, "states_per_page", fmt::format("{}, expected > 0 states per page", a.states_per_page));
  need_optional_count(op, "num_pages", a.num_pages);
  if (a.token_to_req.device == Device::CUDA) {
#if defined(DSV41KV_WITH_CUDA)
    detail::cuda::build_compressed_slots(a, ctx);
    return;
#else
    detail::no_cuda(op);
#endif
  }
  const auto* t2r = a.token_to_req.ptr<const int32_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  const int64_t* tslot = a.token_slots.present() ? a.token_slots.ptr<const int64_t>() : nullptr;
  const int64_t r = a.ratio, S = a.states_per_page;
  check_tokens(op, a.token_to_req, a.positions, a.block_table, "block_table", a.num_actual_tokens);
  auto gets_slot = [&](int64_t t) {
    return closes_group(pos[t], r) && (tslot == nullptr || tslot[t] >= 0);  // PAD rule
  };
  const int64_t cols = a.block_table.shape[1];
  for (int64_t t = 0; t < a.num_actual_tokens; ++t) {
    if (!gets_slot(t)) continue;
    const int64_t s = pos[t] / r, lp = s / S;
    if (lp >= cols)
      bad_arg(op, "block_table",
          fmt::format("token {} (request {}, position {}) closes state {} in logical page {} "
                      "({} states per page), expected < {} columns",
                      t, t2r[t], pos[t], s, lp, S, cols));
    const int32_t pg = table_at(a.block_table, t2r[t], lp);
    if (a.num_pages >= 0 && pg >= a.num_pages)
      bad_arg(op, "block_table",
          fmt::format("block_table[{}][{}] = {} (token {}, position {}), expected a page id < "
                      "num_pages = {}",
                      t2r[t], lp, pg, t, pos[t], a.num_pages));
  }

  // Every row is written: -1 first (the whole buffer, SPEC 6.5), then the valid closing tokens.
  // Computed per row (reads of token_slots[t] precede the write of slots[t], so the output may
  // alias token_slots).
  auto* out = a.slots.ptr<int64_t>();
  for (int64_t t = 0; t < N; ++t) {
    int64_t v = -1;
    if (t < a.num_actual_tokens && gets_slot(t)) {
      const int64_t s = pos[t] / r;
      const int64_t pg = table_at(a.block_table, t2r[t], s / S);
      v = detail::slot_in_page(pg, S, s % S);
    }
    out[t] = v;
  }
}

}  // namespace dsv41kv

// StepMetadata (pipeline.hpp): the batch's host data staged into buffers reserved at construction,
// uploaded, and the metadata builders of SPEC 6 run on the configured device.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/validate.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pipeline.hpp"
#include "pipeline/timeline.hpp"

namespace dsv41kv::pipeline {

struct StepMetadata::Impl {
  ServingConfig cfg;
  int64_t R = 0, A = 0, N = 0, max_pos = -1;
  // host staging, sized for the largest step at construction
  std::vector<int32_t> h_qsl, h_ring_bt;
  std::vector<int64_t> h_pos;
  std::vector<int32_t> h_bt[2];
  Buffer qsl, pos, t2r, ring_bt, ring_slots;
  Buffer bt[2], cslots[2];
  // the read path (served SWA cache)
  std::vector<int32_t> h_swa_bt;
  std::vector<int64_t> h_seq;
  Buffer swa_bt, swa_slots, valid, seq;
  Buffer window, window_lens, gather_lens, gather_starts;
  std::vector<int64_t> h_glen, h_gstart;  // the gather lengths as built on the host
  DecodeSplit split;
  int s_q = 1;
  int64_t max_seq = 0;
  uint64_t generation = 0;
  detail::Timeline timeline;

  explicit Impl(const ServingConfig& c) : cfg(c), timeline(c.device, 2) {}

  int64_t width(int r) const { return cfg.compressed(r).block_table_width; }
  void check(const StepBatch& b) const;
  void build_read_path(const StepBatch& b);
};

namespace {

constexpr const char* kOp = "StepMetadata::build";

[[noreturn]] void bad_request(size_t j, const char* field, const std::string& msg) {
  detail::bad_arg(kOp, fmt::format("batch.requests[{}].{}", j, field).c_str(), msg);
}

}  // namespace

void StepMetadata::Impl::check(const StepBatch& b) const {
  if (static_cast<int64_t>(b.requests.size()) > cfg.max_requests)
    detail::bad_arg(kOp, "batch.requests",
                    fmt::format("{} requests, expected at most max_requests = {}", b.requests.size(), cfg.max_requests));
  if (b.padding_rows < 0) detail::bad_arg(kOp, "batch.padding_rows", fmt::format("{}, expected >= 0", b.padding_rows));
  int64_t tokens = 0;  // saturating: the bound below only needs to be exceeded
  for (size_t j = 0; j < b.requests.size(); ++j) {
    const StepRequest& q = b.requests[j];
    if (q.query_len < 0) bad_request(j, "query_len", fmt::format("{}, expected >= 0", q.query_len));
    if (q.num_computed < 0 || q.num_computed > (int64_t{1} << 60))
      bad_request(j, "num_computed", fmt::format("{}, expected 0..2^60", q.num_computed));
    if (__builtin_add_overflow(tokens, q.query_len, &tokens)) tokens = std::numeric_limits<int64_t>::max();
  }
  if (tokens > cfg.max_tokens || b.padding_rows > cfg.max_tokens - tokens)
    detail::bad_arg(kOp, "batch", fmt::format("{} tokens and {} padding rows, expected at most max_tokens = {} rows",
                                              tokens, b.padding_rows, cfg.max_tokens));
  for (size_t j = 0; j < b.requests.size(); ++j) {
    const StepRequest& q = b.requests[j];
    if (cfg.serves_swa()) {
      const SwaCacheGeometry& g = cfg.swa;
      if (static_cast<int64_t>(q.swa_pages.size()) > g.block_table_width)
        bad_request(j, "swa_pages", fmt::format("{} entries, expected at most swa.block_table_width = {}",
                                                q.swa_pages.size(), g.block_table_width));
      for (size_t k = 0; k < q.swa_pages.size(); ++k)
        if (q.swa_pages[k] >= g.num_pages)
          bad_request(j, "swa_pages", fmt::format("page {} at logical page {}, expected < swa.num_pages = {} (<= 0: "
                                                  "the null page)", q.swa_pages[k], k, g.num_pages));
      if (q.query_len > 0 && (q.num_computed + q.query_len - 1) / g.page_tokens >= g.block_table_width)
        bad_request(j, "num_computed + query_len",
                    fmt::format("{}: position {} lies on logical SWA page {}, expected a page below "
                                "swa.block_table_width = {}", q.num_computed + q.query_len,
                                q.num_computed + q.query_len - 1, (q.num_computed + q.query_len - 1) / g.page_tokens,
                                g.block_table_width));
    } else if (!q.swa_pages.empty()) {
      bad_request(j, "swa_pages", fmt::format("{} entries, expected none: the configuration has no SWA cache",
                                              q.swa_pages.size()));
    }
    if (cfg.serves(2) && q.ring_block >= cfg.ring_blocks)
      bad_request(j, "ring_block", fmt::format("{}, expected < ring_blocks = {} (<= 0: the null block)", q.ring_block,
                                               cfg.ring_blocks));
    for (int r : {1, 2}) {
      if (!cfg.serves(r)) continue;
      const char* field = r == 1 ? "c1a_pages" : "c2a_pages";
      const std::vector<int32_t>& pages = q.pages(r);
      const CompressedCacheGeometry& g = cfg.compressed(r);
      if (static_cast<int64_t>(pages.size()) > g.block_table_width)
        bad_request(j, field, fmt::format("{} entries, expected at most block_table_width = {}", pages.size(),
                                          g.block_table_width));
      for (size_t k = 0; k < pages.size(); ++k)
        if (pages[k] >= g.num_pages)
          bad_request(j, field, fmt::format("page {} at logical page {}, expected < num_pages = {} (<= 0: the null page)",
                                            pages[k], k, g.num_pages));
      // The last closing token reads the block table at the logical page of its state (SPEC 6.4,
      // 6.5); the host builders reject one beyond the row, the CUDA builders cannot report it.
      if (q.query_len == 0) continue;
      const int64_t last = q.num_computed + q.query_len - 1;
      const int64_t closing = last - (last + 1) % r;
      if (closing < q.num_computed) continue;
      const int64_t logical = group_state(closing, r) / cfg.states_per_page(r);
      if (logical >= g.block_table_width)
        bad_request(j, "num_computed + query_len",
                    fmt::format("{}: position {} closes state {} on logical page {} of the c{}a table, expected a page "
                                "below block_table_width = {}", q.num_computed + q.query_len, closing,
                                group_state(closing, r), logical, r, g.block_table_width));
    }
  }
}

void StepMetadata::Impl::build_read_path(const StepBatch& b) {
  const ExecContext& ctx = cfg.exec;
  const int64_t W = cfg.swa.block_table_width;
  swa_bt.upload(h_swa_bt.data(), static_cast<size_t>(R * W) * sizeof(int32_t), 0, ctx);
  seq.upload(h_seq.data(), static_cast<size_t>(R) * sizeof(int64_t), 0, ctx);
  max_seq = R > 0 ? *std::max_element(h_seq.begin(), h_seq.begin() + R) : 0;
  const TensorView t2r = this->t2r.view(DType::I32, {N}), p = pos.view(DType::I64, {N}), slots = swa_slots.view(DType::I64, {N});
  TokenSlotArgs ts;
  ts.token_to_req = t2r;
  ts.positions = p;
  ts.block_table = swa_bt.view(DType::I32, {R, W});
  ts.num_actual_tokens = A;
  ts.page = cfg.swa.page_tokens;
  ts.slots = slots;
  ts.num_pages = cfg.swa.num_pages;
  build_token_slots(ts, ctx);
  build_token_valid(slots, valid.view(DType::I32, {N}), ctx);
  // The split is the host's decision (SPEC 6.2), made from the batch's own qsl; the device
  // builders take it and never read qsl back.
  const TensorView hq = TensorView::contiguous(h_qsl.data(), DType::I32, {R + 1});
  split = split_decode_prefill(hq, cfg.num_speculative_tokens, kOp);
  SwaWindowArgs wa;
  wa.qsl = qsl.view(DType::I32, {R + 1});
  wa.num_speculative_tokens = cfg.num_speculative_tokens;
  wa.positions = p;
  wa.slot_swa = slots;
  wa.block_table = ts.block_table;
  wa.page = cfg.swa.page_tokens;
  wa.num_pages = cfg.swa.num_pages;
  wa.indices = window.view(DType::I32, {cfg.max_tokens, kSwaWindow});
  wa.lengths = window_lens.view(DType::I32, {cfg.max_tokens});
  wa.split = &split;
  build_swa_window(wa, ctx);
  // The gather lengths feed the prefill chunk plan, which runs on the host: built from the host
  // staging, then copied to the device.
  const int64_t P = std::max<int64_t>(split.num_prefills, 0);
  PrefillGatherArgs ga;
  ga.qsl = hq;
  ga.num_speculative_tokens = cfg.num_speculative_tokens;
  ga.seq_lens = TensorView::contiguous(h_seq.data(), DType::I64, {R});
  ga.gather_lens = TensorView::contiguous(h_glen.data(), DType::I64, {P});
  ga.gather_starts = TensorView::contiguous(h_gstart.data(), DType::I64, {P});
  build_prefill_gather(ga, ctx);
  gather_lens.upload(h_glen.data(), static_cast<size_t>(P) * sizeof(int64_t), 0, ctx);
  gather_starts.upload(h_gstart.data(), static_cast<size_t>(P) * sizeof(int64_t), 0, ctx);
  s_q = 1;
  for (int64_t j = 0; j < split.num_decodes; ++j) {
    const int64_t n = b.requests[static_cast<size_t>(j)].query_len;
    if (j == 0) s_q = static_cast<int>(std::max<int64_t>(n, 1));
    else if (n != s_q) { s_q = 1; break; }
  }
}

StepMetadata::StepMetadata(const ServingConfig& cfg) {
  validate(cfg);
  impl_ = std::make_unique<Impl>(cfg);
  Impl& m = *impl_;
  const Device d = cfg.device;
  const auto T = static_cast<size_t>(cfg.max_tokens), Rq = static_cast<size_t>(cfg.max_requests);
  m.h_qsl.resize(Rq + 1);
  m.h_pos.resize(T);
  m.h_ring_bt.resize(Rq);
  m.qsl = Buffer(d, (Rq + 1) * sizeof(int32_t));
  m.pos = Buffer(d, T * sizeof(int64_t));
  m.t2r = Buffer(d, T * sizeof(int32_t));
  for (int r : {1, 2}) {
    if (!cfg.serves(r)) continue;
    const size_t w = static_cast<size_t>(m.width(r));
    m.h_bt[r - 1].resize(Rq * w);
    m.bt[r - 1] = Buffer(d, Rq * w * sizeof(int32_t));
    m.cslots[r - 1] = Buffer(d, T * sizeof(int64_t));
  }
  if (cfg.serves(2)) {
    m.ring_bt = Buffer(d, Rq * sizeof(int32_t));
    m.ring_slots = Buffer(d, T * sizeof(int64_t));
  }
  if (cfg.serves_swa()) {
    const size_t w = static_cast<size_t>(cfg.swa.block_table_width);
    m.h_swa_bt.resize(Rq * w);
    m.h_seq.resize(Rq);
    m.swa_bt = Buffer(d, Rq * w * sizeof(int32_t));
    m.swa_slots = Buffer(d, T * sizeof(int64_t));
    m.valid = Buffer(d, T * sizeof(int32_t));
    m.seq = Buffer(d, Rq * sizeof(int64_t));
    m.window = Buffer(d, T * kSwaWindow * sizeof(int32_t));
    m.window_lens = Buffer(d, T * sizeof(int32_t));
    m.gather_lens = Buffer(d, Rq * sizeof(int64_t));
    m.gather_starts = Buffer(d, Rq * sizeof(int64_t));
    m.h_glen.resize(Rq);
    m.h_gstart.resize(Rq);
  }
}

StepMetadata::~StepMetadata() = default;

void StepMetadata::set_exec(const ExecContext& exec) {
  detail::check_exec_context(exec, "StepMetadata::set_exec");
  impl_->cfg.exec = exec;
}

void StepMetadata::build(const StepBatch& batch) {
  Impl& m = *impl_;
  m.check(batch);
  const ServingConfig& c = m.cfg;
  const ExecContext& ctx = c.exec;
  const int64_t R = static_cast<int64_t>(batch.requests.size());
  const int64_t A = batch.num_tokens(), N = A + batch.padding_rows;
  m.R = R;
  m.A = A;
  m.N = N;
  m.max_pos = -1;
  // qsl and positions (SPEC 6.1: padding rows at position 0), block-table rows padded with the
  // null page
  m.h_qsl[0] = 0;
  int64_t t = 0;
  for (int64_t j = 0; j < R; ++j) {
    const StepRequest& q = batch.requests[static_cast<size_t>(j)];
    for (int64_t i = 0; i < q.query_len; ++i) m.h_pos[static_cast<size_t>(t++)] = q.num_computed + i;
    if (q.query_len > 0) m.max_pos = std::max(m.max_pos, q.num_computed + q.query_len - 1);
    m.h_qsl[static_cast<size_t>(j + 1)] = static_cast<int32_t>(t);
    m.h_ring_bt[static_cast<size_t>(j)] = q.ring_block;
    for (int r : {1, 2}) {
      if (!c.serves(r)) continue;
      const std::vector<int32_t>& pages = q.pages(r);
      const auto row = m.h_bt[r - 1].begin() + j * m.width(r);
      std::fill(std::copy(pages.begin(), pages.end(), row), row + m.width(r), 0);
    }
    if (c.serves_swa()) {
      const auto row = m.h_swa_bt.begin() + j * c.swa.block_table_width;
      std::fill(std::copy(q.swa_pages.begin(), q.swa_pages.end(), row), row + c.swa.block_table_width, 0);
      m.h_seq[static_cast<size_t>(j)] = q.num_computed + q.query_len;
    }
  }
  std::fill(m.h_pos.begin() + A, m.h_pos.begin() + N, 0);

  m.timeline.mark(0, ctx);
  m.qsl.upload(m.h_qsl.data(), static_cast<size_t>(R + 1) * sizeof(int32_t), 0, ctx);
  m.pos.upload(m.h_pos.data(), static_cast<size_t>(N) * sizeof(int64_t), 0, ctx);
  build_token_to_req({qsl(), token_to_req(), A}, ctx);
  for (int r : {1, 2}) {
    if (!c.serves(r)) continue;
    m.bt[r - 1].upload(m.h_bt[r - 1].data(), static_cast<size_t>(R * m.width(r)) * sizeof(int32_t), 0, ctx);
    CompressedSlotArgs a;
    a.ratio = r;
    a.token_to_req = token_to_req();
    a.positions = positions();
    a.block_table = block_table(r);
    a.num_actual_tokens = A;
    a.states_per_page = c.states_per_page(r);
    a.slots = compressed_slots(r);
    a.num_pages = c.compressed(r).num_pages;
    build_compressed_slots(a, ctx);
  }
  if (c.serves(2)) {
    m.ring_bt.upload(m.h_ring_bt.data(), static_cast<size_t>(R) * sizeof(int32_t), 0, ctx);
    RingSlotArgs a;
    a.token_to_req = token_to_req();
    a.positions = positions();
    a.ring_block_table = ring_block_table();
    a.num_actual_tokens = A;
    a.cap = c.ring_capacity();
    a.ring_slots = ring_slots();
    a.num_ring_blocks = c.ring_blocks;
    build_ring_slots(a, ctx);
  }
  if (c.serves_swa()) m.build_read_path(batch);
  ++m.generation;
  m.timeline.mark(1, ctx);
}

const ServingConfig& StepMetadata::config() const { return impl_->cfg; }
int64_t StepMetadata::num_requests() const { return impl_->R; }
int64_t StepMetadata::num_tokens() const { return impl_->A; }
int64_t StepMetadata::num_rows() const { return impl_->N; }
int64_t StepMetadata::max_position() const { return impl_->max_pos; }
double StepMetadata::last_ms() const { return impl_->timeline.ms(0, 1); }

TensorView StepMetadata::qsl() const { return impl_->qsl.view(DType::I32, {impl_->R + 1}); }
TensorView StepMetadata::positions() const { return impl_->pos.view(DType::I64, {impl_->N}); }
TensorView StepMetadata::token_to_req() const { return impl_->t2r.view(DType::I32, {impl_->N}); }

TensorView StepMetadata::compressed_slots(int ratio) const {
  if (!impl_->cfg.serves(ratio))
    detail::bad_arg("StepMetadata::compressed_slots", "ratio", fmt::format("{}: the c{}a type is not served", ratio, ratio));
  return impl_->cslots[ratio - 1].view(DType::I64, {impl_->N});
}

TensorView StepMetadata::block_table(int ratio) const {
  if (!impl_->cfg.serves(ratio))
    detail::bad_arg("StepMetadata::block_table", "ratio", fmt::format("{}: the c{}a type is not served", ratio, ratio));
  return impl_->bt[ratio - 1].view(DType::I32, {impl_->R, impl_->width(ratio)});
}

TensorView StepMetadata::ring_slots() const {
  if (!impl_->cfg.serves(2)) detail::bad_arg("StepMetadata::ring_slots", "c2a", "not served, expected a ratio-2 type");
  return impl_->ring_slots.view(DType::I64, {impl_->N});
}

TensorView StepMetadata::ring_block_table() const {
  if (!impl_->cfg.serves(2))
    detail::bad_arg("StepMetadata::ring_block_table", "c2a", "not served, expected a ratio-2 type");
  return impl_->ring_bt.view(DType::I32, {impl_->R, 1});
}

}  // namespace dsv41kv::pipeline

namespace dsv41kv::pipeline {

namespace {
const StepMetadata::Impl& read_path(const std::unique_ptr<StepMetadata::Impl>& m, const char* op) {
  if (!m->cfg.serves_swa())
    detail::bad_arg(op, "cfg.swa", "num_pages 0: no SWA cache, expected a configuration with the read path's SWA cache");
  return *m;
}
}  // namespace

TensorView StepMetadata::swa_block_table() const {
  const Impl& m = read_path(impl_, "StepMetadata::swa_block_table");
  return m.swa_bt.view(DType::I32, {m.R, m.cfg.swa.block_table_width});
}
TensorView StepMetadata::swa_slots() const {
  const Impl& m = read_path(impl_, "StepMetadata::swa_slots");
  return m.swa_slots.view(DType::I64, {m.N});
}
TensorView StepMetadata::token_valid() const {
  const Impl& m = read_path(impl_, "StepMetadata::token_valid");
  return m.valid.view(DType::I32, {m.N});
}
TensorView StepMetadata::seq_lens() const {
  const Impl& m = read_path(impl_, "StepMetadata::seq_lens");
  return m.seq.view(DType::I64, {m.R});
}
int64_t StepMetadata::max_seq_len() const { return read_path(impl_, "StepMetadata::max_seq_len").max_seq; }
DecodeSplit StepMetadata::split() const { return read_path(impl_, "StepMetadata::split").split; }
int StepMetadata::decode_s_q() const { return read_path(impl_, "StepMetadata::decode_s_q").s_q; }
TensorView StepMetadata::swa_window() const {
  const Impl& m = read_path(impl_, "StepMetadata::swa_window");
  return m.window.view(DType::I32, {m.cfg.max_tokens, kSwaWindow});
}
TensorView StepMetadata::swa_window_lens() const {
  const Impl& m = read_path(impl_, "StepMetadata::swa_window_lens");
  return m.window_lens.view(DType::I32, {m.cfg.max_tokens});
}
TensorView StepMetadata::gather_lens() const {
  const Impl& m = read_path(impl_, "StepMetadata::gather_lens");
  return m.gather_lens.view(DType::I64, {m.split.num_prefills});
}
TensorView StepMetadata::gather_starts() const {
  const Impl& m = read_path(impl_, "StepMetadata::gather_starts");
  return m.gather_starts.view(DType::I64, {m.split.num_prefills});
}
TensorView StepMetadata::host_qsl() const {
  return TensorView::contiguous(const_cast<int32_t*>(impl_->h_qsl.data()), DType::I32, {impl_->R + 1});
}
TensorView StepMetadata::host_seq_lens() const {
  const Impl& m = read_path(impl_, "StepMetadata::host_seq_lens");
  return TensorView::contiguous(const_cast<int64_t*>(m.h_seq.data()), DType::I64, {m.R});
}
TensorView StepMetadata::host_gather_lens() const {
  const Impl& m = read_path(impl_, "StepMetadata::host_gather_lens");
  return TensorView::contiguous(const_cast<int64_t*>(m.h_glen.data()), DType::I64, {m.split.num_prefills});
}
TensorView StepMetadata::host_gather_starts() const {
  const Impl& m = read_path(impl_, "StepMetadata::host_gather_starts");
  return TensorView::contiguous(const_cast<int64_t*>(m.h_gstart.data()), DType::I64, {m.split.num_prefills});
}
TensorView StepMetadata::host_swa_block_table() const {
  const Impl& m = read_path(impl_, "StepMetadata::host_swa_block_table");
  return TensorView::contiguous(const_cast<int32_t*>(m.h_swa_bt.data()), DType::I32, {m.R, m.cfg.swa.block_table_width});
}
TensorView StepMetadata::host_block_table(int ratio) const {
  if (!impl_->cfg.serves(ratio))
    detail::bad_arg("StepMetadata::host_block_table", "ratio", fmt::format("{}: the c{}a type is not served", ratio, ratio));
  return TensorView::contiguous(const_cast<int32_t*>(impl_->h_bt[ratio - 1].data()), DType::I32,
                                {impl_->R, impl_->width(ratio)});
}
uint64_t StepMetadata::generation() const { return impl_->generation; }

}  // namespace dsv41kv::pipeline

// The PCP simulation (SPEC 10.6): P ranks as threads replaying a seeded workload, the two
// single-rank references of SPEC 7.8, and the per-step invariant check.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "dsv41kv/compressor.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/pcp_step_cuda.hpp"
#include "dsv41kv/rng.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rope.hpp"
#include "oracles/pcp_read.hpp"
#if defined(DSV41KV_TEST_SEAMS)
#include "dsv41kv/test_seam.hpp"
#endif

namespace dsv41kv::pcp {

std::string Mismatch::to_string() const {
  return fmt::format("step {} rank {} tensor {} index {}{}{}", step,
                     rank < 0 ? std::string("ref") : std::to_string(rank), tensor, index,
                     detail.empty() ? "" : ": ", detail);
}

ReadPathCounts& ReadPathCounts::operator+=(const ReadPathCounts& o) {
  decode_rows += o.decode_rows;
  prefill_rows += o.prefill_rows;
  prefill_chunks += o.prefill_chunks;
  swa_keys += o.swa_keys;
  topk_entries += o.topk_entries;
  topk_max = std::max(topk_max, o.topk_max);
  shortcut_steps += o.shortcut_steps;
  return *this;
}

CheckStats& CheckStats::operator+=(const CheckStats& o) {
  latent_elements += o.latent_elements;
  latent_mismatched += o.latent_mismatched;
  cache_bytes += o.cache_bytes;
  cache_mismatched += o.cache_mismatched;
  ring_floats += o.ring_floats;
  ring_mismatched += o.ring_mismatched;
  link_entries += o.link_entries;
  link_mismatched += o.link_mismatched;
  read_cache_bytes += o.read_cache_bytes;
  read_cache_mismatched += o.read_cache_mismatched;
  attention_rows += o.attention_rows;
  topk_entries += o.topk_entries;
  topk_mismatched += o.topk_mismatched;
  output_elements += o.output_elements;
  output_mismatched += o.output_mismatched;
  lse_elements += o.lse_elements;
  lse_mismatched += o.lse_mismatched;
  return *this;
}

namespace {

constexpr float kRingCanary = 3.0f;
constexpr uint16_t kLatentCanary = 0x7FC0;  // bf16 NaN: latents are not initialised by compress
constexpr float kPlainFp8Scale = 0.5f;

// kv_score row of (request, position): a deterministic function, the same on every rank.
void fill_kv_row(float* dst, uint64_t seed, int64_t req, int64_t pos, int cols) {
  const uint64_t row = splitmix64(splitmix64(splitmix64(seed ^ 0x6B765F73636F7265ull) ^
                                             static_cast<uint64_t>(req)) ^
                                  static_cast<uint64_t>(pos));
  for (int c = 0; c < cols; ++c) {
    const uint64_t h = splitmix64(row + static_cast<uint64_t>(c));
    dst[c] = c < kLatentDim ? hash_float(h, -2.0f, 2.0f) : hash_float(h, -4.0f, 4.0f);
  }
}

struct CacheSet {
  std::vector<std::vector<uint8_t>> backing;  // one per format
  std::vector<CacheView> views;
};

CacheSet make_caches(const std::vector<RecordFormat>& formats, int64_t num_pages, int64_t S) {
  CacheSet cs;
  for (RecordFormat f : formats) {
    CacheView v = CacheView::with_default_strides(nullptr, f, num_pages, S);
    std::vector<uint8_t> b(v.backing_bytes());
    if (f == RecordFormat::PLAIN_BF16) {
      for (size_t i = 0; i + 1 < b.size(); i += 2) {
        b[i] = 0x40;
        b[i + 1] = 0x40;
      }
    } else {
      std::fill(b.begin(), b.end(), uint8_t{165});
    }
    cs.backing.push_back(std::move(b));
    cs.views.push_back(v);
  }
  for (size_t i = 0; i < formats.size(); ++i) {
    cs.views[i].base = cs.backing[i].data();
    if (formats[i] == RecordFormat::PLAIN_FP8) cs.views[i].fp8_scale = kPlainFp8Scale;
  }
  return cs;
}

struct RankState {
  std::vector<float> ring;
  CacheSet caches;
  std::vector<int32_t> token_to_req;
  std::vector<int64_t> ring_slots;
  std::vector<uint16_t> latent;
  std::vector<uint16_t> gathered_latent;
  LayerStepResult result;
  CommVolume volume;
  uint64_t measured_sent = 0, measured_received = 0;
  std::unique_ptr<DeviceRank> dev;  // device CUDA: this rank's state on the GPU
  double device_ms = 0;
  std::unique_ptr<read_path::Layer> read;  // SimConfig::read_path
  std::vector<uint16_t> gathered_kv;       // the step's SWA kv rows of every rank
};

struct RefState {
  std::vector<float> ring_tail, ring_open;
  CacheSet caches;
  std::vector<int32_t> qsl, token_to_req;
  std::vector<int64_t> positions, ring_slots, cslots;
  std::vector<uint16_t> latent_tail, latent_open;
  std::unique_ptr<read_path::Layer> read;  // SimConfig::read_path: the layer run whole
};

TensorView v_i64(std::vector<int64_t>& v, int64_t n) {
  return TensorView::contiguous(v.data(), DType::I64, {n});
}
TensorView v_i32(std::vector<int32_t>& v, int64_t n) {
  return TensorView::contiguous(v.data(), DType::I32, {n});
}

}  // namespace

struct Simulation::Impl {
  SimConfig cfg;
  Workload w;
  int P = 1;
  bool with_ref = false;
  int64_t S = 0, cap = 8, ring_blocks = 0, num_pages = 0, max_pages = 0;
  std::vector<std::vector<int32_t>> ctable;  // per workload request [max_pages]
  std::vector<float> rope;
  int64_t rope_rows = 0;
  std::vector<uint16_t> norm_w;
  std::unique_ptr<ThreadGroup> group;
  Communicator* external = nullptr;  // this process runs only rank only_rank over it
  int only_rank = -1;
  bool local(int k) const { return only_rank < 0 || k == only_rank; }
  std::vector<RankState> ranks;
  RefState ref;
  int64_t next_step = 0;
  // The last run step.
  StepPlan plan;
  std::vector<ScheduledRequest> sreqs;
  std::vector<int64_t> gathered_cslots;
  std::vector<int64_t> computed;  // per workload request, after the last run step
  // SimConfig::read_path: what every layer shares; the last run step's gathered SWA slot mapping
  // (from the global batch, identical on every rank) and its longest sequence.
  std::unique_ptr<read_path::Setup> read;
  std::vector<int64_t> gathered_swa_slots;
  int64_t step_max_seq = 0;

  int cols() const { return kLatentDim * cfg.ratio; }

  void kv_rows(std::vector<float>& out, int64_t rows, const std::vector<int32_t>& ids,
               const std::vector<int64_t>& pos) const {
    out.assign(static_cast<size_t>(rows) * static_cast<size_t>(cols()), 0.0f);
    for (size_t t = 0; t < ids.size(); ++t)
      if (ids[t] >= 0) fill_kv_row(out.data() + t * static_cast<size_t>(cols()), w.config.seed, ids[t], pos[t], cols());
  }

  void seed_rings() {
    // Requests admitted with num_computed > 0 had their earlier positions computed before the
    // simulation: the tail ring holds their last min(start, cap) rows, the open-row rings only
    // the newest row when its group is open.
    std::vector<float> row(kRingRowFloats);
    for (size_t id = 0; id < w.requests.size(); ++id) {
      const auto& r = w.requests[id];
      if (r.ring_block <= 0 || r.start == 0 || cfg.ratio != 2) continue;
      for (int64_t p = std::max<int64_t>(0, r.start - cap); p < r.start; ++p) {
        fill_kv_row(row.data(), w.config.seed, static_cast<int64_t>(id), p, kRingRowFloats);
        const size_t off = static_cast<size_t>((r.ring_block * cap + p % cap) * kRingRowFloats);
        const bool open = p == r.start - 1 && !closes_group(p, 2);
        if (with_ref) std::memcpy(ref.ring_tail.data() + off, row.data(), sizeof(float) * kRingRowFloats);
        if (!open) continue;
        if (with_ref) std::memcpy(ref.ring_open.data() + off, row.data(), sizeof(float) * kRingRowFloats);
        for (auto& rs : ranks)
          if (!rs.ring.empty()) std::memcpy(rs.ring.data() + off, row.data(), sizeof(float) * kRingRowFloats);
      }
    }
  }

  TensorView ring_view(std::vector<float>& ring) {
    return TensorView::contiguous(ring.data(), DType::F32, {ring_blocks, cap, kRingRowFloats});
  }

  // Compressed block table rows of the step's requests, [G, max_pages].
  std::vector<int32_t> step_ctable() const {
    std::vector<int32_t> bt(sreqs.size() * static_cast<size_t>(max_pages));
    for (size_t g = 0; g < sreqs.size(); ++g)
      std::copy(ctable[static_cast<size_t>(sreqs[g].id)].begin(), ctable[static_cast<size_t>(sreqs[g].id)].end(),
                bt.begin() + static_cast<ptrdiff_t>(g * static_cast<size_t>(max_pages)));
    return bt;
  }

  void run_reference();
  void run_rank(Communicator& comm);
  void init_read_path();
  void write_prefixes();
  void read_step_metadata();
  void read_rank(Communicator& comm, RankState& rs, int k, std::vector<int64_t>& gpos);
};

namespace {

// Largest states_per_page the simulation takes (pages of 64 / ratio states are the model's; larger
// ones are for tests of the paged layout).
constexpr int64_t kMaxStatesPerPage = int64_t{1} << 16;

// The largest step of a workload: its tokens, a bound of any rank's padded rows (the step's
// tokens rounded up to the graph-pad multiple; every rank holds at most all of them) and the most
// requests of a step.
struct StepBounds {
  int64_t tokens = 0, padded = 0, requests = 0;
};
StepBounds step_bounds(const Workload& w) {
  StepBounds b;
  for (const auto& step : w.steps) {
    int64_t t = 0;
    for (const auto& r : step) t += r.req.query_len;
    b.tokens = std::max(b.tokens, t);
    b.requests = std::max(b.requests, static_cast<int64_t>(step.size()));
  }
  const int64_t mult = std::max<int64_t>(w.config.graph_pad_multiple, 1);
  b.padded = (b.tokens + mult - 1) / mult * mult;
  return b;
}

// The host bytes a simulation allocates, estimated before it allocates anything: per rank held
// by this process its compressed caches (every format), its ring and its largest step buffers
// (kv_score rows, latents, the gathered latents of all P ranks), plus the single-rank references'
// caches and rings (tail and open-row policies); with the read path, each rank's and the
// reference's layer (read_path::layer_bytes) and the gathered kv rows. Padded rows are bounded by
// step_bounds(). Rejects (E8) when cfg.max_host_bytes > 0 and the estimate exceeds it, so that an
// oversized workload is an error before any work, not a bad_alloc halfway.
void check_host_memory(const SimConfig& cfg, const Workload& w, int P, bool with_reference, bool external, int64_t S,
                       int64_t num_pages, int64_t cap, int64_t ring_blocks) {
  if (cfg.max_host_bytes <= 0) return;
  double cache = 0.0;
  for (RecordFormat f : cfg.formats)  // what make_caches allocates (S <= 2^16 and the workload's bounds keep it in int64)
    cache += static_cast<double>(CacheView::with_default_strides(nullptr, f, num_pages, S).backing_bytes());
  const double ring = cfg.ratio == 2 ? static_cast<double>(ring_blocks) * static_cast<double>(cap) * kRingRowFloats * 4.0 : 0.0;
  const StepBounds b = step_bounds(w);
  const double padded = static_cast<double>(b.padded);
  double step = padded * (512.0 * cfg.ratio * 4.0 + kLatentDim * 2.0 * (1.0 + P));
  double read_rank = 0.0, read_ref = 0.0;
  if (cfg.read_path) {
    int64_t swa_pages = 1;
    for (const auto& r : w.requests) swa_pages += r.null_block ? 0 : read_path::swa_pages_of(r);
    auto layer = [&](int64_t rows) {
      return read_path::layer_bytes(cfg.ratio, cfg.formats[0], cfg.num_heads, swa_pages, num_pages, S,
                                    w.max_position + 1, rows);
    };
    int64_t longest_prefix = 0;  // the prefix writer of the constructor (write_prefixes)
    for (const auto& r : w.requests) longest_prefix = std::max(longest_prefix, r.null_block ? 0 : r.start);
    read_rank = layer(b.padded);
    read_ref = layer(b.tokens) + (longest_prefix > 0 ? layer(longest_prefix) : 0.0);
    step += padded * kLatentDim * 2.0 * P;  // the gathered kv rows
  }
  const double ranks = external ? 1.0 : static_cast<double>(P);
  const double refs = with_reference ? cache + 2.0 * ring + read_ref : 0.0;
  const double total = ranks * (cache + ring + step + read_rank) + refs;
  if (total <= static_cast<double>(cfg.max_host_bytes)) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  invalid_argument(
       fmt::format("simulation: needs about {:.1f} GiB of host memory, more than max_host_bytes = {:.1f} GiB: {} "
                   "rank(s) x (caches {:.2f} GiB [{} pages x {} states x {} format(s)] + ring {:.2f} GiB [{} blocks x "
                   "capacity {}] + step buffers {:.2f} GiB [up to {} padded rows]{}){} (expected fewer requests or "
                   "tokens, a smaller states_per_page, num_speculative_tokens or graph_pad_multiple, or fewer ranks)",
                   total / kGiB, static_cast<double>(cfg.max_host_bytes) / kGiB, external ? 1 : P, cache / kGiB,
                   num_pages, S, cfg.formats.size(), ring / kGiB, ring_blocks, cap, step / kGiB, b.padded,
                   cfg.read_path ? fmt::format(" + read-path layer {:.2f} GiB [{} heads]", read_rank / kGiB, cfg.num_heads)
                                 : std::string(),
                   with_reference ? fmt::format(" + references {:.2f} GiB", refs / kGiB) : std::string()));
}

}  // namespace

Simulation::Simulation(const SimConfig& cfg, const Workload& w, int P, bool with_reference,
                       Communicator* external)
    : impl_(new Impl) {
  Impl& m = *impl_;
  if (external) {
    if (external->size() != P)
      invalid_argument(fmt::format("simulation: external communicator of size {} with P = {} (expected equal)",
                                   external->size(), P));
    if (with_reference)
      invalid_argument("simulation: with_reference and an external communicator (expected one of them: the "
                       "references need every rank)");
    m.external = external;
    m.only_rank = external->rank();
  }
  if (cfg.device != Device::CPU && cfg.device != Device::CUDA)
    invalid_argument(fmt::format("simulation: device {} (expected cpu or cuda)", device_name(cfg.device)));
  if (cfg.ratio != 1 && cfg.ratio != 2)
    fail(ErrorCode::kCompressorRatio, fmt::format("simulation: ratio = {} (expected 1 or 2)", cfg.ratio));
  if (P < 1 || P > 64) invalid_argument(fmt::format("simulation: P = {} (expected 1..64)", P));
  check_pcp_speculation("simulation", P, cfg.num_speculative_tokens);
  if (cfg.formats.empty()) invalid_argument("simulation: formats is empty (expected at least one)");
  validate(w.config);
  if (cfg.read_path && cfg.device != Device::CPU)
    invalid_argument(fmt::format("simulation: read_path on {}: the read path's layer (pipeline::AttentionLayer) runs "
                                 "on the CPU only (expected read_path = false, or device cpu)", device_name(cfg.device)));
#if defined(DSV41KV_TEST_SEAMS)
  if (!cfg.read_path && (cfg.fault == seam::PcpFault::kLocalSwaInsert || cfg.fault == seam::PcpFault::kPerturbAttention))
    invalid_argument(fmt::format("simulation: fault {} breaks the read path, which does not run (expected read_path = "
                                 "true)", seam::fault_name(cfg.fault)));
#endif
  m.cfg = cfg;
  m.w = w;
  m.P = P;
  m.with_ref = with_reference;
  if (cfg.states_per_page < 0 || cfg.states_per_page > kMaxStatesPerPage)
    invalid_argument(fmt::format("simulation: states_per_page = {} (expected 0 for 64 / ratio, or 1..{})",
                                 cfg.states_per_page, kMaxStatesPerPage));
  if (cfg.max_host_bytes < 0)
    invalid_argument(fmt::format("simulation: max_host_bytes = {} (expected >= 0; 0: no limit)", cfg.max_host_bytes));
  m.S = cfg.states_per_page > 0 ? cfg.states_per_page : 64 / cfg.ratio;
  m.cap = ring_capacity(cfg.num_speculative_tokens);
  int32_t max_block = 0;
  for (const auto& r : w.requests) max_block = std::max(max_block, r.ring_block);
  m.ring_blocks = max_block + 1;

  // Compressed block tables: shuffled distinct pages >= 1; null-block requests all 0.
  Rng rng(w.config.seed ^ 0xC0FFEEull ^ static_cast<uint64_t>(cfg.ratio));
  std::vector<int64_t> need(w.requests.size());
  int64_t total = 0;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const auto& r = w.requests[i];
    const int64_t last = r.start + r.prompt_len + r.decode_steps - 1;
    need[i] = (last / cfg.ratio) / m.S + 1;
    m.max_pages = std::max(m.max_pages, need[i]);
    if (!r.null_block) total += need[i];
  }
  check_host_memory(cfg, w, P, with_reference, external != nullptr, m.S, total + 1, m.cap, m.ring_blocks);
  std::vector<int32_t> pages(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) pages[static_cast<size_t>(i)] = static_cast<int32_t>(i + 1);
  for (int64_t i = total - 1; i > 0; --i)
    std::swap(pages[static_cast<size_t>(i)], pages[static_cast<size_t>(rng.integer(0, i))]);
  m.num_pages = total + 1;
  size_t next = 0;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    std::vector<int32_t> row(static_cast<size_t>(m.max_pages), 0);
    if (!w.requests[i].null_block)
      for (int64_t k = 0; k < need[i]; ++k) row[static_cast<size_t>(k)] = pages[next++];
    m.ctable.push_back(std::move(row));
  }

  // RoPE table (the plain theta = 10000 table of SPEC 1.4), rows for every group start.
  m.rope_rows = w.max_position + 2;
  m.rope = build_rope_table(RopeParams{}, m.rope_rows).data;
  m.norm_w.resize(kLatentDim);
  for (int d = 0; d < kLatentDim; ++d)
    m.norm_w[static_cast<size_t>(d)] = num::bf16_encode(hash_float(splitmix64(w.config.seed + 77 + static_cast<uint64_t>(d)), 0.5f, 1.5f));

  const size_t ring_floats = static_cast<size_t>(m.ring_blocks * m.cap) * kRingRowFloats;
  m.ranks.resize(static_cast<size_t>(P));
  for (int k = 0; k < P; ++k) {
    if (!m.local(k)) continue;
    RankState& rs = m.ranks[static_cast<size_t>(k)];
    if (cfg.ratio == 2) rs.ring.assign(ring_floats, kRingCanary);
    rs.caches = make_caches(cfg.formats, m.num_pages, m.S);
    if (cfg.device == Device::CUDA) rs.dev = std::make_unique<DeviceRank>(cfg.cuda_device);
  }
  if (with_reference) {
    if (cfg.ratio == 2) {
      m.ref.ring_tail.assign(ring_floats, kRingCanary);
      m.ref.ring_open.assign(ring_floats, kRingCanary);
    }
    m.ref.caches = make_caches(cfg.formats, m.num_pages, m.S);
  }
  m.seed_rings();
  m.computed.resize(w.requests.size());
  for (size_t i = 0; i < w.requests.size(); ++i) m.computed[i] = w.requests[i].start;
  if (cfg.read_path) m.init_read_path();
  if (!external)
    m.group = cfg.device == Device::CUDA ? std::make_unique<ThreadGroup>(P, Device::CUDA)
                                         : std::make_unique<ThreadGroup>(P);
}

Simulation::~Simulation() = default;
int Simulation::P() const { return impl_->P; }
int64_t Simulation::num_steps() const { return static_cast<int64_t>(impl_->w.steps.size()); }

void Simulation::Impl::run_reference() {
  const int64_t G = static_cast<int64_t>(sreqs.size());
  RefState& r = ref;
  r.qsl.assign(1, 0);
  r.positions.clear();
  std::vector<int32_t> ids;
  for (const auto& s : sreqs) {
    r.qsl.push_back(static_cast<int32_t>(r.qsl.back() + s.req.query_len));
    for (int64_t i = 0; i < s.req.query_len; ++i) {
      r.positions.push_back(s.req.num_computed + i);
      ids.push_back(s.id);
    }
  }
  const int64_t N = r.qsl.back();
  r.token_to_req.assign(static_cast<size_t>(N), 0);
  build_token_to_req({v_i32(r.qsl, G + 1), v_i32(r.token_to_req, N)});
  std::vector<int32_t> ring_bt(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) ring_bt[static_cast<size_t>(g)] = w.requests[static_cast<size_t>(sreqs[static_cast<size_t>(g)].id)].ring_block;
  std::vector<int32_t> cbt = step_ctable();
  r.cslots.assign(static_cast<size_t>(N), -1);
  {
    CompressedSlotArgs a;
    a.ratio = cfg.ratio;
    a.token_to_req = v_i32(r.token_to_req, N);
    a.positions = v_i64(r.positions, N);
    a.block_table = TensorView::contiguous(cbt.data(), DType::I32, {G, max_pages});
    a.num_actual_tokens = N;
    a.states_per_page = S;
    a.slots = v_i64(r.cslots, N);
    build_compressed_slots(a);
  }
  std::vector<float> kv;
  kv_rows(kv, N, ids, r.positions);
  ExecContext ctx;
  ctx.num_threads = 1;
  if (cfg.ratio == 2) {
    r.ring_slots.assign(static_cast<size_t>(N), -1);
    RingSlotArgs a;
    a.token_to_req = v_i32(r.token_to_req, N);
    a.positions = v_i64(r.positions, N);
    a.ring_block_table = TensorView::contiguous(ring_bt.data(), DType::I32, {G, 1});
    a.num_actual_tokens = N;
    a.cap = cap;
    a.ring_slots = v_i64(r.ring_slots, N);
    build_ring_slots(a);
  }
  auto base_args = [&](std::vector<uint16_t>& latent, std::vector<float>& ring) {
    latent.assign(static_cast<size_t>(N) * kLatentDim, kLatentCanary);
    CompressArgs c;
    c.ratio = cfg.ratio;
    c.kv_score = TensorView::contiguous(kv.data(), DType::F32, {N, cols()});
    c.positions = v_i64(r.positions, N);
    c.slot_mapping = cfg.ratio == 2 ? v_i64(r.ring_slots, N) : v_i64(r.cslots, N);
    c.norm_weight = TensorView::contiguous(norm_w.data(), DType::BF16, {kLatentDim});
    c.eps = cfg.eps;
    c.latent_out = TensorView::contiguous(latent.data(), DType::BF16, {N, kLatentDim});
    if (cfg.ratio == 2) {
      c.ring = ring_view(ring);
      c.qsl = v_i32(r.qsl, G + 1);
      c.token_to_req = v_i32(r.token_to_req, N);
    }
    return c;
  };
  // Non-PCP single-rank run (policy tail), then its inserts.
  {
    std::vector<float> none;
    CompressArgs c = base_args(r.latent_tail, cfg.ratio == 2 ? r.ring_tail : none);
    c.policy = RingPolicy::kTail;
    compress(c, ctx);
    for (const CacheView& cv : r.caches.views) {
      InsertArgs ins;
      ins.ratio = cfg.ratio;
      ins.latent = TensorView::contiguous(r.latent_tail.data(), DType::BF16, {N, kLatentDim});
      ins.positions = v_i64(r.positions, N);
      ins.rope_table = TensorView::contiguous(rope.data(), DType::F32, {rope_rows, 64});
      ins.slots = v_i64(r.cslots, N);
      ins.cache = cv;
      insert(ins, ctx);
    }
  }
  // Open-row single-rank run: unsplit batch, every prev_row_indices -1, save_ring_rows writes
  // each request's newest row when its group is open.
  if (cfg.ratio == 2) {
    CompressArgs c = base_args(r.latent_open, r.ring_open);
    c.policy = RingPolicy::kOpenRow;
    std::vector<float> last_rows(static_cast<size_t>(G) * kRingRowFloats);
    std::vector<int64_t> idx(static_cast<size_t>(G), -1), wslots(static_cast<size_t>(G), -1);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t e = r.qsl[static_cast<size_t>(g + 1)];
      if (e == r.qsl[static_cast<size_t>(g)]) continue;
      std::memcpy(last_rows.data() + g * kRingRowFloats, kv.data() + (e - 1) * cols(),
                  sizeof(float) * kRingRowFloats);
      const int64_t p = r.positions[static_cast<size_t>(e - 1)];
      const int32_t b = ring_bt[static_cast<size_t>(g)];
      if (b > 0 && !closes_group(p, 2)) wslots[static_cast<size_t>(g)] = b * cap + p % cap;
    }
    c.prev_rows = TensorView::contiguous(last_rows.data(), DType::F32, {G, kRingRowFloats});
    c.prev_row_indices = v_i64(idx, G);
    compress(c, ctx);
    SaveRingRowsArgs s;
    s.prev_rows = c.prev_rows;
    s.ring_write_slots = v_i64(wslots, G);
    s.ring = ring_view(r.ring_open);
    save_ring_rows(s, ctx);
  }
  // The read path's single-rank run: the whole layer on the unsplit batch.
  if (r.read) {
    std::vector<read_path::BatchRequest> batch;
    for (const auto& q : sreqs) batch.push_back({q.id, q.req.num_computed, q.req.query_len});
    r.read->prepare(batch, 0);
    if (kv.empty()) kv.assign(static_cast<size_t>(cols()), 0.0f);  // a view needs data even for no rows
    pipeline::LayerInputs in = r.read->inputs();
    in.kv_score = TensorView::contiguous(kv.data(), DType::F32, {std::max<int64_t>(N, 1), cols()});
    r.read->layer().run(r.read->meta(), in);
  }
}

void Simulation::Impl::init_read_path() {
  read = std::make_unique<read_path::Setup>(read_path::make_setup(cfg, w, S, num_pages, ctable, ring_blocks,
                                                                  RopeTable{rope_rows, rope}, norm_w, kPlainFp8Scale));
  const StepBounds b = step_bounds(w);
  for (int k = 0; k < P; ++k)  // a rank holds at most two chunks of each request (SPEC 7.2)
    if (local(k)) ranks[static_cast<size_t>(k)].read = std::make_unique<read_path::Layer>(*read, b.padded, 2 * b.requests);
  if (with_ref) ref.read = std::make_unique<read_path::Layer>(*read, b.tokens, b.requests);
  write_prefixes();
  if (with_ref && cfg.ratio == 2) {  // the single-rank layer's ring is the tail-policy reference's
    const TensorView ring = ref.read->layer().ring();
    std::memcpy(ring.data, ref.ring_tail.data(), ref.ring_tail.size() * sizeof(float));
  }
}

// Requests admitted with num_computed > 0 had positions [0, start) computed before the
// simulation: their SWA, compressed and index-K entries are written once, by the layer's write
// half over each prefix as one fresh prefill, and copied into every layer, so that a continued
// prefill attends to the keys its prefix would have left.
void Simulation::Impl::write_prefixes() {
  int64_t longest = 0;
  for (const auto& r : w.requests)
    if (!r.null_block) longest = std::max(longest, r.start);
  if (longest == 0) return;
  read_path::Layer pre(*read, longest, 1);
  std::vector<int64_t> pos;
  std::vector<int32_t> ids;
  std::vector<float> kv;
  for (size_t id = 0; id < w.requests.size(); ++id) {
    const auto& r = w.requests[id];
    if (r.null_block || r.start == 0) continue;
    const read_path::BatchRequest q{static_cast<int32_t>(id), 0, r.start};
    pre.prepare({&q, 1}, 0);
    pos.resize(static_cast<size_t>(r.start));
    for (int64_t p = 0; p < r.start; ++p) pos[static_cast<size_t>(p)] = p;
    ids.assign(static_cast<size_t>(r.start), static_cast<int32_t>(id));
    kv_rows(kv, r.start, ids, pos);
    pipeline::LayerInputs in = pre.inputs();
    in.kv_score = TensorView::contiguous(kv.data(), DType::F32, {r.start, cols()});
    pre.layer().run_writes(pre.meta(), in);
  }
  for (RankState& rs : ranks)
    if (rs.read) rs.read->copy_caches_from(pre);
  if (ref.read) ref.read->copy_caches_from(pre);
}

// The gathered SWA slot mapping of the step from the global batch (SPEC 7.3), identical on every
// rank: each token's slot, -1 for PAD rows and masked replicas; and the step's longest sequence.
void Simulation::Impl::read_step_metadata() {
  const int64_t G = static_cast<int64_t>(sreqs.size()), GP = static_cast<int64_t>(P) * plan.padded;
  const int64_t W = read->serving.swa.block_table_width;
  std::vector<int32_t> bt(static_cast<size_t>(G * W), 0);
  step_max_seq = 0;
  for (int64_t g = 0; g < G; ++g) {
    const ScheduledRequest& q = sreqs[static_cast<size_t>(g)];
    const std::vector<int32_t>& pages = read->requests[static_cast<size_t>(q.id)].swa_pages;
    std::copy(pages.begin(), pages.end(), bt.begin() + g * W);
    step_max_seq = std::max(step_max_seq, q.req.num_computed + q.req.query_len);
  }
  gathered_swa_slots.assign(static_cast<size_t>(GP), -1);
  TokenSlotArgs a;
  a.token_to_req = TensorView::contiguous(plan.gathered_req.data(), DType::I32, {GP});
  a.positions = TensorView::contiguous(plan.gathered_positions.data(), DType::I64, {GP});
  a.block_table = TensorView::contiguous(bt.data(), DType::I32, {G, W});
  a.num_actual_tokens = GP;
  a.page = read_path::kSwaPageTokens;
  a.slots = v_i64(gathered_swa_slots, GP);
  a.num_pages = read->serving.swa.num_pages;
  build_token_slots(a);
  for (int64_t row = 0; row < GP; ++row)
    if (!plan.gathered_kv_write[static_cast<size_t>(row)]) gathered_swa_slots[static_cast<size_t>(row)] = -1;
}

// SPEC 7.6 steps 2-4 on rank k after its layer step: the step's kv rows gathered (every rank's
// tokens) into the SWA cache, the gathered latents into the index-K cache (the layer step
// inserted them into the compressed cache), then the attention of the rank's own query rows.
void Simulation::Impl::read_rank(Communicator& comm, RankState& rs, int k, std::vector<int64_t>& gpos) {
  const int64_t padded = plan.padded, GP = static_cast<int64_t>(P) * padded;
  read_path::Layer& L = *rs.read;
  rs.gathered_kv.resize(static_cast<size_t>(GP) * kLatentDim);
  comm.all_gather(L.inputs().kv.data, static_cast<size_t>(padded) * kLatentDim * sizeof(uint16_t),
                  rs.gathered_kv.data());
  std::vector<int64_t> swa_slots = gathered_swa_slots;
#if defined(DSV41KV_TEST_SEAMS)
  if (cfg.fault == seam::PcpFault::kLocalSwaInsert)  // the other ranks' rows are not inserted
    for (int64_t row = 0; row < GP; ++row)
      if (row / padded != k) swa_slots[static_cast<size_t>(row)] = -1;
#endif
  ExecContext ctx;
  ctx.num_threads = 1;
  L.write_gathered(TensorView::contiguous(rs.gathered_kv.data(), DType::BF16, {GP, kLatentDim}),
                   TensorView::contiguous(rs.gathered_latent.data(), DType::BF16, {GP, kLatentDim}), v_i64(gpos, GP),
                   v_i64(swa_slots, GP), v_i64(gathered_cslots, GP), ctx);
  L.layer().run_queries(L.meta(), L.inputs(), step_max_seq);
#if defined(DSV41KV_TEST_SEAMS)
  const int64_t n = plan.ranks[static_cast<size_t>(k)].num_tokens;
  if (cfg.fault == seam::PcpFault::kPerturbAttention && k == P - 1 && n > 0)  // one element off by one ulp
    L.layer().output().ptr<uint16_t>()[(n - 1) * cfg.num_heads * kLatentDim] ^= 1;
#endif
  rs.volume.swa_kv_sent = static_cast<uint64_t>(padded) * kLatentDim * sizeof(uint16_t);
  rs.volume.swa_kv_received = static_cast<uint64_t>(GP) * kLatentDim * sizeof(uint16_t);
}

void Simulation::Impl::run_rank(Communicator& comm) {
  const int k = comm.rank();
  RankState& rs = ranks[static_cast<size_t>(k)];
  const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
  const int64_t padded = plan.padded;
  const int64_t nreq = rb.num_reqs();
  const Communicator::Counters before = comm.counters();

  std::vector<int32_t> qsl = rb.qsl;
  std::vector<int64_t> positions = rb.positions;
  rs.token_to_req.assign(static_cast<size_t>(padded), 0);
  build_token_to_req({v_i32(qsl, nreq + 1), v_i32(rs.token_to_req, padded)});
  std::vector<int32_t> ring_bt(static_cast<size_t>(nreq), 0);
  std::vector<int32_t> ids(static_cast<size_t>(padded), -1);
  for (int64_t j = 0; j < nreq; ++j) {
    const int32_t g = rb.local_to_global_req[static_cast<size_t>(j)];
    if (g < 0) continue;
    const int32_t id = sreqs[static_cast<size_t>(g)].id;
    ring_bt[static_cast<size_t>(j)] = w.requests[static_cast<size_t>(id)].ring_block;
    for (int32_t t = qsl[static_cast<size_t>(j)]; t < qsl[static_cast<size_t>(j + 1)]; ++t) ids[static_cast<size_t>(t)] = id;
  }
  rs.ring_slots.assign(static_cast<size_t>(padded), -1);
  if (cfg.ratio == 2) {
    RingSlotArgs a;
    a.token_to_req = v_i32(rs.token_to_req, padded);
    a.positions = v_i64(positions, padded);
    a.ring_block_table = TensorView::contiguous(ring_bt.data(), DType::I32, {nreq, 1});
    a.num_actual_tokens = rb.num_tokens;
    a.cap = cap;
    a.ring_slots = v_i64(rs.ring_slots, padded);
    build_ring_slots(a);
  }
  std::vector<float> kv;
  kv_rows(kv, padded, ids, positions);

  // Positions are gathered once per step (SPEC 7.6).
  std::vector<int64_t> gpos(static_cast<size_t>(P * padded));
  if (rs.dev)
    rs.dev->all_gather_host(comm, positions.data(), positions.size() * sizeof(int64_t), gpos.data());
  else
    comm.all_gather(positions.data(), positions.size() * sizeof(int64_t), gpos.data());
  if (gpos != plan.gathered_positions)
    fail(ErrorCode::kComm, fmt::format("rank {}: gathered positions differ from the plan", k));

  rs.latent.assign(static_cast<size_t>(padded) * kLatentDim, kLatentCanary);
  rs.gathered_latent.assign(static_cast<size_t>(P * padded) * kLatentDim, kLatentCanary);
  if (rs.read) {  // the rank's local batch: its chunks as requests (local positions and lengths)
    std::vector<read_path::BatchRequest> batch;
    for (const LocalSegment& seg : rb.segments) {
      if (seg.global_req < 0) {
        batch.emplace_back();
        continue;
      }
      const ScheduledRequest& q = sreqs[static_cast<size_t>(seg.global_req)];
      batch.push_back({q.id, q.req.num_computed + seg.chunk_offset, seg.len});
    }
    rs.read->prepare(batch, padded - rb.num_tokens);
  }
  LayerStepArgs a;
  a.ratio = cfg.ratio;
  a.cap = cap;
  a.max_num_seqs = w.config.max_num_seqs;
  a.eps = cfg.eps;
  a.kv_score = TensorView::contiguous(kv.data(), DType::F32, {padded, cols()});
  a.positions = v_i64(positions, padded);
  a.qsl = v_i32(qsl, nreq + 1);
  a.token_to_req = v_i32(rs.token_to_req, padded);
  a.ring_slots = v_i64(rs.ring_slots, padded);
  if (cfg.ratio == 2) a.ring = ring_view(rs.ring);
  a.norm_weight = TensorView::contiguous(norm_w.data(), DType::BF16, {kLatentDim});
  a.gathered_positions = v_i64(gpos, P * padded);
  a.gathered_cslots = v_i64(gathered_cslots, P * padded);
  a.rope_table = TensorView::contiguous(rope.data(), DType::F32, {rope_rows, 64});
  a.caches = rs.caches.views;
  if (rs.read) a.caches.push_back(rs.read->layer().compressed_cache());  // the attention's, SPEC 7.6 step 2
  a.latent = TensorView::contiguous(rs.latent.data(), DType::BF16, {padded, kLatentDim});
  a.gathered_latent = TensorView::contiguous(rs.gathered_latent.data(), DType::BF16, {P * padded, kLatentDim});
#if defined(DSV41KV_TEST_SEAMS)
  a.fault = cfg.fault;
#endif
  a.exec.num_threads = 1;
  if (rs.dev) {
    rs.result = rs.dev->step(a, comm);
    rs.device_ms = rs.dev->last_step_ms();
  } else {
    rs.result = pcp_layer_step(a, comm);
  }
  rs.volume = rs.result.volume;
  rs.volume.positions_sent = static_cast<uint64_t>(padded) * 8;
  rs.volume.positions_received = static_cast<uint64_t>(P * padded) * 8;
  if (rs.read) read_rank(comm, rs, k, gpos);
  const Communicator::Counters after = comm.counters();
  rs.measured_sent = after.bytes_sent - before.bytes_sent;
  rs.measured_received = after.bytes_received - before.bytes_received;
}

StepReport Simulation::run_step(int64_t i) {
  Impl& m = *impl_;
  if (i != m.next_step || i < 0 || i >= num_steps())
    invalid_argument(fmt::format("run_step: step {} (expected the next step {} of {})", i,
                                 m.next_step, num_steps()));
  m.sreqs = m.w.steps[static_cast<size_t>(i)];
  std::vector<GlobalRequest> reqs;
  for (const auto& s : m.sreqs) reqs.push_back(s.req);
  PlanOptions opt;
  opt.P = m.P;
  opt.step = i;
  opt.placement = m.cfg.placement;
  opt.num_speculative_tokens = m.cfg.num_speculative_tokens;
  opt.graph_pad_multiple = m.w.config.graph_pad_multiple;
  m.plan = plan_pcp_step(reqs, opt);
  const int64_t G = static_cast<int64_t>(m.sreqs.size());
  const int64_t GP = static_cast<int64_t>(m.P) * m.plan.padded;

  // Gathered compressed slot mapping from the global batch, identical on every rank: PAD rows
  // and masked replicas carry token slot -1 (PAD rule, SPEC 6.5 / 7.3).
  {
    std::vector<int32_t> cbt = m.step_ctable();
    std::vector<int64_t> mask(static_cast<size_t>(GP));
    for (int64_t r = 0; r < GP; ++r) mask[static_cast<size_t>(r)] = m.plan.gathered_kv_write[static_cast<size_t>(r)] ? 0 : -1;
    m.gathered_cslots.assign(static_cast<size_t>(GP), -1);
    CompressedSlotArgs a;
    a.ratio = m.cfg.ratio;
    a.token_to_req = TensorView::contiguous(m.plan.gathered_req.data(), DType::I32, {GP});
    a.positions = TensorView::contiguous(m.plan.gathered_positions.data(), DType::I64, {GP});
    a.block_table = TensorView::contiguous(cbt.data(), DType::I32, {G, m.max_pages});
    a.token_slots = v_i64(mask, GP);
    a.num_actual_tokens = GP;
    a.states_per_page = m.S;
    a.slots = v_i64(m.gathered_cslots, GP);
    build_compressed_slots(a);
  }

  if (m.read) m.read_step_metadata();
  if (m.external)
    m.run_rank(*m.external);
  else
    m.group->run([&m](Communicator& comm) { m.run_rank(comm); });
  if (m.with_ref) m.run_reference();
  for (const auto& s : m.sreqs) m.computed[static_cast<size_t>(s.id)] = s.req.num_computed + s.req.query_len;
  m.next_step = i + 1;

  StepReport rep;
  rep.step = i;
  rep.num_reqs = G;
  rep.num_tokens = m.plan.num_global_tokens;
  for (const auto& s : m.sreqs) rep.num_decodes += s.req.is_prefilling ? 0 : 1;
  rep.padded = m.plan.padded;
  rep.num_rows = m.cfg.ratio == 2 ? m.ranks[static_cast<size_t>(std::max(m.only_rank, 0))].result.link.num_rows : 0;
  rep.tokens_per_rank = m.plan.tokens_per_rank();
  for (size_t k = 0; k < m.ranks.size(); ++k) {
    const RankState& rs = m.ranks[k];
    const RankBatch& rb = m.plan.ranks[k];
    if (m.cfg.ratio == 2) {
      const LinkResult& L = rs.result.link;
      for (int64_t j = 0; j < L.R; ++j) {
        const int32_t s0 = rb.qsl[static_cast<size_t>(j)];
        if (s0 == rb.qsl[static_cast<size_t>(j + 1)] || rs.ring_slots[static_cast<size_t>(s0)] < 0 ||
            !closes_group(rb.positions[static_cast<size_t>(s0)], 2))
          continue;
        if (L.prev_row_indices[static_cast<size_t>(j)] >= 0) ++rep.prev_from_gathered;
        else ++rep.prev_from_ring;
      }
      if (static_cast<int>(k) == std::max(m.only_rank, 0))
        for (int64_t ws : L.ring_write_slots) rep.ring_writes += ws >= 0 ? 1 : 0;
    }
    for (int64_t t = 0; t < rb.num_tokens; ++t) {
      const int64_t row = static_cast<int64_t>(k) * m.plan.padded + t;
      const int32_t g = m.plan.gathered_req[static_cast<size_t>(row)];
      if (m.w.requests[static_cast<size_t>(m.sreqs[static_cast<size_t>(g)].id)].null_block) ++rep.null_block_tokens;
      if (!m.plan.gathered_kv_write[static_cast<size_t>(row)]) ++rep.masked_replica_rows;
    }
    if (rs.read) {
      const pipeline::LayerStepStats& ls = rs.read->layer().last_stats();
      rep.read += {ls.decode_rows, ls.prefill_rows, ls.prefill_chunks, ls.swa_keys, ls.topk_entries, ls.topk_max, 0};
      rep.read.shortcut_steps = ls.shortcut ? 1 : 0;  // one step, whichever rank says it
    }
    rep.volume.push_back(rs.volume);
    rep.measured_sent.push_back(rs.measured_sent);
    rep.measured_received.push_back(rs.measured_received);
    rep.device_ms.push_back(rs.device_ms);
  }
  return rep;
}

namespace {

// "page P byte B" of byte i of a cache backing with pages of `page_bytes` bytes, or of a CacheView's.
std::function<std::string(int64_t)> page_byte(int64_t page_bytes) {
  return [page_bytes](int64_t i) { return fmt::format("page {} byte {}", i / page_bytes, i % page_bytes); };
}
std::function<std::string(int64_t)> page_byte(const CacheView& c) {
  return page_byte(c.page_stride * static_cast<int64_t>(dtype_size(record_info(c.format).element)));
}

struct Checker {
  int64_t step;
  CheckStats st;
  std::optional<Mismatch> first;
  void note(int rank, std::string tensor, int64_t index, std::string detail) {
    if (!first) first = Mismatch{step, rank, std::move(tensor), index, std::move(detail)};
  }
  // n elements against their expected values, bit for bit: counts them into `total` and those
  // that differ into `bad`; returns the first differing index, or -1 when identical.
  template <class T>
  static int64_t row(const T* got, const T* want, int64_t n, uint64_t& total, uint64_t& bad) {
    total += static_cast<uint64_t>(n);
    if (std::memcmp(got, want, static_cast<size_t>(n) * sizeof(T)) == 0) return -1;
    int64_t first_i = -1;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        ++bad;
        if (first_i < 0) first_i = i;
      }
    return first_i;
  }
  // One latent row (kLatentDim bf16): the first differing dim, or -1.
  int64_t latent_row(const uint16_t* got, const uint16_t* want) {
    return row(got, want, kLatentDim, st.latent_elements, st.latent_mismatched);
  }
  // Comparison of two whole buffers; counts and records the first difference.
  template <class T>
  void compare(std::span<const T> got, std::span<const T> want, int rank, const std::string& tensor, uint64_t& total,
               uint64_t& bad, const std::function<std::string(int64_t)>& describe = nullptr) {
    if (got.size() != want.size()) {
      total += got.size();
      bad += std::max(got.size(), want.size());
      note(rank, tensor, 0, fmt::format("size {} vs {}", got.size(), want.size()));
      return;
    }
    const uint64_t before = bad;
    const int64_t first_i = row(got.data(), want.data(), static_cast<int64_t>(got.size()), total, bad);
    if (first_i < 0) return;
    note(rank, tensor, first_i,
         fmt::format("{}{} of {} elements differ", describe ? describe(first_i) + "; " : "", bad - before, got.size()));
  }
  template <class T>
  void compare(const std::vector<T>& got, const std::vector<T>& want, int rank, const std::string& tensor,
               uint64_t& total, uint64_t& bad, const std::function<std::string(int64_t)>& describe = nullptr) {
    compare(std::span<const T>(got), std::span<const T>(want), rank, tensor, total, bad, describe);
  }

  // The read path of rank k (`got`, its last step) against `want`: the SWA, compressed and
  // index-K caches byte for byte, then every real local row i < n (decode copies included)
  // against row want_row(i) of `want`: its top-k row, its attention output (bf16, after the
  // inverse RoPE) and its lse, bit for bit. `versus` names `want` in the details.
  void read_layer(int k, const read_path::Layer& got, const read_path::Layer& want, int64_t n,
                 const std::function<int64_t(int64_t)>& want_row, const char* versus) {
    const pipeline::AttentionLayer& g = got.layer();
    const pipeline::AttentionLayer& e = want.layer();
    compare(got.swa_bytes(), want.swa_bytes(), k, "read.swa_cache", st.read_cache_bytes, st.read_cache_mismatched,
            page_byte(g.swa_cache()));
    compare(got.compressed_bytes(), want.compressed_bytes(), k,
            fmt::format("read.cache[{}]", record_info(g.compressed_cache().format).name), st.read_cache_bytes,
            st.read_cache_mismatched, page_byte(g.compressed_cache()));
    compare(got.index_k_bytes(), want.index_k_bytes(), k, "read.index_k_cache", st.read_cache_bytes,
            st.read_cache_mismatched, page_byte(g.index_k_cache().page_stride));
    const int64_t H = g.output().shape[1], Hp = g.lse().shape[1], O = H * kLatentDim;
    const auto* go = g.output().ptr<const uint16_t>();
    const auto* eo = e.output().ptr<const uint16_t>();
    const auto* gl = g.lse().ptr<const float>();
    const auto* el = e.lse().ptr<const float>();
    const auto* gt = got.shared().topk().ptr<const int32_t>();
    const auto* et = want.shared().topk().ptr<const int32_t>();
    const std::span<const pipeline::TokenId> tokens = got.tokens();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = want_row(i);
      const pipeline::TokenId& id = tokens[static_cast<size_t>(i)];
      auto where = [&](const char* what) {
        return fmt::format("local token {} (request {}, position {}) {}", i, id.request, id.position, what);
      };
      ++st.attention_rows;
      const int64_t t0 = row(gt + i * kIndexTopk, et + j * kIndexTopk, kIndexTopk, st.topk_entries, st.topk_mismatched);
      if (t0 >= 0)
        note(k, "attention.topk", i * kIndexTopk + t0,
             fmt::format("{}: {} vs {} {}", where(fmt::format("entry {}", t0).c_str()), gt[i * kIndexTopk + t0], versus,
                         et[j * kIndexTopk + t0]));
      const int64_t o0 = row(go + i * O, eo + j * O, O, st.output_elements, st.output_mismatched);
      if (o0 >= 0)
        note(k, "attention.out", i * O + o0,
             fmt::format("{}: 0x{:04x} vs {} 0x{:04x}",
                         where(fmt::format("head {} dim {}", o0 / kLatentDim, o0 % kLatentDim).c_str()), go[i * O + o0],
                         versus, eo[j * O + o0]));
      const int64_t l0 = row(gl + i * Hp, el + j * Hp, Hp, st.lse_elements, st.lse_mismatched);
      if (l0 >= 0)
        note(k, "attention.lse", i * Hp + l0,
             fmt::format("{}: {} vs {} {}", where(fmt::format("head {}", l0).c_str()), gl[i * Hp + l0], versus,
                         el[j * Hp + l0]));
    }
  }
};

}  // namespace

std::optional<Mismatch> Simulation::check_step(CheckStats* stats) const {
  const Impl& m = *impl_;
  if (!m.with_ref) invalid_argument("check_step: the simulation was built without references");
  if (m.next_step == 0) invalid_argument("check_step: no step has run");
  Checker ck{m.next_step - 1, {}, {}};
  const StepPlan& plan = m.plan;
  const int P = m.P;
  const int64_t padded = plan.padded;
  const int r = m.cfg.ratio;

  // 1. The link against an oracle derived from the plan alone (ratio 2).
  if (r == 2) {
    const int64_t rows = m.ranks[0].result.link.num_rows;
    const int64_t GR = static_cast<int64_t>(P) * rows;
    auto block_of = [&](int32_t g) { return g < 0 ? 0 : m.w.requests[static_cast<size_t>(m.sreqs[static_cast<size_t>(g)].id)].ring_block; };
    std::vector<int64_t> want_w(static_cast<size_t>(GR), -1);
    // newest position of each global request and the copy (largest gathered index) that holds it
    for (size_t g = 0; g < m.sreqs.size(); ++g) {
      const auto& q = m.sreqs[g].req;
      const int32_t b = block_of(static_cast<int32_t>(g));
      if (q.query_len == 0 || b <= 0) continue;
      const int64_t newest = q.num_computed + q.query_len - 1;
      if (newest % 2 != 0) continue;
      int64_t best = -1;
      for (int k = 0; k < P; ++k) {
        const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
        for (int64_t j = 0; j < std::min(rb.num_reqs(), rows); ++j) {
          const LocalSegment& s = rb.segments[static_cast<size_t>(j)];
          if (s.global_req == static_cast<int32_t>(g) && s.len > 0 &&
              q.num_computed + s.chunk_offset + s.len - 1 == newest)
            best = std::max(best, k * rows + j);
        }
      }
      if (best < 0) {
        ck.note(-1, "link.oracle", static_cast<int64_t>(g), "newest row of a request is on no rank");
        continue;
      }
      want_w[static_cast<size_t>(best)] = b * m.cap + newest % m.cap;
    }
    for (int k = 0; k < P; ++k) {
      const LinkResult& L = m.ranks[static_cast<size_t>(k)].result.link;
      ck.st.link_entries += want_w.size();
      for (size_t e = 0; e < want_w.size(); ++e)
        if (e >= L.ring_write_slots.size() || L.ring_write_slots[e] != want_w[e]) {
          ++ck.st.link_mismatched;
          ck.note(k, "link.ring_write_slots", static_cast<int64_t>(e),
                  fmt::format("got {} expected {}", e < L.ring_write_slots.size() ? L.ring_write_slots[e] : -2, want_w[e]));
        }
      const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
      for (int64_t j = 0; j < L.R; ++j) {
        const LocalSegment& s = rb.segments[static_cast<size_t>(j)];
        int64_t want = -1;
        if (s.global_req >= 0 && s.len > 0 && block_of(s.global_req) > 0) {
          const int64_t fp = m.sreqs[static_cast<size_t>(s.global_req)].req.num_computed + s.chunk_offset;
          if (closes_group(fp, 2)) {
            for (int k2 = P - 1; k2 >= 0; --k2) {
              const RankBatch& rb2 = plan.ranks[static_cast<size_t>(k2)];
              for (int64_t j2 = std::min(rb2.num_reqs(), rows) - 1; j2 >= 0; --j2) {
                const LocalSegment& s2 = rb2.segments[static_cast<size_t>(j2)];
                if (s2.global_req == s.global_req && s2.len > 0 &&
                    m.sreqs[static_cast<size_t>(s2.global_req)].req.num_computed + s2.chunk_offset + s2.len - 1 == fp - 1)
                  want = k2 * rows + j2;  // ends at the smallest gathered index
              }
            }
          }
        }
        ++ck.st.link_entries;
        const int64_t got = L.prev_row_indices[static_cast<size_t>(j)];
        if (got != want) {
          ++ck.st.link_mismatched;
          ck.note(k, "link.prev_row_indices", j, fmt::format("got {} expected {}", got, want));
        }
      }
    }
  }

  // 2. Latents of closing tokens vs the single-rank run.
  for (int k = 0; k < P; ++k) {
    const RankState& rs = m.ranks[static_cast<size_t>(k)];
    const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    for (int64_t i = 0; i < rb.num_tokens; ++i) {
      const int64_t row = k * padded + i;
      const int64_t p = rb.positions[static_cast<size_t>(i)];
      if (!closes_group(p, r)) continue;
      const bool valid = r == 2 ? rs.ring_slots[static_cast<size_t>(i)] >= 0 : m.gathered_cslots[static_cast<size_t>(row)] >= 0;
      if (!valid) continue;
      const int64_t src = plan.gathered_source[static_cast<size_t>(row)];
      const uint16_t* got = rs.latent.data() + i * kLatentDim;
      const uint16_t* want = m.ref.latent_tail.data() + src * kLatentDim;
      const int64_t d0 = ck.latent_row(got, want);
      if (d0 < 0) continue;
      ck.note(k, "latent", i * kLatentDim + d0,
              fmt::format("local token {} (request {}, position {}) dim {}: 0x{:04x} vs single-rank 0x{:04x}",
                          i, m.sreqs[static_cast<size_t>(plan.gathered_req[static_cast<size_t>(row)])].id, p, d0,
                          got[d0], want[d0]));
    }
  }
  if (r == 2) {
    const int64_t N = static_cast<int64_t>(m.ref.positions.size());
    for (int64_t t = 0; t < N; ++t) {
      if ((m.ref.positions[static_cast<size_t>(t)] + 1) % 2 != 0 || m.ref.ring_slots[static_cast<size_t>(t)] < 0) continue;
      ck.st.latent_elements += kLatentDim;
      if (std::memcmp(m.ref.latent_open.data() + t * kLatentDim, m.ref.latent_tail.data() + t * kLatentDim, kLatentDim * 2) != 0) {
        ck.st.latent_mismatched += kLatentDim;
        ck.note(-1, "open_row_ref.latent", t * kLatentDim, "open-row reference differs from the tail reference");
      }
    }
  }

  // 3. Every byte of every compressed-cache backing, every format, every rank.
  for (int k = 0; k < P; ++k)
    for (size_t f = 0; f < m.cfg.formats.size(); ++f) {
      ck.compare(m.ranks[static_cast<size_t>(k)].caches.backing[f], m.ref.caches.backing[f], k,
                 fmt::format("cache[{}]", record_info(m.cfg.formats[f]).name), ck.st.cache_bytes,
                 ck.st.cache_mismatched, page_byte(m.ref.caches.views[f]));
    }

  // 4. Rings: equal across ranks, equal to the open-row reference, newest open rows equal to
  //    the tail-policy ring (and to the request's kv_score row).
  if (r == 2) {
    const int64_t cap = m.cap;
    auto where = [cap](int64_t i) {
      const int64_t row = i / kRingRowFloats;
      return fmt::format("ring block {} row {} float {}", row / cap, row % cap, i % kRingRowFloats);
    };
    for (int k = 1; k < P; ++k)
      ck.compare(m.ranks[static_cast<size_t>(k)].ring, m.ranks[0].ring, k, "ring(vs rank 0)",
                 ck.st.ring_floats, ck.st.ring_mismatched, where);
    ck.compare(m.ranks[0].ring, m.ref.ring_open, 0, "ring(vs open-row reference)", ck.st.ring_floats,
               ck.st.ring_mismatched, where);
    std::vector<float> row(kRingRowFloats);
    for (size_t id = 0; id < m.w.requests.size(); ++id) {
      const auto& rq = m.w.requests[id];
      const int64_t c = m.computed[id];
      if (rq.ring_block <= 0 || c == 0 || (c - 1) % 2 != 0) continue;
      const int64_t p = c - 1;
      const size_t off = static_cast<size_t>((rq.ring_block * m.cap + p % m.cap) * kRingRowFloats);
      fill_kv_row(row.data(), m.w.config.seed, static_cast<int64_t>(id), p, kRingRowFloats);
      ck.st.ring_floats += 2 * kRingRowFloats;
      const bool vs_tail = std::memcmp(m.ranks[0].ring.data() + off, m.ref.ring_tail.data() + off, sizeof(float) * kRingRowFloats) == 0;
      const bool vs_row = std::memcmp(m.ranks[0].ring.data() + off, row.data(), sizeof(float) * kRingRowFloats) == 0;
      if (!vs_tail || !vs_row) {
        ck.st.ring_mismatched += kRingRowFloats;
        ck.note(0, "ring(newest open row)", static_cast<int64_t>(off),
                fmt::format("request {} position {} (ring block {} row {}): {}", id, p, rq.ring_block,
                            p % m.cap, !vs_tail ? "differs from the tail-policy ring" : "differs from its kv_score row"));
      }
    }
  }
  // 5. The read path: every rank's caches and token rows against the single-rank run's rows of
  //    the same tokens (a rank's local row i is the global token gathered_source[k * padded + i]).
  if (m.ref.read)
    for (int k = 0; k < P; ++k)
      ck.read_layer(k, *m.ranks[static_cast<size_t>(k)].read, *m.ref.read, plan.ranks[static_cast<size_t>(k)].num_tokens,
                    [&](int64_t i) { return plan.gathered_source[static_cast<size_t>(k * padded + i)]; }, "single-rank");
  if (stats) *stats += ck.st;
  return ck.first;
}

int Simulation::local_rank() const { return impl_->only_rank; }

std::optional<Mismatch> Simulation::compare_rank(const Simulation& other, CheckStats* stats) const {
  const Impl& m = *impl_;
  const Impl& o = *other.impl_;
  if (m.P != o.P || m.cfg.ratio != o.cfg.ratio || m.cfg.formats.size() != o.cfg.formats.size() ||
      m.w.steps.size() != o.w.steps.size() || m.cfg.read_path != o.cfg.read_path ||
      (m.cfg.read_path && m.cfg.num_heads != o.cfg.num_heads))
    invalid_argument(fmt::format("compare_rank: simulations differ in P ({} vs {}), ratio, formats, workload or read "
                                 "path (expected the same run)", m.P, o.P));
  if (m.next_step == 0 || m.next_step != o.next_step)
    invalid_argument(fmt::format("compare_rank: at steps {} and {} (expected the same step, after one ran)",
                                 m.next_step, o.next_step));
  Checker ck{m.next_step - 1, {}, {}};
  const StepPlan& plan = m.plan;
  for (int k = 0; k < m.P; ++k) {
    if (!m.local(k)) continue;
    if (!o.local(k))
      invalid_argument(fmt::format("compare_rank: rank {} does not run in the other simulation", k));
    const RankState& rs = m.ranks[static_cast<size_t>(k)];
    const RankState& os = o.ranks[static_cast<size_t>(k)];
    if (m.cfg.ratio == 2) {
      ck.compare(rs.result.link.ring_write_slots, os.result.link.ring_write_slots, k, "link.ring_write_slots",
                 ck.st.link_entries, ck.st.link_mismatched);
      ck.compare(rs.result.link.prev_row_indices, os.result.link.prev_row_indices, k, "link.prev_row_indices",
                 ck.st.link_entries, ck.st.link_mismatched);
    }
    // Latents of closing tokens with a valid slot (the rows compress writes).
    const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    for (int64_t i = 0; i < rb.num_tokens; ++i) {
      const int64_t p = rb.positions[static_cast<size_t>(i)];
      if (!closes_group(p, m.cfg.ratio)) continue;
      const bool valid = m.cfg.ratio == 2
                             ? rs.ring_slots[static_cast<size_t>(i)] >= 0
                             : m.gathered_cslots[static_cast<size_t>(k * plan.padded + i)] >= 0;
      if (!valid) continue;
      const uint16_t* got = rs.latent.data() + i * kLatentDim;
      const uint16_t* want = os.latent.data() + i * kLatentDim;
      const int64_t d0 = ck.latent_row(got, want);
      if (d0 < 0) continue;
      ck.note(k, "latent", i * kLatentDim + d0,
              fmt::format("local token {} (position {}) dim {}: 0x{:04x} vs 0x{:04x}", i, p, d0, got[d0], want[d0]));
    }
    for (size_t f = 0; f < m.cfg.formats.size(); ++f)
      ck.compare(rs.caches.backing[f], os.caches.backing[f], k,
                 fmt::format("cache[{}]", record_info(m.cfg.formats[f]).name), ck.st.cache_bytes,
                 ck.st.cache_mismatched);
    if (m.cfg.ratio == 2) ck.compare(rs.ring, os.ring, k, "ring", ck.st.ring_floats, ck.st.ring_mismatched);
    if (rs.read && os.read)
      ck.read_layer(k, *rs.read, *os.read, rb.num_tokens, [](int64_t i) { return i; }, "the other run's");
  }
  if (stats) *stats += ck.st;
  return ck.first;
}

RunResult run_simulation(const SimConfig& cfg, const Workload& w, int P, bool verify, bool keep_going) {
  RunResult res;
  res.P = P;
  Simulation sim(cfg, w, P, verify);
  for (int64_t i = 0; i < sim.num_steps(); ++i) {
    res.steps.push_back(sim.run_step(i));
    if (!verify) continue;
    auto mm = sim.check_step(&res.stats);
    if (mm && !res.first_mismatch) res.first_mismatch = mm;
    if (res.first_mismatch && !keep_going) break;
  }
  return res;
}

}  // namespace dsv41kv::pcp

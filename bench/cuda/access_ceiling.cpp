// The memory-traffic ceiling of the 256K ratio-1 fused launch (access_ceiling.hpp): buffers and
// inputs, then every measurement with dsv41kv bench's own timer and copy (timing.hpp).
#include "access_ceiling.hpp"

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/cuda/timing.hpp"
#include "dsv41kv/records.hpp"
#include "traffic_kernels.hpp"

namespace dsv41kv::bench {

const char* mechanism_name(RowMechanism m) {
  switch (m) {
    case RowMechanism::kRegisters: return "registers";
    case RowMechanism::kCpAsync: return "cp.async";
    case RowMechanism::kBulkCopy: return "bulk copy";
  }
  return "?";
}

CeilingReport run_access_ceiling(int iters, bool all_inputs) {
  if (iters < 1) throw std::invalid_argument("iters must be >= 1, got " + std::to_string(iters));
  int dev = 0, major = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "attribute");
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  CeilingReport rep;
  rep.device = prop.name;
  rep.all_inputs = all_inputs;
  const bool sm90 = major >= 9;

  constexpr int64_t T = 16 * 16384;  // the prefill256k workload
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  Timer timer(st, iters, Timing::kDoBench);
  rep.copy_GBps = copy_bandwidth(st, timer);

  Dev<float> kv(static_cast<size_t>(T) * kRowFloats);
  kv.fill(0x3F);
  std::vector<int64_t> consecutive(static_cast<size_t>(T));  // slots and insert slots, as the bench's
  for (int64_t t = 0; t < T; ++t) consecutive[static_cast<size_t>(t)] = t;
  Dev<int64_t> slots(static_cast<size_t>(T));
  slots.upload(consecutive);
  // all_inputs: the bench's positions (16 requests of 16384 tokens, each from a random start below
  // 4096), insert slots and a RoPE table with a row per position
  constexpr int64_t kRequests = 16, kRequestTokens = T / kRequests, kTableRows = 4096 + kRequestTokens;
  Dev<int64_t> pos, ins;
  Dev<float> table;
  if (all_inputs) {
    std::mt19937_64 rng(20261130);
    std::uniform_int_distribution<int64_t> start(0, 4095);
    std::vector<int64_t> hp(static_cast<size_t>(T));
    for (int64_t r = 0; r < kRequests; ++r) {
      const int64_t s0 = start(rng);
      for (int64_t k = 0; k < kRequestTokens; ++k) hp[static_cast<size_t>(r * kRequestTokens + k)] = s0 + k;
    }
    pos = Dev<int64_t>(static_cast<size_t>(T));
    pos.upload(hp);
    ins = Dev<int64_t>(static_cast<size_t>(T));
    ins.upload(consecutive);
    table = Dev<float>(static_cast<size_t>(kTableRows * kRopeFloats));
    table.fill(0x3E);
  }
  Dev<uint8_t> cache(static_cast<size_t>(T / kPageStates * V4Layout::default_page_stride(kPageStates)));
  cache.fill(0);
  // the copy of the same bytes: up to half of the largest record's traffic each way
  const size_t max_half = static_cast<size_t>(T) * (kRowBytes + V4Layout::kRecordBytes) / 2;
  Dev<uint8_t> src(max_half), dst(max_half);
  src.fill(1);

  struct Fmt {
    const char* name;
    int vb, sb;
    int64_t ps;
  };
  const Fmt fmts[] = {{"v4_584", V4Layout::kValueBytes, V4Layout::kScaleBytes, V4Layout::default_page_stride(kPageStates)},
                      {"mxfp8_528", Mxfp8Layout::kValueBytes, Mxfp8Layout::kScaleBytes,
                       Mxfp8Layout::default_page_stride(kPageStates)},
                      {"nvfp4_288", Nvfp4Layout::kValueBytes, Nvfp4Layout::kScaleBytes,
                       Nvfp4Layout::default_page_stride(kPageStates)}};
  for (const Fmt& f : fmts) {
    CeilingRow row;
    row.record = f.name;
    row.bytes = static_cast<double>(T) * (kRowBytes + f.vb + f.sb);
    const size_t half = static_cast<size_t>(row.bytes / 2);
    row.copy_same_bytes_us = 1e3 * timer.eager([&] {
      ck(cudaMemcpyAsync(dst.p, src.p, half, cudaMemcpyDeviceToDevice, st), "memcpy");
    }, true);
    const TrafficParams p{kv.p, slots.p, pos.p, ins.p, table.p, cache.p, T, f.vb, f.sb, f.ps};
    for (RowMechanism m : {RowMechanism::kRegisters, RowMechanism::kCpAsync, RowMechanism::kBulkCopy}) {
      if (m != RowMechanism::kRegisters && !sm90) {
        row.us.push_back(-1.0);  // needs sm_90 (cp.async.bulk, and the same build's other form)
        continue;
      }
      row.us.push_back(1e3 * timer.eager([&] { ck(launch_traffic(m, all_inputs, p, st), "launch"); }, true));
    }
    rep.rows.push_back(row);
  }
  ck(cudaStreamSynchronize(st), "synchronize");
  cudaStreamDestroy(st);
  return rep;
}

}  // namespace dsv41kv::bench

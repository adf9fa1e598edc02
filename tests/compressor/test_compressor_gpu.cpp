// CUDA compressor backend vs the CPU reference (SPEC 0.4 item 2): fresh random inputs each run
// (seed printed), canary/NaN-filled whole backings compared byte for byte after both backends
// ran the same op. Covers compress (ratio 1, ratio 2 tail policy, ratio 2 PCP open-row),
// insert for the 5 record formats, the fused compress_insert (with and without latent_out,
// one-warp and four-warp program paths, aligned and unaligned rings/pages), gather,
// save_ring_rows, CUDA-graph capture + replay, and rejection of bad inputs before any launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/compressor.hpp"
#include "dsv41kv/tuning.hpp"
#include "support/gpu_batch.hpp"

namespace dsv41kv::test {
namespace {

// The streaming kernel's row mechanisms: chunk 8 (ratio 1: TMA rows, swizzled), chunk 16 with
// TMA where allowed (ratio-1 NVFP4: rows and RoPE entries, rotated reads; the library picks it
// for large grids only), chunk 16 with cp.async rows.
struct StreamMech {
  int chunk;
  int rows;
  std::string name() const {
    return "chunk " + std::to_string(chunk) + (rows == 1 ? " cp.async rows" : rows == 2 ? " TMA rows" : "");
  }
  void set(CompressTuning& t) const {
    t.stream_chunk = chunk;
    t.stream_rows = rows;
  }
};
const StreamMech kStreamMechs[] = {{kStreamChunkLarge, 0}, {kStreamChunkSmall, 2}, {kStreamChunkSmall, 1}};

class CompressorGpu : public GpuTest {
 protected:
  // The launch choices of the test's GPU calls (tuning.hpp): the library's own unless a test
  // sets one; ctx_ carries them.
  CompressTuning tuning_;
  ExecContext ctx_ = [this] {
    ExecContext c;
    c.compress_tuning = &tuning_;
    return c;
  }();
  // One fused launch (compress + insert, with the latent output unless told otherwise only for
  // records other than NVFP4) on a fresh batch of shape `s` on the CPU and on the GPU under the
  // test's tuning: outputs byte for byte equal.
  testing::AssertionResult fused_matches_cpu(const GpuBatchSpec& s, const std::string& what) {
    return fused_matches_cpu(s, what, s.format != RecordFormat::NVFP4_288);
  }
  testing::AssertionResult fused_matches_cpu(const GpuBatchSpec& s, const std::string& what, bool with_latent) {
    GpuBatch b = GpuBatch::make(s, rng());
    GpuBatchDev d(b);
    compress_insert(compress_insert_args(b, nullptr, with_latent));
    compress_insert(compress_insert_args(b, &d, with_latent), ctx_);
    return outputs_equal(b, d, what + " " + gpu_batch_name(s));
  }
};

TEST_F(CompressorGpu, CompressMatchesCpu) {
  for (int ratio : {1, 2})
    for (bool pcp : {false, true}) {
      if (pcp && ratio == 1) continue;
      for (GpuBatchSpec s : gpu_batch_shapes(ratio)) {
        s.pcp = pcp;
        GpuBatch b = GpuBatch::make(s, rng());
        GpuBatchDev d(b);
        compress(compress_args(b, nullptr));
        compress(compress_args(b, &d));
        EXPECT_TRUE(outputs_equal(b, d, "compress " + gpu_batch_name(s)));
      }
    }
}

// Both launch modes (ExecContext::programmatic_launch: the default PDL launch and the plain one).
TEST_F(CompressorGpu, FusedCompressInsertMatchesCpu) {
  for (int ratio : {1, 2})
    for (RecordFormat f : kAllRecordFormats)
      for (bool with_latent : {true, false})
        for (bool pdl : {true, false})
          for (GpuBatchSpec s : gpu_batch_shapes(ratio)) {
            s.format = f;
            s.pcp = ratio == 2 && with_latent && f == RecordFormat::V4_584;
            s.nonfinite_fraction = f == RecordFormat::MXFP8_528 ? 0.001 : 0.0;
            GpuBatch b = GpuBatch::make(s, rng());
            GpuBatchDev d(b);
            ExecContext ctx;
            ctx.programmatic_launch = pdl;
            compress_insert(compress_insert_args(b, nullptr, with_latent));
            compress_insert(compress_insert_args(b, &d, with_latent), ctx);
            EXPECT_TRUE(outputs_equal(b, d,
                                      "compress_insert " + gpu_batch_name(s) +
                                          (with_latent ? " +latent" : " no latent") +
                                          (pdl ? " pdl" : " plain launch")));
          }
}

// Both chunk sizes of the streaming kernel (the host picks 8 programs only for grids of many
// waves, which the test shapes are not; 8 reads the ratio-1 rows with TMA into a swizzled ring,
// 16 with cp.async and the evict-first policy, kRowsEvictFirst, and ratio-1 NVFP4 at 16 also with
// rows and RoPE entries by TMA, forced by the rows override) on the same inputs,
// for both ratios and every record, ratio 2 with the tail policy and PCP, with and without the
// latent output, and compress alone: each equal to the CPU byte for byte.
TEST_F(CompressorGpu, StreamChunkSizesMatchCpu) {
  for (const StreamMech& m : kStreamMechs)
    for (int ratio : {1, 2})
      for (RecordFormat f : kAllRecordFormats)
        for (bool pcp : {false, true}) {
          if (pcp && ratio == 1) continue;
          m.set(tuning_);
          GpuBatchSpec s = gpu_batch_shapes(ratio)[2];  // the streaming-kernel shape
          s.format = f;
          s.pcp = pcp;
          EXPECT_TRUE(fused_matches_cpu(s, m.name()));
          // ratio-1 NVFP4 with the latent output too (left out by default for NVFP4): the
          // rotated reads store the latent chunk by chunk
          if (ratio == 1 && f == RecordFormat::NVFP4_288) {
            EXPECT_TRUE(fused_matches_cpu(s, m.name() + " +latent", true));
          }
        }
  // compress alone (no record: its own kernel instantiation, the one the separate path and
  // every compress call of a large batch launch)
  for (int chunk : {kStreamChunkLarge, kStreamChunkSmall})
    for (int ratio : {1, 2}) {
      tuning_.stream_chunk = chunk;
      GpuBatch b = GpuBatch::make(gpu_batch_shapes(ratio)[2], rng());
      GpuBatchDev d(b);
      compress(compress_args(b, nullptr));
      compress(compress_args(b, &d), ctx_);
      EXPECT_TRUE(outputs_equal(b, d, "compress chunk " + std::to_string(chunk) + " " + gpu_batch_name(b.s)));
    }
}

// kv_score rows further apart than their width (a view into a wider projection output; the
// extra floats hold NaN, so a record or latent built from them would differ): the decode kernel
// and both chunk sizes of the streaming kernel (the chunk-8 ratio-1 kernel copies its rows with
// TMA through a tensor map that carries this stride), for both ratios and every record, equal to
// the CPU byte for byte.
TEST_F(CompressorGpu, StridedKvRowsMatchCpu) {
  for (int ratio : {1, 2})
    for (RecordFormat f : kAllRecordFormats) {
      GpuBatchSpec dec = gpu_batch_shapes(ratio)[0];
      dec.format = f;
      dec.kv_row_extra = 48;
      EXPECT_TRUE(fused_matches_cpu(dec, "kv row stride +48"));
      for (const StreamMech& m : kStreamMechs) {
        m.set(tuning_);
        GpuBatchSpec s = gpu_batch_shapes(ratio)[2];  // the streaming-kernel shape
        s.format = f;
        s.kv_row_extra = 16;
        EXPECT_TRUE(fused_matches_cpu(s, "kv row stride +16, " + m.name()));
      }
    }
}

// The ratio-1 streaming grid with head and tail parts (stream_split_r1: here parts of 0.05 and
// 0.02 waves, i.e. 184 and 73 warps on an H200, so the grid has every kind of segment; the
// test's batches are too small for the library's own shape, so the tuning sets one) writes
// what the CPU writes, for every record and part chunk.
TEST_F(CompressorGpu, StreamShapedGridMatchesCpu) {
  tuning_.stream_chunk = kStreamChunkLarge;
  for (int chunk : {1, 3, kStreamChunkLarge - 1})
    for (RecordFormat f : kAllRecordFormats) {
      StreamTaper& tp = tuning_.taper;  // head: 0.02 waves of 2; tail: 0.05 waves of `chunk`, 0.02 of 1
      tp.set = true;
      tp.nhead = 1;
      tp.head_waves[0] = 0.02;
      tp.head_chunk[0] = 2;
      tp.ntail = 2;
      tp.tail_waves[0] = 0.05;
      tp.tail_chunk[0] = chunk;
      tp.tail_waves[1] = 0.02;
      tp.tail_chunk[1] = 1;
      GpuBatchSpec s = gpu_batch_shapes(1)[2];
      s.format = f;
      EXPECT_TRUE(fused_matches_cpu(s, "part chunk " + std::to_string(chunk)));
    }
}

// The fused launch equals the two separate CUDA kernels (compress, then insert) on the same
// inputs, and those equal the CPU's compress + insert. Every ring and cache slot is valid here,
// so every closing token with a cache slot emits a latent and both sequences write the same
// records.
TEST_F(CompressorGpu, FusedEqualsSeparateKernels) {
  for (int ratio : {1, 2})
    for (RecordFormat f : kAllRecordFormats) {
      GpuBatchSpec s = gpu_batch_shapes(ratio)[2];
      s.format = f;
      s.invalid_slot_fraction = 0.0;
      s.null_request = false;
      GpuBatch b = GpuBatch::make(s, rng());
      GpuBatch b2 = b;
      GpuBatchDev d(b), d2(b);
      compress_insert(compress_insert_args(b, &d, true));
      compress(compress_args(b2, &d2));
      insert(insert_args(b2, &d2));
      compress(compress_args(b2, nullptr));
      insert(insert_args(b2, nullptr));
      const std::string w = std::string(" r") + std::to_string(ratio) + " " + record_info(f).name;
      EXPECT_TRUE(bits_equal(d2.latent.download(), d.latent.download(), "latent fused vs separate" + w));
      EXPECT_TRUE(bits_equal(d2.ring.download(), d.ring.download(), "ring fused vs separate" + w));
      if (b.bf16_cache())
        EXPECT_TRUE(bits_equal(d2.cache16.download(), d.cache16.download(), "cache fused vs separate" + w));
      else
        EXPECT_TRUE(bits_equal(d2.cache8.download(), d.cache8.download(), "cache fused vs separate" + w));
      EXPECT_TRUE(outputs_equal(b2, d2, "separate kernels vs cpu" + w));
    }
}

// Capture compress_insert + gather on a stream into a CUDA graph; replaying it over new
// inputs (copied into the same buffers) must give exactly the eager results. Decode (the
// graph-replayed case) for both ratios, and the ratio-1 streaming kernels whose launches carry
// TMA tensor maps (chunk 8: kv rows; NVFP4 chunk 16: kv rows and RoPE table), which the graph
// records by value.
TEST_F(CompressorGpu, GraphCaptureReplayEqualsEager) {
  struct Case {
    int ratio, shape;
    RecordFormat f;
    StreamMech mech;
  };
  const Case cases[] = {{1, 0, RecordFormat::V4_584, {0, 0}},
                        {2, 0, RecordFormat::V4_584, {0, 0}},
                        {1, 2, RecordFormat::V4_584, {kStreamChunkLarge, 0}},
                        {1, 2, RecordFormat::NVFP4_288, {kStreamChunkSmall, 2}}};
  for (const Case& cs : cases) {
    const int ratio = cs.ratio;
    cs.mech.set(tuning_);
    GpuBatchSpec s = gpu_batch_shapes(ratio)[cs.shape];
    s.format = cs.f;
    GpuBatch b1 = GpuBatch::make(s, rng());
    GpuBatch b2 = b1;  // same batch layout, new row and ring contents
    for (auto& v : b2.kv) v = static_cast<float>(rng().normal());
    for (auto& v : b2.ring) v = static_cast<float>(rng().normal());

    cudaStream_t st;
    GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ExecContext ctx = ctx_;
    ctx.stream = st;
    GpuBatchDev d(b1);
    const int64_t M = b1.num_pages * s.S;
    std::vector<int64_t> all(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) all[static_cast<size_t>(i)] = i;
    DeviceBuffer<int64_t> gslots(all);
    DeviceBuffer<uint16_t> gout(std::vector<uint16_t>(static_cast<size_t>(M * 512), kBf16Sentinel));
    auto gather_args = [&] {
      GatherArgs g;
      g.cache = cache_view(b1, &d);
      g.slots = gslots.view1();
      g.out = gout.view({M, 512});
      return g;
    };

    // eager reference for both input sets
    std::vector<std::vector<uint8_t>> eager_cache;
    std::vector<std::vector<uint16_t>> eager_lat, eager_gather;
    std::vector<std::vector<float>> eager_ring;
    for (GpuBatch* b : {&b1, &b2}) {
      GpuBatchDev e(*b);
      DeviceBuffer<uint16_t> eo(std::vector<uint16_t>(static_cast<size_t>(M * 512), kBf16Sentinel));
      compress_insert(compress_insert_args(*b, &e, true), ctx);
      GatherArgs g;
      g.cache = cache_view(*b, &e);
      g.slots = gslots.view1();
      g.out = eo.view({M, 512});
      gather(g, ctx);
      GPU_CHECK(cudaStreamSynchronize(st));
      eager_cache.push_back(e.cache8.download());
      eager_lat.push_back(e.latent.download());
      eager_ring.push_back(e.ring.download());
      eager_gather.push_back(eo.download());
    }

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    compress_insert(compress_insert_args(b1, &d, true), ctx);
    gather(gather_args(), ctx);
    GPU_CHECK(cudaStreamEndCapture(st, &graph));
    GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) {
      for (int which = 0; which < 2; ++which) {
        GpuBatch& b = which == 0 ? b1 : b2;
        d.kv.upload(b.kv);
        d.ring.upload(b.ring);
        d.latent.upload(b.latent);
        d.cache8.upload(b.cache8);
        gout.upload(std::vector<uint16_t>(static_cast<size_t>(M * 512), kBf16Sentinel));
        GPU_CHECK(cudaGraphLaunch(exec, st));
        GPU_CHECK(cudaStreamSynchronize(st));
        const std::string w = "graph replay r" + std::to_string(ratio) + " " + gpu_batch_name(s) + " " + cs.mech.name() +
                              " set " + std::to_string(which);
        EXPECT_TRUE(bits_equal(eager_cache[static_cast<size_t>(which)], d.cache8.download(), w + " cache"));
        EXPECT_TRUE(bits_equal(eager_lat[static_cast<size_t>(which)], d.latent.download(), w + " latent"));
        EXPECT_TRUE(bits_equal(eager_ring[static_cast<size_t>(which)], d.ring.download(), w + " ring"));
        EXPECT_TRUE(bits_equal(eager_gather[static_cast<size_t>(which)], gout.download(), w + " gather"));
      }
    }
    EXPECT_NE(eager_cache[0], eager_cache[1]) << "the two input sets must give different caches";
    GPU_CHECK(cudaGraphExecDestroy(exec));
    GPU_CHECK(cudaGraphDestroy(graph));
    GPU_CHECK(cudaStreamDestroy(st));
  }
}

// kSteps consecutive decode steps of one batch shape (200 requests x 1 token): positions advance
// by one per step, so for ratio 2 an odd step closes its pair from the ring row the step before
// stored; every step's inputs live in their own device buffers, the outputs (ring, latents,
// cache) of all steps in step 0's. `ring`, `latent`, `cache` hold the CPU's result after all
// steps (run one after the other), the *0 vectors the initial contents.
struct DecodeChain {
  static constexpr int kSteps = 4;
  std::vector<GpuBatch> steps;
  std::vector<float> ring0, ring;
  std::vector<uint16_t> latent0, latent;
  std::vector<uint8_t> cache0, cache;
  std::vector<std::unique_ptr<GpuBatchDev>> dev;

  DecodeChain(const GpuBatchSpec& s, Rng& rng) {
    steps.reserve(kSteps);  // references into it stay valid
    steps.push_back(GpuBatch::make(s, rng));
    GpuBatch& b0 = steps[0];
    // room for every step's records (closing token t of step k -> slot k * N + t) and RoPE rows
    b0.num_pages = (kSteps * b0.N + s.S - 1) / s.S;
    b0.cache8.assign(static_cast<size_t>(b0.num_pages * b0.page_stride), kByteCanary);
    b0.table_rows += kSteps;
    b0.table = random_rope_table(b0.table_rows, rng);
    for (int k = 1; k < kSteps; ++k) {
      GpuBatch b = steps.back();
      for (int64_t t = 0; t < b.A; ++t) {
        const size_t i = static_cast<size_t>(t);
        b.pos[i] += 1;
        if (b.ring_slots[i] >= 0) b.ring_slots[i] = (b.ring_slots[i] / s.cap) * s.cap + b.pos[i] % s.cap;
      }
      for (auto& v : b.kv) v = static_cast<float>(rng.normal());
      steps.push_back(std::move(b));
    }
    const int64_t capacity = b0.num_pages * s.S;
    for (int k = 0; k < kSteps; ++k) {
      GpuBatch& b = steps[static_cast<size_t>(k)];
      for (int64_t t = 0; t < b.A; ++t) {
        const bool closing = (b.pos[static_cast<size_t>(t)] + 1) % s.ratio == 0;
        b.cache_slots[static_cast<size_t>(t)] =
            closing ? (rng.uniform() < 0.03 ? -1 : k * b.N + t) : rng.integer(-1, capacity - 1);
      }
    }
    // CPU: the steps one after the other, outputs carried over
    ring0 = ring = b0.ring;
    latent0 = latent = b0.latent;
    cache0 = cache = b0.cache8;
    for (GpuBatch& b : steps) {
      b.ring = ring;
      b.latent = latent;
      b.cache8 = cache;
      compress_insert(compress_insert_args(b, nullptr, true));
      ring = b.ring;
      latent = b.latent;
      cache = b.cache8;
    }
    for (const GpuBatch& b : steps) dev.push_back(std::make_unique<GpuBatchDev>(b));
  }
  // Step k's arguments: its own inputs, the shared outputs.
  CompressInsertArgs args(int k) {
    CompressInsertArgs a = compress_insert_args(steps[static_cast<size_t>(k)], dev[static_cast<size_t>(k)].get(), true);
    a.compress.ring.data = dev[0]->ring.data();
    a.compress.latent_out.data = dev[0]->latent.data();
    a.cache.base = dev[0]->cache8.data();
    return a;
  }
  void reset_outputs() {
    dev[0]->ring.upload(ring0);
    dev[0]->latent.upload(latent0);
    dev[0]->cache8.upload(cache0);
  }
  // Device outputs == the CPU's, bit for bit (downloads synchronise the device).
  void expect_equal(const std::string& w) {
    EXPECT_TRUE(bits_equal(ring, dev[0]->ring.download(), w + ": ring"));
    EXPECT_TRUE(bits_equal(latent, dev[0]->latent.download(), w + ": latent"));
    EXPECT_TRUE(bits_equal(cache, dev[0]->cache8.download(), w + ": cache"));
  }
  // The chain must have something to get wrong.
  void expect_nontrivial(const std::string& w, int ratio) {
    EXPECT_NE(cache, cache0) << w << ": the steps must write records";
    if (ratio == 2) {
      EXPECT_NE(ring, ring0) << w << ": the steps must write ring rows";
    }
    ASSERT_FALSE(cache.empty());
  }
};

// The decode chain launched back to back on one stream, plainly, with programmatic dependent
// launch (ExecContext::programmatic_launch, the default) and with PDL and early metadata,
// eagerly and captured in one CUDA graph: a kernel touching memory before its grid dependency
// resolved would differ from the CPU's step-by-step result.
TEST_F(CompressorGpu, LaunchChainEqualsCpuInEveryLaunchMode) {
  for (int ratio : {1, 2})
    for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::NVFP4_288}) {
      GpuBatchSpec s = gpu_batch_shapes(ratio)[0];  // decode: 200 requests x 1 token
      s.format = f;
      DecodeChain c(s, rng());
      cudaStream_t st;
      GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      // pdl_early_metadata: every step's metadata lives in its own buffers, uploaded before the
      // chain, so no kernel of the chain writes metadata (the flag's promise holds)
      for (int mode : {0, 1, 2}) {  // plain, PDL, PDL + early metadata
        ExecContext ctx;
        ctx.stream = st;
        ctx.programmatic_launch = mode > 0;
        ctx.pdl_early_metadata = mode == 2;
        const std::string w = std::string("chain r") + std::to_string(ratio) + " " + record_info(f).name +
                              (mode == 0 ? " plain launches" : mode == 1 ? " pdl" : " pdl early metadata");
        c.reset_outputs();
        for (int k = 0; k < DecodeChain::kSteps; ++k) compress_insert(c.args(k), ctx);
        GPU_CHECK(cudaStreamSynchronize(st));
        c.expect_equal(w + " eager");
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < DecodeChain::kSteps; ++k) compress_insert(c.args(k), ctx);
        GPU_CHECK(cudaStreamEndCapture(st, &graph));
        GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
          c.reset_outputs();
          GPU_CHECK(cudaGraphLaunch(exec, st));
          GPU_CHECK(cudaStreamSynchronize(st));
          c.expect_equal(w + " graph");
        }
        GPU_CHECK(cudaGraphExecDestroy(exec));
        GPU_CHECK(cudaGraphDestroy(graph));
      }
      c.expect_nontrivial(std::string("chain r") + std::to_string(ratio) + " " + record_info(f).name, ratio);
      GPU_CHECK(cudaStreamDestroy(st));
    }
}

// SPEC 0.4 item 4 (serial, multi-stream and graph-replayed execution give the same bits) under
// both launch modes: the decode chain's steps alternate between two streams, each step ordered
// after the previous one only by an event (a cross-stream dependency, which a programmatic launch
// must honour like any other), eagerly and captured as a fork/join graph (the second stream
// joins the capture through the first step's event), against the CPU's serial result.
TEST_F(CompressorGpu, TwoStreamChainEqualsCpu) {
  for (int ratio : {1, 2}) {
    GpuBatchSpec s = gpu_batch_shapes(ratio)[0];
    s.format = RecordFormat::MXFP8_528;
    DecodeChain c(s, rng());
    cudaStream_t st[2];
    cudaEvent_t ev[DecodeChain::kSteps];
    for (auto& x : st) GPU_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    for (auto& e : ev) GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // step k on stream k % 2 after step k - 1's event; the last step's stream joins stream 0
    auto enqueue = [&](bool pdl) {
      for (int k = 0; k < DecodeChain::kSteps; ++k) {
        cudaStream_t x = st[k % 2];
        if (k > 0) GPU_CHECK(cudaStreamWaitEvent(x, ev[k - 1], 0));
        ExecContext ctx;
        ctx.stream = x;
        ctx.programmatic_launch = pdl;
        compress_insert(c.args(k), ctx);
        GPU_CHECK(cudaEventRecord(ev[k], x));
      }
      GPU_CHECK(cudaStreamWaitEvent(st[0], ev[DecodeChain::kSteps - 1], 0));
    };
    for (bool pdl : {true, false}) {
      const std::string w = std::string("two streams r") + std::to_string(ratio) + (pdl ? " pdl" : " plain launches");
      c.reset_outputs();
      enqueue(pdl);
      GPU_CHECK(cudaStreamSynchronize(st[0]));
      c.expect_equal(w + " eager");
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GPU_CHECK(cudaStreamBeginCapture(st[0], cudaStreamCaptureModeThreadLocal));
      enqueue(pdl);
      GPU_CHECK(cudaStreamEndCapture(st[0], &graph));
      GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 2; ++rep) {
        c.reset_outputs();
        GPU_CHECK(cudaGraphLaunch(exec, st[0]));
        GPU_CHECK(cudaStreamSynchronize(st[0]));
        c.expect_equal(w + " graph");
      }
      GPU_CHECK(cudaGraphExecDestroy(exec));
      GPU_CHECK(cudaGraphDestroy(graph));
    }
    c.expect_nontrivial("two streams r" + std::to_string(ratio), ratio);
    for (auto& e : ev) GPU_CHECK(cudaEventDestroy(e));
    for (auto& x : st) GPU_CHECK(cudaStreamDestroy(x));
  }
}

// Bad inputs are rejected on the host before any launch: the device outputs keep their bytes.
TEST_F(CompressorGpu, BadInputsRejectedBeforeLaunch) {
  GpuBatchSpec s = gpu_batch_shapes(2)[1];
  GpuBatch b = GpuBatch::make(s, rng());
  GpuBatchDev d(b);
  auto expect_untouched = [&](const char* what) {
    EXPECT_TRUE(outputs_equal(b, d, std::string("untouched after rejected ") + what));
  };
  {  // wrong dtype of kv_score
    CompressInsertArgs a = compress_insert_args(b, &d, true);
    a.compress.kv_score.dtype = DType::BF16;
    EXPECT_THROW(compress_insert(a), Error);
    expect_untouched("dtype");
  }
  {  // mixed devices
    CompressInsertArgs a = compress_insert_args(b, &d, true);
    a.compress.positions.device = Device::CPU;
    EXPECT_THROW(compress_insert(a), Error);
    expect_untouched("device mix");
  }
  {  // kv_score not 16-byte aligned (CUDA requirement)
    CompressArgs a = compress_args(b, &d);
    a.kv_score.data = static_cast<char*>(a.kv_score.data) + 4;
    a.kv_score.shape[0] -= 1;
    EXPECT_THROW(compress(a), Error);
    expect_untouched("misaligned kv_score");
  }
  {  // ratio 3
    CompressArgs a = compress_args(b, &d);
    a.ratio = 3;
    try {
      compress(a);
      ADD_FAILURE() << "ratio 3 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCompressorRatio);
    }
    expect_untouched("ratio");
  }
  {  // insert: page stride below the payload
    InsertArgs a = insert_args(b, &d);
    a.cache.page_stride = 1;
    EXPECT_THROW(insert(a), Error);
    expect_untouched("page stride");
  }
  GPU_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(cudaGetLastError());
}

// Out-of-range device values (which the host cannot check without a synchronisation, SPEC 0.4
// item 3) are skipped by the kernels: nothing faults (compute-sanitizer runs this test), nothing
// is written outside the backings' live regions (ring padding between blocks, cache page
// padding, the latent rows past N keep their canaries), and every request that holds no
// poisoned value gets exactly the CPU's latents of the clean batch. Poisons: ring and cache
// slots beyond the ring/cache, token_to_req beyond num_reqs, negative positions and (ratio 2) a
// qsl entry beyond N. Both kernels (the decode-sized and the streaming grid), fused with the
// insert for every record format.
TEST_F(CompressorGpu, OutOfRangeDeviceValuesAreSkipped) {
  for (int ratio : {1, 2})
    for (int shape : {1, 2})
      for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288,
                             RecordFormat::PLAIN_BF16, RecordFormat::PLAIN_FP8}) {
        GpuBatchSpec s = gpu_batch_shapes(ratio)[static_cast<size_t>(shape)];
        s.format = f;
        if (shape == 2) s.page_extra = 5;  // page padding in the streaming-kernel shape too
        GpuBatch b = GpuBatch::make(s, rng());
        GpuBatch ref = b;  // the clean batch: the CPU reference
        compress_insert(compress_insert_args(ref, nullptr, true));
        const std::string w = "r" + std::to_string(ratio) + " " + gpu_batch_name(s) + " " + record_info(f).name;

        std::vector<char> dirty(static_cast<size_t>(s.num_reqs), 0);  // requests holding a poison
        auto req_of = [&](int64_t t) { return static_cast<size_t>(b.t2r[static_cast<size_t>(t)]); };
        const int64_t ring_cap = b.ring_blocks * s.cap, cache_cap = b.num_pages * s.S;
        int poisoned = 0;
        for (int64_t t = 0; t < b.A; ++t) {
          const int kind = static_cast<int>(t % 29);
          if (kind > 4) continue;
          const size_t req = req_of(t);
          if (ratio == 2 && req % 2 == 1) continue;  // odd requests stay clean (compared below)
          if (kind == 0) b.cache_slots[static_cast<size_t>(t)] = cache_cap + 1 + t;
          if (kind == 1) b.pos[static_cast<size_t>(t)] = -1 - t;
          if (ratio == 2 && kind == 2) b.ring_slots[static_cast<size_t>(t)] = ring_cap + 5;
          if (ratio == 2 && kind == 3) b.t2r[static_cast<size_t>(t)] = 1000;
          if (ratio == 2 && kind == 4) b.t2r[static_cast<size_t>(t)] = -2;
          if (ratio == 1 && kind >= 2) continue;
          dirty[req] = 1;
          ++poisoned;
        }
        if (ratio == 2 && s.num_reqs >= 3) {  // request k's start (and k-1's end) beyond N
          const int k = s.num_reqs / 2;
          b.qsl[static_cast<size_t>(k)] = static_cast<int32_t>(b.N + 100);
          dirty[static_cast<size_t>(k)] = dirty[static_cast<size_t>(k - 1)] = 1;
        }
        ASSERT_GT(poisoned, 0) << w;
        GpuBatchDev d(b);
        compress_insert(compress_insert_args(b, &d, true));
        GPU_CHECK(cudaDeviceSynchronize());
        GPU_CHECK(cudaGetLastError());

        // 1. nothing outside the live regions
        const std::vector<float> ring = d.ring.download();
        for (int64_t blk = 0; blk < b.ring_blocks; ++blk)
          for (int64_t x = s.cap * 1024; x < b.block_stride; ++x)
            ASSERT_EQ(num::f2u(ring[static_cast<size_t>(blk * b.block_stride + x)]),
                      num::f2u(b.ring[static_cast<size_t>(blk * b.block_stride + x)]))
                << w << ": ring padding of block " << blk;
        const int64_t live = CacheView::with_default_strides(nullptr, f, b.num_pages, s.S).page_stride;
        ASSERT_GT(b.page_stride, live) << w;
        if (b.bf16_cache()) {
          const std::vector<uint16_t> c = d.cache16.download();
          for (int64_t pg = 0; pg < b.num_pages; ++pg)
            for (int64_t x = live; x < b.page_stride; ++x)
              ASSERT_EQ(c[static_cast<size_t>(pg * b.page_stride + x)], kBf16Canary) << w << ": page " << pg;
        } else {
          const std::vector<uint8_t> c = d.cache8.download();
          for (int64_t pg = 0; pg < b.num_pages; ++pg)
            for (int64_t x = live; x < b.page_stride; ++x)
              ASSERT_EQ(c[static_cast<size_t>(pg * b.page_stride + x)], kByteCanary) << w << ": page " << pg;
        }
        const std::vector<uint16_t> lat = d.latent.download();
        for (size_t x = static_cast<size_t>(b.N * 512); x < lat.size(); ++x)
          ASSERT_EQ(lat[x], kBf16NaN) << w << ": latent row " << x / 512 << " past N";
        // 2. the clean requests' latents are the CPU's (ratio 1: every token is its own program)
        int64_t compared = 0;
        for (int64_t t = 0; t < b.A; ++t) {
          const bool clean =
              ratio == 1 ? (t % 29 > 1) : !dirty[static_cast<size_t>(ref.t2r[static_cast<size_t>(t)])];
          if (!clean) continue;
          for (size_t x = static_cast<size_t>(t * 512); x < static_cast<size_t>((t + 1) * 512); ++x)
            ASSERT_EQ(lat[x], ref.latent[x]) << w << ": latent of clean token " << t;
          ++compared;
        }
        EXPECT_GT(compared, 0) << w << ": no clean token compared";
      }
}

}  // namespace
}  // namespace dsv41kv::test

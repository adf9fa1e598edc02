// select_backend (SPEC 6.7): every row of the capability table, each failing alone with its code,
// all failing rows reported in one error, the resolved record formats and kernel block sizes, and
// the mega-attention backend reported as not implemented.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "dsv41kv/config.hpp"
#include "dsv41kv/metadata.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

constexpr ErrorCode E4 = ErrorCode::kBackendUnsupported, E5 = ErrorCode::kComputeCapability,
                    E8 = ErrorCode::kInvalidArgument;

const ModelConfig& flash() {
  static const ModelConfig c = deepseek_v41_flash();
  return c;
}

TEST(SelectBackend, ResolvesFormatsAndBlockSizePerProfile) {
  struct Want {
    ComputeDevice dev;
    RecordFormat format;
    int64_t block;
  };
  const Want wants[] = {{ComputeDevice::cpu(), RecordFormat::V4_584, 64},
                        {ComputeDevice::cuda(9, 0), RecordFormat::V4_584, 64},
                        {ComputeDevice::cpu(true), RecordFormat::MXFP8_528, 128}};
  for (const Want& w : wants)
    for (const char* dtype : {"auto", "fp8_ds_mla", "fp8"})
      for (int64_t block : {int64_t{0}, w.block}) {
        SCOPED_TRACE(w.dev.describe() + " " + dtype + " block " + std::to_string(block));
        const BackendSelection s = select_backend(flash(), w.dev, dtype, block);
        EXPECT_EQ(s.backend, AttentionBackend::kSparse);
        EXPECT_EQ(s.kv_cache_dtype, "fp8_ds_mla");
        EXPECT_EQ(s.swa_format, w.format);
        EXPECT_EQ(s.compressed_format, w.format);
        EXPECT_EQ(s.kernel_block_size, w.block);
        EXPECT_EQ(s.topk_tokens, 512);
        EXPECT_EQ(kernel_block_size(w.dev), w.block);
      }
  EXPECT_STREQ(attention_backend_name(AttentionBackend::kSparse), "FLASHMLA_SPARSE_DSV41");
  EXPECT_STREQ(attention_backend_name(AttentionBackend::kMega), "FLASHMLA_MEGA_ATTN_DSV41");
  EXPECT_EQ(kernel_block_size(ComputeDevice::cuda(10, 0)), 128);
  EXPECT_EQ(ComputeDevice::cuda(9, 0).describe(), "cuda sm_90");
  EXPECT_EQ(ComputeDevice::cpu(true).describe(), "cpu (SM100 profile)");
}

// Every row failing alone: its code and its line in the message, "1 failing check".
TEST(SelectBackend, EveryRowFailsAloneWithItsCode) {
  struct Row {
    const char* name;
    std::function<void(ModelConfig&, ComputeDevice&, std::string&, int64_t&, BackendOptions&)> mutate;
    ErrorCode code;
    const char* line;
  };
  const Row rows[] = {
      {"model dtype",
       [](ModelConfig&, ComputeDevice&, std::string&, int64_t&, BackendOptions& o) { o.model_dtype = DType::F32; }, E4,
       "[E4] model dtype f32, expected bf16"},
      {"head size", [](ModelConfig& c, ComputeDevice&, std::string&, int64_t&, BackendOptions&) { c.head_dim = 576; },
       E4, "[E4] head size: head_dim 576 with qk_rope_head_dim 64, expected 512 = 448 NoPE + 64 RoPE"},
      {"rope dims",
       [](ModelConfig& c, ComputeDevice&, std::string&, int64_t&, BackendOptions&) { c.qk_rope_head_dim = 128; }, E4,
       "[E4] head size: head_dim 512 with qk_rope_head_dim 128"},
      {"MLA",
       [](ModelConfig& c, ComputeDevice&, std::string&, int64_t&, BackendOptions&) { c.num_key_value_heads = 8; }, E4,
       "[E4] MLA: num_key_value_heads 8, expected 1"},
      {"sparse", [](ModelConfig& c, ComputeDevice&, std::string&, int64_t&, BackendOptions&) { c.index_topk = 2048; },
       E4, "[E4] sparse: index_topk 2048, expected 512"},
      {"window",
       [](ModelConfig& c, ComputeDevice&, std::string&, int64_t&, BackendOptions&) { c.sliding_window = 256; }, E4,
       "[E4] sliding_window 256, expected 128"},
      {"kv-cache dtype", [](ModelConfig&, ComputeDevice&, std::string& k, int64_t&, BackendOptions&) { k = "bf16"; },
       E4, "[E4] kv-cache dtype 'bf16', expected auto, fp8_ds_mla or fp8"},
      {"nvfp4 on sparse",
       [](ModelConfig&, ComputeDevice&, std::string& k, int64_t&, BackendOptions&) { k = "nvfp4_ds_mla"; }, E4,
       "[E4] kv-cache dtype nvfp4_ds_mla, expected auto, fp8_ds_mla or fp8 (nvfp4_ds_mla is served by "
       "FLASHMLA_MEGA_ATTN_DSV41 only)"},
      {"block size", [](ModelConfig&, ComputeDevice&, std::string&, int64_t& b, BackendOptions&) { b = 128; }, E4,
       "[E4] block size 128 tokens, expected 64 (the FLASHMLA_SPARSE_DSV41 kernel block size on cpu)"},
      {"block size, SM100 profile",
       [](ModelConfig&, ComputeDevice& d, std::string&, int64_t& b, BackendOptions&) {
         d = ComputeDevice::cpu(true);
         b = 64;
       },
       E4, "[E4] block size 64 tokens, expected 128"},
      {"SM100: not implemented by dsv41kv",
       [](ModelConfig&, ComputeDevice& d, std::string&, int64_t&, BackendOptions&) { d = ComputeDevice::cuda(10, 0); },
       E5, "[E5] dsv41kv implements FLASHMLA_SPARSE_DSV41 on SM90 and the CPU only, not on compute capability 10.0"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    ModelConfig c = flash();
    ComputeDevice d = ComputeDevice::cpu();
    std::string k = "auto";
    int64_t b = 0;
    BackendOptions o;
    r.mutate(c, d, k, b, o);
    expect_error([&] { (void)select_backend(c, d, k, b, o); }, r.code,
                 {r.code == E4 ? "E4: " : "E5: ", "select_backend: FLASHMLA_SPARSE_DSV41 cannot serve this model on ",
                  ": 1 failing check: ", r.line});
  }
}

// All failing rows in one error, the smallest code first.
TEST(SelectBackend, ReportsEveryFailingCheckAtOnce) {
  ModelConfig c = flash();
  c.head_dim = 576;
  const std::string msg = expect_error(
      [&] { (void)select_backend(c, ComputeDevice::cuda(8, 0), "fp16", 16); }, E4,
      {"E4: select_backend: FLASHMLA_SPARSE_DSV41 cannot serve this model on cuda sm_80 (kv-cache dtype 'fp16', block "
       "size 16): 5 failing checks: ",
       "[E4] head size: head_dim 576", "; [E4] kv-cache dtype 'fp16'", "; [E4] block size 16 tokens, expected 128",
       "; [E5] compute capability 8.0, expected major 9 or 10",
       "; [E5] dsv41kv implements FLASHMLA_SPARSE_DSV41 on SM90 and the CPU only, not on compute capability 8.0"});
  // only E5 rows: the error is an E5
  expect_error([&] { (void)select_backend(flash(), ComputeDevice::cuda(7, 5)); }, E5,
               {"E5: ", "2 failing checks", "[E5] compute capability 7.5"});
}

TEST(SelectBackend, MegaAttentionIsReportedNotImplemented) {
  BackendOptions mega;
  mega.backend = AttentionBackend::kMega;
  // on SM100 with its own kv-cache dtype: only the implementation row fails
  expect_error([&] { (void)select_backend(flash(), ComputeDevice::cuda(10, 0), "nvfp4_ds_mla", 128, mega); }, E5,
               {"E5: select_backend: FLASHMLA_MEGA_ATTN_DSV41 cannot serve",
                "1 failing check: ", "[E5] dsv41kv does not implement FLASHMLA_MEGA_ATTN_DSV41 (SM100 only"});
  // on SM90 and the CPU: compute capability as well (SPEC 6.7: mega requested on SM90/CPU is E5)
  for (const ComputeDevice& d : {ComputeDevice::cuda(9, 0), ComputeDevice::cpu()})
    expect_error([&] { (void)select_backend(flash(), d, "auto", 0, mega); }, E5,
                 {"2 failing checks", "[E5] compute capability: FLASHMLA_MEGA_ATTN_DSV41 on " + d.describe() +
                                          ", expected an SM100 device (major 10)"});
  // its block size is 128 on every device
  expect_error([&] { (void)select_backend(flash(), ComputeDevice::cuda(10, 0), "fp8", 64, mega); }, E4,
               {"[E4] block size 64 tokens, expected 128 (the FLASHMLA_MEGA_ATTN_DSV41 kernel block size"});
}

TEST(SelectBackend, BadArgumentsAreE8) {
  BackendOptions o;
  o.backend = static_cast<AttentionBackend>(7);
  expect_error([&] { (void)select_backend(flash(), ComputeDevice::cpu(), "auto", 0, o); }, E8,
               {"select_backend: options.backend: unknown value 7"});
  expect_error([&] { (void)select_backend(flash(), ComputeDevice::cpu(), "auto", -64); }, E8,
               {"select_backend: block_size: -64"});
  ComputeDevice d;
  d.kind = static_cast<Device>(5);
  expect_error([&] { (void)select_backend(flash(), d); }, E8, {"select_backend: device: unknown device kind 5"});
}

}  // namespace
}  // namespace dsv41kv::test

// select_backend (SPEC 6.7): every row of the capability table of vLLM's sparse_mla.py for the
// requested backend, every failing row reported at once with its code.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "core/validate.hpp"
#include "dsv41kv/metadata.hpp"
#include "formats/window.hpp"

namespace dsv41kv {
namespace {

struct Failure {
  ErrorCode code;
  std::string what;
};

constexpr ErrorCode E4 = ErrorCode::kBackendUnsupported, E5 = ErrorCode::kComputeCapability;

}  // namespace

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::kSparse:
      return "FLASHMLA_SPARSE_DSV41";
    case AttentionBackend::kMega:
      return "FLASHMLA_MEGA_ATTN_DSV41";
  }
  return "?";
}

BackendSelection select_backend(const ModelConfig& cfg, const ComputeDevice& dev, std::string_view kv_cache_dtype,
                                int64_t block_size, const BackendOptions& opt) {
  static constexpr const char* op = "select_backend";
  const bool mega = opt.backend == AttentionBackend::kMega;
  if (!mega && opt.backend != AttentionBackend::kSparse)
    detail::bad_arg(op, "options.backend", fmt::format("unknown value {}", static_cast<int>(opt.backend)));
  if (dev.kind != Device::CPU && dev.kind != Device::CUDA)
    detail::bad_arg(op, "device", fmt::format("unknown device kind {}", static_cast<int>(dev.kind)));
  if (block_size < 0)
    detail::bad_arg(op, "block_size", fmt::format("{}, expected > 0 tokens, or 0 for the backend's", block_size));
  const char* name = attention_backend_name(opt.backend);
  std::vector<Failure> f;

  // model dtype, head size, MLA, sparse (the model side of the table)
  if (opt.model_dtype != DType::BF16)
    f.push_back({E4, fmt::format("model dtype {}, expected bf16", dtype_name(opt.model_dtype))});
  if (cfg.head_dim != 512 || cfg.qk_rope_head_dim != 64)
    f.push_back({E4, fmt::format("head size: head_dim {} with qk_rope_head_dim {}, expected 512 = 448 NoPE + 64 RoPE",
                                 cfg.head_dim, cfg.qk_rope_head_dim)});
  if (cfg.num_key_value_heads != 0 && cfg.num_key_value_heads != 1)
    f.push_back({E4, fmt::format("MLA: num_key_value_heads {}, expected 1 (one 512-d latent K = V per token)",
                                 cfg.num_key_value_heads)});
  if (cfg.any_compressed() && cfg.index_topk != kIndexTopk)
    f.push_back({E4, fmt::format("sparse: index_topk {}, expected {} (the width of the top-k key lists)",
                                 cfg.index_topk, kIndexTopk)});
  if (cfg.sliding_window != kSwaWindow)
    f.push_back({E4, fmt::format("sliding_window {}, expected {} (the width of the SWA window rows)",
                                 cfg.sliding_window, kSwaWindow)});

  // kv-cache dtype
  const bool fp8 = kv_cache_dtype == "auto" || kv_cache_dtype == "fp8_ds_mla" || kv_cache_dtype == "fp8";
  const bool nvfp4 = kv_cache_dtype == "nvfp4_ds_mla";
  if (!fp8 && !(mega && nvfp4))
    f.push_back({E4, nvfp4 ? std::string("kv-cache dtype nvfp4_ds_mla, expected auto, fp8_ds_mla or fp8 (nvfp4_ds_mla "
                                         "is served by FLASHMLA_MEGA_ATTN_DSV41 only)")
                           : fmt::format("kv-cache dtype '{}', expected auto, fp8_ds_mla{}", kv_cache_dtype,
                                         mega ? ", fp8 or nvfp4_ds_mla" : " or fp8")});

  // kernel block size
  const int64_t want_block = mega ? 128 : kernel_block_size(dev);
  if (block_size != 0 && block_size != want_block)
    f.push_back({E4, fmt::format("block size {} tokens, expected {} (the {} kernel block size on {})", block_size,
                                 want_block, name, dev.describe())});

  // compute capability, then what dsv41kv implements
  const std::string cc = fmt::format("{}.{}", dev.major, dev.minor);
  if (mega) {
    if (dev.kind == Device::CPU || dev.major != 10)
      f.push_back(
          {E5, fmt::format("compute capability: {} on {}, expected an SM100 device (major 10)", name, dev.describe())});
    f.push_back({E5, fmt::format("dsv41kv does not implement {} (SM100 only; its records, 528 SWA and 288 compressed, "
                                 "exist at kernel level)",
                                 name)});
  } else if (dev.kind == Device::CUDA) {
    if (dev.major != 9 && dev.major != 10)
      f.push_back({E5, fmt::format("compute capability {}, expected major 9 or 10", cc)});
    if (dev.major != 9)
      f.push_back({E5, fmt::format("dsv41kv implements {} on SM90 and the CPU only, not on compute capability {} (the "
                                   "CPU's SM100 profile emulates the SM100 records)",
                                   name, cc)});
  }

  if (!f.empty()) {
    ErrorCode code = f.front().code;
    std::string list;
    for (const Failure& x : f) {
      if (static_cast<int>(x.code) < static_cast<int>(code)) code = x.code;
      list += fmt::format("{}[E{}] {}", list.empty() ? "" : "; ", static_cast<int>(x.code), x.what);
    }
    fail(code,
         fmt::format("{}: {} cannot serve this model on {} (kv-cache dtype '{}', block size {}): {} failing "
                     "check{}: {}",
                     op, name, dev.describe(), kv_cache_dtype, block_size, f.size(), f.size() == 1 ? "" : "s", list));
  }

  BackendSelection s;
  s.backend = opt.backend;
  s.kv_cache_dtype = "fp8_ds_mla";
  s.swa_format = s.compressed_format = dev.sm90_profile() ? RecordFormat::V4_584 : RecordFormat::MXFP8_528;
  s.kernel_block_size = want_block;
  s.topk_tokens = kIndexTopk;
  return s;
}

}  // namespace dsv41kv

// dsv41kv: the oracles of the whole read path, for `dsv41kv demo --verify` and the tests.
//   - SeededActivations: an engine stand-in whose activations of a token depend only on (seed,
//     layer, request id, position), never on how the tokens are batched, so that the same
//     sequence attended as one prefill or token by token through decode sees the same inputs.
//   - check_layer_dense: SPEC 9.2 in binary64 (reference::sparse_attention) over the key sets of
//     SPEC 9.1 rebuilt from the layer's caches and the top-k it read (the window from the SWA
//     cache through the SWA block table, the top-k entries from the kv source's compressed cache
//     through its block table), held against the layer's attention output and lse with the 9.7
//     rule (conformance::check_attention_out / check_attention_lse).
//   - compare_layer_rows: the 9.7 rule between two runs' outputs of the same tokens (after the
//     inverse RoPE of 9.6: its dims judged by the pair magnitude, check_attention_out).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/model_runner.hpp"

namespace dsv41kv::oracles {

class SeededActivations : public pipeline::ActivationSource {
 public:
  explicit SeededActivations(uint64_t seed) : seed_(seed) {}
  // q, index_q, w_raw uniform in [-1, 1), kv uniform in [-2, 2) (bf16), kv_score uniform in
  // [-2, 2) (fp32); padding rows zero.
  void fill(const LayerInfo& layer, std::span<const pipeline::TokenId> tokens, int64_t num_rows,
            const pipeline::LayerInputs& out) override;

 private:
  uint64_t seed_;
};

struct LayerCheck {
  int64_t rows = 0;       // token rows checked
  conformance::ReadCheck out, lse;// the 9.7 rule over those rows (every head of H_pad)
  bool pass() const { return out.pass && lse.pass; }
};

// The dense binary64 check of `layer`'s last step for the runner's real rows `rows` (row indices
// of the step; every real row when empty). Call it right after the layer ran (the runner's
// after_layer hook): the shared top-k buffer must still hold what the layer read.
// A runner on CUDA is read back first (ctx.stream; it waits for the step's work).
LayerCheck check_layer_dense(const pipeline::ModelRunner& runner, const pipeline::AttentionLayer& layer,
                             std::span<const int64_t> rows = {}, const ExecContext& ctx = {});
// The same over a step's metadata and the layers' shared buffers (a stack of layers run without a
// ModelRunner).
LayerCheck check_layer_dense(const pipeline::StepMetadata& meta, const pipeline::LayerShared& shared,
                             const pipeline::AttentionLayer& layer, std::span<const int64_t> rows = {},
                             const ExecContext& ctx = {});

// The 9.7 rule of `rows` output rows (bf16 [rows, H, 512] each, contiguous) of one run against
// another's: the element bound, the cosine of every (token, head) row, zero rows exactly zero.
conformance::ReadCheck compare_layer_rows(const uint16_t* out, const uint16_t* ref, int64_t rows, int num_heads);

}  // namespace dsv41kv::oracles

// dsv41kv: the conformance runner (SPEC 10.3, shared/conformance/README.md). A conformance file
// is a safetensors file with the inputs and outputs of vLLM's fused_save_compress_norm +
// rope_quant_insert for several cases; this runs dsv41kv::compress + dsv41kv::insert on the
// same inputs (canary-filled outputs) and checks agreement:
//   - ring_out bit for bit;
//   - latent rows that are NaN in latent_out untouched, every element of the others agreeing
//     (element_agrees);
//   - every cache byte outside the records the reference wrote equal to the canary;
//   - every written record agreeing with the reference, decoded: packed and fp8 records within
//     one quantization step, plain bf16 rows by element_agrees (they hold the latent's values);
//     the share of byte-identical records reported;
//   - the reference latent_out fed to insert reproduces every cache backing byte for byte.
//
// Files of op indexer_topk (the read path, src/oracles/conformance_indexer.cpp) run
// indexer_prepare_q + indexer_topk and report one ReadCheck per output: q8 byte for byte, w bit
// for bit, topk and (candidate source) candidates as sets up to SPEC 8.8's boundary tolerance.
//
// A malformed file (missing tensors or metadata keys, wrong dtypes or shapes) is an
// Error(kFormat) naming the file and what is wrong; a missing file is Error(kIo). Errors
// thrown by compress/insert on the file's inputs are reported as failed checks instead.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::conformance {

struct Options {
  Device device = Device::CPU;  // where compress/insert run (CUDA: inputs are copied to the GPU)
  std::string dump_dir;         // non-empty: write <dump_dir>/<file name without .gz>
  int num_threads = 0;          // CPU threads (0 = hardware concurrency)
};

// The README's agreement rule for a latent element and a plain bf16 record element: the
// project's value a agrees with the reference's b when
//   |a - b| <= kLatentAtol + max(kLatentRtol * |b|, ulp_bf16(b)),
// ulp_bf16(b) being the spacing of bf16 values at |b| (2^(e-7) in the binade [2^e, 2^(e+1)) of
// |b|, 2^-133 below the normal range). The ulp term admits the one bf16 step (up to 2^-7
// relative, more than rtol) by which two correct roundings of nearly equal fp32 values differ at
// a rounding midpoint; the atol term admits the few steps a near-cancellation leaves near zero.
// A NaN agrees with a NaN, an infinity with the same infinity.
inline constexpr double kLatentRtol = 0.004;
inline constexpr double kLatentAtol = 1e-6;
bool element_agrees(double a, double b);

// The latent and ring checks of one case.
struct LatentCheck {
  bool pass = false;
  int64_t rows = 0;            // latent rows in the file
  int64_t written_rows = 0;    // rows the reference wrote (not all NaN)
  int64_t bad_elements = 0;    // elements of written rows that do not agree (element_agrees)
  int64_t differing_elements = 0;  // elements of written rows not bit-identical to the reference
  int64_t touched_nan_rows = 0;  // reference-NaN rows that the project changed
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;    // over elements with |ref| > atol
  int64_t max_ulp = 0;         // largest bf16 ulp distance between the project and the reference
  bool ring_pass = false;
  int64_t ring_diff_floats = 0;
  std::string detail;          // first failure, empty when passing
};

// The checks of one record format of one case.
struct FormatCheck {
  RecordFormat format = RecordFormat::V4_584;
  bool pass = false;
  int64_t records = 0;           // records the reference wrote
  int64_t identical = 0;         // of those, byte-identical
  int64_t beyond_tolerance = 0;  // records with a value that does not agree (see the file comment)
  int64_t stray_bytes = 0;       // bytes outside the written records that are not the canary
  bool from_reference_identical = false;
  int64_t from_reference_diff_bytes = 0;
  std::string detail;            // first failure, empty when passing
};

struct CaseResult {
  int index = 0;        // i of the c{i}. tensors
  std::string name;     // e.g. "random0"
  int ratio = 0;
  int64_t num_tokens = 0;
  std::string error;    // compress() threw (then every check of the case fails)
  LatentCheck latent;
  std::vector<FormatCheck> formats;  // the five record formats, in RecordFormat order
  bool pass() const;
};

// One check of a read-path case (ops sparse_decode, sparse_prefill, indexer_topk): one report
// line, e.g. the attention output, its lse, or the indexer's q8, w, top-k, candidates.
struct ReadCheck {
  std::string what;     // "out", "lse", "q8", "w", "topk", "candidates"
  bool pass = false;
  std::string summary;  // what was compared and the figures (errors, counts)
  std::string detail;   // first failure, empty when passing
};

// The README's agreement rule for attention outputs (SPEC 9.7), one definition for the runner and
// the tests: every element of the bf16 output o within kAttnAtol + kAttnRtol * |ref| (non-finite
// reference elements matched exactly), the cosine similarity of every row whose reference is not
// all zero >= 1 - kAttnCosineGap, rows whose reference is all zero exactly 0 (either sign); the lse
// +inf exactly where the reference's is, elsewhere within kLseAtol + kLseRtol * |ref|.
inline constexpr double kAttnAtol = 4e-3;
inline constexpr double kAttnRtol = 1e-2;
inline constexpr double kAttnCosineGap = 1e-5;
inline constexpr double kLseAtol = 1e-3;
inline constexpr double kLseRtol = 1e-4;
// `rows` rows of 512 bf16 values (out, contiguous) against their references (ref, contiguous).
// rotated_from < 512: the output carries SPEC 9.6's inverse RoPE on the pairs (2j, 2j + 1) of dims
// rotated_from .. 511, which moves each element's error onto its pair partner; there the relative
// term uses the pair's larger reference magnitude (the rule of the rotation's input, which is an
// orthogonal map of the pair).
ReadCheck check_attention_out(const uint16_t* out, const double* ref, int64_t rows, int rotated_from = 512);
// `rows` lse values against their references.
ReadCheck check_attention_lse(const float* lse, const double* ref, int64_t rows);

struct ReadCaseResult {
  int index = 0;         // i of the c{i}. tensors
  std::string name;
  std::string error;     // the op threw on the case's inputs (the case is one failed check)
  std::vector<ReadCheck> checks;
  bool pass() const;
};

struct FileResult {
  std::string path;
  std::string op;        // the file's `op`
  int ratio = 0;         // compress_insert files
  std::vector<CaseResult> cases;           // compress_insert files
  std::vector<ReadCaseResult> read_cases;  // read-path files
  std::string dump_path;  // set when Options::dump_dir was given
  int64_t checks() const;  // lines of report(): per compress_insert case the latent line + 5 format
                           // lines; per read-path case one line per check (one for an error)
  int64_t failed() const;
};

// Runs every case of one file.
FileResult run_file(const std::string& path, const Options& options = {});

// The SPEC 8.8 agreement of one top-k (or candidate-block) output row with the reference row, one
// definition for the conformance runner and `dsv41kv bench --read`: `ours` a strictly ascending
// prefix of non-negative ids, then -1; the prefix as long as `ref`'s; the same set except ids whose
// reference score lies within tolerance of the selection boundary (the smallest reference score
// of the reference's set): |score(id) - boundary| <= tol(id) + tol(boundary id). `score` and `tol`
// are the reference's. Adds the ids of the symmetric difference to `differing`; returns "" when
// the row agrees, else the reason.
std::string topk_row_agreement(const int32_t* ours, const int32_t* ref, int64_t width,
                               const std::function<double(int64_t)>& score, const std::function<double(int64_t)>& tol,
                               int64_t& differing);

// Report lines, one per case and check, e.g.
// "r2 c5 random0          v4_584     PASS  records 121/121 byte-identical (100.0%), from-reference-latent: identical"
std::vector<std::string> report(const FileResult& r);

}  // namespace dsv41kv::conformance

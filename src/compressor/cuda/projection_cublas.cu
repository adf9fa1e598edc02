// cuBLAS projection (include/dsv41kv/projection_cuda.hpp).
//
// Row-major kv_score[T, O] = hidden[T, H] . W[O, H]^T is, in cuBLAS's column-major terms,
// C[O, T] = op(W)[O, H] . hidden^T[H, T] with op = transpose: cublasGemmEx(T, N, m = O, n = T,
// k = H, W (ld = W row stride), hidden (ld = hidden row stride), C (ld = kv row stride)).
#include <cublas_v2.h>

#include <string>

#include "core/cuda/cuda_util.hpp"
#include "core/validate.hpp"
#include "dsv41kv/projection_cuda.hpp"

namespace dsv41kv {
namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(ErrorCode::kCuda, std::string("cublas: ") + what + ": " + cublasGetStatusName(s) + ": " +
                               cublasGetStatusString(s));
}

constexpr const char* kOp = "project_kv_score (cuda)";
[[noreturn]] void bad(const char* arg, const std::string& msg) { detail::bad_arg(kOp, arg, msg); }

// A device matrix of dtype dt (the kit's checks, the span included, and the device).
void need_matrix(const TensorView& v, const char* arg, DType dt) {
  detail::need_matrix(kOp, v, arg, dt, dt == DType::BF16 ? "bf16 [rows, cols]" : "f32 [rows, cols]");
  detail::need_on(kOp, v, arg, Device::CUDA);
}

}  // namespace

CublasProjection::CublasProjection(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  if (workspace_bytes_ > 0) {
    const cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_);
    if (e != cudaSuccess) {
      cublasDestroy(h);
      handle_ = nullptr;
      DSV41KV_CUDA_CHECK(e);
    }
    cublas_check(cublasSetWorkspace(h, workspace_, workspace_bytes_), "cublasSetWorkspace");
  }
  cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasProjection::~CublasProjection() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
}

void CublasProjection::project(const TensorView& hidden, const TensorView& weight,
                               const TensorView& kv_score, const ExecContext& ctx) const {
  need_matrix(hidden, "hidden", DType::BF16);
  need_matrix(weight, "weight", DType::BF16);
  need_matrix(kv_score, "kv_score", DType::F32);
  const int64_t T = hidden.shape[0], H = hidden.shape[1], O = weight.shape[0];
  if (O != 512 && O != 1024)
    fail(ErrorCode::kCompressorRatio, std::string(kOp) + ": weight: " + weight.describe() +
                                          ", expected 512 (ratio 1) or 1024 (ratio 2) rows");
  if (weight.shape[1] != H)
    bad("weight", weight.describe() + ", expected " + std::to_string(H) + " columns like hidden");
  if (kv_score.shape[0] != T || kv_score.shape[1] != O)
    bad("kv_score", kv_score.describe() + ", expected [" + std::to_string(T) + ", " + std::to_string(O) + "]");
  if (T == 0) return;
  const int64_t lda = O > 1 ? weight.stride[0] : H, ldb = T > 1 ? hidden.stride[0] : H,
                ldc = T > 1 ? kv_score.stride[0] : O;
  const int64_t lim = int64_t{1} << 31;
  if (T >= lim || H >= lim || lda >= lim || ldb >= lim || ldc >= lim)
    bad("hidden", "dimensions and strides must be < 2^31 for cuBLAS");
  auto h = static_cast<cublasHandle_t>(handle_);
  cublas_check(cublasSetStream(h, detail::as_stream(ctx.stream)), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(O), static_cast<int>(T),
                            static_cast<int>(H), &alpha, weight.data, CUDA_R_16BF,
                            static_cast<int>(lda), hidden.data, CUDA_R_16BF, static_cast<int>(ldb),
                            &beta, kv_score.data, CUDA_R_32F, static_cast<int>(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace dsv41kv

// Public compressor API (compressor.hpp): validate every argument on the host, then dispatch
// to the CPU backend (cpu.cpp) or, in CUDA builds, the CUDA backend (cuda/) by the device of the
// views. Nothing is written before all checks have passed. Value checks (qsl, token_to_req,
// slot ranges, positions against the RoPE table) need host memory and run only for CPU views;
// for CUDA views only dtypes/shapes/strides/devices are checked, and the CUDA kernels skip
// (write nothing for) any index that is out of range.
#include "compressor/backend.hpp"
#include "core/dispatch.hpp"

namespace dsv41kv {

void compress(const CompressArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "compress");
  const detail::CompressPlan p = detail::plan_compress(args);
  detail::dispatch(
      "compress", p.device, p.N == 0, [&] { detail::check_compress_values(args, p, "compress"); },
      [&] { detail::cpu::compress(args, p, ctx); }, [&] { detail::cuda::compress(args, p, ctx); });
}

void compress_insert(const CompressInsertArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "compress_insert");
  detail::CompressPlan cp;
  detail::InsertPlan ip;
  detail::plan_compress_insert(args, cp, ip);
  detail::dispatch(
      "compress_insert", cp.device, cp.N == 0,
      [&] {
        detail::check_compress_values(args.compress, cp, "compress_insert");
        detail::check_insert_values("compress_insert", detail::insert_half(args), ip);
      },
      [&] { detail::cpu::compress_insert(args, cp, ip, ctx); },
      [&] { detail::cuda::compress_insert(args, cp, ip, ctx); });
}

}  // namespace dsv41kv

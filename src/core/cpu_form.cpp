// cpu_has_avx512 (cpu_form.hpp).
#include "core/cpu_form.hpp"

namespace dsv41kv::detail {

bool cpu_has_avx512() {
#if defined(DSV41KV_AVX512_FORMS)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

}  // namespace dsv41kv::detail

// The form of a CPU backend's inner loops, chosen once at run time. The library is compiled for
// any x86-64 with FMA (-mfma, never -march=native); loops that pay for wider vectors also exist
// in an AVX-512 form, compiled per function with DSV41KV_AVX512 (a target attribute, so that no
// AVX-512 instruction reaches code that every CPU runs) and taken only where the CPU has it.
// Every such form gives the same bits as the portable one: each performs, element by element,
// the same IEEE operations in the same order (docs/numerics.md, "The CPU's AVX-512 forms").
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define DSV41KV_AVX512_FORMS 1
#define DSV41KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
// GCC 12 warns that the intrinsics' _mm512_undefined_* pass-through operands may be used
// uninitialized where they are inlined (GCC bug 105593; they are never read).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace dsv41kv::detail {

enum class CpuForm : uint8_t {
  kPortable = 0,  // the forms every build has (AVX + FMA lanes where compiled in, else scalars)
  kAvx512 = 1,    // 16 fp32 / 8 binary64 lanes, register blocks
};

// Whether this CPU runs the AVX-512 forms (decided once). Defined in cpu_form.cpp, not inline:
// translation units that nvcc compiles include this header without DSV41KV_AVX512_FORMS.
bool cpu_has_avx512();

// The fastest form this CPU runs.
inline CpuForm fastest_cpu_form() { return cpu_has_avx512() ? CpuForm::kAvx512 : CpuForm::kPortable; }

// An allocator of whole cache lines: the vector loops' full-width loads of a buffer's rows (64
// bytes) then never straddle two lines.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const { return true; }
};
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace dsv41kv::detail

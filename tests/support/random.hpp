// Deterministic random inputs for tests (platform-independent: splitmix64 + binary64 math).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::test {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Integer in [lo, hi] inclusive.
  int64_t integer(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Fisher-Yates shuffle.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(next() % i)]);
  }

 private:
  uint64_t s_;
};

// n fp32 values ~ N(0, scale^2).
inline std::vector<float> random_f32(size_t n, Rng& rng, double scale = 1.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}
// n bf16 bit patterns of N(mean, scale^2) values.
inline std::vector<uint16_t> random_bf16(size_t n, Rng& rng, double scale = 1.0,
                                         double mean = 0.0) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = num::bf16_encode(static_cast<float>(mean + rng.normal() * scale));
  return v;
}
// A RoPE table [rows, 64] of random angles: row = 32 cos then 32 sin (SPEC 1.4 layout).
inline std::vector<float> random_rope_table(int64_t rows, Rng& rng) {
  std::vector<float> t(static_cast<size_t>(rows) * 64);
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < 32; ++j) {
      const double a = rng.uniform(0.0, 6.283185307179586);
      t[static_cast<size_t>(r * 64 + j)] = static_cast<float>(std::cos(a));
      t[static_cast<size_t>(r * 64 + 32 + j)] = static_cast<float>(std::sin(a));
    }
  return t;
}

}  // namespace dsv41kv::test

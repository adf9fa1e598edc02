// dsv41kv: the one portable random generator of the library, its oracles and tests (splitmix64):
// the same seed gives the same workloads, weights, kv_score rows and test inputs on every
// platform and standard library (no <random> distributions, whose outputs differ between
// implementations; real values through binary64 arithmetic only).
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace dsv41kv {

// One splitmix64 step: the state advanced by the golden-ratio increment, then mixed.
inline constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform float in [lo, hi) from the top 24 bits of a hash (exactly representable steps).
inline float hash_float(uint64_t h, float lo, float hi) {
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(splitmix64(seed ^ 0x5DEECE66Dull)) {}
  uint64_t next() {
    s_ += 0x9E3779B97F4A7C15ull;
    return splitmix64(s_);
  }
  // Uniform integer in [lo, hi] (hi >= lo); the modulo bias is irrelevant for workloads and tests.
  int64_t integer(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(span == 0 ? next() : next() % span);
  }
  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in the open interval (0, 1) (safe for log).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // N(0, 1) by Box-Muller in binary64.
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

}  // namespace dsv41kv

// A small portable generator (splitmix64) for the PCP simulation: the same seed gives the same
// workload and the same kv_score rows on every platform and standard library.
#pragma once

#include <cstdint>

namespace dsv41kv::pcp {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(splitmix64(seed ^ 0x5DEECE66Dull)) {}
  uint64_t next() {
    s_ += 0x9E3779B97F4A7C15ull;
    return splitmix64(s_);
  }
  // Uniform integer in [lo, hi] (hi >= lo); modulo bias is irrelevant here.
  int64_t uniform(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(span == 0 ? next() : next() % span);
  }
  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t s_;
};

// Uniform float in [lo, hi) from 24 bits of a hash (exactly representable steps).
inline float hash_float(uint64_t h, float lo, float hi) {
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

}  // namespace dsv41kv::pcp

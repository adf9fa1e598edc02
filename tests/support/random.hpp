// Deterministic random inputs for tests (the library's portable Rng, dsv41kv/rng.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/rng.hpp"

namespace dsv41kv::test {

using dsv41kv::Rng;

// One seed per test process: DSV41KV_SEED when set (to replay a run), else fresh from
// std::random_device; printed once. Tests name the seed they derive from it in a SCOPED_TRACE.
// Fresh seed per process (printed), or DSV41KV_SEED to replay a run.
inline uint64_t run_seed() {
  static const uint64_t seed = [] {
    uint64_t s;
    if (const char* e = std::getenv("DSV41KV_SEED")) {
      s = std::strtoull(e, nullptr, 0);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::printf("[tests] seed %llu (replay with DSV41KV_SEED=%llu)\n", static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}
// The seed of one test: run_seed() mixed with the test's name (FNV-1a), so every test gets its own
// inputs and a run replays from its printed seed.
inline uint64_t seed_for(const char* test_name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = test_name; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 1099511628211ull;
  return run_seed() ^ h;
}

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

#include "support/compare.hpp"

#include <fmt/format.h>

#include <cmath>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::test {

std::optional<size_t> first_difference(const void* a, const void* b, size_t nbytes) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  if (std::memcmp(x, y, nbytes) == 0) return std::nullopt;
  for (size_t i = 0; i < nbytes; ++i)
    if (x[i] != y[i]) return i;
  return std::nullopt;
}

::testing::AssertionResult bytes_equal(const void* expected, const void* got, size_t nbytes,
                                       const std::string& what) {
  const auto first = first_difference(expected, got, nbytes);
  if (!first) return ::testing::AssertionSuccess();
  const auto* x = static_cast<const uint8_t*>(expected);
  const auto* y = static_cast<const uint8_t*>(got);
  size_t count = 0;
  std::string list;
  for (size_t i = *first; i < nbytes; ++i) {
    if (x[i] == y[i]) continue;
    if (count < 8) list += fmt::format(" [{}] expected 0x{:02X} got 0x{:02X};", i, x[i], y[i]);
    ++count;
  }
  return ::testing::AssertionFailure()
         << what << ": " << count << " of " << nbytes << " bytes differ; first at byte " << *first
         << ":" << list;
}

::testing::AssertionResult all_close(const float* got, const double* ref, size_t n, double rtol,
                                     double atol, const std::string& what) {
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    const double err = std::fabs(g - r);
    const bool ok = err <= atol + rtol * std::fabs(r);  // NaN fails
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << n << " elements outside rtol " << rtol << " atol "
         << atol << "; first at " << first << ": got " << got[first] << " ref " << ref[first]
         << "; worst abs error " << worst;
}

::testing::AssertionResult bf16_close(const uint16_t* got, const double* ref, size_t n,
                                      double rtol, double atol, const std::string& what) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = num::bf16_decode(got[i]);
  return all_close(g.data(), ref, n, rtol, atol, what);
}

}  // namespace dsv41kv::test

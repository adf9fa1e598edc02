// The top-K selection of SPEC 8.5 / 8.7 (select.hpp).
#include "indexer/select.hpp"

#include <algorithm>
#include <functional>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::detail {

int64_t select_top(const float* key, int64_t n, int64_t K, bool finite_only, int32_t* out,
                   std::vector<float>& scratch) {
  auto eligible = [finite_only](float v) { return finite_only ? num::is_finite(v) : !num::is_nan(v); };
  scratch.clear();
  for (int64_t i = 0; i < n; ++i)
    if (eligible(key[i])) scratch.push_back(key[i]);
  const auto m = static_cast<int64_t>(scratch.size());
  int64_t c = 0;
  if (m <= K) {
    for (int64_t i = 0; i < n; ++i)
      if (eligible(key[i])) out[c++] = static_cast<int32_t>(i);
    return c;
  }
  if (K <= 0) return 0;
  // v = the K-th largest eligible key: every key before it in scratch is >= v, every key after it
  // <= v, so the keys > v all lie before it; the selection takes them and the first (by index) of
  // the keys equal to v.
  const auto nth = scratch.begin() + (K - 1);
  std::nth_element(scratch.begin(), nth, scratch.end(), std::greater<float>());
  const float v = *nth;
  int64_t ties = K;
  for (auto it = scratch.begin(); it != nth; ++it) ties -= *it > v;
  for (int64_t i = 0; i < n; ++i) {
    const float x = key[i];
    if (!eligible(x)) continue;
    if (x > v || (x == v && ties > 0)) {
      if (!(x > v)) --ties;
      out[c++] = static_cast<int32_t>(i);
    }
  }
  return c;
}

}  // namespace dsv41kv::detail

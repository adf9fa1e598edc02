// The top-K selection of SPEC 8.5 / 8.7 (select.hpp).
#include "indexer/select.hpp"

#include <algorithm>
#include <array>
#include <functional>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::detail {

int64_t select_top(const float* key, int64_t n, int64_t K, bool finite_only, int32_t* out,
                   std::vector<float>& scratch) {
  auto eligible = [finite_only](float v) { return finite_only ? num::is_finite(v) : !num::is_nan(v); };
  // A key's rank as an unsigned number, increasing with the value (+0 and -0 equal); its top 11
  // bits pick a histogram bin. Four histograms take turns, so that runs of keys in one bin do not
  // wait on each other's counts.
  auto order = [](float v) {
    uint32_t u = num::f2u(v);
    u = u == 0x80000000u ? 0u : u;
    return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
  };
  constexpr int kBinShift = 21;
  constexpr size_t kBins = size_t{1} << (32 - kBinShift);
  std::array<std::array<uint32_t, kBins>, 4> sub{};
  for (int64_t i = 0; i < n; ++i)
    if (eligible(key[i])) ++sub[static_cast<size_t>(i & 3)][order(key[i]) >> kBinShift];
  std::array<int64_t, kBins> hist{};
  int64_t m = 0;
  for (size_t b = 0; b < kBins; ++b) {
    hist[b] = int64_t{sub[0][b]} + sub[1][b] + sub[2][b] + sub[3][b];
    m += hist[b];
  }
  int64_t c = 0;
  if (m <= K) {
    for (int64_t i = 0; i < n; ++i)
      if (eligible(key[i])) out[c++] = static_cast<int32_t>(i);
    return c;
  }
  if (K <= 0) return 0;
  // v = the K-th largest eligible key. It lies in the highest bin b where the keys of bins >= b
  // reach K; `above` keys (those of the bins over b) are greater than v. Among the keys of bin b
  // (scratch), v is the (K - above)-th largest: the keys before it are >= v, those after <= v.
  size_t b = hist.size();
  int64_t above = 0;
  while (above + hist[--b] < K) above += hist[b];
  scratch.clear();
  for (int64_t i = 0; i < n; ++i)
    if (eligible(key[i]) && (order(key[i]) >> kBinShift) == b) scratch.push_back(key[i]);
  const auto nth = scratch.begin() + (K - above - 1);
  std::nth_element(scratch.begin(), nth, scratch.end(), std::greater<float>());
  const float v = *nth;
  // the selection takes the keys > v and the first (by index) `ties` of the keys equal to v
  int64_t ties = K - above;
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

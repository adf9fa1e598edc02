// Doctored copies of conformance files: the oracles' tests show that a check fails when the
// reference disagrees with the project.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv41kv/safetensors.hpp"

namespace dsv41kv::test {

// A copy of `src` with tensor `name` replaced by `edit(bytes)` (same dtype and shape).
template <class Fn>
void write_doctored(const std::string& src, const std::string& dst, const std::string& name, Fn edit) {
  const auto f = st::SafetensorsFile::load(src);
  st::SafetensorsWriter w;
  for (const auto& t : f.names()) {
    if (t != name) {
      w.add_from(f, t);
      continue;
    }
    std::vector<uint8_t> b(f.bytes(t).begin(), f.bytes(t).end());
    edit(b);
    w.add(t, f.info(t).dtype, f.info(t).shape, b);
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  w.write(dst);
}

}  // namespace dsv41kv::test

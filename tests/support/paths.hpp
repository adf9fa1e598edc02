// Paths the tests need, fixed at configure time (overridable by environment variables).
#pragma once

#include <cstdlib>
#include <string>

namespace dsv41kv::test {

// Directory of the shipped conformance files; env DSV41KV_CONFORMANCE_DIR overrides.
inline std::string conformance_dir() {
  if (const char* e = std::getenv("DSV41KV_CONFORMANCE_DIR")) return e;
  return DSV41KV_CONFORMANCE_DIR;
}
inline std::string cli_path() { return DSV41KV_CLI_PATH; }
inline std::string source_dir() { return DSV41KV_SOURCE_DIR; }

}  // namespace dsv41kv::test

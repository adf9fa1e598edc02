// Checks of the library's errors (dsv41kv::Error) shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::test {

// The code of the dsv41kv::Error that f throws; ErrorCode(0) when it throws nothing.
inline ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return static_cast<ErrorCode>(0);
}

// Runs f and expects a dsv41kv::Error with `code` whose message contains every string of
// `parts`; returns the message ("" and a test failure when nothing was thrown).
inline std::string expect_error(const std::function<void()>& f, ErrorCode code,
                                const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    return e.what();
  }
  ADD_FAILURE() << "no error, expected code " << static_cast<int>(code);
  return "";
}
inline std::string expect_error(const std::function<void()>& f, ErrorCode code, const char* fragment) {
  return expect_error(f, code, std::vector<std::string>{fragment});
}

}  // namespace dsv41kv::test

// File reading (file.hpp).
#include "core/file.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorCode::kIo, fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  std::vector<uint8_t> buf;
  struct stat stt {};
  if (fstat(fileno(f), &stt) == 0 && S_ISREG(stt.st_mode)) buf.reserve(static_cast<size_t>(stt.st_size));
  if (S_ISDIR(stt.st_mode)) {
    std::fclose(f);
    fail(ErrorCode::kIo, fmt::format("cannot read '{}': it is a directory", path));
  }
  uint8_t chunk[1 << 16];
  for (;;) {
    const size_t n = std::fread(chunk, 1, sizeof chunk, f);
    buf.insert(buf.end(), chunk, chunk + n);
    if (n < sizeof chunk) break;
  }
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) fail(ErrorCode::kIo, fmt::format("error reading '{}'", path));
  return buf;
}

}  // namespace dsv41kv::detail

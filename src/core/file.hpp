// Reading a whole file (the config, safetensors and conformance readers share it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41kv::detail {

// The bytes of `path`; Error(kIo) naming the file and the reason when it cannot be read (missing,
// a directory, a read error).
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace dsv41kv::detail

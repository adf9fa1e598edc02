// Rendezvous for multi-process communicators: rank 0 publishes a small blob (the 128-byte
// ncclUniqueId) and every other rank fetches it, through a file or a TCP server on the
// loopback interface. Host code only; always built (no NCCL, no CUDA needed).
//
// Addresses (DSV41KV_RDZV):
//   file:/abs/path  or  /abs/path      rank 0 writes the blob atomically (temp file + rename);
//                                      the others poll until it appears.
//   tcp://127.0.0.1:PORT               rank 0 listens on 127.0.0.1:PORT and serves the blob to
//   tcp://localhost:PORT               the P-1 other ranks; they connect (retrying while the
//                                      server is not up yet) and read it.
// Only loopback addresses are accepted (anything else is E8). Every socket operation, poll
// and retry is bounded by the timeout; failures are Error(kComm) naming the rank, the address
// and the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dsv41kv::comm {

// Size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kUniqueIdBytes = 128;

struct RendezvousAddress {
  enum class Kind { File, Tcp };
  Kind kind = Kind::File;
  std::string path;  // File
  uint16_t port = 0; // Tcp (host is always 127.0.0.1)

  std::string str() const;  // "file:/tmp/x" or "tcp://127.0.0.1:29500"
};

// Parses the forms above. E8 (kInvalidArgument) for a malformed address, a relative path, a
// non-loopback host or a port outside 1..65535.
RendezvousAddress parse_rendezvous_address(const std::string& text);

// Rank 0 publishes `blob` and returns it (TCP: after every other rank fetched it, or kComm
// when some rank did not come within `timeout`, naming the missing ranks). Other ranks fetch
// and return the blob; kComm when it does not arrive within `timeout` (naming rank 0, the
// address and what was observed) or when its size is not `expected_bytes` (naming both
// sizes). `world` must match on every rank (checked over TCP and in the file header).
std::vector<uint8_t> rendezvous(const RendezvousAddress& address, int rank, int world,
                                const std::vector<uint8_t>& blob_if_rank0,
                                std::chrono::milliseconds timeout,
                                size_t expected_bytes = kUniqueIdBytes);

// The pieces, for tests and callers that want them separately.
void publish_file(const std::string& path, int world, const std::vector<uint8_t>& blob);
std::vector<uint8_t> fetch_file(const std::string& path, int rank, int world,
                                std::chrono::milliseconds timeout, size_t expected_bytes);
void serve_tcp(uint16_t port, int world, const std::vector<uint8_t>& blob,
               std::chrono::milliseconds timeout);
std::vector<uint8_t> fetch_tcp(uint16_t port, int rank, int world,
                               std::chrono::milliseconds timeout, size_t expected_bytes);

// A port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close). There is a
// small window in which another process may take it; the launcher accepts that race (rank 0
// then fails with a clear bind error naming the port).
uint16_t pick_free_loopback_port();

}  // namespace dsv41kv::comm

// Rendezvous through a file or a loopback TCP server (see rendezvous.hpp). Every wait is
// bounded by one deadline computed from the caller's timeout.
#include "comm/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "dsv41kv/common.hpp"

namespace dsv41kv::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kFileMagic[8] = {'D', 'S', 'V', 'R', 'D', 'Z', 'V', '1'};
constexpr uint32_t kHelloMagic = 0x48525644u;  // "DVRH"
constexpr uint32_t kReplyMagic = 0x42525644u;  // "DVRB"
constexpr size_t kMaxBlobBytes = size_t{1} << 20;

enum ReplyStatus : uint32_t { kOk = 0, kWorldMismatch = 1, kBadRank = 2, kDuplicateRank = 3 };

int remaining_ms(Clock::time_point deadline) {
  // Rounded up: 0 only once the deadline has passed (never fail early).
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

std::string errno_text(int e) { return fmt::format("{} ({})", std::strerror(e), e); }

// Closes the descriptor on every path.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Sends/receives exactly n bytes before the deadline. Returns "" on success, else what went
// wrong ("timed out", "connection closed by peer", strerror).
std::string send_all(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    pollfd pfd{fd, POLLOUT, 0};
    const int ms = remaining_ms(deadline);
    if (ms <= 0) return "timed out";
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_text(errno);
    }
    if (r == 0) return "timed out";
    const ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno_text(errno);
    }
    done += static_cast<size_t>(w);
  }
  return "";
}

std::string recv_all(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    pollfd pfd{fd, POLLIN, 0};
    const int ms = remaining_ms(deadline);
    if (ms <= 0) return "timed out";
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_text(errno);
    }
    if (r == 0) return "timed out";
    const ssize_t got = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (got == 0) return "connection closed by peer";
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno_text(errno);
    }
    done += static_cast<size_t>(got);
  }
  return "";
}

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void check_rank_world(int rank, int world, const char* what) {
  if (world < 1 || world > 4096)
    invalid_argument(fmt::format("{}: world size {} out of range [1, 4096]", what, world));
  if (rank < 0 || rank >= world)
    invalid_argument(fmt::format("{}: rank {} out of range [0, {})", what, rank, world));
}

}  // namespace

std::string RendezvousAddress::str() const {
  return kind == Kind::File ? "file:" + path : fmt::format("tcp://127.0.0.1:{}", port);
}

RendezvousAddress parse_rendezvous_address(const std::string& text) {
  RendezvousAddress a;
  if (text.rfind("tcp://", 0) == 0) {
    const std::string rest = text.substr(6);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos)
      invalid_argument(fmt::format("rendezvous address '{}': expected tcp://127.0.0.1:PORT", text));
    const std::string host = rest.substr(0, colon);
    if (host != "127.0.0.1" && host != "localhost")
      invalid_argument(fmt::format(
          "rendezvous address '{}': host '{}' is not a loopback address (only 127.0.0.1 and "
          "localhost are allowed)", text, host));
    const std::string port = rest.substr(colon + 1);
    long v = 0;
    size_t used = 0;
    try {
      v = std::stol(port, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != port.size() || v < 1 || v > 65535)
      invalid_argument(fmt::format("rendezvous address '{}': port '{}' is not in 1..65535", text, port));
    a.kind = RendezvousAddress::Kind::Tcp;
    a.port = static_cast<uint16_t>(v);
    return a;
  }
  std::string path = text.rfind("file:", 0) == 0 ? text.substr(5) : text;
  if (path.empty() || path[0] != '/')
    invalid_argument(fmt::format(
        "rendezvous address '{}': expected file:/absolute/path, /absolute/path or "
        "tcp://127.0.0.1:PORT", text));
  a.kind = RendezvousAddress::Kind::File;
  a.path = path;
  return a;
}

// ---------------------------------------------------------------- file

void publish_file(const std::string& path, int world, const std::vector<uint8_t>& blob) {
  if (blob.size() > kMaxBlobBytes)
    invalid_argument(fmt::format("rendezvous file {}: blob of {} bytes is too large", path, blob.size()));
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::vector<uint8_t> data(16 + blob.size());
  std::memcpy(data.data(), kFileMagic, 8);
  put_u32(data.data() + 8, static_cast<uint32_t>(world));
  put_u32(data.data() + 12, static_cast<uint32_t>(blob.size()));
  if (!blob.empty()) std::memcpy(data.data() + 16, blob.data(), blob.size());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous file:{}: cannot create {}: {}", path, tmp,
                                       errno_text(errno)));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous file:{}: write to {} failed: {}", path,
                                         tmp, errno_text(e)));
    }
    done += static_cast<size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous file:{}: rename from {} failed: {}", path,
                                       tmp, errno_text(e)));
  }
}

std::vector<uint8_t> fetch_file(const std::string& path, int rank, int world, milliseconds timeout,
                                size_t expected_bytes) {
  const auto deadline = Clock::now() + timeout;
  auto sleep_for = milliseconds(2);
  std::string observed = "file does not exist";
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      Fd guard(fd);
      std::vector<uint8_t> data;
      uint8_t buf[4096];
      for (;;) {
        const ssize_t r = ::read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
          fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: read failed: {}", rank, path,
                                             errno_text(errno)));
        if (r == 0) break;
        data.insert(data.end(), buf, buf + r);
        if (data.size() > kMaxBlobBytes + 16)
          fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: larger than {} bytes: not a "
                                             "rendezvous file", rank, path, kMaxBlobBytes + 16));
      }
      if (data.size() < 16 || std::memcmp(data.data(), kFileMagic, 8) != 0)
        fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: not a rendezvous file ({} bytes, "
                                           "bad header); was it left from another run?", rank, path,
                                           data.size()));
      const uint32_t w = get_u32(data.data() + 8);
      const uint32_t n = get_u32(data.data() + 12);
      if (static_cast<int64_t>(w) != world)
        fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: published for world size {}, "
                                           "this rank expects {}", rank, path, w, world));
      if (n != data.size() - 16)
        fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: header says {} bytes, file holds {}",
                                           rank, path, n, data.size() - 16));
      if (n != expected_bytes)
        fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous file:{}: unique id has {} bytes, expected {}",
                                           rank, path, n, expected_bytes));
      return std::vector<uint8_t>(data.begin() + 16, data.end());
    }
    if (errno != ENOENT) observed = fmt::format("open failed: {}", errno_text(errno));
    const int ms = remaining_ms(deadline);
    if (ms <= 0)
      fail(ErrorCode::kComm,
           fmt::format("rank {}: rendezvous file:{}: timed out after {} ms waiting for rank 0 to publish "
                       "the unique id ({}); did rank 0 start?", rank, path, timeout.count(), observed));
    std::this_thread::sleep_for(std::min(sleep_for, milliseconds(ms)));
    sleep_for = std::min(sleep_for * 2, milliseconds(50));
  }
}

// ---------------------------------------------------------------- tcp

void serve_tcp(uint16_t port, int world, const std::vector<uint8_t>& blob, milliseconds timeout) {
  if (world <= 1) return;
  const std::string addr = fmt::format("tcp://127.0.0.1:{}", port);
  if (blob.size() > kMaxBlobBytes)
    invalid_argument(fmt::format("rendezvous {}: blob of {} bytes is too large", addr, blob.size()));
  const auto deadline = Clock::now() + timeout;
  Fd ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (ls.fd < 0)
    fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: socket() failed: {}", addr, errno_text(errno)));
  const int one = 1;
  ::setsockopt(ls.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = loopback(port);
  if (::bind(ls.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: bind failed: {} (is the port in use by "
                                       "another run?)", addr, errno_text(errno)));
  if (::listen(ls.fd, std::max(world, 16)) != 0)
    fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: listen failed: {}", addr, errno_text(errno)));

  std::vector<char> served(static_cast<size_t>(world), 0);
  served[0] = 1;
  int count = 0;
  std::string notes;  // connections that were dropped (strays, broken clients)
  auto missing = [&] {
    std::string s;
    for (int k = 1; k < world; ++k)
      if (!served[static_cast<size_t>(k)]) s += fmt::format("{}{}", s.empty() ? "" : ",", k);
    return s;
  };
  while (count < world - 1) {
    const int ms = remaining_ms(deadline);
    if (ms <= 0)
      fail(ErrorCode::kComm,
           fmt::format("rank 0: rendezvous {}: timed out after {} ms: rank(s) {} did not fetch the "
                       "unique id ({} of {} served){}", addr, timeout.count(), missing(), count,
                       world - 1, notes));
    pollfd pfd{ls.fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0 && errno != EINTR)
      fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: poll failed: {}", addr, errno_text(errno)));
    if (r <= 0) continue;
    Fd c(::accept4(ls.fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.fd < 0) continue;
    uint8_t hello[12];
    // A client sends its hello at once; a silent connection gets at most 2 s of our time.
    const auto op_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    std::string err = recv_all(c.fd, hello, sizeof hello, op_deadline);
    if (!err.empty() || get_u32(hello) != kHelloMagic) {
      notes += fmt::format("; dropped a connection ({})", err.empty() ? "bad hello" : err);
      continue;
    }
    const int32_t crank = static_cast<int32_t>(get_u32(hello + 4));
    const int32_t cworld = static_cast<int32_t>(get_u32(hello + 8));
    uint32_t status = kOk;
    if (cworld != world) status = kWorldMismatch;
    else if (crank <= 0 || crank >= world) status = kBadRank;
    else if (served[static_cast<size_t>(crank)]) status = kDuplicateRank;
    std::vector<uint8_t> reply(16 + (status == kOk ? blob.size() : 0));
    put_u32(reply.data(), kReplyMagic);
    put_u32(reply.data() + 4, status);
    put_u32(reply.data() + 8, static_cast<uint32_t>(world));
    put_u32(reply.data() + 12, static_cast<uint32_t>(status == kOk ? blob.size() : 0));
    if (status == kOk && !blob.empty()) std::memcpy(reply.data() + 16, blob.data(), blob.size());
    err = send_all(c.fd, reply.data(), reply.size(), std::min(deadline, Clock::now() + std::chrono::seconds(2)));
    if (status == kWorldMismatch)
      fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: rank {} expects world size {}, rank 0 has {}",
                                         addr, crank, cworld, world));
    if (status == kBadRank)
      fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: a client claims rank {}, outside [1, {})",
                                         addr, crank, world));
    if (status == kDuplicateRank)
      fail(ErrorCode::kComm, fmt::format("rank 0: rendezvous {}: rank {} connected twice (two runs on one "
                                         "port?)", addr, crank));
    if (!err.empty()) {
      notes += fmt::format("; sending to rank {} failed ({})", crank, err);
      continue;  // the client will retry or time out on its side
    }
    served[static_cast<size_t>(crank)] = 1;
    ++count;
  }
}

std::vector<uint8_t> fetch_tcp(uint16_t port, int rank, int world, milliseconds timeout,
                               size_t expected_bytes) {
  const std::string addr = fmt::format("tcp://127.0.0.1:{}", port);
  const auto deadline = Clock::now() + timeout;
  std::string observed = "no attempt";
  auto sleep_for = milliseconds(2);
  for (;;) {
    const int ms0 = remaining_ms(deadline);
    if (ms0 <= 0)
      fail(ErrorCode::kComm,
           fmt::format("rank {}: rendezvous {}: timed out after {} ms waiting for rank 0 to serve the "
                       "unique id (last attempt: {}); did rank 0 start?", rank, addr, timeout.count(),
                       observed));
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (s.fd < 0)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: socket() failed: {}", rank, addr,
                                         errno_text(errno)));
    sockaddr_in a = loopback(port);
    int rc = ::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd pfd{s.fd, POLLOUT, 0};
      const int r = ::poll(&pfd, 1, remaining_ms(deadline));
      if (r <= 0) {
        err = r == 0 ? ETIMEDOUT : errno;
      } else {
        socklen_t len = sizeof err;
        ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      observed = fmt::format("connect: {}", errno_text(err));
      std::this_thread::sleep_for(std::min(sleep_for, milliseconds(std::max(remaining_ms(deadline), 0))));
      sleep_for = std::min(sleep_for * 2, milliseconds(50));
      continue;
    }
    uint8_t hello[12];
    put_u32(hello, kHelloMagic);
    put_u32(hello + 4, static_cast<uint32_t>(rank));
    put_u32(hello + 8, static_cast<uint32_t>(world));
    std::string e = send_all(s.fd, hello, sizeof hello, deadline);
    uint8_t head[16];
    if (e.empty()) e = recv_all(s.fd, head, sizeof head, deadline);
    if (!e.empty()) {
      // The server went away mid-exchange (or something else listens on the port): retry
      // within the deadline; the final message says what was seen.
      observed = fmt::format("exchange with the server failed: {}", e);
      std::this_thread::sleep_for(std::min(sleep_for, milliseconds(std::max(remaining_ms(deadline), 0))));
      continue;
    }
    if (get_u32(head) != kReplyMagic)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: the server is not a dsv41kv rendezvous "
                                         "(bad reply header)", rank, addr));
    const uint32_t status = get_u32(head + 4);
    const uint32_t sworld = get_u32(head + 8);
    const uint32_t n = get_u32(head + 12);
    if (status == kWorldMismatch)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: rank 0 has world size {}, this rank "
                                         "expects {}", rank, addr, sworld, world));
    if (status == kBadRank)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: rank 0 rejects rank {} (world {})", rank,
                                         addr, rank, sworld));
    if (status == kDuplicateRank)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: rank 0 already served a rank {} (two runs "
                                         "on one port?)", rank, addr, rank));
    if (status != kOk)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: unknown status {}", rank, addr, status));
    if (n != expected_bytes)
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: unique id has {} bytes, expected {}", rank,
                                         addr, n, expected_bytes));
    std::vector<uint8_t> blob(n);
    e = n ? recv_all(s.fd, blob.data(), n, deadline) : "";
    if (!e.empty())
      fail(ErrorCode::kComm, fmt::format("rank {}: rendezvous {}: reading the {}-byte unique id failed: {}",
                                         rank, addr, n, e));
    return blob;
  }
}

uint16_t pick_free_loopback_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0) fail(ErrorCode::kComm, fmt::format("pick_free_loopback_port: socket(): {}", errno_text(errno)));
  sockaddr_in a = loopback(0);
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    fail(ErrorCode::kComm, fmt::format("pick_free_loopback_port: bind(127.0.0.1:0): {}", errno_text(errno)));
  socklen_t len = sizeof a;
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    fail(ErrorCode::kComm, fmt::format("pick_free_loopback_port: getsockname: {}", errno_text(errno)));
  return ntohs(a.sin_port);
}

// ---------------------------------------------------------------- both

std::vector<uint8_t> rendezvous(const RendezvousAddress& address, int rank, int world,
                                const std::vector<uint8_t>& blob_if_rank0, milliseconds timeout,
                                size_t expected_bytes) {
  check_rank_world(rank, world, "rendezvous");
  if (timeout.count() <= 0) invalid_argument(fmt::format("rendezvous: timeout {} ms must be positive", timeout.count()));
  if (rank == 0) {
    if (blob_if_rank0.size() != expected_bytes)
      invalid_argument(fmt::format("rendezvous {}: rank 0's unique id has {} bytes, expected {}",
                                   address.str(), blob_if_rank0.size(), expected_bytes));
    if (address.kind == RendezvousAddress::Kind::File) publish_file(address.path, world, blob_if_rank0);
    else serve_tcp(address.port, world, blob_if_rank0, timeout);
    return blob_if_rank0;
  }
  if (address.kind == RendezvousAddress::Kind::File)
    return fetch_file(address.path, rank, world, timeout, expected_bytes);
  return fetch_tcp(address.port, rank, world, timeout, expected_bytes);
}

}  // namespace dsv41kv::comm

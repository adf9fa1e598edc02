// Rendezvous (file and loopback TCP): success with P threads, timeouts that name what was waited
// for and end within the timeout plus a small slack, wrong sizes, world mismatches, stale
// files, non-loopback addresses.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "comm/rendezvous.hpp"
#include "dsv41kv/common.hpp"
#include "support/cli.hpp"

using namespace dsv41kv;
using namespace dsv41kv::comm;
using dsv41kv::test::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Generous slack for a loaded CI machine; the point is "bounded", not "exact".
constexpr auto kSlack = 1500ms;

std::string expect_error(ErrorCode code, const std::function<void()>& f, std::vector<std::string> needles) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "missing '" << n << "' in: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::vector<uint8_t> random_blob(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> b(n);
  for (auto& c : b) c = static_cast<uint8_t>(g());
  return b;
}

double elapsed_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Runs P ranks as threads; returns each rank's blob (or records the failure).
std::vector<std::vector<uint8_t>> run_ranks(const RendezvousAddress& a, int P, const std::vector<uint8_t>& blob,
                                            std::chrono::milliseconds rank0_delay = 0ms) {
  std::vector<std::vector<uint8_t>> got(static_cast<size_t>(P));
  std::vector<std::string> errors(static_cast<size_t>(P));
  std::vector<std::thread> ts;
  for (int r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      try {
        if (r == 0) std::this_thread::sleep_for(rank0_delay);
        got[static_cast<size_t>(r)] = rendezvous(a, r, P, r == 0 ? blob : std::vector<uint8_t>{}, 10s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < P; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return got;
}

}  // namespace

TEST(RendezvousAddress, ParsesLoopbackForms) {
  auto a = parse_rendezvous_address("tcp://127.0.0.1:29500");
  EXPECT_EQ(a.kind, RendezvousAddress::Kind::Tcp);
  EXPECT_EQ(a.port, 29500);
  EXPECT_EQ(a.str(), "tcp://127.0.0.1:29500");
  a = parse_rendezvous_address("tcp://localhost:7");
  EXPECT_EQ(a.port, 7);
  a = parse_rendezvous_address("file:/tmp/x/id");
  EXPECT_EQ(a.kind, RendezvousAddress::Kind::File);
  EXPECT_EQ(a.path, "/tmp/x/id");
  EXPECT_EQ(parse_rendezvous_address("/tmp/y").path, "/tmp/y");
  EXPECT_EQ(parse_rendezvous_address("/tmp/y").str(), "file:/tmp/y");
}

TEST(RendezvousAddress, RejectsNonLoopbackAndMalformed) {
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://10.0.0.1:29500"); },
               {"10.0.0.1", "loopback"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://0.0.0.0:29500"); }, {"loopback"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://example.com:1"); }, {"loopback"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://127.0.0.1:0"); }, {"port"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://127.0.0.1:70000"); }, {"port"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("tcp://127.0.0.1"); }, {"PORT"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address("relative/path"); }, {"absolute"});
  expect_error(ErrorCode::kInvalidArgument, [] { parse_rendezvous_address(""); }, {"absolute"});
}

TEST(Rendezvous, TcpDeliversTheSameBlobToEveryRank) {
  for (int P : {1, 2, 4, 8}) {
    const auto blob = random_blob(kUniqueIdBytes, static_cast<uint32_t>(P));
    RendezvousAddress a;
    a.kind = RendezvousAddress::Kind::Tcp;
    a.port = pick_free_loopback_port();
    const auto got = run_ranks(a, P, blob);
    for (int r = 0; r < P; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], blob) << "P " << P << " rank " << r;
  }
}

TEST(Rendezvous, TcpClientsWaitForALateServer) {
  const auto blob = random_blob(kUniqueIdBytes, 9);
  RendezvousAddress a;
  a.kind = RendezvousAddress::Kind::Tcp;
  a.port = pick_free_loopback_port();
  const auto got = run_ranks(a, 3, blob, 300ms);
  for (const auto& g : got) EXPECT_EQ(g, blob);
}

TEST(Rendezvous, FileDeliversTheSameBlobToEveryRankAndWaitsForALatePublisher) {
  for (int P : {1, 2, 5}) {
    TempDir d;
    const auto blob = random_blob(kUniqueIdBytes, 100u + static_cast<uint32_t>(P));
    const auto a = parse_rendezvous_address("file:" + (d / "unique_id"));
    const auto got = run_ranks(a, P, blob, P == 5 ? 300ms : 0ms);
    for (int r = 0; r < P; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], blob) << "P " << P << " rank " << r;
    // Atomic publication: no temp file is left behind.
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path)) {
      ++files;
      EXPECT_EQ(e.path().filename(), "unique_id");
    }
    EXPECT_EQ(files, P > 0 ? 1 : 0);
  }
}

TEST(Rendezvous, TcpTimeoutWhenRank0NeverAppearsNamesWhatWasWaitedFor) {
  const uint16_t port = pick_free_loopback_port();
  const auto t0 = Clock::now();
  expect_error(ErrorCode::kComm, [&] { fetch_tcp(port, 1, 2, 500ms, kUniqueIdBytes); },
               {"rank 1", fmt::format("tcp://127.0.0.1:{}", port), "500 ms", "rank 0", "Connection refused"});
  const double ms = elapsed_ms(t0);
  EXPECT_GE(ms, 500);
  EXPECT_LE(ms, 500 + static_cast<double>(kSlack.count()));
}

TEST(Rendezvous, FileTimeoutWhenRank0NeverAppearsNamesWhatWasWaitedFor) {
  TempDir d;
  const std::string path = d / "unique_id";
  const auto t0 = Clock::now();
  expect_error(ErrorCode::kComm,
               [&] { rendezvous(parse_rendezvous_address(path), 3, 4, {}, 400ms); },
               {"rank 3", path, "400 ms", "rank 0", "does not exist"});
  const double ms = elapsed_ms(t0);
  EXPECT_GE(ms, 400);
  EXPECT_LE(ms, 400 + static_cast<double>(kSlack.count()));
}

TEST(Rendezvous, TcpServerTimesOutNamingTheRanksThatNeverCame) {
  const uint16_t port = pick_free_loopback_port();
  const auto blob = random_blob(kUniqueIdBytes, 3);
  std::vector<uint8_t> got;
  std::thread client([&] { got = fetch_tcp(port, 2, 4, 5s, kUniqueIdBytes); });
  const auto t0 = Clock::now();
  expect_error(ErrorCode::kComm, [&] { serve_tcp(port, 4, blob, 600ms); },
               {"rank 0", fmt::format("tcp://127.0.0.1:{}", port), "600 ms", "rank(s) 1,3", "1 of 3 served"});
  client.join();
  EXPECT_EQ(got, blob);
  EXPECT_LE(elapsed_ms(t0), 600 + static_cast<double>(kSlack.count()));
}

TEST(Rendezvous, TcpServerIgnoresAStrayConnection) {
  const uint16_t port = pick_free_loopback_port();
  const auto blob = random_blob(kUniqueIdBytes, 4);
  std::thread server([&] { serve_tcp(port, 2, blob, 10s); });
  // A stray connection that sends garbage and hangs up, then the real client.
  std::this_thread::sleep_for(100ms);
  {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const char junk[12] = "GET / HTTP/";
    EXPECT_EQ(::send(s, junk, sizeof junk, MSG_NOSIGNAL), 12);
    ::close(s);
  }
  EXPECT_EQ(fetch_tcp(port, 1, 2, 5s, kUniqueIdBytes), blob);
  server.join();
}

TEST(Rendezvous, WrongSizeIsReportedWithBothSizes) {
  // Rank 0 refuses to publish a blob of the wrong size.
  expect_error(ErrorCode::kInvalidArgument,
               [] { rendezvous(parse_rendezvous_address("tcp://127.0.0.1:9"), 0, 2, std::vector<uint8_t>(64), 1s); },
               {"64 bytes", "expected 128"});
  // A file holding 64 bytes where 128 are expected.
  TempDir d;
  const std::string path = d / "unique_id";
  publish_file(path, 2, std::vector<uint8_t>(64, 1));
  expect_error(ErrorCode::kComm, [&] { fetch_file(path, 1, 2, 1s, kUniqueIdBytes); },
               {"rank 1", path, "64 bytes", "expected 128"});
  // A server serving 64 bytes where 128 are expected.
  const uint16_t port = pick_free_loopback_port();
  std::thread server([&] {
    try {
      serve_tcp(port, 2, std::vector<uint8_t>(64, 2), 5s);
    } catch (...) {
    }
  });
  expect_error(ErrorCode::kComm, [&] { fetch_tcp(port, 1, 2, 5s, kUniqueIdBytes); },
               {"rank 1", "64 bytes", "expected 128"});
  server.join();
}

TEST(Rendezvous, WorldMismatchFailsBothSides) {
  const uint16_t port = pick_free_loopback_port();
  std::string server_error;
  std::thread server([&] {
    try {
      serve_tcp(port, 2, random_blob(kUniqueIdBytes, 1), 5s);
    } catch (const Error& e) {
      server_error = e.what();
    }
  });
  expect_error(ErrorCode::kComm, [&] { fetch_tcp(port, 1, 3, 5s, kUniqueIdBytes); },
               {"rank 1", "world size 2", "expects 3"});
  server.join();
  EXPECT_NE(server_error.find("rank 1 expects world size 3, rank 0 has 2"), std::string::npos) << server_error;

  TempDir d;
  const std::string path = d / "unique_id";
  publish_file(path, 4, random_blob(kUniqueIdBytes, 2));
  expect_error(ErrorCode::kComm, [&] { fetch_file(path, 1, 2, 1s, kUniqueIdBytes); },
               {"rank 1", "world size 4", "expects 2"});
}

TEST(Rendezvous, StaleOrForeignFileIsNotAccepted) {
  TempDir d;
  const std::string path = d / "unique_id";
  std::ofstream(path) << "hello, not a unique id";
  expect_error(ErrorCode::kComm, [&] { fetch_file(path, 1, 2, 1s, kUniqueIdBytes); },
               {"rank 1", path, "not a rendezvous file"});
}

TEST(Rendezvous, BadRankOrWorldIsE8) {
  const auto a = parse_rendezvous_address("tcp://127.0.0.1:9");
  expect_error(ErrorCode::kInvalidArgument, [&] { rendezvous(a, 2, 2, {}, 1s); }, {"rank 2"});
  expect_error(ErrorCode::kInvalidArgument, [&] { rendezvous(a, 0, 0, {}, 1s); }, {"world size 0"});
  expect_error(ErrorCode::kInvalidArgument, [&] { rendezvous(a, 1, 2, {}, 0ms); }, {"timeout"});
}

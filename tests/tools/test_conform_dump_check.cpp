// The `--dump` outputs of `dsv41kv conform` on the shipped read-path files pass the README's
// agreement rules when checked independently: scripts/check-conform-dump.py (Python standard
// library only, written from shared/conformance/README.md and SPEC 8.8, not from the project's
// code) reads each dump and the input file's references. Doctored dumps show that the script
// notices a disagreement and names the case. Skips when python3 is not on PATH or the shipped
// read-path files are absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "dsv41kv/safetensors.hpp"
#include "support/cli.hpp"
#include "support/doctor.hpp"
#include "support/paths.hpp"

namespace fs = std::filesystem;
using namespace dsv41kv;
using test::CliRun;
using test::TempDir;

namespace {

const char* const kReadPathFiles[] = {"sparse_decode_shared.safetensors.gz", "sparse_prefill_shared.safetensors.gz",
                                      "indexer_shared.safetensors.gz"};

std::string shipped(const std::string& name) { return test::conformance_dir() + "/" + name; }
std::string quoted(const std::string& s) { return "'" + s + "'"; }

bool python3_on_path() { return std::system("command -v python3 > /dev/null 2>&1") == 0; }

// Why the tests cannot run here, or "" when they can.
std::string missing_prerequisite() {
  if (!python3_on_path()) return "python3 is not on PATH";
  for (const char* f : kReadPathFiles)
    if (!fs::exists(shipped(f))) return "shipped read-path file absent: " + shipped(f);
  if (!fs::exists(test::source_dir() + "/scripts/check-conform-dump.py"))
    return "scripts/check-conform-dump.py absent under " + test::source_dir();
  return "";
}

std::string input_args() {
  std::string s;
  for (const char* f : kReadPathFiles) {
    s += ' ';
    s += quoted(shipped(f));
  }
  return s;
}

// `dsv41kv conform --dump DIR` on the shipped read-path files.
CliRun dump(const std::string& dir, const TempDir& tmp) { return test::run_cli("conform --dump " + quoted(dir) + input_args(), tmp); }

// `python3 scripts/check-conform-dump.py DIR files...`
CliRun check(const std::string& dir, const TempDir& tmp) {
  return test::run_program("python3", quoted(test::source_dir() + "/scripts/check-conform-dump.py") + " " + quoted(dir) + input_args(), tmp);
}

// "N passed, M failed" -> {N, M}; {-1, -1} when the line is not of that form.
std::pair<long, long> summary(const std::string& line) {
  static const std::regex re(R"(^(\d+) passed, (\d+) failed$)");
  std::smatch m;
  if (!std::regex_match(line, m, re)) return {-1, -1};
  return {std::stol(m[1].str()), std::stol(m[2].str())};
}

std::string case_name(const std::string& file, int c) {
  const auto f = st::SafetensorsFile::load(file);
  return nlohmann::json::parse(f.metadata("dsv41")).at("cases").at(c).at("name").get<std::string>();
}

}  // namespace

// The must-show item: every check of the dumped outputs passes the README's rules.
TEST(ConformDumpCheck, ShippedDumpsPassIndependentCheck) {
  if (const std::string why = missing_prerequisite(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string dir = tmp / "dump";
  const CliRun d = dump(dir, tmp);
  ASSERT_EQ(d.code, 0) << d.out << d.err;
  for (const char* f : kReadPathFiles) {
    const std::string name = fs::path(f).stem().string();  // without .gz
    ASSERT_TRUE(fs::exists(dir + "/" + name)) << name << "\n" << d.out;
  }
  const CliRun r = check(dir, tmp);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const auto [passed, failed] = summary(r.last_line());
  EXPECT_GT(passed, 0) << r.out;
  EXPECT_EQ(failed, 0) << r.out;
  EXPECT_EQ(r.out.find(" FAIL "), std::string::npos) << r.out;
  // every file and kind of check was looked at
  for (const char* s : {"sparse_decode_shared c0 ", "sparse_prefill_shared c0 ", "indexer_shared c0 "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  for (const char* s : {" out PASS ", " lse PASS ", " q8 PASS ", " w PASS ", " topk PASS "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // one line per check, then the summary
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), passed + 1) << r.out;
}

// One attention output element of c0 moved far out of tolerance in the dump: the script fails
// that case's `out` check (exit 1) and passes everything else.
TEST(ConformDumpCheck, DoctoredAttentionOutputFails) {
  if (const std::string why = missing_prerequisite(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string dir = tmp / "dump";
  const CliRun d = dump(dir, tmp);
  ASSERT_EQ(d.code, 0) << d.out << d.err;
  const std::string dumped = dir + "/sparse_decode_shared.safetensors";
  // flip the top exponent bit of element 0 (bf16, little-endian: byte 1 is the high byte): the
  // value moves by a factor 2^128 or 2^-128, far beyond 4e-3 + 1e-2 |ref|
  test::write_doctored(dumped, dumped, "c0.out", [](std::vector<uint8_t>& b) { b[1] ^= 0x40; });
  const CliRun r = check(dir, tmp);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const std::string head = "sparse_decode_shared c0 " + case_name(dumped, 0);
  EXPECT_NE(r.out.find(head + " out FAIL "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 elements beyond"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first bad row: token 0 head 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(head + " lse PASS "), std::string::npos) << r.out;
  const auto [passed, failed] = summary(r.last_line());
  EXPECT_GT(passed, 0) << r.out;
  EXPECT_EQ(failed, 1) << r.out;
}

// The indexer outputs: one e4m3 code of c1's q8 changed, and c0's first non-empty top-k row cut
// short by one entry (no longer a prefix of the reference's length): both cases fail.
TEST(ConformDumpCheck, DoctoredIndexerOutputsFail) {
  if (const std::string why = missing_prerequisite(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string dir = tmp / "dump";
  const CliRun d = dump(dir, tmp);
  ASSERT_EQ(d.code, 0) << d.out << d.err;
  const std::string dumped = dir + "/indexer_shared.safetensors";
  test::write_doctored(dumped, dumped, "c1.q8", [](std::vector<uint8_t>& b) { b[77] ^= 0x01; });
  bool cut = false;
  test::write_doctored(dumped, dumped, "c0.topk", [&](std::vector<uint8_t>& b) {
    // i32 [T, 512] little-endian: find the last entry >= 0 of the first row holding one
    const size_t K = 512, rows = b.size() / (4 * K);
    for (size_t t = 0; t < rows && !cut; ++t)
      for (size_t j = K; j-- > 0;) {
        uint8_t* e = &b[4 * (t * K + j)];
        if ((e[3] & 0x80) == 0) {  // non-negative
          e[0] = e[1] = e[2] = e[3] = 0xFF;  // -1
          cut = true;
          break;
        }
      }
  });
  ASSERT_TRUE(cut) << "no non-empty top-k row in " << dumped;
  const CliRun r = check(dir, tmp);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const std::string c0 = "indexer_shared c0 " + case_name(dumped, 0), c1 = "indexer_shared c1 " + case_name(dumped, 1);
  EXPECT_NE(r.out.find(c1 + " q8 FAIL "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(c0 + " topk FAIL "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 not a sorted valid prefix of the reference's length"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(c0 + " q8 PASS "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(c1 + " topk PASS "), std::string::npos) << r.out;
  const auto [passed, failed] = summary(r.last_line());
  EXPECT_GT(passed, 0) << r.out;
  EXPECT_EQ(failed, 2) << r.out;
}

// A dump folder without the dump of an input file: a bad file, exit 2 with its name on stderr.
TEST(ConformDumpCheck, MissingDumpExits2) {
  if (const std::string why = missing_prerequisite(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string dir = tmp / "empty";
  fs::create_directories(dir);
  const CliRun r = check(dir, tmp);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("sparse_decode_shared.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(r.last_line(), "0 passed, 0 failed") << r.out;
}

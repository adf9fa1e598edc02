// Safetensors reader/writer: round trips, the shipped conformance files, and corruption of valid
// files (every truncation of the header, flipped header-length bytes, lying offsets, random byte
// mutations): each must be a dsv41kv::Error, never a crash (also run under ASan/UBSan in CI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "dsv41kv/safetensors.hpp"
#include "support/cli.hpp"
#include "support/paths.hpp"

namespace fs = std::filesystem;
using namespace dsv41kv;
using namespace dsv41kv::st;
using dsv41kv::test::TempDir;

namespace {

std::vector<uint8_t> sample_file() {
  SafetensorsWriter w;
  const std::vector<float> f = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -0.0f};
  const std::vector<int64_t> i64 = {-1, 0, 1LL << 40};
  const std::vector<int32_t> i32 = {7, -7};
  const std::vector<uint8_t> u8 = {0xA5, 0, 255};
  const std::vector<uint16_t> bf = {0x3F80, 0x4040};
  w.add<float>("weights", {2, 3}, f);
  w.add<int64_t>("positions", {3}, i64);
  w.add<int32_t>("qsl", {2}, i32);
  w.add<uint8_t>("bytes", {3}, u8);
  w.add("bf", StDType::BF16, {2}, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bf.data()), 4));
  w.add("empty", StDType::F32, {0, 4}, {});
  w.set_metadata("dsv41", R"({"op": "test"})");
  w.set_metadata("format", "pt");
  return w.serialize();
}

uint64_t header_len(const std::vector<uint8_t>& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<size_t>(i)];
  return n;
}

// Rebuilds a file with a replaced header (data area kept).
std::vector<uint8_t> with_header(const std::vector<uint8_t>& file, const std::string& header) {
  const uint64_t n = header_len(file);
  std::vector<uint8_t> out(8);
  const uint64_t m = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(m >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), file.begin() + static_cast<std::ptrdiff_t>(8 + n), file.end());
  return out;
}
nlohmann::ordered_json header_of(const std::vector<uint8_t>& file) {
  const uint64_t n = header_len(file);
  return nlohmann::ordered_json::parse(file.begin() + 8, file.begin() + static_cast<std::ptrdiff_t>(8 + n));
}

void expect_format_error(const std::vector<uint8_t>& bytes, const std::string& what,
                         const std::string& must_contain = "") {
  try {
    (void)SafetensorsFile::parse(bytes, "mem.safetensors");
    ADD_FAILURE() << what << ": parse succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("mem.safetensors"), std::string::npos) << e.what();
    if (!must_contain.empty()) {
      EXPECT_NE(std::string(e.what()).find(must_contain), std::string::npos) << what << ": " << e.what();
    }
  }
}

// Parse; if it succeeds, touch every tensor (under ASan any out-of-bounds access would fire).
bool parse_and_touch(const std::vector<uint8_t>& bytes) {
  try {
    const auto f = SafetensorsFile::parse(bytes, "mem.safetensors");
    uint64_t sum = 0;
    for (const auto& n : f.names())
      for (uint8_t b : f.bytes(n)) sum += b;
    (void)sum;
    return true;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
    return false;
  }
}

}  // namespace

TEST(Safetensors, DTypeTable) {
  for (auto [d, name, size] : {std::tuple{StDType::F32, "F32", 4}, {StDType::BF16, "BF16", 2},
                               {StDType::U8, "U8", 1}, {StDType::I32, "I32", 4}, {StDType::I64, "I64", 8},
                               {StDType::F16, "F16", 2}, {StDType::I8, "I8", 1}, {StDType::I16, "I16", 2},
                               {StDType::U16, "U16", 2}, {StDType::F64, "F64", 8}, {StDType::BOOL, "BOOL", 1},
                               {StDType::F8_E4M3, "F8_E4M3", 1}}) {
    EXPECT_STREQ(dtype_name(d), name);
    EXPECT_EQ(dtype_size(d), static_cast<size_t>(size));
    EXPECT_EQ(parse_dtype(name), d);
  }
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("Q4").has_value());
  for (DType d : {DType::F32, DType::BF16, DType::U8, DType::I32, DType::I64}) EXPECT_EQ(to_dtype(from_dtype(d)), d);
  EXPECT_FALSE(to_dtype(StDType::F16).has_value());
}

TEST(Safetensors, RoundTrip) {
  const auto bytes = sample_file();
  const uint64_t n = header_len(bytes);
  EXPECT_EQ((8 + n) % 8, 0u) << "header padded to 8-byte alignment";
  EXPECT_EQ(bytes[8], '{');
  const auto f = SafetensorsFile::parse(bytes, "mem");
  EXPECT_EQ(f.names().size(), 6u);
  // larger elements first, then by name
  EXPECT_EQ(f.names(), (std::vector<std::string>{"positions", "empty", "qsl", "weights", "bf", "bytes"}));
  EXPECT_TRUE(f.has("weights"));
  EXPECT_FALSE(f.has("nope"));
  EXPECT_EQ(f.info("weights").dtype, StDType::F32);
  EXPECT_EQ(f.info("weights").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.info("empty").numel(), 0);
  EXPECT_EQ(f.copy_as<float>("weights"), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -0.0f}));
  EXPECT_EQ(f.copy_as<int64_t>("positions"), (std::vector<int64_t>{-1, 0, 1LL << 40}));
  EXPECT_EQ(f.copy_as<int32_t>("qsl"), (std::vector<int32_t>{7, -7}));
  EXPECT_EQ(f.copy_as<uint8_t>("bytes"), (std::vector<uint8_t>{0xA5, 0, 255}));
  EXPECT_EQ(f.copy_as<uint16_t>("bf"), (std::vector<uint16_t>{0x3F80, 0x4040}));
  EXPECT_EQ(f.metadata("format"), "pt");
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata("dsv41"), R"({"op": "test"})");
  // every tensor is aligned to its element size in the data area
  for (const auto& name : f.names())
    EXPECT_EQ(f.info(name).begin % dtype_size(f.info(name).dtype), 0u) << name;

  const TensorView v = f.view("weights");
  EXPECT_EQ(v.dtype, DType::F32);
  EXPECT_EQ(v.ndim, 2);
  EXPECT_EQ(v.size(0), 2);
  EXPECT_EQ(v.size(1), 3);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.ptr<float>()[2], 3.25f);
  EXPECT_EQ(f.view("bf").dtype, DType::BF16);

  // serialize(parse(x)) == x
  SafetensorsWriter w2;
  for (const auto& name : f.names()) w2.add_from(f, name);
  for (const auto& [k, val] : f.metadata()) w2.set_metadata(k, val);
  EXPECT_EQ(w2.serialize(), bytes);
}

TEST(Safetensors, TypedAccessChecks) {
  const auto f = SafetensorsFile::parse(sample_file(), "mem.safetensors");
  auto expect_fmt = [](auto fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("mem.safetensors"), std::string::npos);
    }
  };
  expect_fmt([&] { (void)f.copy_as<int32_t>("weights"); }, "f32 as i32");
  expect_fmt([&] { (void)f.copy_as<double>("weights"); }, "f32 as f64");
  expect_fmt([&] { (void)f.copy_as<float>("positions"); }, "i64 as f32");
  expect_fmt([&] { (void)f.copy_as<int16_t>("bf"); }, "bf16 as i16");
  expect_fmt([&] { (void)f.info("missing"); }, "missing tensor");
  expect_fmt([&] { (void)f.bytes("missing"); }, "missing tensor bytes");
  expect_fmt([&] { (void)f.metadata("missing"); }, "missing metadata");
  expect_fmt([&] { f.expect("weights", StDType::F32, {3, 2}); }, "shape mismatch");
  expect_fmt([&] { f.expect("weights", StDType::BF16); }, "dtype mismatch");
  f.expect("weights", StDType::F32, {2, 3});
  f.expect("weights", StDType::F32);
  try {
    (void)f.info("missing");
    FAIL() << "no throw for a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsWriter w;
  const std::vector<float> f = {1, 2, 3};
  EXPECT_THROW(w.add<float>("x", {2, 2}, f), Error);
  EXPECT_THROW(w.add<float>("__metadata__", {3}, f), Error);
  EXPECT_THROW(w.add<float>("x", {-3}, f), Error);
  w.add<float>("x", {3}, f);
  EXPECT_THROW(w.add<float>("x", {3}, f), Error);
  EXPECT_THROW(w.add("y", TensorView{}), Error);
}

TEST(Safetensors, WriterGathersStridedViews) {
  std::vector<int32_t> m = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // [3, 4]
  SafetensorsWriter w;
  // column 1..2 of every row: shape [3, 2], strides [4, 1]
  w.add("sub", TensorView::strided(m.data() + 1, DType::I32, {3, 2}, {4, 1}));
  w.add("t", TensorView::strided(m.data(), DType::I32, {4, 3}, {1, 4}));  // transpose
  const auto f = SafetensorsFile::parse(w.serialize(), "mem");
  EXPECT_EQ(f.copy_as<int32_t>("sub"), (std::vector<int32_t>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(f.copy_as<int32_t>("t"), (std::vector<int32_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST(Safetensors, AtomicWriteAndGzip) {
  TempDir tmp;
  const auto bytes = sample_file();
  const auto f = SafetensorsFile::parse(bytes, "mem");
  SafetensorsWriter w;
  for (const auto& name : f.names()) w.add_from(f, name);
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  const std::string plain = (tmp.path / "a.safetensors").string();
  const std::string gz = (tmp.path / "a.safetensors.gz").string();
  w.write(plain);
  w.write(gz);
  w.write(plain);  // overwrite in place
  EXPECT_EQ(read_file(plain), bytes);
  EXPECT_EQ(read_file(gz), bytes) << "gzip round trip";
  EXPECT_LT(fs::file_size(gz), bytes.size());
  EXPECT_EQ(SafetensorsFile::load(gz).copy_as<float>("weights"), f.copy_as<float>("weights"));
  int files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) {
    ++files;
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "temporary left behind: " << e.path();
  }
  EXPECT_EQ(files, 2);

  // truncated gzip -> kFormat; missing file / directory / unwritable path -> kIo
  {
    auto gzb = std::vector<uint8_t>();
    std::ifstream in(gz, std::ios::binary);
    gzb.assign(std::istreambuf_iterator<char>(in), {});
    gzb.resize(gzb.size() / 2);
    const std::string cut = (tmp.path / "cut.safetensors.gz").string();
    write_file_atomic(cut, gzb);
    try {
      (void)SafetensorsFile::load(cut);
      ADD_FAILURE() << "truncated gzip loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("cut.safetensors.gz"), std::string::npos) << e.what();
    }
  }
  try {
    (void)SafetensorsFile::load((tmp.path / "nope.safetensors").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos);
  }
  EXPECT_THROW((void)SafetensorsFile::load(tmp.path.string()), Error);
  try {
    w.write((tmp.path / "no_such_dir" / "x.safetensors").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

TEST(SafetensorsCorruption, TruncateEverywhereInHeader) {
  const auto bytes = sample_file();
  const uint64_t n = header_len(bytes);
  for (size_t cut = 0; cut < 8 + n; ++cut) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    expect_format_error(b, "truncated at " + std::to_string(cut));
  }
  // truncating the data area makes some tensor lie outside it
  const uint64_t total = bytes.size();
  for (size_t cut = 8 + n; cut < total; ++cut) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    expect_format_error(b, "data truncated at " + std::to_string(cut), "outside the data area");
  }
}

TEST(SafetensorsCorruption, FlipHeaderLengthBytes) {
  const auto bytes = sample_file();
  for (int i = 0; i < 8; ++i) {
    for (uint8_t x : {0x01, 0x02, 0x10, 0x80, 0xFF}) {
      auto b = bytes;
      b[static_cast<size_t>(i)] ^= x;
      parse_and_touch(b);  // must not crash; most are errors
      if (i >= 1) expect_format_error(b, "header length byte " + std::to_string(i));
    }
  }
  // the all-ones length
  auto b = bytes;
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = 0xFF;
  expect_format_error(b, "length 2^64-1", "header length");
}

TEST(SafetensorsCorruption, LyingHeaders) {
  const auto bytes = sample_file();
  const auto h = header_of(bytes);
  auto edit = [&](auto fn) {
    auto j = h;
    fn(j);
    return with_header(bytes, j.dump());
  };
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"][1] = 1u << 20; }), "end beyond data",
                      "'weights'");
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"] = {24, 0}; }), "end < begin", "'weights'");
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"] = {0, -24}; }), "negative offset");
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"] = {0}; }), "one offset");
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"] = {0.5, 24}; }), "float offset");
  expect_format_error(edit([](auto& j) { j["weights"]["data_offsets"] = "0,24"; }), "string offsets");
  expect_format_error(edit([](auto& j) { j["weights"].erase("data_offsets"); }), "no offsets");
  expect_format_error(edit([](auto& j) { j["weights"]["shape"] = {2, 4}; }), "bytes != shape", "'weights'");
  expect_format_error(edit([](auto& j) { j["weights"]["shape"] = {-2, -3}; }), "negative shape");
  expect_format_error(edit([](auto& j) { j["weights"]["shape"] = {1u << 31, 1u << 31, 1u << 31}; }), "overflow");
  expect_format_error(edit([](auto& j) { j["weights"]["shape"] = 6; }), "scalar shape");
  expect_format_error(edit([](auto& j) { j["weights"]["dtype"] = "F128"; }), "unknown dtype", "F128");
  expect_format_error(edit([](auto& j) { j["weights"]["dtype"] = 4; }), "numeric dtype");
  expect_format_error(edit([](auto& j) { j["weights"]["dtype"] = "I64"; }), "dtype size lie");
  expect_format_error(edit([](auto& j) { j["weights"] = "x"; }), "entry not object");
  expect_format_error(edit([](auto& j) { j["__metadata__"]["n"] = 3; }), "metadata value not string");
  expect_format_error(edit([](auto& j) { j["__metadata__"] = {1, 2}; }), "metadata not object");
  // overlap: make 'qsl' alias the bytes of 'weights'
  expect_format_error(edit([&](auto& j) {
                        const auto b = j["weights"]["data_offsets"][0].template get<uint64_t>();
                        j["qsl"]["data_offsets"] = {b + 4, b + 12};
                      }),
                      "overlap", "overlaps");
  // duplicate names: write the JSON text by hand
  {
    std::string text = h.dump();
    const std::string entry = "\"weights\":" + h["weights"].dump();
    text.insert(text.size() - 1, "," + entry);
    expect_format_error(with_header(bytes, text), "duplicate", "'weights'");
  }
  expect_format_error(with_header(bytes, "[1, 2, 3]"), "array header", "expected an object");
  expect_format_error(with_header(bytes, "\"str\"    "), "string header");
  expect_format_error(with_header(bytes, "{\"a\": "), "broken JSON", "not valid JSON");
  expect_format_error(with_header(bytes, std::string(16, ' ')), "blank header");
  expect_format_error(with_header(bytes, ""), "empty header");
  // still valid: an empty object, null metadata, extra spaces
  EXPECT_TRUE(parse_and_touch(with_header(bytes, "{}      ")));
  EXPECT_TRUE(parse_and_touch(edit([](auto& j) { j["__metadata__"] = nullptr; })));
}

TEST(SafetensorsCorruption, RandomHeaderMutations) {
  const auto bytes = sample_file();
  const uint64_t n = header_len(bytes);
  std::mt19937_64 rng(12345);
  int ok = 0;
  for (int it = 0; it < 4000; ++it) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = 8 + rng() % n;
      if (rng() % 2) {
        b[pos] = static_cast<uint8_t>(rng());
      } else {  // digits are the interesting bytes: they change shapes and offsets
        b[pos] = static_cast<uint8_t>('0' + rng() % 10);
      }
    }
    ok += parse_and_touch(b);
  }
  SUCCEED() << ok << " of 4000 mutated files still parsed";
}

TEST(SafetensorsConformance, ShippedFilesLoad) {
  for (const char* name : {"compress_r1_shared.safetensors", "compress_r2_shared.safetensors"}) {
    const std::string path = dsv41kv::test::conformance_dir() + "/" + name;
    const auto f = SafetensorsFile::load(path);
    EXPECT_EQ(f.names().size(), 123u) << name;
    const auto meta = nlohmann::json::parse(f.metadata("dsv41"));
    EXPECT_EQ(meta["op"], "compress_insert");
    EXPECT_EQ(meta["cases"].size(), 8u);
    f.expect("cos_sin", StDType::F32, {1024, 64});
    f.expect("norm_weight", StDType::BF16, {512});
    f.expect("fp8_scale", StDType::F32, {1});
    const TensorView cs = f.view("cos_sin");
    EXPECT_EQ(cs.ptr<float>()[0], 1.0f);   // cos(0)
    EXPECT_EQ(cs.ptr<float>()[32], 0.0f);  // sin(0)
    for (const auto& t : f.names()) {
      const auto& ti = f.info(t);
      EXPECT_EQ(ti.begin % dtype_size(ti.dtype), 0u) << t;
      if (to_dtype(ti.dtype)) (void)f.view(t);
    }
  }
}

TEST(SafetensorsConformance, ShippedFileHeaderTruncations) {
  const std::string path = dsv41kv::test::conformance_dir() + "/compress_r2_shared.safetensors";
  const auto full = read_file(path);
  const uint64_t n = header_len(full);
  // Every truncation inside the header (strided to keep the test fast), and just past it.
  for (uint64_t cut = 0; cut < 8 + n + 64; cut += (cut < 16 || cut + 16 > 8 + n) ? 1 : 13) {
    std::vector<uint8_t> b(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
    expect_format_error(b, "conformance file truncated at " + std::to_string(cut));
  }
  // Re-serialising the shipped file reproduces it byte for byte (same writer conventions).
  const auto f = SafetensorsFile::parse(full, path);
  SafetensorsWriter w;
  for (const auto& t : f.names()) w.add_from(f, t);
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  const auto again = SafetensorsFile::parse(w.serialize(), "again");
  ASSERT_EQ(again.names().size(), f.names().size());
  for (const auto& t : f.names()) {
    const auto a = f.bytes(t), b = again.bytes(t);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t;
    EXPECT_EQ(f.info(t).shape, again.info(t).shape);
  }
}

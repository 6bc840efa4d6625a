// Safetensors files and checkpoints: round trips of every dtype, zero-copy and unaligned reads,
// sharded checkpoints, and every defect of a file or index ending in a one-line dsi::Error that
// names the file and tensor.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/safetensors.h"

namespace dsi {
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("dsinfer_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
            std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string str() const { return path.string(); }
};

// f() must throw dsi::Error with a one-line message containing every string in `parts`.
template <typename F>
testing::AssertionResult throws_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find('\n') != std::string::npos)
      return testing::AssertionFailure() << "message is not one line: " << msg;
    for (const auto& p : parts) {
      if (msg.find(p) == std::string::npos)
        return testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
    }
    return testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << "threw something other than dsi::Error: " << e.what();
  } catch (...) {
    return testing::AssertionFailure() << "threw a non-exception";
  }
  return testing::AssertionFailure() << "did not throw";
}

template <typename T>
Tensor make(DType dt, const Shape& shape, const std::vector<T>& v) {
  EXPECT_EQ(sizeof(T), dtype_size(dt));
  Tensor t = Tensor::empty(shape, dt);
  EXPECT_EQ(t.nbytes(), v.size() * sizeof(T));
  std::memcpy(t.raw(), v.data(), t.nbytes());
  return t;
}

// Copies the elements out with memcpy, so this works whatever the alignment.
template <typename T>
std::vector<T> values(const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  std::memcpy(v.data(), t.raw(), t.nbytes());
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string u64le(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(n >> (8 * i));
  return s;
}

// A file with the given header text followed by `data_bytes` zero bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return u64le(header.size()) + header + std::string(data_bytes, '\0');
}

// A header with one entry "w" whose fields are spelled out in JSON.
std::string one_entry(const std::string& fields) { return "{\"w\": {" + fields + "}}"; }

// ---- Reading good files ----

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir tmp;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 1e-3f, -0.0f, 65504.0f};
  std::vector<uint16_t> f16, bf16;
  std::vector<uint8_t> e4m3;
  for (float x : {1.0f, -2.5f, 0.333f, 448.0f}) {
    f16.push_back(f32_to_f16(x));
    bf16.push_back(f32_to_bf16(x));
    e4m3.push_back(f32_to_e4m3(x));
  }
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -1, 0, 1LL << 40};
  const std::vector<int32_t> i32 = {-7, 1 << 30, 42};
  const std::vector<int16_t> i16 = {-32768, 32767};
  const std::vector<int8_t> i8 = {-128, 0, 127};
  const std::vector<uint8_t> u8 = {0, 200, 255};
  const std::vector<uint8_t> b = {1, 0, 1, 1};
  const Tensors in = {{"f32", make(DType::F32, {2, 3}, f32)},
                      {"f16", make(DType::F16, {4}, f16)},
                      {"bf16", make(DType::BF16, {2, 2}, bf16)},
                      {"e4m3", make(DType::F8_E4M3, {4, 1}, e4m3)},
                      {"i64", make(DType::I64, {4}, i64)},
                      {"i32", make(DType::I32, {3}, i32)},
                      {"i16", make(DType::I16, {1, 2}, i16)},
                      {"i8", make(DType::I8, {3}, i8)},
                      {"u8", make(DType::U8, {3}, u8)},
                      {"bool", make(DType::BOOL, {2, 2}, b)},
                      {"scalar", make(DType::F32, {}, std::vector<float>{7.0f})}};
  const std::string path = tmp.file("all.safetensors");
  write_safetensors(path, in);

  // The header is padded with spaces to a multiple of 8, as the reference writer does.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->tensors().size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(f->has(name)) << name;
    Tensor got = f->get(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(f->tensors().at(name).nbytes, t.nbytes()) << name;
    ASSERT_EQ(got.nbytes(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got.raw(), t.raw(), t.nbytes()), 0) << name;
  }
  EXPECT_EQ(values<float>(f->get("f32")), f32);
  EXPECT_EQ(values<float>(f->get("scalar")), std::vector<float>{7.0f});
  EXPECT_EQ(f16_to_f32(values<uint16_t>(f->get("f16"))[1]), -2.5f);
  EXPECT_EQ(bf16_to_f32(values<uint16_t>(f->get("bf16"))[3]), 448.0f);
  EXPECT_EQ(e4m3_to_f32(values<uint8_t>(f->get("e4m3"))[0]), 1.0f);
  EXPECT_EQ(values<int64_t>(f->get("i64")), i64);
  EXPECT_EQ(values<int32_t>(f->get("i32")), i32);
  EXPECT_EQ(values<int16_t>(f->get("i16")), i16);
  EXPECT_EQ(values<int8_t>(f->get("i8")), i8);
  EXPECT_EQ(values<uint8_t>(f->get("u8")), u8);
  EXPECT_EQ(values<uint8_t>(f->get("bool")), b);
}

TEST(Safetensors, AlignedTensorsViewTheMappingAndKeepItAlive) {
  TempDir tmp;
  const std::string path = tmp.file("a.safetensors");
  write_safetensors(path, {{"x", Tensor::from_f32({1, 2, 3, 4}, {2, 2})},
                           {"y", Tensor::from_i32({5, 6}, {2})}});
  auto f = SafetensorsFile::open(path);
  Tensor x = f->get("x");
  Tensor y = f->get("y");
  ASSERT_NE(dynamic_cast<MappedFile*>(x.storage().get()), nullptr);
  EXPECT_EQ(x.raw(), static_cast<char*>(x.storage()->data()) + f->tensors().at("x").offset);
  EXPECT_EQ(x.storage(), y.storage());
  f.reset();  // the views keep the mapping alive
  EXPECT_EQ(x.f32()[3], 4.0f);
  EXPECT_EQ(y.i32()[1], 6);
}

TEST(Safetensors, UnalignedDataIsCopied) {
  TempDir tmp;
  const std::string path = tmp.file("u.safetensors");
  // U8[1] puts the next F32 at data offset 1; BF16[1] the last F32 at offset 15; I64 at 23.
  write_safetensors(path, {{"u8", make(DType::U8, {1}, std::vector<uint8_t>{9})},
                           {"a", Tensor::from_f32({1.5f, -2.0f, 3.0f}, {3})},
                           {"h", make(DType::BF16, {1}, std::vector<uint16_t>{0x3f80})},
                           {"b", Tensor::from_f32({4.0f, 5.5f}, {2})},
                           {"q", make(DType::I64, {1}, std::vector<int64_t>{-3})}});
  auto f = SafetensorsFile::open(path);
  for (const char* name : {"a", "b", "q"}) {
    EXPECT_NE(f->tensors().at(name).offset % 4, 0u) << name << " should be misaligned on disk";
    Tensor t = f->get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % dtype_size(t.dtype()), 0u) << name;
    EXPECT_NE(dynamic_cast<HostStorage*>(t.storage().get()), nullptr) << name;
  }
  Tensor a = f->get("a"), b = f->get("b");
  EXPECT_EQ(a.f32()[0], 1.5f);
  EXPECT_EQ(a.f32()[1], -2.0f);
  EXPECT_EQ(a.f32()[2], 3.0f);
  EXPECT_EQ(b.f32()[0], 4.0f);
  EXPECT_EQ(b.f32()[1], 5.5f);
  EXPECT_EQ(f->get("q").data<int64_t>()[0], -3);
  EXPECT_EQ(bf16_to_f32(f->get("h").data<uint16_t>()[0]), 1.0f);
  EXPECT_EQ(f->get("u8").data<uint8_t>()[0], 9);
}

TEST(Safetensors, MetadataEmptyAndZeroSizedTensors) {
  TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  write_bytes(path, raw_file(R"({"__metadata__": {"format": "pt"},
      "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},
      "w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})", 2));
  auto f = SafetensorsFile::open(path);
  EXPECT_FALSE(f->has("__metadata__"));
  EXPECT_EQ(f->get("e").numel(), 0);
  EXPECT_EQ(f->get("e").shape(), (Shape{0, 5}));
  EXPECT_EQ(f->get("w").numel(), 2);

  const std::string empty = tmp.file("empty.safetensors");
  write_safetensors(empty, {});
  EXPECT_TRUE(SafetensorsFile::open(empty)->tensors().empty());
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(empty)->get("nope"); },
                           {empty, "missing tensor 'nope'"}));
}

// ---- Broken files: every defect is a dsi::Error naming the file (and tensor) ----

TEST(Safetensors, MissingOrUnreadableFile) {
  TempDir tmp;
  const std::string missing = tmp.file("missing.safetensors");
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(missing); }, {missing, "cannot open"}));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(""); }, {"empty path"}));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(tmp.str()); },
                           {tmp.str(), "not a regular file"}));
  // A FIFO must not block open() waiting for a writer.
  const std::string fifo = tmp.file("fifo.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(fifo); }, {fifo, "not a regular file"}));
  // Permissions do not stop root, so this part only runs as an ordinary user.
  if (geteuid() != 0) {
    const std::string locked = tmp.file("locked.safetensors");
    write_safetensors(locked, {});
    fs::permissions(locked, fs::perms::none);
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(locked); }, {locked, "cannot open"}));
  }
}

TEST(Safetensors, ShorterThanHeaderLength) {
  TempDir tmp;
  const std::string path = tmp.file("short.safetensors");
  for (size_t n : {0, 1, 7}) {
    write_bytes(path, std::string(n, '\x01'));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "8-byte header length"}));
  }
}

TEST(Safetensors, HeaderLongerThanFile) {
  TempDir tmp;
  const std::string path = tmp.file("trunc.safetensors");
  write_bytes(path, u64le(64) + "{\"w\": {");
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "header length 64", "truncated"}));
}

TEST(Safetensors, AbsurdHeaderLength) {
  TempDir tmp;
  const std::string path = tmp.file("huge.safetensors");
  for (uint64_t n : {uint64_t(200'000'000), uint64_t(1) << 62, ~uint64_t(0)}) {
    write_bytes(path, u64le(n) + "{}");
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                             {path, "header length " + std::to_string(n), "limit"}));
  }
}

TEST(Safetensors, HeaderNotJson) {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  for (const char* h : {"{\"w\": ", "not json", "", "{\"a\": 1}\nxyz", "{\"a\": \"\x01\"}"}) {
    write_bytes(path, raw_file(h, 0));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "not valid JSON"})) << h;
  }
  // Deep nesting is refused before it builds a huge tree.
  write_bytes(path, raw_file(std::string(100000, '[') + std::string(100000, ']'), 0));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "nests deeper"}));
}

TEST(Safetensors, HeaderNotObject) {
  TempDir tmp;
  const std::string path = tmp.file("arr.safetensors");
  for (const char* h : {"[1, 2]", "42", "\"w\"", "null"}) {
    write_bytes(path, raw_file(h, 0));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "expected an object"}))
        << h;
  }
}

TEST(Safetensors, DuplicateTensorName) {
  TempDir tmp;
  const std::string path = tmp.file("dup.safetensors");
  write_bytes(path, raw_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                                 "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                             2));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "duplicate key 'w'"}));
}

TEST(Safetensors, EntryMissingOrMistypedFields) {
  TempDir tmp;
  const std::string path = tmp.file("fields.safetensors");
  struct Case {
    std::string fields, expect;
  };
  const std::vector<Case> cases = {
      {R"("shape": [1], "data_offsets": [0, 4])", "missing \"dtype\""},
      {R"("dtype": "F32", "data_offsets": [0, 4])", "missing \"shape\""},
      {R"("dtype": "F32", "shape": [1])", "missing \"data_offsets\""},
      {R"("dtype": 5, "shape": [1], "data_offsets": [0, 4])", "\"dtype\" is a JSON number"},
      {R"("dtype": "F32", "shape": 1, "data_offsets": [0, 4])", "\"shape\" is a JSON number"},
      {R"("dtype": "F32", "shape": [1.0], "data_offsets": [0, 4])", "expected integers"},
      {R"("dtype": "F32", "shape": ["1"], "data_offsets": [0, 4])", "expected integers"},
      {R"("dtype": "F32", "shape": [1], "data_offsets": [0])", "\"data_offsets\" must be"},
      {R"("dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8])", "\"data_offsets\" must be"},
      {R"("dtype": "F32", "shape": [1], "data_offsets": "0-4")", "\"data_offsets\" must be"},
      {R"("dtype": "F32", "shape": [1], "data_offsets": [-4, 0])", "\"data_offsets\" must be"},
      {R"("dtype": "F32", "shape": [1], "data_offsets": [0.0, 4])", "\"data_offsets\" must be"},
  };
  for (const auto& c : cases) {
    write_bytes(path, raw_file(one_entry(c.fields), 8));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "tensor 'w'", c.expect}))
        << c.fields;
  }
  write_bytes(path, raw_file(R"({"w": [1, 2]})", 0));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'w'", "entry is a JSON array"}));
}

TEST(Safetensors, UnknownDtype) {
  TempDir tmp;
  const std::string path = tmp.file("f64.safetensors");
  write_bytes(path, raw_file(one_entry(R"("dtype": "F64", "shape": [1], "data_offsets": [0, 8])"),
                             8));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'w'", "unknown dtype 'F64'", "BF16"}));
}

TEST(Safetensors, NegativeOrHugeDims) {
  TempDir tmp;
  const std::string path = tmp.file("dims.safetensors");
  const std::string neg = R"("dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8])";
  write_bytes(path, raw_file(one_entry(neg), 8));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'w'", "negative dimension -1"}));
  // Overflowing shapes, also ones whose total is 0 but whose partial products overflow.
  for (const char* shape : {"[4294967296, 4294967296, 16]", "[18446744073709551615]",
                            "[3037000500, 3037000500, 0]", "[9223372036854775807]"}) {
    write_bytes(path, raw_file(one_entry(std::string("\"dtype\": \"BF16\", \"shape\": ") + shape +
                                         ", \"data_offsets\": [0, 0]"),
                               0));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "tensor 'w'", "large"}))
        << shape;
  }
}

TEST(Safetensors, OffsetsEndBeforeBegin) {
  TempDir tmp;
  const std::string path = tmp.file("rev.safetensors");
  write_bytes(path, raw_file(one_entry(R"("dtype": "U8", "shape": [4], "data_offsets": [8, 4])"),
                             8));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'w'", "[8, 4] end before they begin"}));
}

TEST(Safetensors, LyingHeaderSize) {
  TempDir tmp;
  const std::string path = tmp.file("lie.safetensors");
  // The header claims 12 bytes for an F32[2, 2] tensor (16 bytes); the data is all there.
  write_safetensors(path, {{"w", Tensor::from_f32({1, 2, 3, 4}, {2, 2})}},
                    one_entry(R"("dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12])"));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'w'", "span 12 bytes", "F32 [2, 2] needs 16"}));
}

TEST(Safetensors, DataPastEndOfFile) {
  TempDir tmp;
  const std::string good = tmp.file("good.safetensors");
  write_safetensors(good, {{"a", Tensor::from_f32({1, 2}, {2})},
                           {"b", Tensor::from_f32({3, 4, 5, 6}, {4})}});
  const std::string bytes = read_bytes(good);
  const std::string path = tmp.file("cut.safetensors");
  write_bytes(path, bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "tensor 'b'", "past the end", "truncated"}));
  // An offset far beyond the file.
  write_bytes(path, raw_file(one_entry(R"("dtype": "U8", "shape": [4],
      "data_offsets": [18446744073709551611, 18446744073709551615])"), 4));
  EXPECT_TRUE(
      throws_error([&] { SafetensorsFile::open(path); }, {path, "tensor 'w'", "past the end"}));
}

TEST(Safetensors, OverlappingTensors) {
  TempDir tmp;
  const std::string path = tmp.file("overlap.safetensors");
  write_bytes(path, raw_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 24));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); },
                           {path, "'a' [0, 16)", "'b' [8, 24)", "overlap"}));
  // Containment (b inside a, c after both) is caught too.
  write_bytes(path, raw_file(R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
      "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
      "c": {"dtype": "U8", "shape": [2], "data_offsets": [10, 12]}})", 16));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path, "'a'", "'b'", "overlap"}));
}

// Every proper prefix of a valid file is a broken file: each must fail cleanly.
TEST(Safetensors, EveryTruncationFailsCleanly) {
  TempDir tmp;
  const std::string good = tmp.file("good.safetensors");
  write_safetensors(good, {{"a", Tensor::from_f32({1, 2, 3}, {3})},
                           {"b", make(DType::BF16, {1}, std::vector<uint16_t>{1})}});
  const std::string bytes = read_bytes(good);
  const std::string path = tmp.file("prefix.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(path, bytes.substr(0, n));
    EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(path); }, {path})) << "prefix " << n;
  }
}

// Random corruption of the header and length bytes: open() either succeeds with tensors inside
// the file or throws dsi::Error; never crashes (ASan/UBSan build checks the rest).
TEST(Safetensors, CorruptedBytesNeverCrash) {
  TempDir tmp;
  const std::string good = tmp.file("good.safetensors");
  write_safetensors(good, {{"a", Tensor::from_f32({1, 2, 3}, {3})},
                           {"b", make(DType::I64, {2}, std::vector<int64_t>{4, 5})}});
  const std::string bytes = read_bytes(good);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string path = tmp.file("fuzz.safetensors");
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 500; ++iter) {
    std::string b = bytes;
    const int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) b[rng() % (8 + n)] = char(rng());
    write_bytes(path, b);
    try {
      auto f = SafetensorsFile::open(path);
      for (const auto& [name, ti] : f->tensors()) {
        EXPECT_LE(ti.offset + ti.nbytes, b.size());
        Tensor t = f->get(name);
        EXPECT_EQ(t.nbytes(), ti.nbytes);
        uint8_t sum = 0;  // touch every byte of the view
        for (size_t i = 0; i < t.nbytes(); ++i) sum ^= static_cast<const uint8_t*>(t.raw())[i];
        (void)sum;
      }
    } catch (const Error&) {
    }
  }
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir tmp;
  const std::string path = tmp.file("w.safetensors");
  Tensor t = Tensor::from_f32({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_TRUE(throws_error([&] { write_safetensors(path, {{"x", t.narrow(1, 0, 2)}}); },
                           {path, "'x'", "contiguous"}));
  EXPECT_TRUE(throws_error([&] { write_safetensors(path, {{"x", t}, {"x", t}}); },
                           {path, "'x'", "twice"}));
  EXPECT_TRUE(throws_error([&] { write_safetensors(path, {{"u", Tensor()}}); }, {path, "'u'"}));
  EXPECT_TRUE(throws_error([&] { write_safetensors(tmp.file("no/such/dir.st"), {}); },
                           {"no/such/dir.st", "cannot open for writing"}));
}

// ---- Checkpoints ----

TEST(Checkpoint, SingleFile) {
  TempDir tmp;
  write_safetensors(tmp.file("model.safetensors"), {{"w", Tensor::from_f32({1, 2, 3, 4}, {2, 2})},
                                                    {"b", Tensor::from_i32({7}, {1})}});
  const auto ck = dsi::Checkpoint::open(tmp.str());
  EXPECT_EQ(ck.dir(), tmp.str());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_TRUE(ck.has("w"));
  EXPECT_FALSE(ck.has("x"));
  EXPECT_EQ(ck.info("w").shape, (Shape{2, 2}));
  EXPECT_EQ(ck.get("w", {2, 2}).f32()[3], 4.0f);
  EXPECT_EQ(ck.get("b").i32()[0], 7);
}

// Writes shard files and an index with the given weight_map body.
void write_index(const TempDir& tmp, const std::string& weight_map) {
  write_bytes(tmp.file("model.safetensors.index.json"),
              R"({"metadata": {"total_size": 40}, "weight_map": )" + weight_map + "}");
}

TEST(Checkpoint, Sharded) {
  TempDir tmp;
  write_safetensors(tmp.file("model-00001-of-00002.safetensors"),
                    {{"embed", Tensor::from_f32({1, 2, 3, 4, 5, 6}, {3, 2})},
                     {"norm", make(DType::BF16, {2}, std::vector<uint16_t>{0x3f80, 0x4000})}});
  write_safetensors(tmp.file("model-00002-of-00002.safetensors"),
                    {{"head", Tensor::from_f32({7, 8}, {1, 2})},
                     {"ids", Tensor::from_i32({9, 10, 11}, {3})}});
  write_index(tmp, R"({"embed": "model-00001-of-00002.safetensors",
                       "norm": "model-00001-of-00002.safetensors",
                       "head": "model-00002-of-00002.safetensors",
                       "ids": "model-00002-of-00002.safetensors"})");
  // A stray model.safetensors is ignored when the index exists.
  write_bytes(tmp.file("model.safetensors"), "garbage");
  const auto ck = dsi::Checkpoint::open(tmp.str());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"embed", "head", "ids", "norm"}));
  EXPECT_EQ(values<float>(ck.get("embed", {3, 2})), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(values<float>(ck.get("head")), (std::vector<float>{7, 8}));
  EXPECT_EQ(values<int32_t>(ck.get("ids", {3})), (std::vector<int32_t>{9, 10, 11}));
  EXPECT_EQ(bf16_to_f32(values<uint16_t>(ck.get("norm"))[1]), 2.0f);
  EXPECT_EQ(ck.info("head").dtype, DType::F32);
  EXPECT_EQ(ck.info("ids").nbytes, 12u);

  const std::string d = tmp.str();
  EXPECT_TRUE(throws_error([&] { ck.get("embed", {2, 3}); },
                           {d + ": tensor 'embed' has shape [3, 2], expected [2, 3]"}));
  EXPECT_TRUE(throws_error([&] { ck.get("nope"); }, {d + ": missing tensor 'nope'"}));
  EXPECT_TRUE(throws_error([&] { ck.get("nope", {1}); }, {d + ": missing tensor 'nope'"}));
  EXPECT_TRUE(throws_error([&] { ck.info("nope"); }, {d + ": missing tensor 'nope'"}));
}

TEST(Checkpoint, MissingDirOrWeights) {
  TempDir tmp;
  const std::string d = tmp.str();
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); },
                           {d + ": no model.safetensors or model.safetensors.index.json"}));
  const std::string missing = tmp.file("nowhere");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(missing); }, {missing, "does not exist"}));
  write_bytes(tmp.file("plain"), "x");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(tmp.file("plain")); },
                           {tmp.file("plain"), "not a directory"}));
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(""); }, {"empty directory path"}));
  // A broken single file is reported with its path.
  write_bytes(tmp.file("model.safetensors"), "abc");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); }, {tmp.file("model.safetensors")}));
}

TEST(Checkpoint, BadIndex) {
  TempDir tmp;
  write_safetensors(tmp.file("s.safetensors"), {{"w", Tensor::from_f32({1}, {1})}});
  const std::string index = tmp.file("model.safetensors.index.json");
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {"{\"weight_map\": ", "not valid JSON"},
      {"", "not valid JSON"},
      {"[]", "expected an object"},
      {"{\"metadata\": {}}", "missing \"weight_map\""},
      {"{\"weight_map\": []}", "\"weight_map\" is a JSON array"},
      {"{\"weight_map\": {}}", "\"weight_map\" is empty"},
      {"{\"weight_map\": {\"w\": 3}}", "tensor 'w' is a JSON number"},
      {"{\"weight_map\": {\"w\": \"s.safetensors\", \"w\": \"s.safetensors\"}}", "duplicate key"},
  };
  for (const auto& c : cases) {
    write_bytes(index, c.text);
    EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(tmp.str()); }, {index, c.expect}))
        << c.text;
  }
}

TEST(Checkpoint, ShardNamesMustStayInsideDir) {
  TempDir tmp;
  fs::create_directories(tmp.path / "sub");
  write_safetensors(tmp.file("sub/s.safetensors"), {{"w", Tensor::from_f32({1}, {1})}});
  for (const char* shard : {"../s.safetensors", "sub/s.safetensors", "..", ".", "",
                            "/etc/passwd"}) {
    write_index(tmp, std::string("{\"w\": \"") + shard + "\"}");
    EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(tmp.str()); },
                             {"tensor 'w'", "shard '" + std::string(shard) + "'",
                              "not a plain file name"}))
        << shard;
  }
}

TEST(Checkpoint, IndexDisagreesWithShards) {
  TempDir tmp;
  const std::string d = tmp.str();
  write_safetensors(tmp.file("a.safetensors"), {{"x", Tensor::from_f32({1}, {1})}});
  write_safetensors(tmp.file("b.safetensors"), {{"y", Tensor::from_f32({2}, {1})},
                                                {"x", Tensor::from_f32({3}, {1})}});
  // Tensor listed under a shard that lacks it.
  write_index(tmp, R"({"y": "a.safetensors", "x": "a.safetensors"})");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); },
                           {d, "tensor 'y'", "shard 'a.safetensors'", "does not contain it"}));
  // Tensor present in two shards.
  write_index(tmp, R"({"x": "a.safetensors", "y": "b.safetensors"})");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); },
                           {d, "tensor 'x'", "two shards", tmp.file("a.safetensors"),
                            tmp.file("b.safetensors")}));
  // A shard that does not exist, and one that is broken, are reported with their paths.
  write_index(tmp, R"({"x": "a.safetensors", "z": "c.safetensors"})");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); },
                           {tmp.file("c.safetensors"), "cannot open"}));
  write_bytes(tmp.file("c.safetensors"), u64le(1000) + "{}");
  EXPECT_TRUE(throws_error([&] { dsi::Checkpoint::open(d); },
                           {tmp.file("c.safetensors"), "truncated"}));
}

}  // namespace
}  // namespace dsi

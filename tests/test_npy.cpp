// .npy files: round trips of the shapes the CLI writes, and clear errors for files we cannot read.
#include <gtest/gtest.h>

#include <fstream>

#include "core/npy.h"
#include "test_util.h"

namespace dsi {
namespace {

TEST(Npy, RoundTripF32AndI32) {
  test::TempDir d;
  const Tensor a = Tensor::from_f32(test::random_floats(6, 1), {2, 3});
  write_npy(d.path() + "/a.npy", a);
  const Tensor b = read_npy(d.path() + "/a.npy");
  ASSERT_EQ(b.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  const Tensor i = Tensor::from_i32({7, -1, 3}, {3});
  write_npy(d.path() + "/i.npy", i);
  const Tensor j = read_npy(d.path() + "/i.npy");
  EXPECT_EQ(j.dtype(), DType::I32);
  EXPECT_EQ(j.shape(), (Shape{3}));
  EXPECT_EQ(j.i32()[1], -1);
  const Tensor e = Tensor::empty({0, 5}, DType::F32);
  write_npy(d.path() + "/e.npy", e);
  EXPECT_EQ(read_npy(d.path() + "/e.npy").shape(), (Shape{0, 5}));
}

TEST(Npy, HeaderIsNumpyCompatible) {
  test::TempDir d;
  write_npy(d.path() + "/a.npy", Tensor::zeros({4, 2}, DType::F32));
  std::ifstream f(d.path() + "/a.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t hlen = uint8_t(bytes[8]) | size_t(uint8_t(bytes[9])) << 8;
  EXPECT_EQ((10 + hlen) % 64, 0u);  // data aligned to 64 bytes, as NumPy writes
  EXPECT_NE(bytes.find("'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }"),
            std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + hlen + 32);
}

TEST(Npy, BadFilesAreNamed) {
  test::TempDir d;
  const std::string p = d.path() + "/x.npy";
  std::ofstream(p) << "not numpy";
  test::expect_error([&] { read_npy(p); }, {p, "not a .npy file"});
  write_npy(p, Tensor::zeros({8}, DType::F32));
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 4);
  test::expect_error([&] { read_npy(p); }, {p, "truncated"});
  test::expect_error([&] { read_npy(d.path() + "/missing.npy"); }, {"missing.npy", "cannot open"});
}

}  // namespace
}  // namespace dsi

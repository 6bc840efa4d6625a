// .npy reader and writer; see npy.h. Header: magic "\x93NUMPY", version 1.0, u16 header length,
// then a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (a, b), }.
#include "core/npy.h"

#include <cstring>
#include <fstream>

namespace dsi {

void write_npy(const std::string& path, const Tensor& t) {
  DSI_CHECK(t.device().is_cpu() && t.is_contiguous(), "write_npy: {} must be a contiguous host tensor",
            t.desc());
  const char* descr = t.dtype() == DType::F32 ? "<f4" : t.dtype() == DType::I32 ? "<i4" : nullptr;
  DSI_CHECK(descr != nullptr, "write_npy: dtype {} not supported (F32, I32)", dtype_name(t.dtype()));
  std::string shape = "(";
  for (int i = 0; i < t.ndim(); ++i) shape += std::to_string(t.dim(i)) + (t.ndim() == 1 ? "," : i + 1 < t.ndim() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " +
                       shape + ", }";
  // Pad so that magic(6) + version(2) + len(2) + header + '\n' is a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  DSI_CHECK(f.good(), "{}: cannot open for writing", path);
  const uint16_t hlen = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char len_bytes[2] = {char(hlen & 0xff), char(hlen >> 8)};
  f.write(len_bytes, 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  DSI_CHECK(f.good(), "{}: write failed", path);
}

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DSI_CHECK(f.good(), "{}: cannot open", path);
  char magic[10];
  f.read(magic, 10);
  DSI_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  size_t hlen;
  if (magic[6] == 1) {
    hlen = size_t(uint8_t(magic[8])) | size_t(uint8_t(magic[9])) << 8;
  } else {
    char more[2];
    f.read(more, 2);
    hlen = size_t(uint8_t(magic[8])) | size_t(uint8_t(magic[9])) << 8 |
           size_t(uint8_t(more[0])) << 16 | size_t(uint8_t(more[1])) << 24;
  }
  DSI_CHECK(hlen < (1u << 20), "{}: header too long", path);
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  DSI_CHECK(f.good(), "{}: truncated header", path);
  // The header is a Python dict literal; pick out the three keys by hand.
  auto value_of = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    DSI_CHECK(k != std::string::npos, "{}: no '{}' in header", path, key);
    const size_t colon = header.find(':', k);
    DSI_CHECK(colon != std::string::npos, "{}: malformed header", path);
    return header.substr(colon + 1);
  };
  const std::string descr = value_of("descr");
  const size_t q = descr.find('\'');
  const std::string type = q == std::string::npos ? "" : descr.substr(q + 1, 3);
  DSI_CHECK(type == "<f4" || type == "<i4" || type == "|i4", "{}: dtype '{}' is not <f4 or <i4", path,
            type);
  const DType dtype = type[1] == 'f' ? DType::F32 : DType::I32;
  DSI_CHECK(value_of("fortran_order").find("False") < value_of("fortran_order").find(','),
            "{}: Fortran-order arrays are not supported", path);
  const std::string dims = value_of("shape");
  const size_t open = dims.find('('), close = dims.find(')');
  DSI_CHECK(open != std::string::npos && close != std::string::npos && open < close,
            "{}: malformed shape", path);
  Shape shape;
  int64_t cur = -1;
  for (size_t i = open + 1; i <= close; ++i) {
    const char c = dims[i];
    if (c >= '0' && c <= '9') {
      cur = (cur < 0 ? 0 : cur) * 10 + (c - '0');
      DSI_CHECK(cur < (int64_t(1) << 40), "{}: dimension too large", path);
    } else if (c == ',' || c == ')') {
      if (cur >= 0) shape.push_back(cur);
      cur = -1;
    } else {
      DSI_CHECK(c == ' ', "{}: malformed shape", path);
    }
  }
  Tensor t = Tensor::empty(shape, dtype);
  f.read(static_cast<char*>(t.raw()), std::streamsize(t.nbytes()));
  DSI_CHECK(f.gcount() == std::streamsize(t.nbytes()), "{}: truncated data ({} of {} bytes)", path,
            f.gcount(), t.nbytes());
  return t;
}

}  // namespace dsi

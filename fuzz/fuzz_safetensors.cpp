// Fuzzes the safetensors reader (SafetensorsFile::open: length prefix, JSON header, entries, offsets,
// overlaps) and SafetensorsFile::get. The reader maps a file by path, so each input becomes an
// in-memory file (memfd) opened through /proc/self/fd. The first input byte picks the layout:
//   even: the rest is the whole file, length prefix included;
//   odd:  the rest is "<header JSON>[\0<data bytes>]" and the harness writes the correct prefix,
//         so the mutations explore the header rather than the length field.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "model/safetensors.h"

namespace {

// An anonymous in-memory file holding `bytes`, closed on scope exit.
struct MemFile {
  int fd = -1;
  explicit MemFile(const std::string& bytes) {
    fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) dsi::fuzz::die("memfd_create failed", __FILE__, __LINE__);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) dsi::fuzz::die("write to memfd failed", __FILE__, __LINE__);
      done += size_t(n);
    }
  }
  ~MemFile() { ::close(fd); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
};

std::string build_file(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  const char* p = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  if ((data[0] & 1) == 0) return std::string(p, n);
  const void* nul = std::memchr(p, '\0', n);
  const size_t header_len = nul ? size_t(static_cast<const char*>(nul) - p) : n;
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char(uint64_t(header_len) >> (8 * i));
  file.append(p, header_len);
  if (nul) file.append(p + header_len + 1, n - header_len - 1);
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = build_file(data, size);
  const MemFile mem(bytes);
  dsi::fuzz::expect_only_dsi_errors("SafetensorsFile::open", [&] {
    const auto file = dsi::SafetensorsFile::open(mem.path());
    for (const auto& [name, ti] : file->tensors()) {
      // An accepted header never points outside the file.
      DSI_FUZZ_ASSERT(ti.offset <= bytes.size() && ti.nbytes <= bytes.size() - ti.offset);
      DSI_FUZZ_ASSERT(ti.nbytes == 0 || ti.offset >= 8);
      const dsi::Tensor t = file->get(name);
      DSI_FUZZ_ASSERT(size_t(t.nbytes()) == ti.nbytes);
      // The view must hold exactly the file's bytes at the stated offset.
      if (ti.nbytes > 0)
        DSI_FUZZ_ASSERT(std::memcmp(t.raw(), bytes.data() + ti.offset, ti.nbytes) == 0);
    }
  });
  return 0;
}

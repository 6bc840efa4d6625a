// Read-only memory mapping of a file (POSIX open/fstat/mmap); see mapped_file.h.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace dsi {

namespace {
std::string errno_str() { return std::error_code(errno, std::generic_category()).message(); }

// Closes the descriptor on every path out of open(); the mapping does not need it afterwards.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  DSI_CHECK(!path.empty(), "MappedFile::open: empty path");
  // O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears; for
  // regular files it changes nothing, and anything else is rejected below.
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  DSI_CHECK(fd.fd >= 0, "{}: cannot open: {}", path, errno_str());
  struct stat st {};
  DSI_CHECK(::fstat(fd.fd, &st) == 0, "{}: cannot stat: {}", path, errno_str());
  DSI_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path);
  auto file = std::shared_ptr<MappedFile>(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ == 0) return file;  // mmap of length 0 is an error; there is nothing to map
  void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  DSI_CHECK(p != MAP_FAILED, "{}: cannot mmap {} bytes: {}", path, file->size_, errno_str());
  file->ptr_ = p;
  return file;
}

MappedFile::~MappedFile() {
  if (ptr_ != nullptr) ::munmap(ptr_, size_);
}

}  // namespace dsi

// MappedFile: a whole file memory-mapped read-only, as a Storage so tensors can view it in place.
// The mapping is private and read-only; it is unmapped when the last owner goes away.
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"

namespace dsi {

class MappedFile final : public Storage {
 public:
  // Throws dsi::Error naming `path` when it cannot be opened, is not a regular file or cannot be
  // mapped. An empty file maps to data() == nullptr, size() == 0.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile() override;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The bytes are mapped PROT_READ: writing through data() faults.
  void* data() override { return ptr_; }
  const void* data() const { return ptr_; }
  size_t size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dsi

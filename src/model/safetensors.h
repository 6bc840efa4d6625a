// Memory-mapped safetensors files and checkpoints (one file, or shards listed by
// model.safetensors.index.json). Every defect of a file (truncation, a header that lies about
// offsets or sizes, unknown dtypes, overlaps) ends in a dsi::Error naming the file and tensor.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dsi {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t offset = 0;  // byte offset of the tensor's data from the start of the file
  size_t nbytes = 0;
};

// One .safetensors file, memory-mapped read-only. The header is validated fully at open.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A host tensor viewing the mapped bytes (read-only; the view keeps the mapping alive). Data that
  // is not aligned to its element size is copied into an aligned host buffer instead.
  Tensor get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<Storage> mapping_;
  std::map<std::string, TensorInfo> tensors_;
};

// A model directory's weights: model.safetensors, or the shards that
// model.safetensors.index.json names (shards are opened once, at open()).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  // Tensors made on demand instead of read from files (synthetic weights for benchmarks): `infos`
  // lists every tensor; make(info) returns a host tensor of that dtype and shape.
  using Maker = std::function<Tensor(const TensorInfo&)>;
  static Checkpoint synthetic(const std::string& name, std::map<std::string, TensorInfo> infos,
                              Maker make);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const TensorInfo& info(const std::string& name) const;  // throws naming the tensor if missing
  // Throws "<dir>: missing tensor '<name>'" when absent.
  Tensor get(const std::string& name) const;
  // Also checks the shape: "<dir>: tensor '<name>' has shape [..], expected [..]".
  Tensor get(const std::string& name, const Shape& expected) const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  std::map<std::string, TensorInfo> synthetic_;  // synthetic checkpoints: every tensor
  Maker make_;
};

// Writes a safetensors file (used by tests to build good and broken files; `header_override`,
// when non-empty, replaces the JSON header verbatim so tests can write lying headers).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::string& header_override = "");

}  // namespace dsi

// Safetensors reading (mmap + full header validation), sharded checkpoints and a writer; see
// safetensors.h. File bytes are untrusted: every size and offset is checked, without overflow,
// before anything points into the mapping, and every failure is a one-line dsi::Error.
#include "model/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/mapped_file.h"

namespace dsi {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Real headers (and index files) are a few MB at most; the reference implementation uses the
// same limit. Anything larger is corruption, and is refused before any parsing or allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Safetensors headers nest three deep (object, entry, shape); the limit stops "[[[[..." bombs
// from building millions of nested DOM nodes.
constexpr int kMaxJsonDepth = 16;

// Names and parser messages come from the file: keep them printable, short and on one line.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string out;
  for (char c : s.substr(0, kMax)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  if (s.size() > kMax) out += "...";
  return out;
}

// Parses untrusted JSON. nlohmann keeps the last of duplicate keys silently, which would hide a
// second definition of a tensor, so the callback rejects duplicates (and excessive nesting).
json parse_json(const std::string& what, std::string_view text) {
  std::vector<std::set<std::string>> keys;  // keys seen, per open object
  int depth = 0;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    using E = json::parse_event_t;
    if (ev == E::object_start || ev == E::array_start) {
      DSI_CHECK(++depth <= kMaxJsonDepth, "{}: JSON nests deeper than {} levels", what,
                kMaxJsonDepth);
      if (ev == E::object_start) keys.emplace_back();
    } else if (ev == E::object_end || ev == E::array_end) {
      --depth;
      if (ev == E::object_end) keys.pop_back();
    } else if (ev == E::key) {
      const auto& k = parsed.get_ref<const std::string&>();
      DSI_CHECK(keys.back().insert(k).second, "{}: duplicate key '{}' in JSON", what,
                printable(k));
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", what, printable(e.what()));
  }
}

std::string supported_dtypes() {
  std::string out;
  for (int i = 0; i <= int(DType::BOOL); ++i)
    out += (i ? ", " : "") + std::string(dtype_name(DType(i)));
  return out;
}

const json& field(const std::string& where, const json& entry, const char* key) {
  auto it = entry.find(key);
  DSI_CHECK(it != entry.end(), "{}: missing \"{}\"", where, key);
  return *it;
}

// One header entry -> TensorInfo; `where` is "<path>: tensor '<name>'".
TensorInfo parse_entry(const std::string& where, const std::string& name, const json& e,
                       uint64_t data_start, uint64_t data_size) {
  DSI_CHECK(e.is_object(), "{}: entry is a JSON {}, expected an object", where, e.type_name());
  TensorInfo ti;
  ti.name = name;

  const json& dt = field(where, e, "dtype");
  DSI_CHECK(dt.is_string(), "{}: \"dtype\" is a JSON {}, expected a string", where,
            dt.type_name());
  const auto& dt_name = dt.get_ref<const std::string&>();
  DSI_CHECK(dtype_from_name(dt_name, &ti.dtype), "{}: unknown dtype '{}' (supported: {})", where,
            printable(dt_name), supported_dtypes());

  const json& shape = field(where, e, "shape");
  DSI_CHECK(shape.is_array(), "{}: \"shape\" is a JSON {}, expected an array", where,
            shape.type_name());
  for (const json& d : shape) {
    DSI_CHECK(d.is_number_integer(), "{}: \"shape\" holds a JSON {}, expected integers", where,
              d.type_name());
    if (d.is_number_unsigned()) {
      const auto u = d.get<uint64_t>();
      DSI_CHECK(u <= uint64_t(INT64_MAX), "{}: dimension {} is too large", where, u);
      ti.shape.push_back(int64_t(u));
    } else {
      const auto v = d.get<int64_t>();
      DSI_CHECK(v >= 0, "{}: negative dimension {} in shape", where, v);
      ti.shape.push_back(v);
    }
  }
  // Byte count with overflow checks. Every partial product of the nonzero dimensions must fit,
  // not just the total: shape_numel and the stride computation multiply in order.
  uint64_t bytes = dtype_size(ti.dtype);
  bool has_zero = false;
  for (int64_t d : ti.shape) {
    if (d == 0) has_zero = true;
    DSI_CHECK(d == 0 || (!__builtin_mul_overflow(bytes, uint64_t(d), &bytes) &&
                         bytes <= uint64_t(INT64_MAX)),
              "{}: shape {} is too large", where, shape_str(ti.shape));
  }
  if (has_zero) bytes = 0;

  const json& off = field(where, e, "data_offsets");
  DSI_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                off[1].is_number_unsigned(),
            "{}: \"data_offsets\" must be [begin, end] with non-negative integers", where);
  const auto begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  DSI_CHECK(end >= begin, "{}: data_offsets [{}, {}] end before they begin", where, begin, end);
  DSI_CHECK(end - begin == bytes, "{}: data_offsets [{}, {}] span {} bytes, but {} {} needs {}",
            where, begin, end, end - begin, dtype_name(ti.dtype), shape_str(ti.shape), bytes);
  DSI_CHECK(end <= data_size,
            "{}: data_offsets [{}, {}] run past the end of the {}-byte data section "
            "(truncated file?)",
            where, begin, end, data_size);
  ti.offset = size_t(data_start + begin);
  ti.nbytes = size_t(bytes);
  return ti;
}

// Two tensors sharing bytes would alias silently (a write through one changes the other, and a
// header that lies this way usually has other problems); empty tensors own no bytes.
void check_overlaps(const std::string& path, const std::map<std::string, TensorInfo>& tensors,
                    size_t data_start) {
  std::vector<const TensorInfo*> ranges;
  for (const auto& [name, ti] : tensors)
    if (ti.nbytes > 0) ranges.push_back(&ti);
  std::sort(ranges.begin(), ranges.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  const TensorInfo* reach = nullptr;  // the tensor ending furthest so far
  for (const TensorInfo* ti : ranges) {
    if (reach != nullptr) {
      DSI_CHECK(ti->offset >= reach->offset + reach->nbytes,
                "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path,
                printable(reach->name), reach->offset - data_start,
                reach->offset + reach->nbytes - data_start, printable(ti->name),
                ti->offset - data_start, ti->offset + ti->nbytes - data_start);
    }
    if (reach == nullptr || ti->offset + ti->nbytes > reach->offset + reach->nbytes) reach = ti;
  }
}

// Shard names come from the index file: a name with '/' or ".." could reach outside the
// checkpoint directory.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

// model.safetensors.index.json -> weight_map (tensor name -> shard file name), validated.
std::map<std::string, std::string> read_weight_map(const std::string& index) {
  auto file = MappedFile::open(index);
  DSI_CHECK(file->size() <= kMaxHeaderBytes, "{}: {} bytes, over the {}-byte limit", index,
            file->size(), kMaxHeaderBytes);
  const json j =
      parse_json(index, std::string_view(static_cast<const char*>(file->data()), file->size()));
  DSI_CHECK(j.is_object(), "{}: top level is a JSON {}, expected an object", index, j.type_name());
  auto wm = j.find("weight_map");
  DSI_CHECK(wm != j.end(), "{}: missing \"weight_map\"", index);
  DSI_CHECK(wm->is_object(), "{}: \"weight_map\" is a JSON {}, expected an object", index,
            wm->type_name());
  DSI_CHECK(!wm->empty(), "{}: \"weight_map\" is empty", index);
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : wm->items()) {
    DSI_CHECK(shard.is_string(), "{}: weight_map entry for tensor '{}' is a JSON {}, expected "
              "a shard file name", index, printable(name), shard.type_name());
    const auto& s = shard.get_ref<const std::string&>();
    DSI_CHECK(plain_file_name(s), "{}: tensor '{}' maps to shard '{}', which is not a plain file "
              "name inside the checkpoint directory", index, printable(name), printable(s));
    out.emplace(name, s);
  }
  return out;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  DSI_CHECK(!path.empty(), "SafetensorsFile::open: empty path");
  auto map = MappedFile::open(path);
  const auto* bytes = static_cast<const uint8_t*>(map->data());
  const uint64_t size = map->size();
  DSI_CHECK(size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian u64
  // The limit comes first so that 8 + n cannot overflow below.
  DSI_CHECK(n <= kMaxHeaderBytes, "{}: header length {} is over the {}-byte limit (corrupt file?)",
            path, n, kMaxHeaderBytes);
  DSI_CHECK(8 + n <= size,
            "{}: header length {} needs a file of at least {} bytes, but it has {} "
            "(truncated file?)",
            path, n, 8 + n, size);
  const json header =
      parse_json(path, std::string_view(reinterpret_cast<const char*>(bytes + 8), size_t(n)));
  DSI_CHECK(header.is_object(), "{}: header is a JSON {}, expected an object", path,
            header.type_name());

  auto file = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  const uint64_t data_start = 8 + n;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;  // free-form string map; nothing here depends on it
    const std::string where = fmt::format("{}: tensor '{}'", path, printable(name));
    file->tensors_.emplace(name, parse_entry(where, name, entry, data_start, size - data_start));
  }
  check_overlaps(path, file->tensors_, size_t(data_start));
  file->mapping_ = std::move(map);
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  DSI_CHECK(it != tensors_.end(), "{}: missing tensor '{}'", path_, name);
  const TensorInfo& ti = it->second;
  auto* p = static_cast<uint8_t*>(mapping_->data()) + ti.offset;
  // The mapping is page-aligned but data_offsets are only byte-aligned, and typed loads from a
  // misaligned address are undefined behaviour: such tensors get an aligned copy.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(ti.dtype) == 0)
    return Tensor::wrap(p, ti.shape, ti.dtype, Device::cpu(), mapping_);
  Tensor t = Tensor::empty(ti.shape, ti.dtype);
  std::memcpy(t.raw(), p, ti.nbytes);
  return t;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  DSI_CHECK(!dir.empty(), "Checkpoint::open: empty directory path");
  // std::filesystem throws its own exception type; the error_code forms keep failures dsi::Error.
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  DSI_CHECK(st.type() != fs::file_type::not_found, "{}: checkpoint directory does not exist", dir);
  DSI_CHECK(!ec, "{}: cannot access checkpoint directory: {}", dir, ec.message());
  DSI_CHECK(fs::is_directory(st), "{}: not a directory", dir);

  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);
  const std::string index = (root / "model.safetensors.index.json").string();
  const std::string single = (root / "model.safetensors").string();
  if (fs::exists(index, ec)) {
    const auto weight_map = read_weight_map(index);
    std::map<std::string, size_t> shard_ids;  // shard file name -> index into files_
    for (const auto& [tensor, shard] : weight_map) shard_ids.emplace(shard, 0);
    for (auto& [shard, id] : shard_ids) {
      id = ck.files_.size();
      ck.files_.push_back(SafetensorsFile::open((root / shard).string()));
    }
    for (const auto& [tensor, shard] : weight_map) {
      DSI_CHECK(ck.files_[shard_ids.at(shard)]->has(tensor),
                "{}: model.safetensors.index.json puts tensor '{}' in shard '{}', which does not "
                "contain it", dir, printable(tensor), shard);
    }
  } else if (fs::exists(single, ec)) {
    ck.files_.push_back(SafetensorsFile::open(single));
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  // Tensors the index does not list are still served from where they are; a name in two shards
  // is ambiguous.
  for (size_t i = 0; i < ck.files_.size(); ++i) {
    for (const auto& [name, ti] : ck.files_[i]->tensors()) {
      auto [it, added] = ck.where_.emplace(name, i);
      DSI_CHECK(added, "{}: tensor '{}' is in two shards: {} and {}", dir, printable(name),
                ck.files_[it->second]->path(), ck.files_[i]->path());
    }
  }
  return ck;
}

Checkpoint Checkpoint::synthetic(const std::string& name, std::map<std::string, TensorInfo> infos,
                                 Maker make) {
  Checkpoint ck;
  ck.dir_ = name;
  ck.synthetic_ = std::move(infos);
  ck.make_ = std::move(make);
  return ck;
}

bool Checkpoint::has(const std::string& name) const {
  return make_ ? synthetic_.count(name) != 0 : where_.count(name) != 0;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  if (make_) {
    for (const auto& [name, info] : synthetic_) out.push_back(name);
    return out;
  }
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  if (make_) {
    auto it = synthetic_.find(name);
    DSI_CHECK(it != synthetic_.end(), "{}: missing tensor '{}'", dir_, name);
    return it->second;
  }
  auto it = where_.find(name);
  DSI_CHECK(it != where_.end(), "{}: missing tensor '{}'", dir_, name);
  return files_[it->second]->tensors().at(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  if (make_) return make_(info(name));
  auto it = where_.find(name);
  DSI_CHECK(it != where_.end(), "{}: missing tensor '{}'", dir_, name);
  return files_[it->second]->get(name);
}

Tensor Checkpoint::get(const std::string& name, const Shape& expected) const {
  const TensorInfo& ti = info(name);
  DSI_CHECK(ti.shape == expected, "{}: tensor '{}' has shape {}, expected {}", dir_, name,
            shape_str(ti.shape), shape_str(expected));
  return get(name);
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::string& header_override) {
  // ordered_json keeps the entries in layout order, which makes written headers easy to read.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DSI_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(),
              "{}: tensor '{}' must be a defined, contiguous host tensor to be written", path,
              name);
    DSI_CHECK(!h.contains(name), "{}: tensor '{}' given twice", path, name);
    h[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
               {"shape", t.shape()},
               {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string header = header_override;
  if (header.empty()) {
    header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');  // as the reference writer pads
  }
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char(uint64_t(header.size()) >> (8 * i));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DSI_CHECK(out.good(), "{}: cannot open for writing", path);
  out.write(len, 8);
  out.write(header.data(), std::streamsize(header.size()));
  for (const auto& [name, t] : tensors)
    out.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  out.close();
  DSI_CHECK(!out.fail(), "{}: write failed", path);
}

}  // namespace dsi

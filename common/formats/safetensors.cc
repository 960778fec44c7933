// safetensors parsing. A file is: u64 little-endian header length N, N bytes of JSON
//   {"<tensor>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>"}}
// and then the data section; offsets are relative to its start. Nothing in the header is
// trusted: N is checked against the file size and a 100 MiB cap, the JSON nesting depth is
// bounded before parsing, duplicate keys are refused, every dimension must be a non-negative
// integer whose product (and byte size) fits in int64, the byte range must lie inside the data
// section and match numel * element size, and no two non-empty ranges may overlap.
// A sharded checkpoint's index.json maps tensor -> shard file; shard names must be plain file
// names in the same folder (no '/', '\', '..' or NUL), and each shard is mapped once.
#include "common/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace moeshard {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr int kMaxJsonDepth = 8;  // a valid header needs 3 (object, entry, shape array)
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kMetadataKey[] = "__metadata__";

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Deepest nesting of {} / [] outside string literals (a cheap bound before the real parse).
int JsonDepth(absl::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// Parses JSON without exceptions; refuses deep nesting and duplicate keys in any object.
absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view where) {
  if (JsonDepth(text) > kMaxJsonDepth) {
    return Invalid(where, absl::StrCat("JSON nested deeper than ", kMaxJsonDepth, " levels"));
  }
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  bool has_duplicate = false;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty() && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second && !has_duplicate) {
        has_duplicate = true;
        duplicate = key;
      }
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(where, "malformed JSON");
  if (has_duplicate) return Invalid(where, absl::StrCat("duplicate JSON key '", duplicate, "'"));
  return j;
}

// A JSON integer in [0, INT64_MAX].
bool AsNonNegativeInt(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

struct ByteRange {
  uint64_t begin, end;
  const std::string* name;
};

// Fills `t` (name, dtype, shape, nbytes, data) from one header entry.
absl::Status ParseEntry(const std::string& name, const json& e, const uint8_t* data,
                        uint64_t data_size, absl::string_view where, TensorInfo* t,
                        ByteRange* range) {
  auto bad = [&](absl::string_view what) {
    return Invalid(where, absl::StrCat("tensor '", name, "': ", what));
  };
  if (!e.is_object()) return bad("entry is not a JSON object");
  auto dtype_it = e.find("dtype"), shape_it = e.find("shape"), offsets_it = e.find("data_offsets");
  if (dtype_it == e.end() || !dtype_it->is_string()) return bad("missing or non-string 'dtype'");
  if (shape_it == e.end() || !shape_it->is_array()) return bad("missing or non-array 'shape'");
  if (offsets_it == e.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return bad("'data_offsets' must be an array of two integers");
  }
  absl::StatusOr<DType> dtype = DTypeFromSafetensors(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) return bad(dtype.status().message());
  t->name = name;
  t->dtype = *dtype;
  uint64_t numel = 1;
  for (const json& d : *shape_it) {
    int64_t dim;
    if (!AsNonNegativeInt(d, &dim)) return bad(absl::StrCat("bad dimension ", d.dump()));
    uint64_t product;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &product) ||
        product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad("element count overflows int64");
    }
    numel = product;
    t->shape.push_back(dim);
  }
  absl::StatusOr<uint64_t> nbytes = DTypeBytes(t->dtype, numel);
  if (!nbytes.ok()) return bad(nbytes.status().message());
  int64_t begin, end;
  if (!AsNonNegativeInt((*offsets_it)[0], &begin) || !AsNonNegativeInt((*offsets_it)[1], &end)) {
    return bad("'data_offsets' must be non-negative integers");
  }
  if (begin > end) return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
  if (static_cast<uint64_t>(end) > data_size) {
    return bad(absl::StrCat("data_offsets end ", end, " is past the data section (", data_size,
                            " bytes)"));
  }
  if (static_cast<uint64_t>(end - begin) != *nbytes) {
    return bad(absl::StrCat("data_offsets span ", end - begin, " bytes but shape and dtype need ",
                            *nbytes));
  }
  t->nbytes = *nbytes;
  t->data = data + begin;
  *range = {static_cast<uint64_t>(begin), static_cast<uint64_t>(end), &t->name};
  return absl::OkStatus();
}

// A shard name from index.json must name a file directly inside the checkpoint folder.
absl::Status CheckShardName(const std::string& shard, const std::string& index_path) {
  if (shard.empty() || shard.find('/') != std::string::npos ||
      shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos ||
      absl::StrContains(shard, "..") || shard == ".") {
    return Invalid(index_path, absl::StrCat("shard name '", shard,
                                            "' is not a plain file name in the checkpoint folder"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint64_t size = file->size();
  if (size < 8) return Invalid(path, "file too short for the 8-byte header length");
  const uint64_t header_bytes = LoadLe64(file->data());
  if (header_bytes > kMaxHeaderBytes) {
    return Invalid(path, absl::StrCat("header length ", header_bytes, " exceeds the limit of ",
                                      kMaxHeaderBytes, " bytes"));
  }
  if (header_bytes > size - 8) {
    return Invalid(path, absl::StrCat("header length ", header_bytes,
                                      " runs past the end of the file (", size, " bytes)"));
  }
  absl::string_view text(reinterpret_cast<const char*>(file->data()) + 8, header_bytes);
  ASSIGN_OR_RETURN(json header, ParseJson(text, path));
  if (!header.is_object()) return Invalid(path, "header is not a JSON object");

  const uint8_t* data = file->data() + 8 + header_bytes;
  const uint64_t data_size = size - 8 - header_bytes;
  std::unique_ptr<SafetensorsCheckpoint> ckpt(new SafetensorsCheckpoint());
  std::vector<ByteRange> ranges;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return Invalid(path, "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return Invalid(path, absl::StrCat("__metadata__ value of '", mk, "' is not a string"));
        }
        ckpt->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    TensorInfo& t = ckpt->tensors_[key];
    ByteRange range;
    RETURN_IF_ERROR(ParseEntry(key, value, data, data_size, path, &t, &range));
    if (range.end > range.begin) ranges.push_back(range);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return Invalid(path, absl::StrCat("tensors '", *ranges[i - 1].name, "' and '",
                                        *ranges[i].name, "' overlap in the data section"));
    }
  }
  ckpt->files_.push_back(std::move(file));
  return ckpt;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  std::string index_path;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / kIndexFile, ec)) {
      index_path = (p / kIndexFile).string();
    } else if (fs::exists(p / kSingleFile, ec)) {
      return OpenFile((p / kSingleFile).string());
    } else {
      return absl::NotFoundError(
          absl::StrCat(path, ": folder holds neither ", kIndexFile, " nor ", kSingleFile));
    }
  } else if (absl::EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    return OpenFile(path);
  }

  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  if (text.size() > kMaxHeaderBytes) return Invalid(index_path, "index file too large");
  ASSIGN_OR_RETURN(json index, ParseJson(text, index_path));
  if (!index.is_object()) return Invalid(index_path, "index is not a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return Invalid(index_path, "missing or non-object 'weight_map'");
  }
  if (map_it->empty()) return Invalid(index_path, "'weight_map' names no tensors");
  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return Invalid(index_path, absl::StrCat("shard of tensor '", tensor, "' is not a string"));
    }
    const std::string& shard_name = shard.get_ref<const std::string&>();
    RETURN_IF_ERROR(CheckShardName(shard_name, index_path));
    tensors_by_shard[shard_name].push_back(tensor);
  }

  const fs::path dir = fs::path(index_path).parent_path();
  std::unique_ptr<SafetensorsCheckpoint> ckpt(new SafetensorsCheckpoint());
  bool first = true;
  for (auto& [shard_name, names] : tensors_by_shard) {
    const std::string shard_path = (dir / shard_name).string();
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> shard, OpenFile(shard_path));
    for (const std::string& name : names) {
      auto it = shard->tensors_.find(name);
      if (it == shard->tensors_.end()) {
        return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", name, "' is not in ",
                                                "shard ", shard_name, " where the index puts it"));
      }
      ckpt->tensors_.emplace(name, std::move(it->second));
    }
    if (first) ckpt->metadata_ = std::move(shard->metadata_);
    first = false;
    // The mapping (and so every data pointer) moves along with the MappedFile.
    for (auto& f : shard->files_) ckpt->files_.push_back(std::move(f));
  }
  return ckpt;
}

const TensorInfo* SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

absl::Status WriteSafetensors(const std::string& file, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey || !seen.insert(t.name).second) {
      return Invalid(file,
                     absl::StrCat("tensor name '", t.name, "' is empty, reserved or repeated"));
    }
    const std::string dtype_name(DTypeName(t.dtype));
    if (!DTypeFromSafetensors(dtype_name).ok()) {
      return Invalid(file, absl::StrCat("tensor '", t.name, "': dtype ", dtype_name,
                                        " has no safetensors name"));
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        return Invalid(file, absl::StrCat("tensor '", t.name, "': bad shape"));
      }
    }
    ASSIGN_OR_RETURN(uint64_t nbytes, DTypeBytes(t.dtype, numel));
    if (nbytes != t.bytes.size()) {
      return Invalid(file, absl::StrCat("tensor '", t.name, "': shape needs ", nbytes,
                                        " bytes, got ", t.bytes.size()));
    }
    header[t.name] = {
        {"dtype", dtype_name}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // names that are not valid UTF-8
    return Invalid(file, absl::StrCat("cannot encode header: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", file));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(t.bytes.data(), static_cast<std::streamsize>(t.bytes.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("error writing ", file));
  return absl::OkStatus();
}

}  // namespace moeshard

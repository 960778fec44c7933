// GGUF parsing. Layout (all little-endian):
//   "GGUF" | u32 version (2 or 3) | u64 tensor count | u64 kv count
//   kv pairs:     string key | u32 value type | value
//   tensor infos: string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset
//   padding to general.alignment (default 32), then the data section.
// A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
// The parser reads through a bounds-checked cursor: every count or length is compared with
// the bytes that remain before anything is allocated, so a hostile count fails at once.
// Tensor offsets are relative to the data section, must be multiples of the alignment, and
// [offset, offset + nbytes) must lie inside the section; nbytes comes from the row length
// ne[0] (a multiple of 32 for block types). Shapes are exposed reversed (outermost first).
#include "common/formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/formats/gguf_reader.h"
#include "common/status.h"

namespace moeshard {
namespace {

using gguf_internal::Reader;
using gguf_internal::ReadValue;

static_assert(std::endian::native == std::endian::little,
              "GGUF reader assumes a little-endian host");

constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

bool DTypeFromGgml(uint32_t ggml_type, DType* out) {
  switch (ggml_type) {
    case 0: *out = DType::kF32; return true;
    case 1: *out = DType::kF16; return true;
    case 8: *out = DType::kQ8_0; return true;
    case 24: *out = DType::kI8; return true;
    case 25: *out = DType::kI16; return true;
    case 26: *out = DType::kI32; return true;
    case 27: *out = DType::kI64; return true;
    case 28: *out = DType::kF64; return true;
    case 30: *out = DType::kBF16; return true;
    case 39: *out = DType::kMXFP4; return true;
    default: return false;
  }
}

absl::string_view KindName(GgufValue::Kind k) {
  switch (k) {
    case GgufValue::Kind::kInt: return "int";
    case GgufValue::Kind::kFloat: return "float";
    case GgufValue::Kind::kBool: return "bool";
    case GgufValue::Kind::kString: return "string";
    case GgufValue::Kind::kIntArray: return "int array";
    case GgufValue::Kind::kFloatArray: return "float array";
    case GgufValue::Kind::kBoolArray: return "bool array";
    case GgufValue::Kind::kStringArray: return "string array";
  }
  return "?";
}

struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;  // innermost first, as stored
  uint64_t numel = 1;
  uint32_t ggml_type = 0;
  uint64_t offset = 0;
};

absl::Status ReadTensorInfo(Reader& r, RawTensor* t) {
  RETURN_IF_ERROR(r.ReadString(&t->name, "tensor name"));
  if (t->name.empty()) return absl::InvalidArgumentError("empty tensor name");
  const std::string what = absl::StrCat("tensor '", t->name, "'");
  uint32_t n_dims;
  RETURN_IF_ERROR(r.Read(&n_dims, what));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", n_dims, " dimensions (1 to ", kMaxDims, " allowed)"));
  }
  t->ne.resize(n_dims);
  for (uint64_t& d : t->ne) {
    RETURN_IF_ERROR(r.Read(&d, what));
    if (__builtin_mul_overflow(t->numel, d, &t->numel) || t->numel > kInt64Max) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": element count overflows int64"));
    }
  }
  RETURN_IF_ERROR(r.Read(&t->ggml_type, what));
  return r.Read(&t->offset, what);
}

absl::Status ParseGguf(const MappedFile& file, uint32_t* version,
                       std::map<std::string, GgufValue>* kv,
                       std::map<std::string, TensorInfo>* tensors,
                       std::map<std::string, uint32_t>* unsupported) {
  Reader r(file.data(), file.size());
  char magic[4];
  RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError("not a GGUF file (bad magic)");
  }
  RETURN_IF_ERROR(r.Read(version, "version"));
  if (*version == 0x02000000u || *version == 0x03000000u) {
    return absl::InvalidArgumentError("big-endian GGUF files are not supported");
  }
  if (*version != 2 && *version != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF version ", *version, " is not supported (only 2 and 3)"));
  }
  uint64_t num_tensors, num_kv;
  RETURN_IF_ERROR(r.Read(&num_tensors, "tensor count"));
  RETURN_IF_ERROR(r.Read(&num_kv, "kv count"));
  // A kv pair takes at least 8 + 4 + 1 bytes, a tensor info at least 8 + 4 + 8 + 4 + 8.
  if (num_kv > r.remaining() / 13) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv count ", num_kv, " exceeds what the file can hold"));
  }
  if (num_tensors > r.remaining() / 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor count ", num_tensors, " exceeds what the file can hold"));
  }
  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(r.ReadString(&key, "metadata key"));
    if (key.empty()) return absl::InvalidArgumentError("empty metadata key");
    if (kv->count(key) != 0)
      return absl::InvalidArgumentError(absl::StrCat("duplicate key '", key, "'"));
    uint32_t type;
    RETURN_IF_ERROR(r.Read(&type, key));
    GgufValue value;
    RETURN_IF_ERROR(ReadValue(r, type, key, &value));
    kv->emplace(std::move(key), std::move(value));
  }

  std::vector<RawTensor> raw(num_tensors);
  std::set<absl::string_view> names;
  for (RawTensor& t : raw) {
    RETURN_IF_ERROR(ReadTensorInfo(r, &t));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor '", t.name, "'"));
    }
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto it = kv->find("general.alignment"); it != kv->end()) {
    const GgufValue& a = it->second;
    if (a.kind != GgufValue::Kind::kInt || a.i <= 0 || static_cast<uint64_t>(a.i) > kMaxAlignment ||
        !std::has_single_bit(static_cast<uint64_t>(a.i))) {
      return absl::InvalidArgumentError("general.alignment must be a power of two up to 2^30");
    }
    alignment = static_cast<uint64_t>(a.i);
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  if (data_start > file.size() && !raw.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("truncated: data section would start at ",
                                                   data_start, " past the end (", file.size(),
                                                   ")"));
  }
  const uint64_t data_size = data_start > file.size() ? 0 : file.size() - data_start;

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (RawTensor& t : raw) {
    const std::string what = absl::StrCat("tensor '", t.name, "'");
    if (t.offset % alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": offset ", t.offset, " is not a multiple of the alignment ", alignment));
    }
    if (t.offset > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": offset ", t.offset, " is past the data section (", data_size, " bytes)"));
    }
    DType dtype;
    if (!DTypeFromGgml(t.ggml_type, &dtype)) {
      unsupported->emplace(t.name, t.ggml_type);
      continue;
    }
    uint64_t nbytes = 0;
    if (t.numel > 0) {
      absl::StatusOr<uint64_t> row_bytes = DTypeBytes(dtype, t.ne[0]);
      if (!row_bytes.ok())
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", row_bytes.status().message()));
      if (__builtin_mul_overflow(*row_bytes, t.numel / t.ne[0], &nbytes)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": byte size overflows"));
      }
    }
    if (nbytes > data_size - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", nbytes, " bytes at offset ",
                                                     t.offset, " run past the data section (",
                                                     data_size, " bytes)"));
    }
    TensorInfo info;
    info.name = t.name;
    info.dtype = dtype;
    info.shape.assign(t.ne.rbegin(), t.ne.rend());
    info.data = file.data() + data_start + t.offset;
    info.nbytes = nbytes;
    auto [it, inserted] = tensors->emplace(t.name, std::move(info));
    if (nbytes > 0) ranges.push_back({t.offset, t.offset + nbytes, &it->first});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors '", *ranges[i - 1].name, "' and '", *ranges[i].name, "' overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  std::unique_ptr<GgufFile> g(new GgufFile());
  absl::Status st = ParseGguf(*file, &g->version_, &g->kv_, &g->tensors_, &g->unsupported_);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  g->file_ = std::move(file);
  return g;
}

const TensorInfo* GgufFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> GgufFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

absl::Status GgufFile::TensorStatus(const std::string& name) const {
  if (tensors_.count(name) != 0) return absl::OkStatus();
  if (auto it = unsupported_.find(name); it != unsupported_.end()) {
    return absl::UnimplementedError(
        absl::StrCat("unsupported ggml type ", it->second, " for tensor ", name));
  }
  return absl::NotFoundError(absl::StrCat("no tensor ", name));
}

const GgufValue* GgufFile::Get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

// The value of `key` when its kind is one of `kinds`, else NotFound / InvalidArgument.
absl::StatusOr<const GgufValue*> Lookup(const GgufFile& g, const std::string& key,
                                        std::initializer_list<GgufValue::Kind> kinds,
                                        absl::string_view wanted) {
  const GgufValue* v = g.Get(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("GGUF key '", key, "' is missing"));
  if (std::find(kinds.begin(), kinds.end(), v->kind) == kinds.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF key '", key, "' holds a ", KindName(v->kind), ", not a ", wanted));
  }
  return v;
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key, {GgufValue::Kind::kInt}, "int"));
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v,
                   Lookup(*this, key, {GgufValue::Kind::kFloat, GgufValue::Kind::kInt}, "float"));
  return v->kind == GgufValue::Kind::kInt ? static_cast<double>(v->i) : v->f;
}

absl::StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key, {GgufValue::Kind::kBool}, "bool"));
  return v->b;
}

absl::StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key, {GgufValue::Kind::kString}, "string"));
  return v->s;
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(
    const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v,
                   Lookup(*this, key, {GgufValue::Kind::kStringArray}, "string array"));
  return &v->strings;
}

absl::StatusOr<const std::vector<int64_t>*> GgufFile::GetIntArray(const std::string& key) const {
  ASSIGN_OR_RETURN(
      const GgufValue* v,
      Lookup(*this, key, {GgufValue::Kind::kIntArray, GgufValue::Kind::kBoolArray}, "int array"));
  return &v->ints;
}

}  // namespace moeshard

// Helpers shared by the format tests: a self-deleting temp folder, raw file writing, the
// testdata folder, little-endian byte builders and a tiny GGUF writer whose every field can be
// overridden, so the malformed-input corpus can break one thing at a time.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/testdata/testdata_dir.h"

namespace moeshard::test {

// A fresh folder under the system temp folder, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moeshard_fmt_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string Path(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

inline bool WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return static_cast<bool>(out);
}

// The test models (tests/testdata/testdata_dir.h); a missing folder fails the tests that use it.
inline std::string TestdataDir() { return TestDataDir(); }

// ---- little-endian byte building ----
inline void PutLe(std::string* out, uint64_t v, int num_bytes) {
  for (int i = 0; i < num_bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline std::string U32(uint32_t v) {
  std::string s;
  PutLe(&s, v, 4);
  return s;
}
inline std::string U64(uint64_t v) {
  std::string s;
  PutLe(&s, v, 8);
  return s;
}
inline std::string GgufStr(std::string_view s) { return U64(s.size()) + std::string(s); }

// GGUF metadata value types.
enum : uint32_t {
  kGU8 = 0,
  kGI8 = 1,
  kGU16 = 2,
  kGI16 = 3,
  kGU32 = 4,
  kGI32 = 5,
  kGF32 = 6,
  kGBool = 7,
  kGString = 8,
  kGArray = 9,
  kGU64 = 10,
  kGI64 = 11,
  kGF64 = 12,
};
// ggml tensor types used by the tests.
enum : uint32_t {
  kGgmlF32 = 0,
  kGgmlF16 = 1,
  kGgmlQ8_0 = 8,
  kGgmlQ4_K = 12,
  kGgmlBF16 = 30,
  kGgmlMXFP4 = 39
};

// One encoded kv pair: key, u32 type, then `payload` as given.
inline std::string Kv(std::string_view key, uint32_t type, std::string_view payload) {
  return GgufStr(key) + U32(type) + std::string(payload);
}
inline std::string KvString(std::string_view key, std::string_view v) {
  return Kv(key, kGString, GgufStr(v));
}
inline std::string KvU32(std::string_view key, uint32_t v) { return Kv(key, kGU32, U32(v)); }
inline std::string KvF32(std::string_view key, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return Kv(key, kGF32, U32(u));
}
inline std::string KvStringArray(std::string_view key, const std::vector<std::string>& v) {
  std::string p = U32(kGString) + U64(v.size());
  for (const std::string& s : v) p += GgufStr(s);
  return Kv(key, kGArray, p);
}
inline std::string KvI32Array(std::string_view key, const std::vector<int32_t>& v) {
  std::string p = U32(kGI32) + U64(v.size());
  for (int32_t x : v) PutLe(&p, static_cast<uint32_t>(x), 4);
  return Kv(key, kGArray, p);
}

struct GgufTensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // innermost first, as GGUF stores it
  uint32_t type = kGgmlF32;
  std::string data;
  std::optional<uint32_t> n_dims;  // override of ne.size() (ne is still written in full)
  std::optional<uint64_t> offset;  // override of the computed offset (data stays in place)
};

struct GgufSpec {
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::vector<std::string> kvs;  // encoded pairs (see Kv*)
  std::vector<GgufTensorSpec> tensors;
  std::optional<uint64_t> kv_count, tensor_count;  // overrides of the real counts
  uint64_t alignment = 32;  // padding the writer uses; general.alignment is a kv of its own
};

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Header, kvs, tensor infos, padding, then each tensor's data at its aligned offset. The file
// ends with the last tensor's data (no trailing padding), so any truncation loses data.
inline std::string BuildGguf(const GgufSpec& spec) {
  std::string out = spec.magic + U32(spec.version);
  out += U64(spec.tensor_count.value_or(spec.tensors.size()));
  out += U64(spec.kv_count.value_or(spec.kvs.size()));
  for (const std::string& kv : spec.kvs) out += kv;
  std::vector<uint64_t> offsets;
  uint64_t end = 0;
  for (const GgufTensorSpec& t : spec.tensors) {
    offsets.push_back(AlignUp(end, spec.alignment));
    end = offsets.back() + t.data.size();
    out += GgufStr(t.name) + U32(t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
    for (uint64_t d : t.ne) out += U64(d);
    out += U32(t.type) + U64(t.offset.value_or(offsets.back()));
  }
  out.resize(AlignUp(out.size(), spec.alignment), '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    out += spec.tensors[i].data;
  }
  return out;
}

inline std::string Bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 7 * i);
  return s;
}

// A valid little file: kvs of most kinds and one tensor of each supported type plus a Q4_K
// tensor (type 12, unsupported). Tensors: f32 ne {3,2}, q4k ne {256}, f16 ne {4},
// bf16 ne {2,2}, mxfp4 ne {32,2}, q8 ne {32,3} (last, so cutting the file cuts its data).
inline GgufSpec TinyGgufSpec() {
  GgufSpec s;
  s.kvs = {
      KvString("general.architecture", "tiny"),
      KvU32("general.alignment", 32),
      KvU32("tiny.block_count", 2),
      Kv("tiny.neg", kGI32, U32(static_cast<uint32_t>(-5))),
      Kv("tiny.big", kGU64, U64(uint64_t{1} << 40)),
      Kv("tiny.small", kGU8, std::string(1, '\x07')),
      KvF32("tiny.eps", 0.5f),
      Kv("tiny.f64", kGF64, U64(0x3FD0000000000000ull)),  // 0.25
      Kv("tiny.flag", kGBool, std::string(1, '\x01')),
      KvStringArray("tokenizer.ggml.tokens", {"a", "bc", ""}),
      KvI32Array("tokenizer.ggml.token_type", {1, -2, 3}),
      Kv("tiny.bools", kGArray, U32(kGBool) + U64(2) + std::string("\x01\x00", 2)),
      Kv("tiny.floats", kGArray, U32(kGF32) + U64(1) + U32(0x3F800000)),  // {1.0}
  };
  s.tensors = {
      {"f32", {3, 2}, kGgmlF32, Bytes(24, 1), {}, {}},
      {"q4k", {256}, kGgmlQ4_K, Bytes(144, 2), {}, {}},
      {"f16", {4}, kGgmlF16, Bytes(8, 3), {}, {}},
      {"bf16", {2, 2}, kGgmlBF16, Bytes(8, 4), {}, {}},
      {"mxfp4", {32, 2}, kGgmlMXFP4, Bytes(34, 5), {}, {}},
      {"q8", {32, 3}, kGgmlQ8_0, Bytes(102, 6), {}, {}},
  };
  return s;
}

}  // namespace moeshard::test

// Malformed-input corpus: small valid safetensors and GGUF files are generated, then broken one
// thing at a time (truncation at every byte, hostile lengths and counts, bad types, offsets,
// JSON, index files). Every variant must be refused with a status, never a crash; run under
// ASan+UBSan (-DMOESHARD_SANITIZE=ON) to also catch out-of-bounds reads and overflow.
// Where a case names `expect`, the message must contain it, proving the intended check fired.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/gguf.h"
#include "common/formats/safetensors.h"
#include "gtest/gtest.h"
#include "tests/formats/format_test_util.h"

namespace moeshard {
namespace {

using test::GgufSpec;
using test::TempDir;
using test::U32;
using test::U64;

struct Case {
  std::string name;         // what was broken
  std::string bytes;        // the whole file
  std::string expect = "";  // substring of the error message ("" = any)
};

enum class Format { kSafetensors, kGguf };

absl::Status OpenAs(Format format, const std::string& path) {
  if (format == Format::kGguf) return GgufFile::Open(path).status();
  return SafetensorsCheckpoint::OpenFile(path).status();
}

void ExpectAllRefused(Format format, const std::vector<Case>& cases) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Path("case.bin");
  for (const Case& c : cases) {
    ASSERT_TRUE(test::WriteFile(path, c.bytes)) << c.name;
    absl::Status st = OpenAs(format, path);
    EXPECT_FALSE(st.ok()) << "case '" << c.name << "' was accepted";
    EXPECT_FALSE(st.message().empty()) << "case '" << c.name << "' has an empty message";
    if (!c.expect.empty()) {
      EXPECT_NE(st.message().find(c.expect), std::string_view::npos)
          << "case '" << c.name << "': expected '" << c.expect << "' in: " << st.message();
    }
  }
}

// Every prefix of `valid` shorter than the whole file.
std::vector<Case> Truncations(const std::string& valid) {
  std::vector<Case> cases;
  for (size_t cut = 0; cut < valid.size(); ++cut) {
    cases.push_back({"truncated to " + std::to_string(cut) + " bytes", valid.substr(0, cut)});
  }
  return cases;
}

// Every single-byte corruption (each byte set to 0xff, then to 0x00) of `valid`. Many stay
// valid files; whatever opens must keep every tensor's bytes readable (touched here, so a bad
// range crashes the test under the sanitizers or not).
void ExpectByteFlipsAreSafe(Format format, const std::string& valid) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Path("flip.bin");
  int num_accepted = 0;
  for (size_t i = 0; i < valid.size(); ++i) {
    for (char value : {'\xff', '\0'}) {
      if (valid[i] == value) continue;
      std::string bytes = valid;
      bytes[i] = value;
      ASSERT_TRUE(test::WriteFile(path, bytes));
      std::unique_ptr<TensorSource> source;
      if (format == Format::kGguf) {
        auto g = GgufFile::Open(path);
        if (g.ok()) source = std::move(*g);
      } else {
        auto st = SafetensorsCheckpoint::OpenFile(path);
        if (st.ok()) source = std::move(*st);
      }
      if (source == nullptr) continue;
      ++num_accepted;
      for (const std::string& name : source->Names()) {
        const TensorInfo* t = source->Find(name);
        ASSERT_NE(t, nullptr) << name;
        if (t->nbytes == 0) continue;
        volatile uint8_t sink = t->data[0];  // volatile: the reads must happen
        sink = t->data[t->nbytes - 1];
        (void)sink;
      }
    }
  }
  EXPECT_GT(num_accepted, 0) << "flipping data bytes should leave some files valid";
}

// ---------------------------------------------------------------- safetensors

const char kHeader[] = R"({"__metadata__":{"format":"pt"},)"
                       R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
                       R"("s":{"dtype":"F32","shape":[],"data_offsets":[32,36]}})";
const std::string kData = test::Bytes(36, 3);

std::string St(std::string_view header, const std::string& data = kData) {
  return U64(header.size()) + std::string(header) + data;
}

// kHeader with the first `from` replaced by `to` (which must occur).
std::string Edit(std::string_view from, std::string_view to) {
  std::string h = kHeader;
  const size_t at = h.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) h.replace(at, from.size(), to);
  return St(h);
}

TEST(MalformedSafetensorsTest, ValidBaseFileOpens) {
  TempDir dir;
  ASSERT_TRUE(test::WriteFile(dir.Path("ok.safetensors"), St(kHeader)));
  auto ckpt = SafetensorsCheckpoint::OpenFile(dir.Path("ok.safetensors"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), 3u);
}

TEST(MalformedSafetensorsTest, TruncatedAtEveryByte) {
  ExpectAllRefused(Format::kSafetensors, Truncations(St(kHeader)));
}

TEST(MalformedSafetensorsTest, ByteFlipsNeverCrash) {
  ExpectByteFlipsAreSafe(Format::kSafetensors, St(kHeader));
}

TEST(MalformedSafetensorsTest, BrokenHeaderFields) {
  const std::string body = std::string(kHeader) + kData;
  const std::string deep(100000, '[');
  // clang-format off
  ExpectAllRefused(Format::kSafetensors, {
      {"header length 2^63", U64(uint64_t{1} << 63) + body, "limit"},
      {"header length 2^64-1", U64(~uint64_t{0}) + body, "limit"},
      {"header length 100 MiB + 1", U64((100u << 20) + 1) + body, "limit"},
      {"header length one past the file", U64(body.size() + 1) + body, "past the end"},
      {"header length 0", U64(0) + body, "malformed JSON"},
      {"header length cuts the JSON", U64(20) + body, "malformed JSON"},
      {"empty file", "", "too short"},
      {"7-byte file", std::string(7, '\0'), "too short"},
      {"JSON cut short", St(R"({"a":)"), "malformed JSON"},
      {"JSON trailing garbage", St(std::string(kHeader) + "x"), "malformed JSON"},
      {"JSON invalid UTF-8",
       St("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}"), "malformed JSON"},
      {"JSON nested 100000 deep", St(deep + std::string(100000, ']')), "deeper"},
      {"JSON unbalanced deep nesting", St(deep), "deeper"},
      {"header is an array", St("[]"), "not a JSON object"},
      {"header is null", St("null"), "not a JSON object"},
      {"header is a number", St("1234"), "not a JSON object"},
      {"duplicate tensor name", Edit(R"("b":)", R"("a":)"), "duplicate"},
      {"entry is a number", Edit(R"("s":{"dtype":"F32","shape":[],"data_offsets":[32,36]})",
                                 R"("s":5)"), "not a JSON object"},
      {"dtype missing", Edit(R"("dtype":"BF16",)", ""), "dtype"},
      {"dtype not a string", Edit(R"("BF16")", "16"), "dtype"},
      {"dtype unknown", Edit(R"("BF16")", R"("BF17")"), "BF17"},
      {"dtype lowercase", Edit(R"("BF16")", R"("bf16")"), "bf16"},
      {"dtype is a GGUF block type", Edit(R"("BF16")", R"("Q8_0")"), "Q8_0"},
      {"shape missing", Edit(R"("shape":[4],)", ""), "shape"},
      {"shape not an array", Edit("[4]", "4"), "shape"},
      {"shape negative", Edit("[2,3]", "[-2,-3]"), "dimension"},
      {"shape fractional", Edit("[2,3]", "[2.0,3]"), "dimension"},
      {"shape string", Edit("[2,3]", R"(["2",3])"), "dimension"},
      {"shape null entry", Edit("[2,3]", "[null,3]"), "dimension"},
      {"shape 2^63", Edit("[2,3]", "[9223372036854775808,1]"), "dimension"},
      {"shape 2^64", Edit("[2,3]", "[18446744073709551616,1]"), "dimension"},
      {"shape product overflows", Edit("[2,3]", "[4294967296,4294967296]"), "overflow"},
      {"shape product overflows int64", Edit("[2,3]", "[3037000500,3037000500]"), "overflow"},
      {"shape bytes overflow", Edit("[2,3]", "[4611686018427387904]"), ""},
      {"offsets missing", Edit(R"(,"data_offsets":[0,24])", ""), "data_offsets"},
      {"offsets one entry", Edit("[0,24]", "[0]"), "data_offsets"},
      {"offsets three entries", Edit("[0,24]", "[0,24,24]"), "data_offsets"},
      {"offsets object", Edit("[0,24]", R"({"b":0})"), "data_offsets"},
      {"offsets negative", Edit("[0,24]", "[-24,0]"), "data_offsets"},
      {"offsets fractional", Edit("[0,24]", "[0.5,24]"), "data_offsets"},
      {"offsets strings", Edit("[0,24]", R"(["0","24"])"), "data_offsets"},
      {"offsets reversed", Edit("[0,24]", "[24,0]"), "reversed"},
      {"offsets end past data", Edit("[32,36]", "[32,40]"), "past the data section"},
      {"offsets far past data", Edit("[32,36]", "[18446744073709551608,18446744073709551612]"),
       ""},
      {"offsets span too short", Edit("[0,24]", "[0,20]"), "need"},
      {"offsets span too long", Edit("[0,24]", "[0,28]"), "need"},
      {"offsets overlap", Edit("[24,32]", "[20,28]"), "overlap"},
      {"scalar needs 4 bytes", Edit("[32,36]", "[32,32]"), "need"},
      {"metadata not an object", Edit(R"({"format":"pt"})", R"(["pt"])"), "__metadata__"},
      {"metadata value not a string", Edit(R"("pt")", "1"), "__metadata__"},
  });
  // clang-format on
}

// Sharded checkpoints: each case builds a folder; Open(folder) must fail.
TEST(MalformedSafetensorsTest, BrokenIndexAndShards) {
  struct ShardCase {
    std::string name;
    std::string index;                      // model.safetensors.index.json ("" = none)
    std::string shard_bytes = St(kHeader);  // written as shard.safetensors
    std::string expect = "";
  };
  const std::string map_a = R"({"weight_map":{"a":"shard.safetensors"}})";
  // clang-format off
  const std::vector<ShardCase> cases = {
      {"index is broken JSON", R"({"weight_map":)", St(kHeader), "malformed JSON"},
      {"index is an array", "[]", St(kHeader), "not a JSON object"},
      {"index has no weight_map", R"({"metadata":{}})", St(kHeader), "weight_map"},
      {"weight_map is an array", R"({"weight_map":["shard.safetensors"]})", St(kHeader),
       "weight_map"},
      {"weight_map is empty", R"({"weight_map":{}})", St(kHeader), "weight_map"},
      {"shard name is a number", R"({"weight_map":{"a":7}})", St(kHeader), "not a string"},
      {"duplicate tensor in weight_map",
       R"({"weight_map":{"a":"shard.safetensors","a":"shard.safetensors"}})", St(kHeader),
       "duplicate"},
      {"shard path traversal ../", R"({"weight_map":{"a":"../shard.safetensors"}})", St(kHeader),
       "plain file name"},
      {"shard in a subfolder", R"({"weight_map":{"a":"sub/shard.safetensors"}})", St(kHeader),
       "plain file name"},
      {"shard absolute path", R"({"weight_map":{"a":"/etc/passwd"}})", St(kHeader),
       "plain file name"},
      {"shard is ..", R"({"weight_map":{"a":".."}})", St(kHeader), "plain file name"},
      {"shard is .", R"({"weight_map":{"a":"."}})", St(kHeader), "plain file name"},
      {"shard name empty", R"({"weight_map":{"a":""}})", St(kHeader), "plain file name"},
      {"shard name with backslash", R"({"weight_map":{"a":"sub\\shard.safetensors"}})", St(kHeader),
       "plain file name"},
      {"shard name with NUL", R"({"weight_map":{"a":"shard.safetensors\u0000x"}})", St(kHeader),
       "plain file name"},
      {"shard file missing", R"({"weight_map":{"a":"other.safetensors"}})", St(kHeader),
       "cannot open"},
      {"tensor not in its shard", R"({"weight_map":{"zz":"shard.safetensors"}})", St(kHeader),
       "zz"},
      {"shard truncated", map_a, St(kHeader).substr(0, 50), "past the end"},
      {"shard has a bad dtype", map_a, Edit(R"("BF16")", R"("X")"), "X"},
      {"folder without index or model.safetensors", "", St(kHeader), "neither"},
  };
  // clang-format on
  for (const ShardCase& c : cases) {
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(test::WriteFile(dir.Path("shard.safetensors"), c.shard_bytes));
    if (!c.index.empty()) {
      ASSERT_TRUE(test::WriteFile(dir.Path("model.safetensors.index.json"), c.index));
    }
    absl::Status st = SafetensorsCheckpoint::Open(dir.path()).status();
    EXPECT_FALSE(st.ok()) << "case '" << c.name << "' was accepted";
    if (!c.expect.empty()) {
      EXPECT_NE(st.message().find(c.expect), std::string_view::npos)
          << "case '" << c.name << "': expected '" << c.expect << "' in: " << st.message();
    }
  }
}

// ---------------------------------------------------------------- GGUF

std::string Gguf(const std::function<void(GgufSpec&)>& edit) {
  GgufSpec spec = test::TinyGgufSpec();
  edit(spec);
  return test::BuildGguf(spec);
}

std::string AddKv(const std::string& kv) {
  return Gguf([&](GgufSpec& s) { s.kvs.push_back(kv); });
}

TEST(MalformedGgufTest, ValidBaseFileOpens) {
  TempDir dir;
  ASSERT_TRUE(test::WriteFile(dir.Path("ok.gguf"), test::BuildGguf(test::TinyGgufSpec())));
  auto g = GgufFile::Open(dir.Path("ok.gguf"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->Names().size(), 5u);
}

TEST(MalformedGgufTest, TruncatedAtEveryByte) {
  ExpectAllRefused(Format::kGguf, Truncations(test::BuildGguf(test::TinyGgufSpec())));
}

TEST(MalformedGgufTest, ByteFlipsNeverCrash) {
  ExpectByteFlipsAreSafe(Format::kGguf, test::BuildGguf(test::TinyGgufSpec()));
}

TEST(MalformedGgufTest, BrokenHeaderAndMetadata) {
  const uint64_t k2p60 = uint64_t{1} << 60;
  using test::Kv;
  // clang-format off
  ExpectAllRefused(Format::kGguf, {
      {"bad magic", Gguf([](GgufSpec& s) { s.magic = "GGUG"; }), "magic"},
      {"version 1", Gguf([](GgufSpec& s) { s.version = 1; }), "version 1"},
      {"version 4", Gguf([](GgufSpec& s) { s.version = 4; }), "version 4"},
      {"version 2^32-1", Gguf([](GgufSpec& s) { s.version = ~0u; }), "version"},
      {"big-endian v3", Gguf([](GgufSpec& s) { s.version = 0x03000000; }), "big-endian"},
      {"big-endian v2", Gguf([](GgufSpec& s) { s.version = 0x02000000; }), "big-endian"},
      {"kv count 2^62", Gguf([](GgufSpec& s) { s.kv_count = uint64_t{1} << 62; }), "kv count"},
      {"kv count 2^64-1", Gguf([](GgufSpec& s) { s.kv_count = ~uint64_t{0}; }), "kv count"},
      {"kv count one too many", Gguf([](GgufSpec& s) { s.kv_count = s.kvs.size() + 1; }), ""},
      {"tensor count 2^62", Gguf([](GgufSpec& s) { s.tensor_count = uint64_t{1} << 62; }),
       "tensor count"},
      {"tensor count one too many",
       Gguf([](GgufSpec& s) { s.tensor_count = s.tensors.size() + 1; }), ""},
      {"key length 2^60", AddKv(U64(k2p60) + "abc" + U32(test::kGU8) + "x"), "truncated"},
      {"empty key", AddKv(test::KvU32("", 1)), "empty metadata key"},
      {"duplicate key", AddKv(test::KvU32("tiny.block_count", 3)), "duplicate key"},
      {"string length 2^60", AddKv(Kv("k", test::kGString, U64(k2p60) + "abc")), "truncated"},
      {"string length 2^64-1", AddKv(Kv("k", test::kGString, U64(~uint64_t{0}))), "truncated"},
      {"value type 13", AddKv(Kv("k", 13, U32(0))), "unknown value type 13"},
      {"value type 2^32-1", AddKv(Kv("k", ~0u, U32(0))), "unknown value type"},
      {"bool value 2", AddKv(Kv("k", test::kGBool, "\x02")), "bool"},
      {"u64 above int64", AddKv(Kv("k", test::kGU64, U64(~uint64_t{0}))), "int64"},
      {"string array count 2^60",
       AddKv(Kv("k", test::kGArray, U32(test::kGString) + U64(k2p60) + U64(1) + "a")), "array"},
      {"u8 array count 2^60", AddKv(Kv("k", test::kGArray, U32(test::kGU8) + U64(k2p60))),
       "array"},
      {"i32 array count 2^64-1",
       AddKv(Kv("k", test::kGArray, U32(test::kGI32) + U64(~uint64_t{0}))), "array"},
      {"array count one too many",
       AddKv(Kv("k", test::kGArray, U32(test::kGU32) + U64(4) + U32(1))), ""},
      {"nested array", AddKv(Kv("k", test::kGArray, U32(test::kGArray) + U64(1) +
                                                    U32(test::kGU8) + U64(1) + "x")), "nested"},
      {"array of unknown type", AddKv(Kv("k", test::kGArray, U32(13) + U64(1) + "x")),
       "unknown array element type"},
      {"bool array value 7", AddKv(Kv("k", test::kGArray, U32(test::kGBool) + U64(1) + "\x07")),
       "bool"},
  });
  // clang-format on
}

TEST(MalformedGgufTest, BrokenAlignmentAndTensors) {
  auto alignment = [](std::string kv) { return Gguf([&](GgufSpec& s) { s.kvs[1] = kv; }); };
  auto tensor = [](size_t idx, std::function<void(test::GgufTensorSpec&)> edit) {
    return Gguf([&](GgufSpec& s) { edit(s.tensors[idx]); });
  };
  // clang-format off
  ExpectAllRefused(Format::kGguf, {
      {"alignment 0", alignment(test::KvU32("general.alignment", 0)), "alignment"},
      {"alignment 3", alignment(test::KvU32("general.alignment", 3)), "alignment"},
      {"alignment 48", alignment(test::KvU32("general.alignment", 48)), "alignment"},
      {"alignment 2^31", alignment(test::KvU32("general.alignment", 1u << 31)), "alignment"},
      {"alignment is a string", alignment(test::KvString("general.alignment", "32")),
       "alignment"},
      {"alignment is a float", alignment(test::KvF32("general.alignment", 32.f)), "alignment"},
      {"alignment 2^62 (data would start past the end)",
       alignment(test::Kv("general.alignment", test::kGU64, U64(uint64_t{1} << 62))),
       "alignment"},
      {"n_dims 0", tensor(0, [](auto& t) { t.n_dims = 0; }), "dimensions"},
      {"n_dims 5", tensor(0, [](auto& t) { t.ne = {3, 2, 1, 1, 1}; }), "dimensions"},
      {"n_dims 2^32-1", tensor(0, [](auto& t) { t.n_dims = ~0u; }), "dimensions"},
      {"ne 2^63", tensor(0, [](auto& t) { t.ne = {uint64_t{1} << 63, 1}; }), "overflow"},
      {"ne product overflows",
       tensor(0, [](auto& t) { t.ne = {uint64_t{1} << 32, uint64_t{1} << 32}; }), "overflow"},
      {"F32 bytes overflow", tensor(0, [](auto& t) { t.ne = {uint64_t{1} << 62}; }), ""},
      {"Q8_0 row of 48", tensor(5, [](auto& t) { t.ne = {48, 2}; }), "multiple of 32"},
      {"MXFP4 row of 16", tensor(4, [](auto& t) { t.ne = {16, 4}; }), "multiple of 32"},
      {"data runs past the end", tensor(5, [](auto& t) { t.ne = {32, 300}; }),
       "run past the data section"},
      {"offset past the end", tensor(2, [](auto& t) { t.offset = uint64_t{1} << 40; }),
       "past the data section"},
      {"offset 2^64-32", tensor(2, [](auto& t) { t.offset = ~uint64_t{0} - 31; }),
       "past the data section"},
      {"unsupported type offset past the end",
       tensor(1, [](auto& t) { t.offset = uint64_t{1} << 40; }), "past the data section"},
      {"misaligned offset", tensor(2, [](auto& t) { t.offset = 1; }), "alignment"},
      {"misaligned offset 16", tensor(2, [](auto& t) { t.offset = 16; }), "alignment"},
      {"overlapping tensors", tensor(2, [](auto& t) { t.offset = 0; }), "overlap"},
      {"duplicate tensor name", tensor(2, [](auto& t) { t.name = "f32"; }), "duplicate tensor"},
      {"empty tensor name", tensor(2, [](auto& t) { t.name = ""; }), "empty tensor name"},
  });
  // clang-format on
  // A tensor name whose length field claims 2^60 bytes.
  std::string bytes = test::BuildGguf(test::TinyGgufSpec());
  const std::string name_field = test::GgufStr("f32");
  const size_t at = bytes.find(name_field);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 8, U64(uint64_t{1} << 60));
  ExpectAllRefused(Format::kGguf, {{"tensor name length 2^60", bytes, "truncated"}});
}

}  // namespace
}  // namespace moeshard

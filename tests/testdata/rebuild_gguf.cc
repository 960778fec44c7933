// testdata_gguf: rebuilds llama.cpp's qwen3moe-tok GGUFs from what the repository commits
// (tests/testdata/qwen3moe-tok: gguf-layout.txt, the heads unpacked from gguf-heads.xz, and
// model.safetensors). The head (header, metadata, tensor table) is llama.cpp's own bytes; each
// tensor's data comes from the safetensors through moeshard's own conversions: bf16 -> f32 for
// F32, bf16 -> f16 (F32ToF16) for F16, and QuantizeRowQ8_0 for Q8_0; the experts of a layer are
// stacked in expert order, as convert_hf_to_gguf.py does. tests/testdata/assemble.sh then
// compares each file's SHA-256 with the original's (gguf-layout.txt), so a rebuild that is not
// llama.cpp's file byte for byte fails the build.
//
//   testdata_gguf LAYOUT HEADS SAFETENSORS OUT_DIR
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/formats/gguf_quant.h"
#include "common/formats/safetensors.h"

namespace moeshard {
namespace {

constexpr int kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8;

struct TensorLine {
  std::string name;
  int type = 0;
  uint64_t offset = 0, nbytes = 0;
};

struct FileLine {
  std::string name;
  uint64_t head_start = 0, head_len = 0, data_offset = 0, size = 0;
  std::vector<TensorLine> tensors;
};

absl::StatusOr<std::vector<FileLine>> ReadLayout(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<FileLine> files;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    bool ok = false;
    if (f.size() == 7 && f[0] == "file") {
      FileLine fl{f[1]};
      ok = absl::SimpleAtoi(f[2], &fl.head_start) && absl::SimpleAtoi(f[3], &fl.head_len) &&
           absl::SimpleAtoi(f[4], &fl.data_offset) && absl::SimpleAtoi(f[5], &fl.size);
      files.push_back(fl);
    } else if (f.size() == 6 && f[0] == "tensor" && !files.empty()) {
      TensorLine t{f[1]};
      ok = absl::SimpleAtoi(f[2], &t.type) && absl::SimpleAtoi(f[3], &t.offset) && absl::SimpleAtoi(f[4], &t.nbytes);
      files.back().tensors.push_back(t);
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": cannot parse '", line, "'"));
  }
  return files;
}

// The Hugging Face tensors a GGUF tensor of qwen3moe is made of (several for stacked experts).
absl::StatusOr<std::vector<std::string>> SourceNames(const std::string& gguf, const TensorSource& st) {
  static const std::map<std::string, std::string> kLayer = {
      {"attn_norm", "input_layernorm"},    {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate_inp", "mlp.gate"}};
  static const std::map<std::string, std::string> kExperts = {
      {"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"}, {"ffn_down_exps", "down_proj"}};
  if (gguf == "token_embd.weight") return std::vector<std::string>{"model.embed_tokens.weight"};
  if (gguf == "output_norm.weight") return std::vector<std::string>{"model.norm.weight"};
  std::vector<std::string> parts = absl::StrSplit(gguf, '.');
  int layer = 0;
  if (parts.size() == 4 && parts[0] == "blk" && absl::SimpleAtoi(parts[1], &layer) && parts[3] == "weight") {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".");
    if (auto it = kLayer.find(parts[2]); it != kLayer.end()) {
      return std::vector<std::string>{absl::StrCat(prefix, it->second, ".weight")};
    }
    if (auto it = kExperts.find(parts[2]); it != kExperts.end()) {
      std::vector<std::string> names;
      for (int e = 0;; ++e) {
        std::string n = absl::StrCat(prefix, "mlp.experts.", e, ".", it->second, ".weight");
        if (st.Find(n) == nullptr) break;
        names.push_back(n);
      }
      if (!names.empty()) return names;
    }
  }
  return absl::NotFoundError(absl::StrCat("no safetensors source for GGUF tensor ", gguf));
}

absl::StatusOr<std::string> TensorBytes(const TensorLine& t, const TensorSource& st) {
  absl::StatusOr<std::vector<std::string>> names = SourceNames(t.name, st);
  if (!names.ok()) return names.status();
  std::vector<float> values;
  int64_t row = 0;
  for (const std::string& n : *names) {
    const TensorInfo* info = st.Find(n);
    if (info == nullptr || info->dtype != DType::kBF16 || info->shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(n, ": missing or not bf16"));
    }
    row = info->shape.back();
    const auto* h = reinterpret_cast<const uint16_t*>(info->data);
    for (int64_t i = 0; i < info->numel(); ++i) values.push_back(Bf16ToF32(h[i]));
  }
  std::string out;
  switch (t.type) {
    case kGgmlF32:
      out.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
      break;
    case kGgmlF16:
      for (float v : values) {
        const uint16_t h = F32ToF16(v);
        out.append(reinterpret_cast<const char*>(&h), sizeof h);
      }
      break;
    case kGgmlQ8_0:
      if (row % kGgufBlock != 0) return absl::InvalidArgumentError(absl::StrCat(t.name, ": rows not of 32"));
      for (size_t r = 0; r < values.size(); r += row) QuantizeRowQ8_0(values.data() + r, row, &out);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(t.name, ": ggml type ", t.type, " is not rebuilt"));
  }
  if (out.size() != t.nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(t.name, ": rebuilt ", out.size(), " bytes, want ", t.nbytes));
  }
  return out;
}

absl::Status Rebuild(const std::string& layout, const std::string& heads_path, const std::string& st_path,
                     const std::string& out_dir) {
  absl::StatusOr<std::vector<FileLine>> files = ReadLayout(layout);
  if (!files.ok()) return files.status();
  std::ifstream hin(heads_path, std::ios::binary);
  if (!hin) return absl::NotFoundError(absl::StrCat("cannot read ", heads_path));
  const std::string heads((std::istreambuf_iterator<char>(hin)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> st = SafetensorsCheckpoint::OpenFile(st_path);
  if (!st.ok()) return st.status();
  for (const FileLine& f : *files) {
    if (f.head_start + f.head_len > heads.size() || f.head_len > f.data_offset || f.data_offset > f.size) {
      return absl::InvalidArgumentError(absl::StrCat(f.name, ": layout does not fit the heads file"));
    }
    std::string buf(f.size, '\0');
    buf.replace(0, f.head_len, heads, f.head_start, f.head_len);
    for (const TensorLine& t : f.tensors) {
      absl::StatusOr<std::string> bytes = TensorBytes(t, **st);
      if (!bytes.ok()) return bytes.status();
      if (f.data_offset + t.offset + t.nbytes > f.size) {
        return absl::InvalidArgumentError(absl::StrCat(t.name, ": past the end of ", f.name));
      }
      buf.replace(f.data_offset + t.offset, t.nbytes, *bytes);
    }
    const std::string path = absl::StrCat(out_dir, "/", f.name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s LAYOUT HEADS SAFETENSORS OUT_DIR\n", argv[0]);
    return 2;
  }
  absl::Status st = moeshard::Rebuild(argv[1], argv[2], argv[3], argv[4]);
  if (!st.ok()) {
    std::fprintf(stderr, "testdata_gguf: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

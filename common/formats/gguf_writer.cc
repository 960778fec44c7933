// GGUF encoding (little-endian): "GGUF" | u32 version 3 | u64 tensor count | u64 kv count |
// kv pairs (string key, u32 value type, value) | tensor infos (string name, u32 n_dims,
// u64 ne[n_dims], u32 ggml type, u64 offset from the data section) | zero padding to the
// alignment | data, each tensor padded with zeros to the alignment (the last one too, as
// llama.cpp's gguf-py writes it). A string is a u64 length and its bytes; an array is a
// u32 element type, a u64 count and the elements.
#include "common/formats/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"

namespace moeshard {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF writer assumes a little-endian host");

// GGUF metadata value types (gguf.h's enum gguf_type).
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

DType ToDType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return DType::kF32;
    case GgmlType::kF16:
      return DType::kF16;
    case GgmlType::kQ8_0:
      return DType::kQ8_0;
    case GgmlType::kBF16:
      return DType::kBF16;
    case GgmlType::kMXFP4:
      return DType::kMXFP4;
  }
  return DType::kF32;
}

uint64_t Padded(uint64_t n) {
  return (n + GgufWriter::kAlignment - 1) / GgufWriter::kAlignment * GgufWriter::kAlignment;
}

}  // namespace

const char* GgmlTypeName(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kMXFP4:
      return "MXFP4";
  }
  return "?";
}

GgufWriter::GgufWriter() { AddU32("general.alignment", kAlignment); }

void GgufWriter::AddKey(const std::string& key, uint32_t value_type, const std::string& payload) {
  if (!keys_.insert(key).second) {
    if (deferred_.ok()) deferred_ = absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "' added twice"));
    return;
  }
  PutString(&kv_bytes_, key);
  Put<uint32_t>(&kv_bytes_, value_type);
  kv_bytes_.append(payload);
  ++num_kv_;
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  std::string p;
  PutString(&p, value);
  AddKey(key, kString, p);
}

void GgufWriter::AddU32(const std::string& key, uint32_t value) {
  std::string p;
  Put(&p, value);
  AddKey(key, kU32, p);
}

void GgufWriter::AddF32(const std::string& key, float value) {
  std::string p;
  Put(&p, value);
  AddKey(key, kF32, p);
}

void GgufWriter::AddBool(const std::string& key, bool value) {
  std::string p;
  Put<uint8_t>(&p, value ? 1 : 0);
  AddKey(key, kBool, p);
}

void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  std::string p;
  Put<uint32_t>(&p, kString);
  Put<uint64_t>(&p, values.size());
  for (const std::string& s : values) PutString(&p, s);
  AddKey(key, kArray, p);
}

void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& values) {
  std::string p;
  Put<uint32_t>(&p, kI32);
  Put<uint64_t>(&p, values.size());
  for (int32_t v : values) Put(&p, v);
  AddKey(key, kArray, p);
}

absl::StatusOr<uint64_t> GgufWriter::CheckTensor(const std::string& name, GgmlType type,
                                                  const std::vector<int64_t>& shape) const {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor name '", name, "' must have 1 to ", kMaxNameBytes, " bytes"));
  }
  if (shape.empty() || shape.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor '", name, "' has ", shape.size(), " dimensions (1 to 4)"));
  }
  uint64_t rows = 1;
  for (int64_t d : shape) {
    if (d <= 0) return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "' has a dimension ", d));
  }
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= static_cast<uint64_t>(shape[i]);
  absl::StatusOr<uint64_t> row_bytes = DTypeBytes(ToDType(type), static_cast<uint64_t>(shape.back()));
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor '", name, "' (", GgmlTypeName(type), "): ", row_bytes.status().message()));
  }
  if (tensor_names_.count(name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "' added twice"));
  }
  return *row_bytes * rows;
}

absl::Status GgufWriter::AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape,
                                   std::string bytes) {
  ASSIGN_OR_RETURN(uint64_t size, CheckTensor(name, type, shape));
  if (bytes.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "' has ", bytes.size(),
                                                   " bytes, its shape and ", GgmlTypeName(type), " need ", size));
  }
  tensor_names_.insert(name);
  tensors_.push_back({name, type, std::vector<int64_t>(shape.rbegin(), shape.rend()), size, std::move(bytes)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorLayout(const std::string& name, GgmlType type, const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(uint64_t size, CheckTensor(name, type, shape));
  tensor_names_.insert(name);
  tensors_.push_back({name, type, std::vector<int64_t>(shape.rbegin(), shape.rend()), size, std::string()});
  streamed_ = true;
  return absl::OkStatus();
}

std::string GgufWriter::Header() const {
  std::string head("GGUF");
  Put<uint32_t>(&head, 3);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, num_kv_);
  head.append(kv_bytes_);
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(&head, static_cast<uint64_t>(d));
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, offset);
    offset += Padded(t.size);
  }
  head.resize(Padded(head.size()), '\0');
  return head;
}

absl::Status GgufWriter::Write(const std::string& path) const {
  RETURN_IF_ERROR(deferred_);
  if (streamed_) return absl::FailedPreconditionError("GGUF tensors added by layout need WriteStreamed");
  const std::string head = Header();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  const std::string zeros(kAlignment, '\0');
  for (const Tensor& t : tensors_) {
    out.write(t.bytes.data(), static_cast<std::streamsize>(t.bytes.size()));
    out.write(zeros.data(), static_cast<std::streamsize>(Padded(t.bytes.size()) - t.bytes.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing ", path, " failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteStreamed(const std::string& path, int threads, const TensorFiller& fill) const {
  RETURN_IF_ERROR(deferred_);
  const std::string head = Header();
  std::vector<uint64_t> offsets;
  uint64_t end = head.size();
  for (const Tensor& t : tensors_) {
    offsets.push_back(end);
    end += Padded(t.size);
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  auto put = [fd, &path](const std::string& b, uint64_t at) -> absl::Status {
    for (size_t done = 0; done < b.size();) {
      const ssize_t n = ::pwrite(fd, b.data() + done, b.size() - done, static_cast<off_t>(at + done));
      if (n <= 0) return absl::InternalError(absl::StrCat("writing ", path, " failed: ", std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  };
  absl::Status st = put(head, 0);
  if (st.ok() && ::ftruncate(fd, static_cast<off_t>(end)) != 0) {
    st = absl::InternalError(absl::StrCat("cannot size ", path, ": ", std::strerror(errno)));
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  auto work = [&] {
    std::string bytes;
    for (size_t i; (i = next++) < tensors_.size();) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!st.ok()) return;
      }
      const std::string* src = &tensors_[i].bytes;
      absl::Status s;
      if (src->empty()) {
        bytes.clear();
        s = fill(i, &bytes);
        src = &bytes;
      }
      if (s.ok() && src->size() != tensors_[i].size) {
        s = absl::InternalError(absl::StrCat("GGUF tensor '", tensors_[i].name, "' was filled with ", src->size(),
                                             " bytes, needs ", tensors_[i].size));
      }
      if (s.ok()) s = put(*src, offsets[i]);
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (st.ok()) st = s;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 0; k < std::max(threads, 1); ++k) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  if (::close(fd) != 0 && st.ok()) st = absl::InternalError(absl::StrCat("closing ", path, ": ", std::strerror(errno)));
  return st;
}

}  // namespace moeshard

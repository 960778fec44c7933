// Internal to the GGUF parser: a bounds-checked little-endian cursor over a mapped file and
// the decoder of one metadata value. Every length or count is compared with the bytes that
// remain before anything is allocated.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/formats/gguf.h"
#include "common/status.h"

namespace moeshard::gguf_internal {

// Bounds-checked little-endian cursor over the mapped file.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= remaining()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("truncated: ", what, " needs ", n,
                                                   " bytes at offset ", pos_, ", ", remaining(),
                                                   " remain"));
  }
  template <typename T>
  absl::Status Read(T* v, absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status ReadString(std::string* s, absl::string_view what) {
    uint64_t len;
    RETURN_IF_ERROR(Read(&len, what));
    RETURN_IF_ERROR(Need(len, what));
    s->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Reads one value of metadata type `type` (0..12) for `key`; arrays of arrays are refused.
absl::Status ReadValue(Reader& r, uint32_t type, const std::string& key, GgufValue* v);

}  // namespace moeshard::gguf_internal

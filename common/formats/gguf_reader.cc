// Decoding of GGUF metadata values: u8/i8/u16/i16/u32/i32/u64/i64 become int64 (u64 above
// INT64_MAX is refused), f32/f64 double, bool a checked 0/1 byte, string u64 length + bytes,
// array u32 element type + u64 count + elements (one level only).
#include "common/formats/gguf_reader.h"

#include <limits>

namespace moeshard::gguf_internal {
namespace {

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Smallest encoding of one value of `type` (0 = unknown type).
uint64_t MinValueBytes(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool: return 1;
    case kU16:
    case kI16: return 2;
    case kU32:
    case kI32:
    case kF32: return 4;
    case kU64:
    case kI64:
    case kF64:
    case kString: return 8;
    case kArray: return 12;
    default: return 0;
  }
}

template <typename T>
absl::Status ReadIntAs(Reader& r, const std::string& key, int64_t* out) {
  T v;
  RETURN_IF_ERROR(r.Read(&v, key));
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

absl::Status ReadInt(Reader& r, uint32_t type, const std::string& key, int64_t* out) {
  switch (type) {
    case kU8: return ReadIntAs<uint8_t>(r, key, out);
    case kI8: return ReadIntAs<int8_t>(r, key, out);
    case kU16: return ReadIntAs<uint16_t>(r, key, out);
    case kI16: return ReadIntAs<int16_t>(r, key, out);
    case kU32: return ReadIntAs<uint32_t>(r, key, out);
    case kI32: return ReadIntAs<int32_t>(r, key, out);
    case kI64: return ReadIntAs<int64_t>(r, key, out);
    case kU64: {
      uint64_t v;
      RETURN_IF_ERROR(r.Read(&v, key));
      if (v > kInt64Max) {
        return absl::InvalidArgumentError(
            absl::StrCat("value ", v, " of key '", key, "' does not fit in int64"));
      }
      *out = static_cast<int64_t>(v);
      return absl::OkStatus();
    }
    default: return absl::InternalError(absl::StrCat("ReadInt called with type ", type));
  }
}

absl::Status ReadFloat(Reader& r, uint32_t type, const std::string& key, double* out) {
  if (type == kF32) {
    float v;
    RETURN_IF_ERROR(r.Read(&v, key));
    *out = v;
    return absl::OkStatus();
  }
  return r.Read(out, key);
}

absl::Status ReadBool(Reader& r, const std::string& key, bool* out) {
  uint8_t v;
  RETURN_IF_ERROR(r.Read(&v, key));
  if (v > 1) {
    return absl::InvalidArgumentError(absl::StrCat("bool of key '", key, "' holds ", int{v}));
  }
  *out = v != 0;
  return absl::OkStatus();
}

bool IsIntType(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kU64 ||
         t == kI64;
}

absl::Status ReadArray(Reader& r, const std::string& key, GgufValue* v) {
  uint32_t elem_type;
  uint64_t count;
  RETURN_IF_ERROR(r.Read(&elem_type, key));
  RETURN_IF_ERROR(r.Read(&count, key));
  if (elem_type == kArray) {
    return absl::UnimplementedError(
        absl::StrCat("key '", key, "': nested arrays are not supported"));
  }
  const uint64_t min_bytes = MinValueBytes(elem_type);
  if (min_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "': unknown array element type ", elem_type));
  }
  if (count > r.remaining() / min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key '", key, "': array of ", count,
                                                   " elements is larger than the ", r.remaining(),
                                                   " bytes left in the file"));
  }
  if (elem_type == kString) {
    v->kind = GgufValue::Kind::kStringArray;
    v->strings.resize(count);
    for (std::string& s : v->strings) RETURN_IF_ERROR(r.ReadString(&s, key));
  } else if (elem_type == kF32 || elem_type == kF64) {
    v->kind = GgufValue::Kind::kFloatArray;
    v->floats.resize(count);
    for (double& f : v->floats) RETURN_IF_ERROR(ReadFloat(r, elem_type, key, &f));
  } else if (elem_type == kBool) {
    v->kind = GgufValue::Kind::kBoolArray;
    v->ints.resize(count);
    for (int64_t& i : v->ints) {
      bool b;
      RETURN_IF_ERROR(ReadBool(r, key, &b));
      i = b;
    }
  } else {
    v->kind = GgufValue::Kind::kIntArray;
    v->ints.resize(count);
    for (int64_t& i : v->ints) RETURN_IF_ERROR(ReadInt(r, elem_type, key, &i));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadValue(Reader& r, uint32_t type, const std::string& key, GgufValue* v) {
  if (IsIntType(type)) {
    v->kind = GgufValue::Kind::kInt;
    return ReadInt(r, type, key, &v->i);
  }
  switch (type) {
    case kF32:
    case kF64: v->kind = GgufValue::Kind::kFloat; return ReadFloat(r, type, key, &v->f);
    case kBool: v->kind = GgufValue::Kind::kBool; return ReadBool(r, key, &v->b);
    case kString: v->kind = GgufValue::Kind::kString; return r.ReadString(&v->s, key);
    case kArray: return ReadArray(r, key, v);
    default:
      return absl::InvalidArgumentError(absl::StrCat("key '", key, "': unknown value type ", type));
  }
}

}  // namespace moeshard::gguf_internal

// libFuzzer target: the safetensors header parser (length, JSON header, dtypes, shapes and
// offsets against the file size) on arbitrary bytes.
#include "common/formats/safetensors.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = moeshard::fuzz::WriteInput(data, size, ".safetensors");
  (void)moeshard::SafetensorsCheckpoint::OpenFile(path);
  return 0;
}

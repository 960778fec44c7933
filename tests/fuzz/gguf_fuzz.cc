// libFuzzer target: the GGUF reader (header, metadata, tensor table) and what is read from
// it (the tokenizer spec), on arbitrary bytes. Errors are fine; crashes and leaks are not.
#include "common/formats/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = moeshard::fuzz::WriteInput(data, size, ".gguf");
  auto file = moeshard::GgufFile::Open(path);
  if (file.ok()) {
    auto spec = moeshard::TokenizerSpecFromGguf(**file);
    if (spec.ok()) (void)moeshard::Tokenizer::Create(*std::move(spec));
  }
  return 0;
}

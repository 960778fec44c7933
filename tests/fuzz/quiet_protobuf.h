// Protobuf logs every string field that fails its UTF-8 check while parsing; a fuzzer makes
// millions of those, which bury the one report that matters when a target fails. Fuzzers of
// protobuf messages call QuietProtobufLogs() once from LLVMFuzzerInitialize: fatal messages
// still reach stderr.
#pragma once

#include <cstdio>
#include <string>

#include <google/protobuf/stubs/logging.h>

namespace moeshard::fuzz {

inline void QuietProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
        if (level >= google::protobuf::LOGLEVEL_FATAL) std::fprintf(stderr, "[libprotobuf FATAL %s:%d] %s\n", file, line, message.c_str());
      });
}

}  // namespace moeshard::fuzz

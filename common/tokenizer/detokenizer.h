// Incremental detokenization with stop strings: the one implementation of stop strings,
// used by the router for served requests and by local/ for single-process commands.
//
// Tokens arrive one at a time; their bytes are appended to a pending buffer, and only the
// part of it that can no longer change is released:
//  - an incomplete UTF-8 sequence at the end is held until its last byte arrives (a token
//    may carry half a character);
//  - the longest tail that is a proper prefix of some stop string is held, because the
//    next token may complete the stop string.
// Everything released before is free of stop-string starts, so a stop string can only
// begin inside the pending buffer: searching the buffer after each token finds it even
// when it spans several tokens. On a match, the text before it is released, the stop
// string and what follows are dropped, and stopped() turns true.
//
// Ill-formed UTF-8 (bytes that can never become a character) is released as U+FFFD.
// Not thread-safe: one instance per request.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeshard {

class Tokenizer;

class IncrementalDetokenizer {
 public:
  struct Options {
    std::vector<std::string> stop;
    // Tokens whose text is never shown: EOS and stop_token_ids (as vLLM does).
    std::vector<int32_t> hidden_ids;
    bool skip_special_tokens = true;
  };

  // `tokenizer` may be null: then every token adds no text. Not owned; must outlive this.
  IncrementalDetokenizer(const Tokenizer* tokenizer, Options options);

  // Adds one token and returns the text now final (often empty). Ignored once stopped().
  std::string Add(int32_t token_id);
  // The end of the stream: returns what was held back (an incomplete character as U+FFFD).
  std::string Flush();

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::string Release(size_t num_bytes);

  const Tokenizer* tokenizer_;
  Options options_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_stop_;
};

// UTF-8 helpers, exposed for tests.
// Number of bytes at the end of `bytes` that begin a well-formed UTF-8 sequence still
// missing its last bytes (0..3).
size_t IncompleteUtf8Tail(std::string_view bytes);
// `bytes` with each ill-formed sequence replaced by U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

}  // namespace moeshard

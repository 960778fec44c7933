// A SAX handler that builds the JSON tree like nlohmann's own parser (a stack of open
// containers, values put into the innermost one), except inside root.model.vocab and
// root.model.merges, whose entries go straight into HfTokenizerJson's vectors.
#include "common/tokenizer/hf_json_reader.h"

#include "absl/strings/str_cat.h"

namespace moeshard::tokenizer_internal {
namespace {

using Json = nlohmann::json;

class Reader final : public nlohmann::json_sax<Json> {
 public:
  explicit Reader(HfTokenizerJson* out) : out_(out) {}
  const std::string& error() const { return error_; }

  bool null() override { return Scalar(Json(nullptr)); }
  bool boolean(bool v) override { return Scalar(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab && depth_ == 1) return VocabId(v);
    return Scalar(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab && depth_ == 1) {
      return VocabId(v > INT64_MAX ? -1 : static_cast<int64_t>(v));
    }
    return Scalar(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Scalar(Json(v)); }
  bool binary(binary_t& v) override { return Scalar(Json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges && depth_ == 1) {  // "a b"
      const size_t space = v.find(' ');
      if (space == std::string::npos) {
        return Fail(absl::StrCat(MergeName(), " '", v, "' has no space"));
      }
      out_->merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::kMerges && depth_ == 2) {  // one side of [a, b]
      pair_.push_back(std::move(v));
      return true;
    }
    return Scalar(Json(std::move(v)));
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::kDom) {
      if (AtModelChild("vocab")) return Enter(Mode::kVocab);
      const bool is_model = stack_.size() == 1 && key_ == "model" && stack_[0]->is_object();
      Json* object = Open(Json::object());
      if (is_model) model_ = object;
      return true;
    }
    return Fail(mode_ == Mode::kVocab ? VocabName() : MergeName());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      out_->has_vocab = true;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kDom) {
      if (AtModelChild("merges")) return Enter(Mode::kMerges);
      Open(Json::array());
      return true;
    }
    if (mode_ == Mode::kMerges && depth_ == 1) {
      depth_ = 2;
      pair_.clear();
      return true;
    }
    return Fail(mode_ == Mode::kVocab ? VocabName() : MergeName());
  }
  bool end_array() override {
    if (mode_ == Mode::kMerges && depth_ == 2) {
      if (pair_.size() != 2) return Fail(MergeName());
      out_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      depth_ = 1;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      out_->has_merges = true;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const Json::exception& e) override {
    return Fail(absl::StrCat("not valid JSON: ", e.what()));
  }

 private:
  enum class Mode { kDom, kVocab, kMerges };

  bool AtModelChild(const char* name) const {
    return model_ != nullptr && stack_.size() == 2 && stack_[1] == model_ && key_ == name;
  }
  bool Enter(Mode mode) {
    mode_ = mode;
    depth_ = 1;
    return true;
  }
  // Puts `value` into the innermost open container (or makes it the root).
  Json* Put(Json value) {
    if (stack_.empty()) {
      out_->rest = std::move(value);
      return &out_->rest;
    }
    Json* parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(value));
      return &parent->back();
    }
    Json& slot = (*parent)[key_];
    slot = std::move(value);
    return &slot;
  }
  Json* Open(Json container) {
    Json* c = Put(std::move(container));
    stack_.push_back(c);
    return c;
  }
  bool Scalar(Json value) {
    if (mode_ == Mode::kVocab) return Fail(VocabName());
    if (mode_ == Mode::kMerges) return Fail(MergeName());
    Put(std::move(value));
    return true;
  }
  bool VocabId(int64_t id) {
    out_->vocab.emplace_back(std::move(key_), id);
    return true;
  }
  std::string VocabName() const {
    return absl::StrCat("model.vocab['", key_, "'] is not an integer id");
  }
  std::string MergeName() const {
    return absl::StrCat("model.merges[", out_->merges.size(), "] is neither \"a b\" nor [a, b]");
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  HfTokenizerJson* out_;
  std::vector<Json*> stack_;  // open containers, outermost first
  Json* model_ = nullptr;     // root.model, once opened
  std::string key_;           // the last object key seen
  Mode mode_ = Mode::kDom;
  int depth_ = 0;  // 1 directly inside vocab/merges, 2 inside one [a, b] merge
  std::vector<std::string> pair_;
  std::string error_;
};

}  // namespace

absl::StatusOr<HfTokenizerJson> ParseHfTokenizerJson(std::string_view text) {
  HfTokenizerJson out;
  Reader reader(&out);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.data(), text.data() + text.size(), &reader);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(reader.error().empty() ? "not valid JSON" : reader.error());
  }
  return out;
}

}  // namespace moeshard::tokenizer_internal

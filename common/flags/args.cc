#include "common/flags/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace moeshard {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
                                 const std::set<std::string>& bool_flags) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) != 0 || s == "--") {
      a.positional_.push_back(s);
      continue;
    }
    std::string name = s.substr(2), value;
    bool has_eq = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_eq = true;
    }
    if (bool_flags.count(name)) {
      if (has_eq) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      a.values_[name] = "1";
    } else if (value_flags.count(name)) {
      if (!has_eq) {
        if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      a.values_[name] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return a;
}

std::string Args::Get(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second;
}

absl::StatusOr<std::string> Args::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t dflt) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs an integer, got '", it->second, "'"));
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double dflt) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a number, got '", it->second, "'"));
  return v;
}

}  // namespace moeshard

// A small command-line parser for moeshard's subcommands: `--name value`, `--name=value`
// and boolean `--flag`. Every flag must be declared; unknown flags and bad values are errors.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard {

class Args {
 public:
  // `value_flags` take a value, `bool_flags` do not.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
                                    const std::set<std::string>& bool_flags);
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Get(const std::string& name, const std::string& dflt = "") const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t dflt) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double dflt) const;
  bool Flag(const std::string& name) const { return values_.count(name) != 0; }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace moeshard

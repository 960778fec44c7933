// Scrapes Prometheus /metrics endpoints and reads samples out of the text exposition
// format, so the suite can check that counters and gauges move as its requests expect.
// Coordinators are told apart from the router and workers by the metrics they export
// (moeshard:kv_cache_usage_perc); their values are summed over replicas.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moeshard::itest {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses sample lines (comments skipped); an error names the first line that is not one.
absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text);

// Splits "http://host:port/path" into base URL and path ("/metrics" when none).
void SplitUrl(const std::string& url, std::string* base, std::string* path);

struct Scrape {
  std::string url, text;
  std::vector<Sample> samples;
  bool coordinator = false;
};

class MetricsView {
 public:
  // Fetches every URL (no API key: /metrics is open).
  static absl::StatusOr<MetricsView> Fetch(const std::vector<std::string>& urls);
  const std::vector<Scrape>& scrapes() const { return scrapes_; }
  int num_coordinators() const;
  // Sum over coordinators of the samples named `name` whose labels include `labels`.
  double Coord(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // Largest value over coordinators (for gauges such as kv_cache_usage_perc).
  double CoordMax(const std::string& name) const;

 private:
  std::vector<Scrape> scrapes_;
};

}  // namespace moeshard::itest

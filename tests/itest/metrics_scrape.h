// Scrapes Prometheus /metrics endpoints and reads samples out of the text exposition
// format, so the suite can check that counters and gauges move as its requests expect.
// Coordinators are told apart from the router and workers by the metrics they export
// (<prefix>kv_cache_usage_perc); their values are summed over replicas. Each process's
// prefix ("moeshard_" by default, "moeshard:" with --metric-prefix) is read from its names,
// so the suite takes vLLM's base names (num_requests_running, ...).
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
  std::string prefix;  // "moeshard_" or "moeshard:", from the names; "" when it has neither
};

// Sum of one scrape's samples named s.prefix + `base` whose labels include `labels`.
double SumSamples(const Scrape& s, const std::string& base, const std::map<std::string, std::string>& labels = {});

class MetricsView {
 public:
  // Fetches every URL (no API key: /metrics is open).
  // `api_key`: sent as a bearer token (a router with a key guards its /metrics).
  static absl::StatusOr<MetricsView> Fetch(const std::vector<std::string>& urls, const std::string& api_key);
  const std::vector<Scrape>& scrapes() const { return scrapes_; }
  int num_coordinators() const;
  // Sum over coordinators of the samples named prefix + `base` whose labels include `labels`.
  double Coord(const std::string& base, const std::map<std::string, std::string>& labels = {}) const;
  // Largest value over coordinators (for gauges such as kv_cache_usage_perc).
  double CoordMax(const std::string& base) const;

 private:
  std::vector<Scrape> scrapes_;
};

}  // namespace moeshard::itest

#include "tests/itest/metrics_scrape.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/itest/client.h"

namespace moeshard::itest {
namespace {

// Parses `{a="x",b="y"}` starting at s[i] == '{'; leaves i after '}'.
bool ParseLabels(const std::string& s, size_t& i, std::map<std::string, std::string>* out) {
  ++i;
  while (i < s.size() && s[i] != '}') {
    size_t eq = s.find('=', i);
    if (eq == std::string::npos || eq + 1 >= s.size() || s[eq + 1] != '"') return false;
    std::string key = s.substr(i, eq - i), val;
    size_t j = eq + 2;
    for (; j < s.size() && s[j] != '"'; ++j) {
      if (s[j] == '\\' && j + 1 < s.size()) {
        ++j;
        val += s[j] == 'n' ? '\n' : s[j];
      } else {
        val += s[j];
      }
    }
    if (j >= s.size()) return false;
    (*out)[key] = val;
    i = j + 1;
    if (i < s.size() && s[i] == ',') ++i;
  }
  if (i >= s.size()) return false;
  ++i;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text) {
  std::vector<Sample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{' && !ParseLabels(line, i, &s.labels)) {
      return absl::InvalidArgumentError(absl::StrCat("bad labels in metrics line '", line, "'"));
    }
    while (i < line.size() && line[i] == ' ') ++i;
    std::string v = line.substr(i, line.find(' ', i) - i);
    char* end = nullptr;
    s.value = std::strtod(v.c_str(), &end);
    if (s.name.empty() || v.empty() || end != v.c_str() + v.size()) {
      return absl::InvalidArgumentError(absl::StrCat("bad metrics line '", line, "'"));
    }
    out.push_back(std::move(s));
  }
  return out;
}

void SplitUrl(const std::string& url, std::string* base, std::string* path) {
  size_t scheme = url.find("://");
  size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  *base = slash == std::string::npos ? url : url.substr(0, slash);
  *path = slash == std::string::npos ? "/metrics" : url.substr(slash);
}

absl::StatusOr<MetricsView> MetricsView::Fetch(const std::vector<std::string>& urls, const std::string& api_key) {
  MetricsView v;
  for (const std::string& url : urls) {
    std::string base, path;
    SplitUrl(url, &base, &path);
    HttpResponse r = HttpClient(base, api_key, 30).Get(path, Auth::kDefault);
    // Coordinators and workers: their /metrics needs the cluster credential, not the API key.
    const char* token = std::getenv("MOESHARD_CLUSTER_TOKEN");
    if (r.status == 401 && token != nullptr) r = HttpClient(base, token, 30).Get(path, Auth::kDefault);
    if (r.status != 200) return absl::UnavailableError(absl::StrCat("GET ", url, ": ", r.Describe()));
    Scrape s;
    s.url = url;
    s.text = r.body;
    auto samples = ParseExposition(r.body);
    if (!samples.ok()) return absl::InvalidArgumentError(absl::StrCat(url, ": ", samples.status().message()));
    s.samples = std::move(*samples);
    for (const Sample& x : s.samples) {
      for (const char* prefix : {"moeshard_", "moeshard:"}) {
        if (!absl::StartsWith(x.name, prefix)) continue;
        if (s.prefix.empty()) s.prefix = prefix;
        s.coordinator |= x.name == absl::StrCat(prefix, "kv_cache_usage_perc");
      }
    }
    v.scrapes_.push_back(std::move(s));
  }
  return v;
}

int MetricsView::num_coordinators() const {
  int n = 0;
  for (const Scrape& s : scrapes_) n += s.coordinator;
  return n;
}

double SumSamples(const Scrape& s, const std::string& base, const std::map<std::string, std::string>& labels) {
  double sum = 0;
  const std::string name = s.prefix + base;
  for (const Sample& x : s.samples) {
    if (x.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = x.labels.find(k);
      match &= it != x.labels.end() && it->second == v;
    }
    if (match) sum += x.value;
  }
  return sum;
}

double MetricsView::Coord(const std::string& base, const std::map<std::string, std::string>& labels) const {
  double sum = 0;
  for (const Scrape& s : scrapes_) {
    if (s.coordinator) sum += SumSamples(s, base, labels);
  }
  return sum;
}

double MetricsView::CoordMax(const std::string& base) const {
  double m = 0;
  for (const Scrape& s : scrapes_) {
    if (!s.coordinator) continue;
    const std::string name = s.prefix + base;
    for (const Sample& x : s.samples) {
      if (x.name == name) m = std::max(m, x.value);
    }
  }
  return m;
}

}  // namespace moeshard::itest

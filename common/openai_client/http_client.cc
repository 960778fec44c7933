#include "common/openai_client/http_client.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace moeshard::openai_client {
namespace {

std::unique_ptr<httplib::Client> Connect(const std::string& url, double timeout_s) {
  auto c = std::make_unique<httplib::Client>(url);
  const time_t sec = static_cast<time_t>(timeout_s);
  const time_t usec = static_cast<time_t>((timeout_s - sec) * 1e6);
  c->set_connection_timeout(5, 0);
  c->set_read_timeout(sec, usec);
  c->set_write_timeout(sec, usec);
  c->set_keep_alive(false);
  return c;
}

void AddAuth(httplib::Headers& h, Auth auth, const std::string& key) {
  if (auth == Auth::kNone) return;
  if (auth == Auth::kWrongKey) {
    h.emplace("Authorization", absl::StrCat("Bearer ", key, "-wrong"));
  } else if (!key.empty()) {
    h.emplace("Authorization", absl::StrCat("Bearer ", key));
  }
}

void Fill(HttpResponse& out, const httplib::Response& res) {
  out.status = res.status;
  out.content_type = res.get_header_value("Content-Type");
  out.retry_after = res.get_header_value("Retry-After");
}

}  // namespace

absl::StatusOr<Json> HttpResponse::JsonBody() const {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("body is not JSON: ", Describe()));
  return j;
}

std::string HttpResponse::Describe() const {
  if (status == 0) return absl::StrCat("no response (", error, ")");
  std::string b = body.size() > 300 ? body.substr(0, 300) + "..." : body;
  while (!b.empty() && (b.back() == '\n' || b.back() == '\r')) b.pop_back();
  return absl::StrCat("HTTP ", status, ": ", b);
}

HttpClient::HttpClient(std::string url, std::string api_key, double timeout_s)
    : url_(std::move(url)), api_key_(std::move(api_key)), timeout_s_(timeout_s) {
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
}

namespace {

// The response of one request, or the transport error when none came.
HttpResponse ToResponse(const httplib::Result& res) {
  HttpResponse out;
  if (!res) {
    out.error = httplib::to_string(res.error());
    return out;
  }
  Fill(out, *res);
  out.body = res->body;
  return out;
}

}  // namespace

HttpResponse HttpClient::Get(const std::string& path, Auth auth) const {
  auto c = Connect(url_, timeout_s_);
  httplib::Headers h;
  AddAuth(h, auth, api_key_);
  return ToResponse(c->Get(path.c_str(), h));
}

HttpResponse HttpClient::Post(const std::string& path, const std::string& body, Auth auth) const {
  auto c = Connect(url_, timeout_s_);
  httplib::Headers h;
  AddAuth(h, auth, api_key_);
  return ToResponse(c->Post(path.c_str(), h, body, "application/json"));
}

HttpResponse HttpClient::PostStream(const std::string& path, const Json& body,
                                    const std::function<bool(const std::string& data)>& on_data) const {
  auto c = Connect(url_, timeout_s_);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  AddAuth(req.headers, Auth::kDefault, api_key_);
  HttpResponse out;
  SseParser sse;
  req.response_handler = [&](const httplib::Response& res) {
    Fill(out, res);
    return true;
  };
  bool stopped = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status < 200 || out.status >= 300) {
      out.body.append(data, n);
      return true;
    }
    if (!sse.Feed(data, n, on_data)) {
      stopped = true;
      return false;  // closes the connection: the server sees the client go away
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool ok = c->send(req, res, err);
  if (!ok && !stopped) {
    out.error = httplib::to_string(err);
    if (out.status == 0) return out;
  }
  if (out.status == 0) Fill(out, res);
  if (out.status >= 200 && out.status < 300 && !stopped && !sse.pending().empty()) {
    out.error = absl::StrCat("stream ended inside an event: '", sse.pending().substr(0, 100), "'");
  }
  return out;
}

bool SseParser::Feed(const char* data, size_t n, const std::function<bool(const std::string&)>& on_data) {
  buf_.append(data, n);
  // An event ends at a blank line; "\r\n" and "\n" line ends are both allowed.
  for (;;) {
    size_t end = std::string::npos, skip = 0;
    for (const char* sep : {"\r\n\r\n", "\n\n"}) {
      size_t p = buf_.find(sep);
      if (p != std::string::npos && p < end) {
        end = p;
        skip = std::char_traits<char>::length(sep);
      }
    }
    if (end == std::string::npos) return true;
    std::string event = buf_.substr(0, end);
    buf_.erase(0, end + skip);
    std::string payload;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        if (has_data) payload += "\n";
        payload += v;
        has_data = true;
      }
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    if (has_data && !on_data(payload)) return false;
  }
}

}  // namespace moeshard::openai_client

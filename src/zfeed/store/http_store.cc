#include "zfeed/store/http_store.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "zfeed/util/cancel.h"
#include "zfeed/util/error.h"
#include "zfeed/util/thread_pool.h"

namespace zfeed {
namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// A switch in the environment, read one way everywhere: 1, true, yes or on (any case).
bool environment_flag(const char* name) {
  std::string value = environment(name);
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return value == "1" || value == "true" || value == "yes" || value == "on";
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// The text of the first <name>...</name> in `xml`, not unescaped; nullopt if there is none.
std::optional<std::string_view> xml_element(std::string_view xml, std::string_view name) {
  const std::string open = "<" + std::string(name) + ">";
  const std::string close = "</" + std::string(name) + ">";
  const size_t begin = xml.find(open);
  if (begin == std::string_view::npos) return std::nullopt;
  const size_t end = xml.find(close, begin + open.size());
  if (end == std::string_view::npos) return std::nullopt;
  return xml.substr(begin + open.size(), end - begin - open.size());
}

void append_utf8(std::string& out, unsigned long code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

std::string xml_unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    const size_t end = text.find(';', i);
    if (end == std::string_view::npos || end - i > 12) {
      throw Error("object listing: malformed XML entity in \"" + std::string(text) + "\"");
    }
    const std::string_view entity = text.substr(i + 1, end - i - 1);
    if (entity == "amp") {
      out += '&';
    } else if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "quot") {
      out += '"';
    } else if (entity == "apos") {
      out += '\'';
    } else if (entity.size() > 1 && entity[0] == '#') {
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const std::string digits(entity.substr(hex ? 2 : 1));
      char* stop = nullptr;
      const unsigned long code = std::strtoul(digits.c_str(), &stop, hex ? 16 : 10);
      if (digits.empty() || *stop != '\0' || code == 0 || code > 0x10FFFF) {
        throw Error("object listing: malformed XML character reference &" + std::string(entity) +
                    ";");
      }
      append_utf8(out, code);
    } else {
      throw Error("object listing: unknown XML entity &" + std::string(entity) + ";");
    }
    i = end;
  }
  return out;
}

// What an S3 error body says: "NoSuchBucket: The specified bucket does not exist".
// S3's error code ("SlowDown") from an error body, or "".
std::string s3_error_code(const Bytes& body) {
  const std::string_view xml(reinterpret_cast<const char*>(body.data()), body.size());
  const auto code = xml_element(xml, "Code");
  return code ? std::string(*code) : std::string();
}

// Whether a response says the service throttles: worth waiting longer for.
bool throttled(long status, const std::string& code) {
  return status == 429 || status == 503 || code == "SlowDown" || code == "Throttling" ||
         code == "ThrottlingException" || code == "RequestLimitExceeded" ||
         code == "TooManyRequestsException";
}

// Errors that may pass on their own: 5xx but "not implemented" and "version not supported",
// 408, S3's timeouts and throttling (which S3 may send as 400).
bool may_pass(long status, const std::string& code) {
  return (status >= 500 && status != 501 && status != 505) || status == 408 ||
         throttled(status, code) || code == "RequestTimeout" || code == "PriorRequestNotComplete";
}

std::string s3_error_text(const Bytes& body) {
  const std::string_view xml(reinterpret_cast<const char*>(body.data()), body.size());
  const auto code = xml_element(xml, "Code");
  if (!code) return "";
  std::string text = std::string(*code);
  if (const auto message = xml_element(xml, "Message")) text += ": " + std::string(*message);
  return text;
}

struct Response {
  long status = 0;
  Bytes body;
  std::string content_range;  // the Content-Range header's value
  std::string bucket_region;  // x-amz-bucket-region, where S3 says the bucket lives elsewhere
  int64_t content_length = -1;
  long retry_after_s = 0;      // the Retry-After header, in seconds (0: none)
  Bytes* body_sink = nullptr;  // where the body goes, reserved from Content-Length
  // An exception in a callback (out of memory for a huge body): libcurl is C, so it is kept
  // here, the transfer aborted, and rethrown once libcurl has returned.
  std::exception_ptr failure;
};

// libcurl's progress callback: nonzero ends the transfer (CURLE_ABORTED_BY_CALLBACK).
int on_progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return CancelScope::cancelled() ? 1 : 0;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<Response*>(user);
  try {
    response->body_sink->append(ByteView(reinterpret_cast<const uint8_t*>(data), size * count));
  } catch (...) {
    response->failure = std::current_exception();
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  return size * count;
}

// One response header line: the ones the store uses are kept in the response.
void read_header_line(std::string_view line, Response* response) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
    value.remove_suffix(1);
  if (name == "content-range") response->content_range = value;
  if (name == "content-length" && response->body_sink) {
    // Grow the body's buffer once, not by doubling as it arrives.
    const uint64_t length = std::strtoull(std::string(value).c_str(), nullptr, 10);
    if (length > 0 && length < (uint64_t{1} << 40)) response->body_sink->reserve(length);
  }
  if (name == "x-amz-bucket-region") response->bucket_region = value;
  if (name == "retry-after") {  // seconds (an HTTP date is left alone)
    const std::string text(value);
    char* stop = nullptr;
    const long seconds = std::strtol(text.c_str(), &stop, 10);
    if (!text.empty() && *stop == '\0' && seconds > 0) response->retry_after_s = seconds;
  }
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<Response*>(user);
  try {
    read_header_line(std::string_view(data, size * count), response);
  } catch (...) {
    response->failure = std::current_exception();
    return 0;  // aborts the transfer
  }
  return size * count;
}

// libcurl handles, kept for their open connections. A forked child leaves its parent's alone
// (their connections are the parent's) and makes its own.
class HandlePool {
 public:
  HandlePool() : pid_(::getpid()) {}
  ~HandlePool() {
    if (pid_ != ::getpid()) return;
    for (CURL* handle : idle_) curl_easy_cleanup(handle);
  }
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  CURL* take() {
    {
      std::lock_guard lock(mutex_);
      if (pid_ != ::getpid()) {
        idle_.clear();
        pid_ = ::getpid();
      }
      if (!idle_.empty()) {
        CURL* handle = idle_.back();
        idle_.pop_back();
        curl_easy_reset(handle);
        return handle;
      }
    }
    CURL* handle = curl_easy_init();
    if (!handle) throw Error("libcurl: curl_easy_init failed");
    return handle;
  }

  void give(CURL* handle) {
    std::lock_guard lock(mutex_);
    if (pid_ == ::getpid()) idle_.push_back(handle);
  }

 private:
  std::mutex mutex_;
  std::vector<CURL*> idle_;
  pid_t pid_;
};

class HttpStore final : public Store {
 public:
  explicit HttpStore(HttpStoreOptions options) : options_(std::move(options)) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    while (options_.base_url.ends_with('/')) options_.base_url.pop_back();
    if (options_.display_url.empty()) options_.display_url = options_.base_url;
  }

  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    Bytes out;
    if (!get_into(key, range, out)) return std::nullopt;
    return out;
  }

  bool get_into(std::string_view key, ByteRange range, Bytes& out) const override {
    std::optional<uint64_t> value_size;
    return get_into_sized(key, range, out, value_size);
  }

  bool get_into_sized(std::string_view key, ByteRange range, Bytes& out,
                      std::optional<uint64_t>& value_size) const override {
    value_size.reset();
    check_key(key);
    const std::string where = options_.display_url + "/" + std::string(key);
    if (range.kind != ByteRange::Kind::kAll && range.length == 0) {
      // HTTP has no empty range: check the value exists and is long enough.
      const auto found = size(key);
      if (!found) return false;
      range.resolve(*found, where);
      value_size = found;
      out.clear();
      return true;
    }
    std::string range_header;
    if (range.kind == ByteRange::Kind::kRange) {
      range_header = "Range: bytes=" + std::to_string(range.offset) + "-" +
                     std::to_string(range.offset + range.length - 1);
    } else if (range.kind == ByteRange::Kind::kSuffix) {
      range_header = "Range: bytes=-" + std::to_string(range.length);
    }
    out.clear();
    if (range.kind != ByteRange::Kind::kAll) out.reserve(range.length);
    Response response = perform("GET", key_url(key), where, range_header, {}, &out);
    if (forbidden_as_missing(response)) return false;
    if (response.status == 404) {
      // A missing key reads as absent (a missing chunk is the fill value); a missing bucket is an
      // error, which only a GET's body tells apart.
      if (s3_error_text(response.body).starts_with("NoSuchBucket")) {
        throw status_error(where, response, Request::kRead);
      }
      return false;
    }
    if (response.status == 416) {
      // "bytes */N": the value has N bytes, and the range starts past them.
      const auto total = total_size(response.content_range);
      if (total) range.resolve(*total, where);
      throw Error(where + ": " + range.describe() + " is past the end of the value");
    }
    if (response.status == 200) {
      value_size = out.size();
      if (range.kind == ByteRange::Kind::kAll) return true;
      // The server ignored the range and sent the whole value.
      const auto [begin, length] = range.resolve(out.size(), where);
      if (begin > 0) std::memmove(out.data(), out.data() + begin, length);
      out.resize(length);
      return true;
    }
    if (response.status == 206) {
      const auto total = total_size(response.content_range);
      const auto first = first_byte(response.content_range);
      // "bytes 100-199/*" (the total unknown) does: the range asked for says where it starts, or
      // (the last bytes) the response does.
      if (!first || (!total && range.kind == ByteRange::Kind::kAll)) {
        throw Error(where + ": a partial response without a usable Content-Range (\"" +
                    response.content_range + "\")");
      }
      const auto [begin, length] =
          total ? range.resolve(*total, where)
                : std::pair<uint64_t, uint64_t>{
                      range.kind == ByteRange::Kind::kRange ? range.offset : *first, range.length};
      if (*first != begin || out.size() != length) {
        throw Error(where + ": asked for " + range.describe() + ", the server sent " +
                    std::to_string(out.size()) + " bytes from byte " + std::to_string(*first));
      }
      value_size = total;
      return true;
    }
    throw status_error(where, response, Request::kRead);
  }

  std::optional<uint64_t> size(std::string_view key) const override {
    check_key(key);
    const std::string where = options_.display_url + "/" + std::string(key);
    Response response = perform("HEAD", key_url(key), where, "", {}, nullptr);
    if (response.status == 404) return std::nullopt;
    if (response.status != 200) {
      // A HEAD's error has no body: a GET of the first byte says S3's error code and message,
      // or, from a server that takes no HEAD (405), the size.
      Bytes first_byte;
      Response detail = perform("GET", key_url(key), where, "Range: bytes=0-0", {}, &first_byte);
      if (forbidden_as_missing(detail) || detail.status == 404) return std::nullopt;
      if (detail.status == 206) {
        if (const auto total = total_size(detail.content_range)) return *total;
      } else if (detail.status == 200) {
        return first_byte.size();  // the range was ignored: the whole value came
      }
      throw status_error(where, detail.status == response.status ? detail : response,
                         Request::kRead);
    }
    if (response.content_length < 0) {
      throw Error(where + ": the server did not say the value's size (no Content-Length)");
    }
    return static_cast<uint64_t>(response.content_length);
  }

  void set(std::string_view key, ByteView value) override {
    check_key(key);
    const std::string where = options_.display_url + "/" + std::string(key);
    require_s3(where, "written");
    // An S3 PUT is atomic: readers see the old object or the new one.
    Response response = perform("PUT", key_url(key), where, "", value, nullptr);
    if (response.status != 200) throw status_error(where, response, Request::kWrite);
  }

  void erase(std::string_view key) override {
    check_key(key);
    const std::string where = options_.display_url + "/" + std::string(key);
    require_s3(where, "changed");
    Response response = perform("DELETE", key_url(key), where, "", {}, nullptr);
    if (response.status != 204 && response.status != 200 && response.status != 404) {
      throw status_error(where, response, Request::kErase);
    }
  }

  std::vector<std::string> list(std::string_view prefix) const override {
    std::vector<std::string> keys;
    for (auto& [key, size] : list_sizes(prefix)) keys.push_back(std::move(key));
    return keys;
  }

  bool can_list() const override { return options_.s3; }

  std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const override {
    if (!options_.s3) {
      throw UnsupportedError(options_.display_url +
                             ": listing keys is not possible over plain HTTP (open arrays by "
                             "their path, groups through consolidated metadata, or use s3://)");
    }
    const std::string full_prefix = options_.key_prefix + std::string(prefix);
    std::vector<std::pair<std::string, uint64_t>> keys;
    for_each_list_page(prefix, "", [&](const ListPage& page) {
      for (size_t i = 0; i < page.keys.size(); ++i) {
        if (!page.keys[i].starts_with(full_prefix)) continue;
        std::string key = page.keys[i].substr(options_.key_prefix.size());
        // "Folders" made by a console or Hadoop's S3A ("temp/", the root's "") are no keys.
        if (key.empty() || key.ends_with('/')) continue;
        keys.emplace_back(std::move(key), page.sizes[i]);
      }
    });
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  // One request per page of 1000 children, not per 1000 keys below them: a group of arrays of
  // millions of chunks lists its members in one request.
  std::vector<std::string> list_dir(std::string_view prefix) const override {
    if (!options_.s3) return Store::list_dir(prefix);  // says listing is not possible
    const std::string full_prefix = options_.key_prefix + std::string(prefix);
    std::set<std::string> children;
    auto add = [&](const std::string& name) {
      if (!name.starts_with(full_prefix)) return;
      std::string child = name.substr(full_prefix.size());
      if (child.ends_with('/')) child.pop_back();
      if (!child.empty() && child.find('/') == std::string::npos) children.insert(child);
    };
    for_each_list_page(prefix, "/", [&](const ListPage& page) {
      for (const auto& key : page.keys) add(key);
      for (const auto& common : page.common_prefixes) add(common);
    });
    return {children.begin(), children.end()};
  }

  std::vector<std::optional<Bytes>> get_many(std::span<const KeyRange> requests) const override {
    std::vector<std::optional<Bytes>> results(requests.size());
    ThreadPool::io().parallel_for(
        requests.size(), [&](size_t i) { results[i] = get(requests[i].key, requests[i].range); });
    return results;
  }

  size_t read_concurrency() const override { return options_.concurrency; }

  std::string url() const override { return options_.display_url; }

 private:
  std::string key_url(std::string_view key) const {
    return options_.base_url + "/" + percent_encode(key, true) + options_.query;
  }

  void require_s3(const std::string& where, const char* what) const {
    if (!options_.s3) {
      throw UnsupportedError(where + ": a plain HTTP store is read-only and cannot be " +
                             std::string(what) + " (use s3:// for an object store)");
    }
  }

  static std::optional<uint64_t> total_size(const std::string& content_range) {
    const size_t slash = content_range.rfind('/');
    if (slash == std::string::npos || slash + 1 >= content_range.size()) return std::nullopt;
    const std::string total = content_range.substr(slash + 1);
    if (total == "*") return std::nullopt;
    char* stop = nullptr;
    const uint64_t value = std::strtoull(total.c_str(), &stop, 10);
    if (*stop != '\0') return std::nullopt;
    return value;
  }

  static std::optional<uint64_t> first_byte(const std::string& content_range) {
    // "bytes 100-199/1000"
    const size_t space = content_range.find(' ');
    const size_t dash = content_range.find('-');
    if (space == std::string::npos || dash == std::string::npos || dash < space)
      return std::nullopt;
    const std::string first = content_range.substr(space + 1, dash - space - 1);
    char* stop = nullptr;
    const uint64_t value = std::strtoull(first.c_str(), &stop, 10);
    if (first.empty() || *stop != '\0') return std::nullopt;
    return value;
  }

  // Calls `use` with each page of ListObjectsV2 of the keys under `prefix` (the store's), with
  // `delimiter` ("/": the folders below as common prefixes) where not empty.
  void for_each_list_page(std::string_view prefix, const std::string& delimiter,
                          const std::function<void(const ListPage&)>& use) const {
    const std::string full_prefix = options_.key_prefix + std::string(prefix);
    const std::string where = options_.display_url + " (listing \"" + std::string(prefix) + "\")";
    std::string token;
    for (;;) {
      // The query's parameters in sorted order, as a V4 signature's canonical request has them.
      std::string url = options_.bucket_url + "?";
      if (!token.empty()) url += "continuation-token=" + percent_encode(token, false) + "&";
      if (!delimiter.empty()) url += "delimiter=" + percent_encode(delimiter, false) + "&";
      url += "list-type=2&prefix=" + percent_encode(full_prefix, false);
      Bytes body;
      Response response = perform("GET", url, where, "", {}, &body);
      if (response.status != 200) throw status_error(where, response, Request::kList);
      ListPage page;
      try {
        page = parse_list_objects(
            std::string_view(reinterpret_cast<const char*>(body.data()), body.size()));
      } catch (const Error&) {
        rethrow_with_context(where);
      }
      use(page);
      if (!page.truncated) return;
      if (page.next_token.empty() || page.next_token == token) {
        throw Error(where + ": a truncated listing without a new continuation token");
      }
      token = page.next_token;
    }
  }

  // What a request did, for what a refusal (403) may mean.
  enum class Request { kRead, kWrite, kErase, kList };
  static Request request_of(const char* method) {
    const std::string_view name = method;
    return name == "PUT" ? Request::kWrite : name == "DELETE" ? Request::kErase : Request::kRead;
  }

  Error status_error(const std::string& where, const Response& response, Request request) const {
    std::string message = where + ": HTTP " + std::to_string(response.status);
    const std::string detail = s3_error_text(response.body);
    if (!detail.empty()) message += " (" + detail + ")";
    if (!response.bucket_region.empty() && response.bucket_region != options_.region) {
      message += "; the bucket is in region " + response.bucket_region + ", not " +
                 options_.region + ": set AWS_REGION=" + response.bucket_region;
    } else if (response.status == 403 && options_.s3) {
      message += forbidden_hint(s3_error_code(response.body), request);
    }
    return Error(message);
  }

  // What a 403 from an S3 API may mean, by how the request was made.
  std::string forbidden_hint(const std::string& code, Request request) const {
    if (options_.display_url.starts_with("gs://")) {
      return "; the request was unsigned (zfeed reads public gs:// data; for private buckets use "
             "an S3 endpoint with HMAC keys)";
    }
    if (options_.access_key.empty()) {
      if (environment_flag("AWS_NO_SIGN_REQUEST")) {
        return "; the request was unsigned (AWS_NO_SIGN_REQUEST=" +
               environment("AWS_NO_SIGN_REQUEST") + ")";
      }
      std::string hint =
          "; the request was unsigned (no AWS_ACCESS_KEY_ID in the environment or "
          "the AWS profile";
      for (const char* other : {"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"}) {
        if (!environment(other).empty()) {
          hint += std::string("; zfeed does not read role credentials (") + other +
                  " is set): export keys with `aws configure export-credentials --format env`";
          break;
        }
      }
      return hint + ")";
    }
    if (code != "AccessDenied" && !code.empty()) return "";
    switch (request) {
      case Request::kRead:
        return "; S3 answers 403 for a missing key when the credentials lack s3:ListBucket: "
               "grant it, or set ZFEED_S3_FORBIDDEN_IS_MISSING=1 to read such keys as missing";
      case Request::kWrite:
        return "; the credentials may lack s3:PutObject on this bucket";
      case Request::kErase:
        return "; the credentials may lack s3:DeleteObject on this bucket";
      case Request::kList:
        return "; the credentials may lack s3:ListBucket on this bucket";
    }
    return "";
  }

  // A 403 read as a missing key, where ZFEED_S3_FORBIDDEN_IS_MISSING asks for it.
  bool forbidden_as_missing(const Response& response) const {
    if (!options_.forbidden_is_missing || response.status != 403) return false;
    const std::string code = s3_error_code(response.body);
    return code != "InvalidAccessKeyId" && code != "SignatureDoesNotMatch";
  }

  // Before retry `attempt + 1`: the doubled delay, drawn between half and all of it, and at
  // least the server's Retry-After (capped: a read must not wait minutes).
  std::chrono::milliseconds retry_delay(int attempt, long retry_after_s) const {
    const long full = std::min(options_.retry_delay_ms << std::min(attempt, 16), 20'000L);
    thread_local std::minstd_rand random(
        static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id())));
    const long drawn =
        full / 2 + static_cast<long>(random() % static_cast<unsigned long>(full / 2 + 1));
    return std::chrono::milliseconds(std::max(drawn, std::min(retry_after_s, 20L) * 1000));
  }

  static bool transient(CURLcode code) {
    switch (code) {
      case CURLE_COULDNT_RESOLVE_HOST:  // a name server overwhelmed by a whole cluster's lookups
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_COULDNT_CONNECT:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_PARTIAL_FILE:
      case CURLE_GOT_NOTHING:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return true;
      default:
        return false;
    }
  }

  // One request, retried with doubling delays while its failure may pass. The body goes into
  // `body` where given (cleared before each attempt); an error body is copied into the response
  // (it is small, and `body` is often a reused buffer whose capacity should stay where it is).
  Response perform(const char* method, const std::string& url, const std::string& where,
                   const std::string& range_header, ByteView upload, Bytes* body) const {
    for (int attempt = 0;; ++attempt) {
      Response response;
      Bytes* sink = body ? body : &response.body;
      sink->clear();
      char error_text[CURL_ERROR_SIZE] = {0};
      const CURLcode code =
          perform_once(method, url, range_header, upload, sink, response, error_text);
      if (response.failure) std::rethrow_exception(response.failure);
      if (code == CURLE_ABORTED_BY_CALLBACK) throw_cancelled(where);
      const bool failed = code != CURLE_OK;
      const std::string error_code =
          !failed && response.status >= 400 ? s3_error_code(*sink) : std::string();
      const bool retry = failed ? transient(code) : may_pass(response.status, error_code);
      const int attempts_left = !failed && throttled(response.status, error_code)
                                    ? options_.throttle_retries
                                    : options_.retries;
      if (!retry || attempt >= attempts_left) {
        if (failed) {
          std::string message = where + ": " + curl_easy_strerror(code);
          if (error_text[0] != '\0') message += " (" + std::string(error_text) + ")";
          if (attempt > 0) message += " after " + std::to_string(attempt + 1) + " attempts";
          throw Error(message);
        }
        if (body && response.status >= 300) response.body = Bytes(body->view());
        if (retry && attempt > 0) {  // still failing once the attempts are spent
          Error error = status_error(where, response, request_of(method));
          throw Error(std::string(error.what()) + " after " + std::to_string(attempt + 1) +
                      " attempts");
        }
        return response;
      }
      // The wait before the retry, ended early where the work is cancelled.
      const auto until =
          std::chrono::steady_clock::now() + retry_delay(attempt, response.retry_after_s);
      while (std::chrono::steady_clock::now() < until) {
        if (CancelScope::cancelled()) throw_cancelled(where);
        std::this_thread::sleep_until(
            std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
      }
    }
  }

  [[noreturn]] static void throw_cancelled(const std::string& where) {
    throw Error(where + ": the read was cancelled (the work it was for stopped)");
  }

  CURLcode perform_once(const char* method, const std::string& url, const std::string& range_header,
                        ByteView upload, Bytes* sink, Response& response, char* error_text) const {
    CURL* handle = handles_.take();
    struct Give {
      HandlePool& pool;
      CURL* handle;
      curl_slist* headers = nullptr;
      ~Give() {
        // The pooled handle must not keep pointers to this request's stack and headers.
        curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, nullptr);
        curl_easy_setopt(handle, CURLOPT_HTTPHEADER, nullptr);
        curl_easy_setopt(handle, CURLOPT_WRITEDATA, nullptr);
        curl_easy_setopt(handle, CURLOPT_HEADERDATA, nullptr);
        curl_slist_free_all(headers);
        pool.give(handle);
      }
    } give{handles_, handle};
    auto add_header = [&](const std::string& header) {
      curl_slist* grown = curl_slist_append(give.headers, header.c_str());
      if (!grown) throw Error("libcurl: out of memory for a header");
      give.headers = grown;
    };
    curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    // ZFEED_HTTP_VERBOSE=1: libcurl prints each request and response header to stderr.
    static const bool verbose = environment("ZFEED_HTTP_VERBOSE") == "1";
    if (verbose) curl_easy_setopt(handle, CURLOPT_VERBOSE, 1L);
    curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, options_.connect_timeout_ms);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, options_.stall_timeout_s);
    // Asked at least once a second, on this thread: a transfer for cancelled work ends.
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(handle, CURLOPT_HEADERDATA, &response);
    response.body_sink = sink;
    // Larger reads from the socket: chunks are megabytes, libcurl's default buffer is 16 KiB.
    curl_easy_setopt(handle, CURLOPT_BUFFERSIZE, 512L * 1024);
    // Certificates where the environment names them (a site's own CA, a proxy's), as the AWS
    // tools and curl do; else libcurl's default bundle.
    static const std::string ca_bundle = [] {
      for (const char* name : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
        if (std::string value = environment(name); !value.empty()) return value;
      }
      return std::string();
    }();
    if (!ca_bundle.empty()) curl_easy_setopt(handle, CURLOPT_CAINFO, ca_bundle.c_str());
    // A plain HTTP server may redirect (a CDN); a signed request must not follow one.
    curl_easy_setopt(handle, CURLOPT_FOLLOWLOCATION, options_.s3 ? 0L : 1L);
    curl_easy_setopt(handle, CURLOPT_MAXREDIRS, 10L);  // a redirect loop is an error, not a storm
    const std::string_view verb = method;
    if (verb == "HEAD") {
      curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
    } else if (verb == "PUT") {
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, "PUT");
      curl_easy_setopt(handle, CURLOPT_POSTFIELDS,
                       upload.empty() ? "" : reinterpret_cast<const char*>(upload.data()));
      curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(upload.size()));
      add_header("Content-Type: application/octet-stream");
      // No "Expect:" to drop the 100-continue round trip: libcurl 7.88 signs that empty header,
      // which it then does not send, and S3 refuses the signature. Wait less for the 100 instead.
      curl_easy_setopt(handle, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
    } else if (verb == "DELETE") {
      curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    if (!range_header.empty()) add_header(range_header);
    if (options_.s3 && !options_.access_key.empty()) {
      const std::string sigv4 = "aws:amz:" + options_.region + ":s3";
      curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(handle, CURLOPT_USERNAME, options_.access_key.c_str());
      curl_easy_setopt(handle, CURLOPT_PASSWORD, options_.secret_key.c_str());
      // S3 wants this header in every signed request; libcurl signs the value given.
      add_header("x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (!options_.session_token.empty()) {
        add_header("x-amz-security-token: " + options_.session_token);
      }
    }
    if (give.headers) curl_easy_setopt(handle, CURLOPT_HTTPHEADER, give.headers);
    const CURLcode code = curl_easy_perform(handle);
    if (code == CURLE_OK) {
      curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
      curl_off_t length = -1;
      curl_easy_getinfo(handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      response.content_length = length;
    }
    return code;
  }

  HttpStoreOptions options_;
  mutable HandlePool handles_;
};

std::string trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return std::string(text);
}

// The keys of one [section] of an AWS shared file (INI); empty if the file or the section is
// absent. `found` says whether the section was there.
std::map<std::string, std::string> aws_file_section(const std::string& path,
                                                    const std::string& section, bool& found) {
  std::map<std::string, std::string> values;
  std::ifstream file(path);
  if (!file) return values;
  std::string line;
  bool inside = false;
  while (std::getline(file, line)) {
    const std::string text = trim(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      inside = trim(std::string_view(text).substr(1, text.size() - 2)) == section;
      found = found || inside;
      continue;
    }
    const size_t equals = text.find('=');
    if (inside && equals != std::string::npos) {
      values[trim(std::string_view(text).substr(0, equals))] =
          trim(std::string_view(text).substr(equals + 1));
    }
  }
  return values;
}

// The AWS CLI's and SDKs' shared files for a profile: credentials (section "NAME") and config
// (section "default" or "profile NAME"), the former's keys first.
std::map<std::string, std::string> aws_profile() {
  std::string profile = environment("AWS_PROFILE");
  const bool named = !profile.empty();
  if (!named) profile = "default";
  const std::string home = environment("HOME");
  std::string credentials = environment("AWS_SHARED_CREDENTIALS_FILE");
  if (credentials.empty() && !home.empty()) credentials = home + "/.aws/credentials";
  std::string config = environment("AWS_CONFIG_FILE");
  if (config.empty() && !home.empty()) config = home + "/.aws/config";
  bool found = false;
  std::map<std::string, std::string> values = aws_file_section(credentials, profile, found);
  const auto from_config =
      aws_file_section(config, profile == "default" ? profile : "profile " + profile, found);
  values.insert(from_config.begin(), from_config.end());
  if (named && !found) {
    throw Error("AWS_PROFILE=" + profile + ": no such profile in " + credentials + " or " + config);
  }
  return values;
}

size_t io_threads() {
  const std::string value = environment("ZFEED_IO_THREADS");
  if (!value.empty()) {
    const long parsed = std::strtol(value.c_str(), nullptr, 10);
    if (parsed > 0) return static_cast<size_t>(parsed);
  }
  return 32;
}

}  // namespace

std::string percent_encode(std::string_view text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (is_unreserved(c) || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

ListPage parse_list_objects(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    throw Error("not an object listing (no <ListBucketResult>): \"" +
                std::string(xml.substr(0, 200)) + "\"");
  }
  ListPage page;
  size_t at = 0;
  while ((at = xml.find("<Contents>", at)) != std::string_view::npos) {
    const size_t end = xml.find("</Contents>", at);
    if (end == std::string_view::npos) throw Error("object listing: unterminated <Contents>");
    const std::string_view entry = xml.substr(at, end - at);
    const auto key = xml_element(entry, "Key");
    if (!key) throw Error("object listing: an entry without a <Key>");
    page.keys.push_back(xml_unescape(*key));
    const auto size = xml_element(entry, "Size");
    const std::string digits(size ? *size : "");
    char* stop = nullptr;
    const uint64_t value = std::strtoull(digits.c_str(), &stop, 10);
    if (digits.empty() || *stop != '\0' || digits[0] == '-') {
      throw Error("object listing: the entry of \"" + page.keys.back() +
                  "\" has no valid <Size> (\"" + digits + "\")");
    }
    page.sizes.push_back(value);
    at = end;
  }
  at = 0;
  while ((at = xml.find("<CommonPrefixes>", at)) != std::string_view::npos) {
    const size_t end = xml.find("</CommonPrefixes>", at);
    if (end == std::string_view::npos) throw Error("object listing: unterminated <CommonPrefixes>");
    const auto prefix = xml_element(xml.substr(at, end - at), "Prefix");
    if (!prefix) throw Error("object listing: <CommonPrefixes> without a <Prefix>");
    page.common_prefixes.push_back(xml_unescape(*prefix));
    at = end;
  }
  const auto truncated = xml_element(xml, "IsTruncated");
  page.truncated = truncated && *truncated == "true";
  if (const auto token = xml_element(xml, "NextContinuationToken")) {
    page.next_token = xml_unescape(*token);
  }
  return page;
}

HttpStoreOptions http_store_options(std::string_view url) {
  HttpStoreOptions options;
  options.concurrency = io_threads();
  if (url.starts_with("http://") || url.starts_with("https://")) {
    // A query (a signed or token URL) follows each key's path, not the store's.
    const size_t query = url.find('?');
    if (query != std::string_view::npos) {
      options.query = std::string(url.substr(query));
      url = url.substr(0, query);
    }
    options.base_url = std::string(url);
    while (options.base_url.ends_with('/')) options.base_url.pop_back();
    // Without the query and the user:password@ of the authority: either may hold a secret.
    options.display_url = options.base_url;
    const size_t authority = options.display_url.find("://") + 3;
    const size_t at = options.display_url.find('@', authority);
    if (at != std::string::npos && at < options.display_url.find('/', authority)) {
      options.display_url.erase(authority, at + 1 - authority);
    }
    return options;
  }
  const bool google = url.starts_with("gs://");
  if (!google && !url.starts_with("s3://")) {
    throw UnsupportedError("unsupported store URL \"" + std::string(url) +
                           "\" (supported: file paths, file://, memory://, http://, https://, "
                           "s3://, gs://)");
  }
  std::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  std::string prefix(slash == std::string_view::npos ? "" : rest.substr(slash + 1));
  while (prefix.ends_with('/')) prefix.pop_back();
  if (bucket.empty()) throw Error("store URL \"" + std::string(url) + "\" names no bucket");
  if (!prefix.empty()) Store::check_key(prefix);

  options.s3 = true;
  // The environment first, then the profile's shared files, as the AWS tools read them.
  const auto profile = google ? std::map<std::string, std::string>() : aws_profile();
  auto from_profile = [&](const char* key) {
    const auto it = profile.find(key);
    return it == profile.end() ? std::string() : it->second;
  };
  options.region = environment("AWS_REGION");
  if (options.region.empty()) options.region = environment("AWS_DEFAULT_REGION");
  if (options.region.empty() && !google) options.region = from_profile("region");
  if (options.region.empty()) options.region = google ? "auto" : "us-east-1";
  std::string endpoint;
  if (google) {
    endpoint = "https://storage.googleapis.com";
  } else {
    endpoint = environment("AWS_ENDPOINT_URL_S3");
    if (endpoint.empty()) endpoint = environment("AWS_ENDPOINT_URL");
    if (endpoint.empty()) endpoint = from_profile("endpoint_url");
    if (endpoint.empty()) endpoint = "https://s3." + options.region + ".amazonaws.com";
  }
  while (endpoint.ends_with('/')) endpoint.pop_back();
  options.bucket_url = endpoint + "/" + percent_encode(bucket, false);
  options.base_url =
      prefix.empty() ? options.bucket_url : options.bucket_url + "/" + percent_encode(prefix, true);
  options.key_prefix = prefix.empty() ? "" : prefix + "/";
  options.display_url =
      std::string(google ? "gs://" : "s3://") + bucket + (prefix.empty() ? "" : "/" + prefix);

  options.forbidden_is_missing = environment_flag("ZFEED_S3_FORBIDDEN_IS_MISSING");
  const bool unsigned_requests = google || environment_flag("AWS_NO_SIGN_REQUEST");
  // Keys from one source: the environment, else the profile; an access key needs its secret.
  auto take_keys = [&](const std::function<std::string(const char*)>& read, const char* access,
                       const char* secret, const char* token, const char* source) {
    options.access_key = read(access);
    options.secret_key = read(secret);
    options.session_token = read(token);
    if (!options.access_key.empty() && options.secret_key.empty()) {
      throw Error(options.display_url + ": " + access + " is set but " + secret + " is not (" +
                  source + ")");
    }
  };
  if (!unsigned_requests) {
    take_keys(environment, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "in the environment");
    if (options.access_key.empty()) {
      take_keys(from_profile, "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                "in the AWS profile");
    }
  }
  return options;
}

std::shared_ptr<Store> make_http_store(HttpStoreOptions options) {
  return std::make_shared<HttpStore>(std::move(options));
}

}  // namespace zfeed

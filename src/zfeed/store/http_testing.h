// For tests: an HTTP/1.1 server on loopback (TestServer) that serves a map of objects as a
// static file server and an S3 bucket would, and can fail, stall or ignore ranges on request.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zfeed/util/bytes.h"

namespace zfeed::testing {

inline std::string text(const Bytes& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

inline std::string percent_decode(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size()) {
      out += static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

inline std::string xml_escape(std::string_view in) {
  std::string out;
  for (char c : in) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else {
      out += c;
    }
  }
  return out;
}

// An HTTP/1.1 server on loopback that keeps objects in a map: GET (with Range), HEAD, PUT,
// DELETE, and S3's ListObjectsV2 (two keys a page) under /bucket. It can fail requests, ignore
// ranges, or stall, to show how the store copes.
class TestServer {
 public:
  TestServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int yes = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 64) != 0) {
      throw std::runtime_error("test server: cannot listen");
    }
    socklen_t length = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~TestServer() {
    stopping_ = true;
    acceptor_.join();
    {
      std::lock_guard lock(mutex_);
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& thread : threads_) thread.join();
    ::close(listener_);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::mutex& mutex() { return mutex_; }  // guards failure_code and the objects

  void put(const std::string& key, const std::string& value) {
    std::lock_guard lock(mutex_);
    objects_[key] = value;
  }
  std::optional<std::string> object(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }

  std::atomic<int> failures_left{0};
  std::atomic<int> failure_status{503};
  std::string failure_code = "SlowDown";   // S3's error code in a failure's body (under the lock)
  std::atomic<bool> redirect_loop{false};  // every request redirected to itself
  std::atomic<bool> ignore_range{false};
  std::atomic<bool> stall{false};
  std::atomic<bool> unknown_total{false};  // partial responses say "bytes a-b/*"
  std::string last_query;                  // of the last read with a query (under the lock)
  std::atomic<int> requests{0};
  std::atomic<int> max_in_flight{0};

 private:
  void accept_loop() {
    while (!stopping_) {
      pollfd ready{listener_, POLLIN, 0};
      if (::poll(&ready, 1, 50) <= 0) continue;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      std::lock_guard lock(mutex_);
      connections_.push_back(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    std::string buffer;
    char chunk[65536];
    for (;;) {
      size_t header_end;
      while ((header_end = buffer.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
        if (got <= 0) return close_connection(fd);
        buffer.append(chunk, static_cast<size_t>(got));
      }
      const std::string head = buffer.substr(0, header_end);
      buffer.erase(0, header_end + 4);
      std::map<std::string, std::string> headers;
      size_t line_end = head.find("\r\n");
      const std::string request_line = head.substr(0, line_end);
      while (line_end != std::string::npos) {
        const size_t next = head.find("\r\n", line_end + 2);
        const std::string line = head.substr(line_end + 2, next - line_end - 2);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          headers[name] = line.substr(colon + 2);
        }
        line_end = next;
      }
      size_t body_length = 0;
      if (headers.count("content-length")) body_length = std::stoul(headers["content-length"]);
      while (buffer.size() < body_length) {
        const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
        if (got <= 0) return close_connection(fd);
        buffer.append(chunk, static_cast<size_t>(got));
      }
      const std::string body = buffer.substr(0, body_length);
      buffer.erase(0, body_length);
      ++requests;
      const int now = ++in_flight_;
      int seen = max_in_flight.load();
      while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
      }
      if (stall) {
        while (!stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        --in_flight_;
        return close_connection(fd);
      }
      std::string response = respond(request_line, headers, body);
      // Hold each request a little, so that reads overlap only where the client overlaps them.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      --in_flight_;
      if (::send(fd, response.data(), response.size(), MSG_NOSIGNAL) < 0) {
        return close_connection(fd);
      }
    }
  }

  void close_connection(int fd) {
    std::lock_guard lock(mutex_);
    connections_.erase(std::find(connections_.begin(), connections_.end(), fd));
    ::close(fd);
  }

  static std::string reply(int status, const std::string& reason, const std::string& body,
                           const std::string& extra = "", bool head = false) {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" +
           (head ? "" : body);
  }

  std::string respond(const std::string& request_line, std::map<std::string, std::string>& headers,
                      const std::string& body) {
    const size_t space = request_line.find(' ');
    const std::string method = request_line.substr(0, space);
    const std::string target = request_line.substr(space + 1, request_line.rfind(' ') - space - 1);
    if (failures_left > 0) {
      --failures_left;
      std::string code;
      {
        std::lock_guard lock(mutex_);
        code = failure_code;
      }
      return reply(failure_status, "Failing",
                   "<Error><Code>" + code + "</Code><Message>" +
                       (code == "SlowDown" ? "Please reduce your request rate" : "Failing") +
                       "</Message></Error>",
                   "", method == "HEAD");
    }
    if (redirect_loop) return reply(302, "Found", "", "Location: " + target + "\r\n");
    const size_t question = target.find('?');
    const std::string path = percent_decode(target.substr(1, question - 1));
    std::lock_guard lock(mutex_);
    if (question != std::string::npos) {
      const std::string query = target.substr(question + 1);
      if (query.find("list-type=") != std::string::npos) return list(path, query);
      last_query = query;  // a key read through a signed or token URL
    }
    const bool head = method == "HEAD";
    if (method == "PUT") {
      objects_[path] = body;
      return reply(200, "OK", "");
    }
    if (method == "DELETE") {
      objects_.erase(path);
      return reply(204, "No Content", "");
    }
    auto it = objects_.find(path);
    if (it == objects_.end()) {
      return reply(404, "Not Found", "<Error><Code>NoSuchKey</Code></Error>", "", head);
    }
    const std::string& value = it->second;
    auto range = headers.find("range");
    if (range == headers.end() || ignore_range || head) return reply(200, "OK", value, "", head);
    const std::string spec = range->second.substr(6);  // "bytes="
    const size_t dash = spec.find('-');
    uint64_t first, last;
    if (dash == 0) {
      const uint64_t suffix = std::stoull(spec.substr(1));
      first = value.size() > suffix ? value.size() - suffix : 0;
      last = value.size() - 1;
    } else {
      first = std::stoull(spec.substr(0, dash));
      last = std::min<uint64_t>(std::stoull(spec.substr(dash + 1)), value.size() - 1);
    }
    if (first >= value.size()) {
      return reply(416, "Range Not Satisfiable", "",
                   "Content-Range: bytes */" + std::to_string(value.size()) + "\r\n");
    }
    return reply(206, "Partial Content", value.substr(first, last - first + 1),
                 "Content-Range: bytes " + std::to_string(first) + "-" + std::to_string(last) +
                     "/" + (unknown_total ? std::string("*") : std::to_string(value.size())) +
                     "\r\n");
  }

  // ListObjectsV2 for the bucket `bucket`, two keys a page, the token being the last key given.
  std::string list(const std::string& bucket, const std::string& query) {
    std::map<std::string, std::string> params;
    size_t at = 0;
    while (at <= query.size()) {
      size_t end = query.find('&', at);
      if (end == std::string::npos) end = query.size();
      const std::string pair = query.substr(at, end - at);
      const size_t equals = pair.find('=');
      params[pair.substr(0, equals)] = percent_decode(pair.substr(equals + 1));
      at = end + 1;
    }
    const std::string prefix = bucket + "/" + params["prefix"];
    std::string xml = "<?xml version=\"1.0\"?><ListBucketResult><Name>" + bucket + "</Name>";
    // The keys under the prefix, and with delimiter=/ the "folders" below it in their place.
    const bool folders = params["delimiter"] == "/";
    std::vector<std::pair<bool, std::string>> entries;  // (a common prefix?, name in the bucket)
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && it->first.starts_with(prefix); ++it) {
      const std::string key = it->first.substr(bucket.size() + 1);
      const size_t slash = it->first.find('/', prefix.size());
      if (folders && slash != std::string::npos) {
        const std::string common = it->first.substr(bucket.size() + 1, slash - bucket.size());
        if (entries.empty() || entries.back().second != common) entries.emplace_back(true, common);
      } else {
        entries.emplace_back(false, key);
      }
    }
    size_t first = 0;
    if (params.count("continuation-token")) {
      while (first < entries.size() && entries[first].second <= params["continuation-token"]) {
        ++first;
      }
    }
    const size_t stop = std::min(entries.size(), first + 2);  // two entries a page
    for (size_t i = first; i < stop; ++i) {
      const auto& [common, name] = entries[i];
      xml += common
                 ? "<CommonPrefixes><Prefix>" + xml_escape(name) + "</Prefix></CommonPrefixes>"
                 : "<Contents><Key>" + xml_escape(name) + "</Key><Size>" +
                       std::to_string(objects_[bucket + "/" + name].size()) + "</Size></Contents>";
    }
    const bool more = stop < entries.size();
    xml += std::string("<IsTruncated>") + (more ? "true" : "false") + "</IsTruncated>";
    if (more) {
      xml += "<NextContinuationToken>" + xml_escape(entries[stop - 1].second) +
             "</NextContinuationToken>";
    }
    return reply(200, "OK", xml + "</ListBucketResult>");
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> in_flight_{0};
  std::thread acceptor_;
  std::mutex mutex_;
  std::vector<int> connections_;
  std::vector<std::thread> threads_;
  std::map<std::string, std::string> objects_;
};

}  // namespace zfeed::testing

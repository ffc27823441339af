#include "zfeed/store/store.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "zfeed/store/http_store.h"
#include "zfeed/store/staged_copy.h"
#include "zfeed/util/error.h"
#include "zfeed/util/scratch.h"

namespace zfeed {

std::string ByteRange::describe() const {
  switch (kind) {
    case Kind::kAll:
      return "all bytes";
    case Kind::kRange:
      return "bytes " + std::to_string(offset) + ".." + std::to_string(offset + length);
    case Kind::kSuffix:
      return "the last " + std::to_string(length) + " bytes";
  }
  return "";
}

bool Store::with_bytes(std::string_view key, ByteRange range,
                       const std::function<void(ByteView)>& use) const {
  ScratchBuffer buffer;
  if (!get_into(key, range, buffer.bytes())) return false;
  use(buffer.bytes());
  return true;
}

bool Store::get_into(std::string_view key, ByteRange range, Bytes& out) const {
  auto value = get(key, range);
  if (!value) return false;
  out = std::move(*value);
  return true;
}

bool Store::get_into_sized(std::string_view key, ByteRange range, Bytes& out,
                           std::optional<uint64_t>& value_size) const {
  if (!get_into(key, range, out)) return false;
  value_size = size(key);
  return true;
}

std::pair<uint64_t, uint64_t> ByteRange::resolve(uint64_t size, std::string_view where) const {
  uint64_t begin = 0, selected = size;
  if (kind == Kind::kRange) {
    begin = offset;
    selected = length;
  } else if (kind == Kind::kSuffix) {
    selected = length;
    begin = size - std::min(length, size);
  }
  if (begin > size || selected > size - begin) {
    throw Error(std::string(where) + ": " + describe() + " is outside the " + std::to_string(size) +
                "-byte value");
  }
  return {begin, selected};
}

std::vector<std::optional<Bytes>> Store::get_many(std::span<const KeyRange> requests) const {
  std::vector<std::optional<Bytes>> results;
  results.reserve(requests.size());
  for (const auto& request : requests) results.push_back(get(request.key, request.range));
  return results;
}

bool Store::read_range_into(std::string_view key, uint64_t offset, MutableByteView out,
                            std::optional<uint64_t> expected_size) const {
  if (expected_size && offset == 0 && out.size() == *expected_size) {
    // The whole value: one read, its size checked from what came back.
    Bytes value;
    if (!get_into(key, ByteRange::all(), value)) return false;
    check_size(key, value.size(), *expected_size);
    if (!out.empty()) std::memcpy(out.data(), value.data(), out.size());
    return true;
  }
  if (expected_size) {
    const std::optional<uint64_t> found = size(key);
    if (!found) return false;
    check_size(key, *found, *expected_size);
  }
  Bytes value;
  if (!get_into(key, ByteRange::range(offset, out.size()), value)) return false;
  if (!out.empty()) std::memcpy(out.data(), value.data(), out.size());
  return true;
}

void Store::check_size(std::string_view key, uint64_t size, uint64_t expected) const {
  if (size != expected) {
    throw SizeMismatchError(url() + "/" + std::string(key) + ": expected " +
                                std::to_string(expected) + " bytes, found " + std::to_string(size),
                            size, expected);
  }
}

std::optional<std::string> Store::local_path(std::string_view) const { return std::nullopt; }

void Store::erase_prefix(std::string_view prefix) {
  for (const auto& key : list(prefix)) erase(key);
}

std::vector<std::pair<std::string, uint64_t>> Store::list_sizes(std::string_view prefix) const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (auto& key : list(prefix)) {
    // A key removed since the listing is skipped, as if listed a moment later.
    if (const auto found = size(key)) out.emplace_back(std::move(key), *found);
  }
  return out;
}

std::vector<std::string> Store::list_dir(std::string_view prefix) const {
  std::set<std::string> children;
  for (const auto& key : list(prefix)) {
    std::string_view rest = std::string_view(key).substr(prefix.size());
    children.emplace(rest.substr(0, rest.find('/')));
  }
  return {children.begin(), children.end()};
}

void Store::check_key(std::string_view key) {
  auto fail = [&](const char* why) {
    std::string shown;  // a NUL would cut the message short
    for (char c : key) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
    throw Error("invalid key \"" + shown + "\": " + why);
  };
  if (key.empty()) fail("empty");
  if (key.front() == '/') fail("absolute paths are not allowed");
  if (key.find('\0') != std::string_view::npos) fail("contains a NUL byte");
  if (key.find('\\') != std::string_view::npos) fail("contains a backslash");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty()) fail("has an empty path component");
    if (part == "." || part == "..") fail("climbs out of the store root (\".\" or \"..\")");
    start = end + 1;
  }
}

std::shared_ptr<Store> open_store(const std::string& path_or_url, bool create) {
  std::string_view path = path_or_url;
  if (path.starts_with("memory://")) return make_memory_store();
  if (path.starts_with("file://")) path.remove_prefix(7);
  if (path.find("://") != std::string_view::npos) {
    // Remote: there is nothing to create (an object store's prefix exists once a key is in it).
    return make_http_store(http_store_options(path));
  }
  FileStoreOptions options;
  options.create = create;
  // A staged copy (zfeed stage) reads as what its record says it holds.
  return open_staged_copy(make_file_store(std::string(path), options), std::string(path));
}

}  // namespace zfeed

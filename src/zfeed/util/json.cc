#include "zfeed/util/json.h"

#include <cmath>

#include "zfeed/util/error.h"

namespace zfeed {

namespace {

// nlohmann's parser is iterative, but copying, dumping, comparing and freeing a document recurse
// once per nesting level, so a deeply nested document (attributes of "[[[[...") would overflow
// the stack. No metadata needs more than a few levels.
constexpr size_t kMaxJsonDepth = 512;

void check_depth(std::string_view text, std::string_view where) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw Error(std::string(where) + ": JSON nested deeper than " +
                    std::to_string(kMaxJsonDepth) + " levels at byte " + std::to_string(i));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace

Json parse_json(std::string_view text, std::string_view where) {
  check_depth(text, where);
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(std::string(where) + ": invalid JSON at byte " + std::to_string(e.byte) + " of " +
                std::to_string(text.size()));
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax the parser still refuses: a number too large for a double ("1e999").
    throw Error(std::string(where) + ": invalid JSON (" + e.what() + ")");
  }
}

std::string json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unexpected JSON value";
  }
}

uint64_t json_to_uint64(const Json& value, std::string_view what) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    if (v < 0) throw Error(std::string(what) + " must not be negative, got " + std::to_string(v));
    return static_cast<uint64_t>(v);
  }
  if (value.is_number_float()) {
    double v = value.get<double>();
    if (v >= 0 && v < 18446744073709551616.0 && std::floor(v) == v) return static_cast<uint64_t>(v);
  }
  throw Error(std::string(what) + " must be a non-negative integer, got " + value.dump());
}

std::string json_string_or(const Json& object, std::string_view field, std::string_view fallback) {
  if (!object.is_object()) return std::string(fallback);
  auto it = object.find(field);
  if (it == object.end() || !it->is_string()) return std::string(fallback);
  return it->get<std::string>();
}

std::string dump_json(const Json& value) { return value.dump(2); }

}  // namespace zfeed

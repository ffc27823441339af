// JSON as zfeed uses it: nlohmann's ordered_json (attribute order is kept as written), parsed
// with errors that name the document.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "zfeed/util/bytes.h"

namespace zfeed {

using Json = nlohmann::ordered_json;

// Parses `text`; `where` names the document in errors ("zarr.json: invalid JSON at byte 12: ...").
Json parse_json(std::string_view text, std::string_view where);

// The JSON type in words, for error messages ("a string", "an array").
std::string json_type_name(const Json& value);

// Reads a non-negative integer exactly (no round trip through double); `what` names it in
// errors.
uint64_t json_to_uint64(const Json& value, std::string_view what);

// The string at `field` of an object, or `fallback` when absent or not a string.
std::string json_string_or(const Json& object, std::string_view field, std::string_view fallback);

// Serializes with two-space indentation, as zarr-python and TensorStore write metadata.
std::string dump_json(const Json& value);

}  // namespace zfeed

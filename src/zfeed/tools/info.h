// `zfeed info PATH`: the tree of a store with, per array, its shape, dimensions, data type,
// chunk and shard shapes, codecs, stored and decoded size and compression ratio.
#pragma once

#include <ostream>
#include <string>

#include "zfeed/util/json.h"

namespace zfeed::tools {

// Describes the store (or the node at `path` within it) as JSON.
Json describe_store(const std::string& store_path);
// Prints it as a tree.
void print_info(const Json& description, std::ostream& out);
std::string human_bytes(double bytes);

}  // namespace zfeed::tools

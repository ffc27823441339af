// `zfeed info PATH`: the tree of a store with, per array, its shape, dimensions, data type,
// chunk and shard shapes, codecs, stored and decoded size and compression ratio; then advice where
// an array's layout slows training reads (read chunks under 1 MiB or over 64 MiB decoded, chunks
// of several time steps, compression that saves under 10%).
#pragma once

#include <ostream>
#include <string>

#include "zfeed/util/json.h"

namespace zfeed::tools {

// Describes the store (or the node at `path` within it) as JSON: each array with its "advice"
// ({"kind", "advice"} objects), and at the top "advice" gathering them as {"array", "kind",
// "advice"}.
Json describe_store(const std::string& store_path);
// Prints it as a tree.
void print_info(const Json& description, std::ostream& out);
std::string human_bytes(double bytes);

}  // namespace zfeed::tools

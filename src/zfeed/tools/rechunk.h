// `zfeed rechunk IN.zarr OUT.zarr`: a Zarr store rewritten with new chunks, shards and codec
// within a memory budget, values and attributes as stored (zfeed/ingest/convert.h does the work).
#pragma once

#include <CLI/CLI.hpp>

namespace zfeed::tools {

// Adds the `rechunk` subcommand; it runs from its own callback (errors: message, exit status 1).
void add_rechunk_command(CLI::App& app);

}  // namespace zfeed::tools

// `zfeed convert IN... OUT.zarr`: netCDF files and Zarr stores to a training-ready Zarr v3 group
// (zfeed/ingest/convert.h does the work; this is the command line around it).
#pragma once

#include <CLI/CLI.hpp>

namespace zfeed::tools {

// Adds the `convert` subcommand; it runs from its own callback (errors: message, exit status 1).
void add_convert_command(CLI::App& app);

}  // namespace zfeed::tools

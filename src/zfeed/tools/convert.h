// `zfeed convert IN... OUT.zarr` and `zfeed rechunk IN.zarr OUT.zarr`: netCDF files and Zarr stores
// to a training-ready Zarr v3 group (zfeed/ingest/convert.h does the work; this is the command
// line around it).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "zfeed/ingest/convert.h"

namespace zfeed::tools {

// Adds the `convert` subcommand; it runs from its own callback (errors: message, exit status 1).
void add_convert_command(CLI::App& app);

// Runs a conversion with what both verbs share: the memory limits of the process, a progress line
// (percent, MB/s, ETA) on a terminal, a summary line at the end, ZFEED_CONVERT_STOP_AFTER.
int run_conversion(const std::string& verb, ingest::ConvertOptions options, bool quiet);

}  // namespace zfeed::tools

// `zfeed stats STORE`: per variable (and level) mean, std, min, max, counts, written as the
// "zfeed_stats" attribute the loader normalizes with, and printed as a table.
#pragma once

#include <CLI/CLI.hpp>

namespace zfeed::tools {

// Adds the `stats` subcommand; it runs from its own callback.
void add_stats_command(CLI::App& app);

}  // namespace zfeed::tools

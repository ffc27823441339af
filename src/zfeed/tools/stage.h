// `zfeed stage SOURCE DESTINATION`: a Zarr hierarchy copied from a remote or shared store to a
// node-local directory, resumable and shared by the node's processes (zfeed/zarr/stage.h).
#pragma once

#include <CLI/CLI.hpp>

namespace zfeed::tools {

// Adds the `stage` subcommand; it runs from its own callback (errors: message, exit status 1).
void add_stage_command(CLI::App& app);

}  // namespace zfeed::tools

// `zfeed synth era5|cam5 OUT.zarr`: realistic synthetic data for tests, demos and benchmarks.
#pragma once

#include <CLI/CLI.hpp>

namespace zfeed::tools {

// Adds the `synth` subcommand; it runs from its own callback.
void add_synth_command(CLI::App& app);

}  // namespace zfeed::tools

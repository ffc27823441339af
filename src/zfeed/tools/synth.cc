#include "zfeed/tools/synth.h"

#include <unistd.h>

#include <iostream>
#include <memory>

#include "zfeed/ingest/synth_era5.h"
#include "zfeed/util/error.h"

namespace zfeed::tools {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  for (char c : text) {
    if (c == separator) {
      if (!part.empty()) parts.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  if (!part.empty()) parts.push_back(part);
  return parts;
}

struct SynthArgs {
  std::string kind;
  std::string output;
  std::string variables;
  std::string grid = "320x640";
  size_t times = 24;
  std::string step = "1h";
  std::string start = "2000-01-01";
  uint64_t seed = 0;
  std::string codec = "zstd:3";
  std::string shards;
  bool overwrite = false;
  bool quiet = false;
};

void run_synth(const SynthArgs& args) {
  if (args.kind == "cam5")
    throw UnsupportedError("zfeed synth cam5 is not implemented yet (only era5 is)");
  if (args.kind != "era5")
    throw Error("unknown synthetic dataset \"" + args.kind + "\" (use era5)");
  ingest::SynthOptions options;
  options.output = args.output;
  options.variables = split(args.variables, ',');
  auto grid = split(args.grid, 'x');
  try {
    if (grid.size() != 2) throw std::invalid_argument(args.grid);
    options.nlat = std::stoul(grid[0]);
    options.nlon = std::stoul(grid[1]);
  } catch (const std::exception&) {
    throw Error("bad --grid \"" + args.grid + "\" (use NLATxNLON, e.g. 320x640)");
  }
  if (args.step == "1h") {
    options.step_hours = 1;
  } else if (args.step == "6h") {
    options.step_hours = 6;
  } else {
    throw Error("bad --step \"" + args.step + "\" (use 1h or 6h)");
  }
  options.times = args.times;
  options.start_hours = ingest::parse_start_time(args.start);
  options.seed = args.seed;
  options.codec = args.codec;
  if (!args.shards.empty()) {
    if (!args.shards.starts_with("time="))
      throw Error("bad --shards \"" + args.shards + "\" (use time=N)");
    try {
      options.shard_times = std::stoul(args.shards.substr(5));
    } catch (const std::exception&) {
      throw Error("bad --shards \"" + args.shards + "\" (use time=N)");
    }
    if (options.shard_times == 0) throw Error("--shards time=N needs N >= 1");
  }
  options.overwrite = args.overwrite;
  options.progress = !args.quiet && isatty(STDERR_FILENO);
  ingest::write_era5_synth(options);
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  auto* cmd = app.add_subcommand(
      "synth", "Write realistic synthetic data (era5; cam5 later) as a Zarr v3 store");
  cmd->add_option("kind", args->kind, "dataset: era5 (cam5 is not implemented yet)")->required();
  cmd->add_option("output", args->output, "output store path")->required();
  cmd->add_option("--variables", args->variables,
                  "comma-separated variables (default t2m,u500,v500,t500,z500,q500; also msl)");
  cmd->add_option("--grid", args->grid, "NLATxNLON")->capture_default_str();
  cmd->add_option("--times", args->times, "number of time steps")->capture_default_str();
  cmd->add_option("--step", args->step, "time step: 1h or 6h")->capture_default_str();
  cmd->add_option("--start", args->start, "first time, YYYY-MM-DD[THH]")->capture_default_str();
  cmd->add_option("--seed", args->seed, "random seed")->capture_default_str();
  cmd->add_option("--codec", args->codec,
                  "zstd[:level], gzip[:level], blosc[:cname[:level]] or none")
      ->capture_default_str();
  cmd->add_option("--shards", args->shards, "shard along time: time=N");
  cmd->add_flag("--overwrite", args->overwrite, "replace an existing output");
  cmd->add_flag("-q,--quiet", args->quiet, "no progress line");
  cmd->callback([args] {
    try {
      run_synth(*args);
    } catch (const std::exception& e) {
      std::cerr << "zfeed: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace zfeed::tools

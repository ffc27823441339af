#include "zfeed/tools/synth.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "zfeed/ingest/synth_cam5.h"
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
  std::string grid;  // per kind: era5 320x640, cam5 768x1152
  std::optional<size_t> nlat, nlon;
  std::optional<size_t> times;  // per kind: era5 24, cam5 8
  std::string step;             // per kind: era5 1h, cam5 3h
  std::string start = "2000-01-01";
  uint64_t seed = 0;
  std::string codec = "zstd:3";
  std::string shards;
  bool stack = false;
  bool overwrite = false;
  bool quiet = false;
};

// A count written in digits only (std::stoul takes "-8" and wraps it, and "8a" as 8).
std::optional<size_t> parse_count(std::string_view text) {
  size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The grid from --grid NLATxNLON, overridden per dimension by --lat and --lon.
std::pair<size_t, size_t> parse_grid(const SynthArgs& args, const std::string& fallback) {
  const std::string text = args.grid.empty() ? fallback : args.grid;
  const size_t x = text.find('x');
  const auto nlat = x == std::string::npos ? std::nullopt : parse_count(text.substr(0, x));
  const auto nlon = x == std::string::npos ? std::nullopt : parse_count(text.substr(x + 1));
  if (!nlat || !nlon) {
    throw Error("bad --grid \"" + text + "\" (use NLATxNLON, e.g. " + fallback + ")");
  }
  return {args.nlat.value_or(*nlat), args.nlon.value_or(*nlon)};
}

size_t parse_shards(const std::string& shards) {
  if (shards.empty()) return 0;
  const auto steps = shards.starts_with("time=") ? parse_count(shards.substr(5)) : std::nullopt;
  if (!steps) throw Error("bad --shards \"" + shards + "\" (use time=N)");
  if (*steps == 0) throw Error("--shards time=N needs N >= 1");
  return *steps;
}

// "1h", "3h", "6h" -> hours, for the steps the kind allows.
double parse_step(const std::string& step, const std::vector<std::string>& allowed) {
  std::string choices;
  for (const auto& a : allowed) choices += (choices.empty() ? "" : ", ") + a;
  if (std::find(allowed.begin(), allowed.end(), step) == allowed.end())
    throw Error("bad --step \"" + step + "\" (use " + choices + ")");
  return double(std::stoul(step.substr(0, step.size() - 1)));
}

void run_era5(const SynthArgs& args) {
  if (args.stack) throw Error("--stack is for synth cam5 only");
  ingest::SynthOptions options;
  options.output = args.output;
  options.variables = split(args.variables, ',');
  std::tie(options.nlat, options.nlon) = parse_grid(args, "320x640");
  options.step_hours = parse_step(args.step.empty() ? "1h" : args.step, {"1h", "6h"});
  options.times = args.times.value_or(24);
  options.start_hours = ingest::parse_start_time(args.start);
  options.seed = args.seed;
  options.codec = args.codec;
  options.shard_times = parse_shards(args.shards);
  options.overwrite = args.overwrite;
  options.progress = !args.quiet && isatty(STDERR_FILENO);
  ingest::write_era5_synth(options);
}

void run_cam5(const SynthArgs& args) {
  if (!args.variables.empty())
    throw Error("synth cam5 always writes its 16 channels; --variables is for era5");
  ingest::Cam5SynthOptions options;
  options.output = args.output;
  std::tie(options.nlat, options.nlon) = parse_grid(args, "768x1152");
  options.step_hours = parse_step(args.step.empty() ? "3h" : args.step, {"1h", "3h", "6h"});
  options.times = args.times.value_or(8);
  options.start_hours = ingest::parse_start_time(args.start);
  options.seed = args.seed;
  options.codec = args.codec;
  options.shard_times = parse_shards(args.shards);
  options.stack = args.stack;
  options.overwrite = args.overwrite;
  options.progress = !args.quiet && isatty(STDERR_FILENO);
  ingest::write_cam5_synth(options);
}

void run_synth(const SynthArgs& args) {
  if (args.kind == "era5") {
    run_era5(args);
  } else if (args.kind == "cam5") {
    run_cam5(args);
  } else {
    throw Error("unknown synthetic dataset \"" + args.kind + "\" (use era5 or cam5)");
  }
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  auto* cmd = app.add_subcommand(
      "synth",
      "Write realistic synthetic data as a Zarr v3 store: era5 (forecasting) or cam5 "
      "(extreme-weather segmentation with labels)");
  cmd->add_option("kind", args->kind, "dataset: era5 or cam5")->required();
  cmd->add_option("output", args->output, "output store path")->required();
  cmd->add_option("--variables", args->variables,
                  "era5: comma-separated variables (default t2m,u500,v500,t500,z500,q500; also "
                  "msl)");
  cmd->add_option("--grid", args->grid, "NLATxNLON (era5 320x640, cam5 768x1152)");
  // Counts: CLI11 reads "-3" into an unsigned option as a huge number; the check refuses it.
  const CLI::Validator count(
      [](std::string& text) {
        return parse_count(text) ? std::string()
                                 : "expected a whole number of 0 or more, got " + text;
      },
      "COUNT");
  cmd->add_option("--lat", args->nlat, "number of latitudes (overrides --grid)")->check(count);
  cmd->add_option("--lon", args->nlon, "number of longitudes (overrides --grid)")->check(count);
  cmd->add_option("--times", args->times, "number of time steps (samples): era5 24, cam5 8")
      ->check(count);
  cmd->add_option("--step", args->step, "time step: era5 1h or 6h (1h); cam5 1h, 3h or 6h (3h)");
  cmd->add_option("--start", args->start, "first time, YYYY-MM-DD[THH]")->capture_default_str();
  cmd->add_option("--seed", args->seed, "random seed")->check(count)->capture_default_str();
  cmd->add_option("--codec", args->codec,
                  "zstd[:level], gzip[:level], blosc[:cname[:level]] or none")
      ->capture_default_str();
  cmd->add_option("--shards", args->shards, "shard along time: time=N");
  cmd->add_flag("--stack", args->stack,
                "cam5: one data(time, variable, lat, lon) array (anemoi-datasets' layout) "
                "instead of one array per channel");
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

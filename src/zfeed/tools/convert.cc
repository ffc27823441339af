#include "zfeed/tools/convert.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "zfeed/ingest/convert.h"
#include "zfeed/tools/info.h"
#include "zfeed/util/error.h"

namespace zfeed::tools {
namespace {

struct Arguments {
  std::vector<std::string> paths;
  std::string chunks, shards, codec = "zstd:3", variables, concat_dim = "time";
  bool overwrite = false;
  bool quiet = false;
};

Arguments& arguments() {
  static Arguments args;
  return args;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) items.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return items;
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds >= 3600) {
    std::snprintf(text, sizeof text, "%dh%02dm", int(seconds / 3600), int(seconds / 60) % 60);
  } else if (seconds >= 60) {
    std::snprintf(text, sizeof text, "%dm%02ds", int(seconds / 60), int(seconds) % 60);
  } else {
    std::snprintf(text, sizeof text, "%ds", int(seconds));
  }
  return text;
}

}  // namespace

int run_convert();

void add_convert_command(CLI::App& app) {
  Arguments& args = arguments();
  auto* cmd = app.add_subcommand(
      "convert", "Convert netCDF files or Zarr stores to a training-ready Zarr v3 store");
  cmd->add_option("paths", args.paths,
                  "IN... OUT.zarr: inputs (joined along time, in this order), then the output")
      ->required()
      ->expected(2, -1);
  cmd->add_option("--chunks", args.chunks,
                  "chunk extents by dimension, e.g. time=1,latitude=181 (others whole)");
  cmd->add_option("--shards", args.shards,
                  "shard extents by dimension, e.g. time=24 (others whole); default none");
  cmd->add_option("--codec", args.codec,
                  "zstd[:LEVEL], blosc[:CNAME[:LEVEL]], gzip[:LEVEL] or none")
      ->capture_default_str();
  cmd->add_option("--variables", args.variables,
                  "comma-separated variables to convert (with their coordinates)");
  cmd->add_option("--concat-dim", args.concat_dim, "the dimension several inputs are joined along")
      ->capture_default_str();
  cmd->add_flag("--overwrite", args.overwrite, "replace OUT if it exists");
  cmd->add_flag("--quiet,-q", args.quiet, "no progress line");
  cmd->callback([] {
    int status = 1;
    try {
      status = run_convert();
    } catch (const std::exception& e) {
      std::cerr << "zfeed: error: " << e.what() << "\n";
    }
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

int run_convert() {
  const Arguments& args = arguments();
  ingest::ConvertOptions options;
  options.inputs.assign(args.paths.begin(), args.paths.end() - 1);
  options.output = args.paths.back();
  options.chunks = ingest::parse_dim_sizes(args.chunks, "--chunks");
  options.shards = ingest::parse_dim_sizes(args.shards, "--shards");
  options.codec = args.codec;
  options.variables = split_list(args.variables);
  options.overwrite = args.overwrite;
  options.concat_dim = args.concat_dim;

  // For tests of resumption: end the process abruptly, as a kill would, after N units.
  uint64_t stop_after = 0;
  if (const char* text = std::getenv("ZFEED_CONVERT_STOP_AFTER"))
    stop_after = std::strtoull(text, nullptr, 10);
  const bool show = !args.quiet && ::isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  uint64_t units_this_run = 0;
  bool shown = false;
  options.on_progress = [&](const ingest::ConvertProgress& p) {
    ++units_this_run;
    if (show) {
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double rate = seconds > 0 ? double(p.bytes_done) / seconds : 0;
      double eta = rate > 0 ? double(p.bytes_todo - p.bytes_done) / rate : 0;
      std::fprintf(stderr, "\rconvert: %llu/%llu units  %5.1f%%  %s/s  ETA %s   ",
                   static_cast<unsigned long long>(p.units_done),
                   static_cast<unsigned long long>(p.units_total),
                   p.units_total ? 100.0 * double(p.units_done) / double(p.units_total) : 100.0,
                   human_bytes(rate).c_str(), format_seconds(eta).c_str());
      std::fflush(stderr);
      shown = true;
    }
    if (stop_after && units_this_run >= stop_after) {
      std::fprintf(stderr,
                   "\nzfeed convert: stopping after %llu units (ZFEED_CONVERT_STOP_AFTER)\n",
                   static_cast<unsigned long long>(units_this_run));
      std::fflush(stderr);
      std::_Exit(75);
    }
  };
  ingest::ConvertResult result = ingest::convert(options);
  if (shown) std::fprintf(stderr, "\n");
  for (const auto& item : result.skipped) std::cerr << "zfeed convert: skipped " << item << "\n";
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "converted " << result.variables.size() << " variables to " << options.output << ": "
            << result.units_total << " units";
  if (result.units_resumed)
    std::cout << " (" << result.units_resumed << " already done by an earlier run)";
  std::cout << ", " << human_bytes(double(result.bytes_written)) << " decoded in "
            << format_seconds(seconds) << "\n";
  return 0;
}

}  // namespace zfeed::tools

#include "zfeed/tools/convert.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "zfeed/ingest/convert.h"
#include "zfeed/tools/info.h"
#include "zfeed/util/error.h"

namespace zfeed::tools {
namespace {

struct Arguments {
  std::vector<std::string> paths;
  std::string chunks, shards, codec = "zstd:3", variables, concat_dim = "time";
  std::vector<std::string> sel, isel;
  std::string max_memory = "2GiB";
  size_t threads = 0;
  bool stack = false;
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
      "convert", "Convert netCDF or GRIB files or Zarr stores to a training-ready Zarr v3 store");
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
  // One value per occurrence (repeatable): a vector option would take the paths after it too.
  cmd->add_option("--sel", args.sel,
                  "keep these coordinate values along a dimension, in this order, e.g. "
                  "level=500,850 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--isel", args.isel,
                  "keep these indices along a dimension, e.g. level=0,3 (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--stack", args.stack,
                "write one float32 array data(time, variable, lat, lon) with every data variable "
                "(one channel per level) as anemoi-datasets does");
  cmd->add_option("--max-memory", args.max_memory,
                  "memory bound for the work in flight, e.g. 512MiB, 2GiB, 1.5G")
      ->capture_default_str();
  cmd->add_option("--threads", args.threads,
                  "threads that convert units, each with working buffers inside --max-memory "
                  "(default: ZFEED_NUM_THREADS, else one per core)")
      ->check(CLI::Range(1, 4096));
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
  options.stack = args.stack;
  options.max_memory = ingest::parse_memory_size(args.max_memory, "--max-memory");
  options.threads = args.threads;
  for (const auto& text : args.sel) {
    auto [dim, values] = ingest::parse_dim_values(text, "--sel");
    if (options.sel.count(dim)) throw Error("--sel: dimension " + dim + " given twice");
    options.sel[dim] = values;
  }
  for (const auto& text : args.isel) {
    auto [dim, values] = ingest::parse_dim_values(text, "--isel");
    if (options.isel.count(dim)) throw Error("--isel: dimension " + dim + " given twice");
    for (const auto& value : values) {
      uint64_t index = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), index);
      if (ec != std::errc() || end != value.data() + value.size()) {
        throw Error("--isel " + dim + "=" + value + ": expected an index (0, 1, ...)");
      }
      options.isel[dim].push_back(index);
    }
  }
  return run_conversion("convert", std::move(options), args.quiet);
}

int run_conversion(const std::string& verb, ingest::ConvertOptions options, bool quiet) {
  // Large buffers go back to the system when freed: glibc would otherwise keep them in per-thread
  // arenas (its mmap threshold grows with every large free), and the process would outgrow
  // --max-memory with memory it no longer uses.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 4 << 20);
  // Every thread may hold a chunk being decoded and one being encoded: under a small budget, use
  // fewer threads (one per 16 MiB) unless --threads or ZFEED_NUM_THREADS says how many. The pool
  // starts on first use, after this.
  if (options.threads == 0 && !std::getenv("ZFEED_NUM_THREADS")) {
    const uint64_t hardware = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t fit = std::max<uint64_t>(1, options.max_memory / (16 << 20));
    if (fit < hardware) ::setenv("ZFEED_NUM_THREADS", std::to_string(fit).c_str(), 1);
  }

  // For tests of resumption: end the process abruptly, as a kill would, after N units.
  uint64_t stop_after = 0;
  if (const char* text = std::getenv("ZFEED_CONVERT_STOP_AFTER"))
    stop_after = std::strtoull(text, nullptr, 10);
  const bool show = !quiet && ::isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  auto last_shown = start - std::chrono::seconds(1);
  uint64_t units_this_run = 0;
  bool shown = false;
  options.on_progress = [&](const ingest::ConvertProgress& p) {
    ++units_this_run;
    const auto now = std::chrono::steady_clock::now();
    const bool finished = p.units_done == p.units_total;
    // At most ten updates a second: thousands of small units would flood the terminal.
    if (show && (finished || now - last_shown >= std::chrono::milliseconds(100))) {
      last_shown = now;
      double seconds = std::chrono::duration<double>(now - start).count();
      double rate = seconds > 0 ? double(p.bytes_done) / seconds : 0;
      double eta = rate > 0 ? double(p.bytes_todo - p.bytes_done) / rate : 0;
      double percent = p.bytes_todo ? 100.0 * double(p.bytes_done) / double(p.bytes_todo) : 100.0;
      std::fprintf(
          stderr, "\r%s: %5.1f%%  %llu/%llu units  %s of %s  %.1f MB/s  ETA %s   ", verb.c_str(),
          percent, static_cast<unsigned long long>(p.units_done),
          static_cast<unsigned long long>(p.units_total), human_bytes(double(p.bytes_done)).c_str(),
          human_bytes(double(p.bytes_todo)).c_str(), rate / 1e6, format_seconds(eta).c_str());
      std::fflush(stderr);
      shown = true;
    }
    if (stop_after && units_this_run >= stop_after) {
      std::fprintf(stderr, "\nzfeed %s: stopping after %llu units (ZFEED_CONVERT_STOP_AFTER)\n",
                   verb.c_str(), static_cast<unsigned long long>(units_this_run));
      std::fflush(stderr);
      std::_Exit(75);
    }
  };
  const std::string output = options.output;
  ingest::ConvertResult result =
      verb == "rechunk" ? ingest::rechunk(std::move(options)) : ingest::convert(options);
  if (shown) std::fprintf(stderr, "\n");
  for (const auto& item : result.skipped)
    std::cerr << "zfeed " << verb << ": skipped " << item << "\n";
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << (verb == "rechunk" ? "rechunked " : "converted ") << result.variables.size()
            << " variables to " << output << ": " << result.units_total << " units";
  if (result.units_resumed)
    std::cout << " (" << result.units_resumed << " already done by an earlier run)";
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.1f MB/s",
                seconds > 0 ? double(result.bytes_written) / seconds / 1e6 : 0.0);
  std::cout << ", " << human_bytes(double(result.bytes_written)) << " decoded in "
            << format_seconds(seconds) << " (" << rate << ")\n";
  return 0;
}

}  // namespace zfeed::tools

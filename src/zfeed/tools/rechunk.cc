#include "zfeed/tools/rechunk.h"

#include <iostream>
#include <memory>

#include "zfeed/ingest/convert.h"
#include "zfeed/tools/convert.h"
#include "zfeed/util/error.h"

namespace zfeed::tools {
namespace {

struct RechunkArgs {
  std::string input, output;
  std::string chunks, shards, codec = "zstd:3", variables, max_memory = "2GiB";
  size_t threads = 0;
  bool overwrite = false;
  bool quiet = false;
};

int run_rechunk(const RechunkArgs& args) {
  ingest::ConvertOptions options;
  options.inputs = {args.input};
  options.output = args.output;
  options.chunks = ingest::parse_dim_sizes(args.chunks, "--chunks");
  options.shards = ingest::parse_dim_sizes(args.shards, "--shards");
  options.codec = args.codec;
  std::string name;
  for (char c : args.variables + ",") {
    if (c != ',') {
      name += c;
    } else if (!name.empty()) {
      options.variables.push_back(name);
      name.clear();
    }
  }
  options.overwrite = args.overwrite;
  options.max_memory = ingest::parse_memory_size(args.max_memory, "--max-memory");
  options.threads = args.threads;
  return run_conversion("rechunk", std::move(options), args.quiet);
}

}  // namespace

void add_rechunk_command(CLI::App& app) {
  auto args = std::make_shared<RechunkArgs>();
  auto* cmd = app.add_subcommand(
      "rechunk", "Rewrite a Zarr store with new chunks, shards and codec within a memory budget");
  cmd->add_option("input", args->input, "IN.zarr: the store to rechunk")->required();
  cmd->add_option("output", args->output, "OUT.zarr: the new store")->required();
  cmd->add_option("--chunks", args->chunks,
                  "chunk extents by dimension, e.g. time=1,latitude=181 (others keep the "
                  "input's chunk extent)");
  cmd->add_option("--shards", args->shards,
                  "shard extents by dimension, e.g. time=24 (others whole); default none");
  cmd->add_option("--codec", args->codec,
                  "zstd[:LEVEL], blosc[:CNAME[:LEVEL]], gzip[:LEVEL] or none")
      ->capture_default_str();
  cmd->add_option("--variables", args->variables,
                  "comma-separated arrays to rechunk (with their coordinates)");
  cmd->add_option("--max-memory", args->max_memory,
                  "memory bound for the work in flight, e.g. 512MiB, 2GiB, 1.5G")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads,
                  "threads that convert units, each with working buffers inside --max-memory "
                  "(default: ZFEED_NUM_THREADS, else one per core)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--overwrite", args->overwrite, "replace OUT if it exists");
  cmd->add_flag("--quiet,-q", args->quiet, "no progress line");
  cmd->callback([args] {
    int status = 1;
    try {
      status = run_rechunk(*args);
    } catch (const std::exception& e) {
      std::cerr << "zfeed: error: " << e.what() << "\n";
    }
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace zfeed::tools

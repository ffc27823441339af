#include "zfeed/tools/stage.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <memory>

#include "zfeed/store/store.h"
#include "zfeed/tools/info.h"
#include "zfeed/util/error.h"
#include "zfeed/zarr/stage.h"

namespace zfeed::tools {
namespace {

struct StageArgs {
  std::string source, destination;
  size_t threads = 0;
  bool quiet = false;
  std::string time;  // "START:STOP"
  std::string time_dim = "time";
};

// "START:STOP" (time indices) as the pair StageOptions takes.
std::pair<uint64_t, uint64_t> parse_time_range(const std::string& text) {
  const size_t colon = text.find(':');
  const Error malformed("stage: --time takes START:STOP, two time indices, got \"" + text + "\"");
  if (colon == std::string::npos) throw malformed;
  auto number = [&](std::string_view part) {
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size()) throw malformed;
    return value;
  };
  return {number(std::string_view(text).substr(0, colon)),
          number(std::string_view(text).substr(colon + 1))};
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", seconds);
  return text;
}

// `progress_line_open`: set while a progress line on a terminal waits for its end (an error
// then starts on a line of its own).
int run_stage(const StageArgs& args, bool& progress_line_open) {
  zarr::StageOptions options;
  options.threads = args.threads;
  if (!args.time.empty()) options.time_range = parse_time_range(args.time);
  options.time_dim = args.time_dim;
  if (!args.quiet) {
    const bool terminal = ::isatty(STDERR_FILENO) == 1;
    options.progress = [print = zarr::stage_progress_printer("stage"), terminal,
                        &progress_line_open](const zarr::StageProgress& p) {
      print(p);  // on a terminal, rewrites one line until the last
      progress_line_open = terminal && p.keys_done != p.keys_total;
    };
  }
  const zarr::StageResult result = zarr::stage(open_store(args.source), args.destination, options);
  const std::string steps =
      result.partial
          ? " (" + result.partial->time_dim + " steps [" + std::to_string(result.partial->start) +
                ", " + std::to_string(result.partial->stop) + ") of the arrays along it)"
          : "";
  if (result.already_complete) {
    std::cout << args.destination << ": already a complete copy of " << args.source << steps << " ("
              << result.keys << " keys)\n";
  } else {
    std::cout << args.destination << ": " << result.keys << " keys of " << args.source << steps
              << ", " << result.copied << " copied (" << human_bytes(double(result.bytes_copied))
              << "), " << result.present << " already there, " << result.missing
              << " absent from the source (fill value), in " << seconds_text(result.seconds)
              << "\n";
  }
  return 0;
}

}  // namespace

void add_stage_command(CLI::App& app) {
  auto args = std::make_shared<StageArgs>();
  auto* cmd = app.add_subcommand(
      "stage",
      "Copy a Zarr store (s3://, gs://, https://, or a shared file system) to a node-local "
      "directory: resumable; the processes of a node that stage it at once share one copy");
  cmd->add_option("source", args->source, "the store to copy (a URL or path)")->required();
  cmd->add_option("destination", args->destination, "a local directory (created)")->required();
  cmd->add_option("--threads", args->threads,
                  "reads in flight (default: ZFEED_IO_THREADS for a remote store, one per core "
                  "for a local one)")
      ->check(CLI::Range(1, 4096));
  auto* time =
      cmd->add_option("--time", args->time,
                      "START:STOP: only these time steps of the arrays along time (the chunks that "
                      "hold them), the rest whole; the copy refuses reads of the chunks left out");
  auto* time_dim = cmd->add_option("--time-dim", args->time_dim,
                                   "the time dimension's name, for --time (default: time)");
  time_dim->needs(time);
  cmd->add_flag("--quiet,-q", args->quiet, "no progress line");
  cmd->callback([args] {
    int status = 1;
    bool progress_line_open = false;
    try {
      status = run_stage(*args, progress_line_open);
    } catch (const std::exception& e) {
      std::cerr << (progress_line_open ? "\n" : "") << "zfeed: error: " << e.what() << "\n";
    }
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace zfeed::tools

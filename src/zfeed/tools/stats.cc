#include "zfeed/tools/stats.h"

#include <iostream>
#include <memory>

#include "zfeed/ingest/stats.h"
#include "zfeed/util/error.h"

namespace zfeed::tools {
namespace {

struct StatsArgs {
  std::string path;
  std::string variables;
  std::string time;
  bool no_write = false;
  bool json = false;
};

std::optional<int64_t> parse_index(const std::string& text, const std::string& whole) {
  if (text.empty()) return std::nullopt;
  try {
    size_t used = 0;
    int64_t value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    throw Error("bad --time \"" + whole + "\" (use START:STOP time indices, either may be empty)");
  }
}

void run_stats(const StatsArgs& args) {
  ingest::StatsOptions options;
  std::string part;
  for (char c : args.variables + ",") {
    if (c == ',') {
      if (!part.empty()) options.variables.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  if (!args.time.empty()) {
    auto colon = args.time.find(':');
    if (colon == std::string::npos)
      throw Error("bad --time \"" + args.time + "\" (use START:STOP)");
    options.time_start = parse_index(args.time.substr(0, colon), args.time);
    options.time_stop = parse_index(args.time.substr(colon + 1), args.time);
  }
  options.write_attributes = !args.no_write;
  // Read-only kinds of store: refused before the work, not after it.
  for (const char* scheme : {"http://", "https://", "gs://"}) {
    if (options.write_attributes && args.path.starts_with(scheme)) {
      throw Error(args.path + ": zfeed stats writes its results as attributes, and a " +
                  std::string(scheme) +
                  " store is read-only here: add --no-write to print them only");
    }
  }
  auto stats = ingest::compute_store_stats(args.path, options);
  if (args.json) {
    Json json = Json::object();
    for (const auto& s : stats) json[s.name] = s.to_json();
    std::cout << json.dump(2) << "\n";
  } else {
    ingest::print_stats_table(stats, std::cout);
  }
}

}  // namespace

void add_stats_command(CLI::App& app) {
  auto args = std::make_shared<StatsArgs>();
  auto* cmd = app.add_subcommand("stats",
                                 "Per variable (and level) mean, std, min, max: written as the "
                                 "zfeed_stats attribute and printed");
  cmd->add_option("path", args->path, "store path or URL")->required();
  cmd->add_option("--variables", args->variables,
                  "comma-separated arrays (default: every data array)");
  cmd->add_option("--time", args->time,
                  "time index range START:STOP (Python slice, stop excluded)");
  cmd->add_flag("--no-write", args->no_write, "print only; leave the attributes as they are");
  cmd->add_flag("--json", args->json, "print JSON instead of a table");
  cmd->callback([args] {
    try {
      run_stats(*args);
    } catch (const std::exception& e) {
      std::cerr << "zfeed: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace zfeed::tools

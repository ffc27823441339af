// The zfeed command: thin verbs over the library.
#include <CLI/CLI.hpp>
#include <iostream>

#include "zfeed/ingest/source.h"
#include "zfeed/tools/convert.h"
#include "zfeed/tools/info.h"
#include "zfeed/tools/python_verb.h"
#include "zfeed/tools/rechunk.h"
#include "zfeed/tools/stage.h"
#include "zfeed/tools/stats.h"
#include "zfeed/tools/synth.h"
#include "zfeed/util/error.h"

namespace {

// "zfeed 0.1.0" and what the build holds, for bug reports.
std::string version_text() {
  std::string text = std::string("zfeed ") + ZFEED_VERSION + "\nbuilt with:";
  auto feature = [&](const char* name, bool present) {
    text += std::string(" ") + name + (present ? " yes," : " no,");
  };
  feature("netCDF", zfeed::ingest::netcdf_support().available);
  feature("GRIB", zfeed::ingest::grib_support().available);
#ifdef ZFEED_HAVE_CUDA
  feature("CUDA", true);
#else
  feature("CUDA", false);
#endif
#ifdef ZFEED_HAVE_NVCOMP
  feature("nvCOMP", true);
#else
  feature("nvCOMP", false);
#endif
  text.pop_back();  // the last comma
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zfeed: feed Zarr weather and climate data to model training"};
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);

  auto* info =
      app.add_subcommand("info", "Show the tree of a Zarr store: shapes, chunks, codecs, sizes");
  std::string info_path;
  bool info_json = false;
  info->add_option("path", info_path,
                   "store path or URL (a directory, file://, s3://, gs://, https://)")
      ->required();
  info->add_flag("--json", info_json, "print JSON instead of a tree");

  zfeed::tools::add_synth_command(app);
  zfeed::tools::add_stats_command(app);
  zfeed::tools::add_convert_command(app);
  zfeed::tools::add_rechunk_command(app);
  zfeed::tools::add_stage_command(app);
  auto* bench = zfeed::tools::add_python_verb(
      app, "bench",
      "Loader throughput on a store, zfeed beside its peers (runs python -m zfeed.bench)");
  auto* train = zfeed::tools::add_python_verb(
      app, "train", "Training recipes: forecast, segment (runs python -m zfeed.recipes)");

  CLI11_PARSE(app, argc, argv);
  if (bench->parsed()) return zfeed::tools::exec_python_module("zfeed.bench", bench->remaining());
  if (train->parsed()) return zfeed::tools::exec_python_module("zfeed.recipes", train->remaining());
  try {
    if (info->parsed()) {
      zfeed::Json description = zfeed::tools::describe_store(info_path);
      if (info_json) {
        std::cout << description.dump(2) << "\n";
      } else {
        zfeed::tools::print_info(description, std::cout);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "zfeed: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

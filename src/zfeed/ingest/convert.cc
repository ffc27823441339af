#include "zfeed/ingest/convert.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "zfeed/ingest/cf.h"
#include "zfeed/ingest/source.h"
#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

namespace fs = std::filesystem;

// One input's share of an output variable: rows [offset, offset + length) along the first
// dimension.
struct Part {
  const Source* source = nullptr;
  const Variable* variable = nullptr;
  CfDecoding cf;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct Output {
  std::string name;
  std::vector<std::string> dims;
  std::vector<uint64_t> shape;
  std::vector<Part> parts;
  DataType dtype;
  zarr::ArrayMetadata metadata;
  uint64_t row = 1;    // extent of one unit along the first dimension
  uint64_t units = 1;  // rows of chunks (or shards)
  uint64_t inner = 1;  // elements per index along the first dimension
};

uint64_t parse_count(std::string_view text, std::string_view what) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0) {
    throw Error(std::string(what) + ": expected a positive integer, got '" + std::string(text) +
                "'");
  }
  return value;
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::map<std::string, uint64_t> dimension_lengths(const Source& source) {
  std::map<std::string, uint64_t> lengths;
  for (const auto& variable : source.variables()) {
    for (size_t d = 0; d < variable.rank(); ++d) lengths[variable.dims[d]] = variable.shape[d];
  }
  return lengths;
}

std::vector<uint8_t> read_all(const Source& source, const Variable& variable) {
  std::vector<uint8_t> values(
      checked_product(variable.shape, variable.dtype.size(), variable.name));
  std::vector<uint64_t> start(variable.rank(), 0);
  source.read(variable, start, variable.shape, values.data());
  return values;
}

bool is_store_or_empty(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  if (fs::is_empty(path, ec)) return true;
  for (const char* marker : {"zarr.json", ".zgroup", ".zarray"}) {
    if (fs::exists(path / marker, ec)) return true;
  }
  return fs::exists(path / std::string(kProgressKey), ec);
}

// A killed run can leave the file store's temporary files (written, not yet renamed into place);
// a resumed run removes them so that it ends with exactly the files of an uninterrupted run.
void remove_stale_temporaries(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) &&
        it->path().filename().string().find(".zfeed-tmp-") != std::string::npos) {
      stale.push_back(it->path());
    }
  }
  for (const auto& path : stale) fs::remove(path, ec);
}

Json codec_chain(const Output& output, const ConvertOptions& options,
                 const std::vector<uint64_t>& chunks) {
  Json bytes = output.dtype.size() > 1
                   ? Json{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}
                   : Json{{"name", "bytes"}};
  Json chain = Json::array({bytes});
  Json compressor = compressor_codec(options.codec, output.dtype);
  if (!compressor.is_null()) chain.push_back(compressor);
  if (output.metadata.chunk_shape == chunks) return chain;
  Json index = Json::array({Json{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}},
                            Json{{"name", "crc32c"}}});
  return Json::array({Json{{"name", "sharding_indexed"},
                           {"configuration",
                            {{"chunk_shape", chunks},
                             {"codecs", chain},
                             {"index_codecs", index},
                             {"index_location", "end"}}}}});
}

// Chunk and shard shapes, the array metadata and the unit size of one output.
void plan_layout(Output& output, const ConvertOptions& options, const Json& attributes) {
  const size_t rank = output.shape.size();
  std::vector<uint64_t> chunks(rank), grid(rank);
  for (size_t d = 0; d < rank; ++d) {
    const uint64_t extent = std::max<uint64_t>(output.shape[d], 1);
    // Coordinates and other one-dimensional variables are small: one chunk.
    auto it = options.chunks.find(output.dims[d]);
    chunks[d] = rank >= 2 && it != options.chunks.end() ? std::min(it->second, extent) : extent;
    grid[d] = chunks[d];
    if (rank >= 2 && !options.shards.empty()) {
      auto shard = options.shards.find(output.dims[d]);
      const uint64_t whole = (extent + chunks[d] - 1) / chunks[d] * chunks[d];
      grid[d] = shard != options.shards.end() ? shard->second : whole;
      if (grid[d] % chunks[d] != 0) {
        throw Error(output.name + ": shard extent " + std::to_string(grid[d]) + " along " +
                    output.dims[d] + " is not a multiple of the chunk extent " +
                    std::to_string(chunks[d]));
      }
    }
  }
  auto& meta = output.metadata;
  meta.zarr_format = 3;
  meta.shape = output.shape;
  meta.dtype = output.dtype;
  meta.chunk_shape = grid;
  meta.fill_value =
      parse_fill_value(output.dtype.is_float() ? Json("NaN") : Json(0), output.dtype, false);
  meta.codecs = codec_chain(output, options, chunks);
  std::vector<std::optional<std::string>> names(output.dims.begin(), output.dims.end());
  meta.dimension_names = names;
  meta.attributes = attributes;
  meta.validate();
  output.inner = 1;
  for (size_t d = 1; d < rank; ++d) output.inner *= output.shape[d];
  if (rank == 0) {
    output.row = 1;
    output.units = 1;
  } else {
    output.row = grid[0];
    output.units = (output.shape[0] + output.row - 1) / output.row;
  }
}

// Reads, decodes and writes one unit; returns the decoded bytes written.
uint64_t run_unit(const Output& output, const zarr::Array& array, uint64_t unit) {
  const size_t rank = output.shape.size();
  const size_t out_size = output.dtype.size();
  if (rank == 0) {
    std::vector<uint8_t> raw(output.parts[0].variable->dtype.size()), values(out_size);
    output.parts[0].source->read(*output.parts[0].variable, {}, {}, raw.data());
    output.parts[0].cf.apply(raw.data(), values.data(), 1);
    array.write({}, values.data());
    return out_size;
  }
  const uint64_t r0 = unit * output.row;
  const uint64_t r1 = std::min(output.shape[0], r0 + output.row);
  std::vector<uint8_t> values((r1 - r0) * output.inner * out_size);
  std::vector<uint8_t> raw;
  for (const Part& part : output.parts) {
    const uint64_t lo = std::max(r0, part.offset), hi = std::min(r1, part.offset + part.length);
    if (lo >= hi) continue;
    std::vector<uint64_t> start(rank, 0), count = part.variable->shape;
    start[0] = lo - part.offset;
    count[0] = hi - lo;
    const uint64_t elements = (hi - lo) * output.inner;
    raw.resize(elements * part.variable->dtype.size());
    part.source->read(*part.variable, start, count, raw.data());
    part.cf.apply(raw.data(), values.data() + (lo - r0) * output.inner * out_size, elements);
  }
  zarr::Selection selection;
  selection.push_back({r0, r1, 1});
  for (size_t d = 1; d < rank; ++d) selection.push_back({0, output.shape[d], 1});
  array.write(selection, values.data());
  return values.size();
}

class ProgressRecord {
 public:
  ProgressRecord(std::shared_ptr<Store> store, Json arguments)
      : store_(std::move(store)), arguments_(std::move(arguments)) {}

  void load(const Json& document) {
    for (const auto& [name, units] : document.at("done").items()) {
      for (const auto& unit : units) done_[name].insert(unit.get<uint64_t>());
    }
  }
  bool is_done(const std::string& name, uint64_t unit) const {
    auto it = done_.find(name);
    return it != done_.end() && it->second.count(unit);
  }
  void mark_done(const std::string& name, uint64_t unit) {
    done_[name].insert(unit);
    save();
  }
  void save() const {
    Json done = Json::object();
    for (const auto& [name, units] : done_)
      done[name] = Json(std::vector<uint64_t>(units.begin(), units.end()));
    Json document = {{"zfeed", "convert progress: the output is incomplete while this file exists"},
                     {"arguments", arguments_},
                     {"done", done}};
    std::string text = document.dump(1);
    store_->set(kProgressKey, ByteView(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }

 private:
  std::shared_ptr<Store> store_;
  Json arguments_;
  std::map<std::string, std::set<uint64_t>> done_;
};

}  // namespace

std::map<std::string, uint64_t> parse_dim_sizes(std::string_view text, std::string_view what) {
  std::map<std::string, uint64_t> sizes;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    size_t equals = item.find('=');
    if (equals == std::string_view::npos || equals == 0) {
      throw Error(std::string(what) + ": expected DIM=SIZE, got '" + std::string(item) + "'");
    }
    std::string name(item.substr(0, equals));
    if (sizes.count(name)) throw Error(std::string(what) + ": dimension " + name + " given twice");
    sizes[name] = parse_count(item.substr(equals + 1), std::string(what) + " " + name);
  }
  return sizes;
}

Json compressor_codec(std::string_view spec, DataType dtype) {
  std::string_view name = spec.substr(0, spec.find(':'));
  std::string_view rest =
      name.size() < spec.size() ? spec.substr(name.size() + 1) : std::string_view();
  auto level = [&](std::string_view text, int fallback) {
    if (text.empty()) return fallback;
    int value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw Error("--codec " + std::string(spec) + ": the level must be an integer");
    }
    return value;
  };
  if (name == "none" && rest.empty()) return Json(nullptr);
  if (name == "zstd")
    return {{"name", "zstd"}, {"configuration", {{"level", level(rest, 3)}, {"checksum", false}}}};
  if (name == "gzip") return {{"name", "gzip"}, {"configuration", {{"level", level(rest, 6)}}}};
  if (name == "blosc") {
    std::string_view cname = rest.substr(0, rest.find(':'));
    std::string_view clevel =
        cname.size() < rest.size() ? rest.substr(cname.size() + 1) : std::string_view();
    static const std::set<std::string_view> kNames = {"lz4", "lz4hc", "blosclz", "zstd", "zlib"};
    if (cname.empty()) cname = "lz4";
    if (!kNames.count(cname))
      throw Error("--codec " + std::string(spec) + ": unknown blosc compressor " +
                  std::string(cname));
    return {{"name", "blosc"},
            {"configuration",
             {{"cname", std::string(cname)},
              {"clevel", level(clevel, 5)},
              {"shuffle", "shuffle"},
              {"typesize", dtype.size()},
              {"blocksize", 0}}}};
  }
  throw Error("--codec " + std::string(spec) +
              ": unknown codec (use zstd[:LEVEL], blosc[:CNAME[:LEVEL]], gzip[:LEVEL] or none)");
}

ConvertResult convert(const ConvertOptions& options) {
  if (options.inputs.empty()) throw Error("convert: no input given");
  if (options.output.empty()) throw Error("convert: no output given");
  compressor_codec(options.codec, DataType{DataTypeId::kFloat32});  // fail early on a bad spec

  // Inputs.
  std::vector<std::unique_ptr<Source>> sources;
  for (const auto& input : options.inputs) sources.push_back(open_source(input));
  const Source& first = *sources[0];
  ConvertResult result;
  for (const auto& source : sources) {
    for (const auto& item : source->skipped())
      result.skipped.push_back(source->path() + ": " + item);
  }

  // The variables: those asked for (and the coordinates of their dimensions), or all.
  std::vector<const Variable*> selected;
  if (options.variables.empty()) {
    for (const auto& variable : first.variables()) selected.push_back(&variable);
  } else {
    std::set<std::string> wanted;
    for (const auto& name : options.variables) {
      const Variable* variable = first.find(name);
      if (!variable) {
        std::vector<std::string> names;
        for (const auto& v : first.variables()) names.push_back(v.name);
        throw NotFoundError(first.path() + ": no variable '" + name + "' (it has " + join(names) +
                            ")");
      }
      wanted.insert(name);
      for (const auto& dim : variable->dims) {
        if (const Variable* coordinate = first.find(dim); coordinate && coordinate->is_coordinate())
          wanted.insert(dim);
      }
    }
    for (const auto& variable : first.variables()) {
      if (wanted.count(variable.name)) selected.push_back(&variable);
    }
  }
  std::set<std::string> used_dims;
  for (const Variable* variable : selected)
    used_dims.insert(variable->dims.begin(), variable->dims.end());
  for (const auto* sizes : {&options.chunks, &options.shards}) {
    for (const auto& [dim, size] : *sizes) {
      if (!used_dims.count(dim)) {
        throw Error((sizes == &options.chunks ? "--chunks" : "--shards") +
                    std::string(": no dimension '") + dim +
                    "' in the variables converted (they have " +
                    join(std::vector<std::string>(used_dims.begin(), used_dims.end())) + ")");
      }
    }
  }

  // Several inputs: they must agree on every dimension but the one they are joined along.
  const std::string& concat = options.concat_dim;
  if (sources.size() > 1) {
    auto lengths0 = dimension_lengths(first);
    for (size_t i = 1; i < sources.size(); ++i) {
      auto lengths = dimension_lengths(*sources[i]);
      if (!lengths.count(concat)) {
        throw Error(sources[i]->path() + ": no dimension '" + concat +
                    "' to join the inputs along");
      }
      for (const auto& dim : used_dims) {
        if (dim == concat) continue;
        auto it = lengths.find(dim);
        if (it == lengths.end() || it->second != lengths0[dim]) {
          throw Error("mismatched grids: dimension " + dim + " has length " +
                      std::to_string(lengths0[dim]) + " in " + first.path() + " but " +
                      (it == lengths.end() ? "is absent" : std::to_string(it->second)) + " in " +
                      sources[i]->path());
        }
        const Variable* c0 = first.find(dim);
        const Variable* ci = sources[i]->find(dim);
        if (c0 && ci && c0->is_coordinate() && ci->is_coordinate() &&
            (c0->dtype != ci->dtype || read_all(first, *c0) != read_all(*sources[i], *ci))) {
          throw Error("mismatched grids: coordinate " + dim + " differs between " + first.path() +
                      " and " + sources[i]->path());
        }
      }
    }
  }

  // The outputs.
  std::vector<Output> outputs;
  for (const Variable* variable : selected) {
    Output output;
    output.name = variable->name;
    output.dims = variable->dims;
    output.shape = variable->shape;
    const bool joined =
        sources.size() > 1 &&
        std::find(variable->dims.begin(), variable->dims.end(), concat) != variable->dims.end();
    if (joined && variable->dims[0] != concat) {
      throw UnsupportedError(variable->name + ": joining along " + concat +
                             " needs it to be the first dimension");
    }
    const size_t count = joined ? sources.size() : 1;
    uint64_t offset = 0;
    for (size_t i = 0; i < count; ++i) {
      const Variable* piece = sources[i]->find(variable->name);
      if (!piece)
        throw Error(sources[i]->path() + ": no variable '" + variable->name + "' to join with " +
                    first.path());
      if (piece->dims != variable->dims || piece->dtype != variable->dtype ||
          !std::equal(piece->shape.begin() + 1, piece->shape.end(), variable->shape.begin() + 1)) {
        throw Error("mismatched inputs: " + variable->name +
                    " differs in dimensions, shape or data type between " + first.path() + " and " +
                    sources[i]->path());
      }
      Part part{sources[i].get(), piece, plan_cf_decoding(*piece), offset,
                joined ? piece->shape[0] : 0};
      if (!joined && variable->rank() > 0) part.length = piece->shape[0];
      if (i > 0 && part.cf.output != output.parts[0].cf.output) {
        throw Error("mismatched inputs: " + variable->name +
                    " decodes to different data types in " + first.path() + " and " +
                    sources[i]->path());
      }
      offset += part.length;
      output.parts.push_back(std::move(part));
    }
    if (joined) output.shape[0] = offset;
    output.dtype = output.parts[0].cf.output;
    plan_layout(output, options, output.parts[0].cf.attributes);
    outputs.push_back(std::move(output));
    result.variables.push_back(variable->name);
  }

  // The arguments a resumed run must repeat.
  Json arguments = Json::object();
  Json inputs = Json::array();
  for (const auto& input : options.inputs) {
    inputs.push_back(input.find("://") == std::string::npos
                         ? fs::absolute(input).lexically_normal().string()
                         : input);
  }
  arguments["inputs"] = inputs;
  arguments["chunks"] = options.chunks;
  arguments["shards"] = options.shards;
  arguments["codec"] = options.codec;
  arguments["variables"] = options.variables;
  arguments["concat_dim"] = concat;

  // The output: new, resumed, or replaced with --overwrite.
  const fs::path out_path(options.output);
  std::error_code ec;
  std::optional<Json> previous;
  if (fs::exists(out_path, ec)) {
    const fs::path record = out_path / std::string(kProgressKey);
    if (options.overwrite) {
      if (!is_store_or_empty(out_path)) {
        throw Error(
            options.output +
            ": exists and is not a Zarr store or an empty directory; refusing to replace it");
      }
      fs::remove_all(out_path, ec);
      if (ec) throw Error(options.output + ": cannot remove it: " + ec.message());
    } else if (fs::is_regular_file(record, ec)) {
      auto store = make_file_store(options.output);
      auto bytes = store->get(kProgressKey);
      Json document =
          parse_json(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()),
                     options.output + "/" + std::string(kProgressKey));
      if (!document.contains("arguments") || document["arguments"] != arguments) {
        throw Error(options.output + ": holds an unfinished conversion with other arguments (" +
                    document.value("arguments", Json()).dump() +
                    "); run it again with those, or pass --overwrite");
      }
      previous = std::move(document);
    } else {
      throw Error(options.output + ": already exists; pass --overwrite to replace it");
    }
  }
  FileStoreOptions store_options;
  store_options.create = true;
  std::shared_ptr<Store> store = make_file_store(options.output, store_options);
  ProgressRecord progress(store, arguments);
  if (previous) {
    progress.load(*previous);
    remove_stale_temporaries(out_path);
  } else {
    progress.save();  // first: the output is marked incomplete before anything else is written
  }

  std::vector<std::optional<zarr::Array>> arrays;
  for (const auto& output : outputs) {
    try {
      arrays.push_back(zarr::Array::open(store, output.name));
    } catch (const NotFoundError&) {
      arrays.push_back(zarr::Array::create(store, output.name, output.metadata));
    }
  }
  // Array::create made the root group; it comes back last, so an unfinished output does not open.
  store->erase("zarr.json");

  // The work still to do.
  struct Unit {
    size_t output;
    uint64_t index;
    uint64_t bytes;
  };
  std::vector<Unit> pending;
  ConvertProgress state;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Output& output = outputs[o];
    for (uint64_t u = 0; u < output.units; ++u) {
      ++state.units_total;
      if (progress.is_done(output.name, u)) {
        ++state.units_resumed;
        continue;
      }
      uint64_t rows = output.shape.empty()
                          ? 1
                          : std::min(output.shape[0], (u + 1) * output.row) - u * output.row;
      uint64_t bytes = rows * output.inner * output.dtype.size();
      pending.push_back({o, u, bytes});
      state.bytes_todo += bytes;
    }
  }
  state.units_done = state.units_resumed;
  std::mutex mutex;
  ThreadPool::shared().parallel_for(pending.size(), [&](size_t i) {
    const Unit& unit = pending[i];
    const Output& output = outputs[unit.output];
    try {
      run_unit(output, *arrays[unit.output], unit.index);
    } catch (const Error&) {
      rethrow_with_context(output.name + " (rows " + std::to_string(unit.index * output.row) +
                           ".." +
                           std::to_string(std::min(output.shape.empty() ? 1 : output.shape[0],
                                                   (unit.index + 1) * output.row)) +
                           ")");
    }
    std::lock_guard lock(mutex);
    progress.mark_done(output.name, unit.index);
    ++state.units_done;
    state.bytes_done += unit.bytes;
    if (options.on_progress) options.on_progress(state);
  });

  // Last: the group with its attributes and the consolidated metadata, then the record goes.
  zarr::Group group = zarr::Group::create(store, "", 3, first.attributes());
  group.set_attributes(first.attributes());
  group.consolidate();
  store->erase(kProgressKey);
  result.units_total = state.units_total;
  result.units_resumed = state.units_resumed;
  result.bytes_written = state.bytes_done;
  return result;
}

}  // namespace zfeed::ingest

#include "zfeed/ingest/convert.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "zfeed/ingest/cf.h"
#include "zfeed/ingest/progress_record.h"
#include "zfeed/ingest/replace.h"
#include "zfeed/ingest/source.h"
#include "zfeed/ingest/zarr_source.h"
#include "zfeed/store/store.h"
#include "zfeed/util/box_copy.h"
#include "zfeed/util/error.h"
#include "zfeed/util/paths.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/cf.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kStackName = "data";
constexpr std::string_view kStackDim = "variable";
// Bookkeeping of one unit beyond its buffers (selections, vectors, the progress record share).
constexpr uint64_t kUnitOverhead = 64 << 10;

// One source variable's share of an output: the box of output indices it covers and, for each of
// its own dimensions, the output dimension it runs along (or none: a fixed index, as a level
// that became a channel) and the source index of each output index (empty: the identity, source
// index = output index - out_lo).
struct Piece {
  const Source* source = nullptr;
  const Variable* variable = nullptr;
  CfDecoding cf;
  std::vector<uint64_t> out_lo, out_hi;
  std::vector<int> follows;
  std::vector<std::vector<uint64_t>> index_of;
  // Zarr inputs: the chunk read at once (inner chunk where sharded) and the stored chunk (shard).
  std::vector<uint64_t> read_chunk, stored_chunk;
};

// How an output is cut into units: `rows` along the first dimension (a multiple of the chunk or
// shard extent); with split_dim > 0 also one chunk per unit along dimensions 1..split_dim-1 and
// `block` chunks along split_dim.
struct UnitPlan {
  uint64_t rows = 1;
  size_t split_dim = 0;
  uint64_t block = 0;
  bool operator==(const UnitPlan&) const = default;
};

struct Box {
  std::vector<uint64_t> start, count;
  uint64_t elements() const {
    uint64_t n = 1;
    for (uint64_t c : count) n *= c;
    return n;
  }
};

struct Output {
  std::string name;
  std::vector<std::string> dims;
  std::vector<uint64_t> shape;
  std::vector<Piece> pieces;
  DataType dtype;
  Json attributes = Json::object();
  std::optional<FillValue> fill;         // none: NaN for floats, 0 otherwise
  std::vector<uint64_t> default_chunks;  // chunk extents of dimensions not named in --chunks
  zarr::ArrayMetadata metadata;
  std::vector<uint64_t> write_chunk;  // chunk or shard shape
  std::vector<uint64_t> inner_chunk;  // the chunk inside a shard (= write_chunk unsharded)
  UnitPlan plan;
  uint64_t units = 1;
  uint64_t unit_bytes = 0;  // memory one unit holds (its buffers)
  uint64_t thread_bytes =
      0;  // working memory each thread may hold for this output's reads and writes
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

// A size in B, KiB or MiB. A need is rounded up, so that a size printed as enough is enough
// ("48MiB", "600KiB"); a budget down, so that one printed as too small is ("100B").
enum class Round { kUp, kDown };
std::string memory_size(uint64_t bytes, Round round) {
  auto in = [&](double unit) {
    const double value = double(bytes) / unit;
    return round == Round::kUp ? std::ceil(value) : std::floor(value);
  };
  char text[32];
  if (bytes < (1 << 10)) {
    std::snprintf(text, sizeof text, "%lluB", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1 << 20)) {
    std::snprintf(text, sizeof text, "%.0fKiB", in(1 << 10));
  } else {
    std::snprintf(text, sizeof text, "%.0fMiB", in(1 << 20));
  }
  return text;
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Worst-case size of an encoded chunk of `bytes` decoded bytes (incompressible data grows a
// little).
uint64_t encoded_bound(uint64_t bytes) { return bytes + bytes / 128 + 4096; }

// A box of `count` inside a C-order array of `shape` is one contiguous run when every dimension
// after the first one with more than one element is whole.
bool is_contiguous(std::span<const uint64_t> count, std::span<const uint64_t> shape) {
  size_t d = 0;
  while (d < count.size() && count[d] == 1) ++d;
  for (++d; d < count.size(); ++d) {
    if (count[d] != shape[d]) return false;
  }
  return true;
}

uint64_t element_offset(std::span<const uint64_t> start, std::span<const uint64_t> shape) {
  uint64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d) offset = offset * shape[d] + start[d];
  return offset;
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

template <typename T>
void append_as_double(const uint8_t* bytes, size_t n, std::vector<double>& out) {
  for (size_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, bytes + i * sizeof(T), sizeof(T));
    out.push_back(static_cast<double>(value));
  }
}

// A 1-D variable's values, CF-decoded, as doubles (for matching --sel values and naming channels).
std::vector<double> coordinate_values(const Source& source, const Variable& variable) {
  CfDecoding cf = plan_cf_decoding(variable, source.path());
  std::vector<uint8_t> raw = read_all(source, variable);
  const size_t n = variable.shape.empty() ? 1 : variable.shape[0];
  std::vector<uint8_t> decoded(n * cf.output.size());
  cf.apply(raw.data(), decoded.data(), n);
  std::vector<double> values;
  switch (cf.output.id) {
    case DataTypeId::kFloat32:
      append_as_double<float>(decoded.data(), n, values);
      break;
    case DataTypeId::kFloat64:
      append_as_double<double>(decoded.data(), n, values);
      break;
    case DataTypeId::kInt8:
      append_as_double<int8_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kInt16:
      append_as_double<int16_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kInt32:
      append_as_double<int32_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kInt64:
      append_as_double<int64_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kUInt8:
      append_as_double<uint8_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kUInt16:
      append_as_double<uint16_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kUInt32:
      append_as_double<uint32_t>(decoded.data(), n, values);
      break;
    case DataTypeId::kUInt64:
      append_as_double<uint64_t>(decoded.data(), n, values);
      break;
    default:
      throw UnsupportedError(source.path() + ": " + variable.name + ": coordinate values of type " +
                             std::string(cf.output.name()) + " cannot be matched");
  }
  return values;
}

// "500" for whole numbers, else the shortest form printf gives ("0.5", "1e-05").
std::string format_value(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// The Zarr array behind a variable of a Zarr input (for its chunk shapes and metadata).
std::optional<zarr::Array> zarr_array_of(const Source& source, const Variable& variable) {
  if (!dynamic_cast<const ZarrSource*>(&source)) return std::nullopt;
  auto store = open_store(source.path());
  zarr::Node node = zarr::open_node(store, "");
  if (auto* array = std::get_if<zarr::Array>(&node)) return *array;
  zarr::Node member = std::get<zarr::Group>(node).open_member(variable.name);
  if (auto* array = std::get_if<zarr::Array>(&member)) return *array;
  return std::nullopt;
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

// Chunk and shard shapes and the array metadata of one output.
void plan_layout(Output& output, const ConvertOptions& options) {
  const size_t rank = output.shape.size();
  std::vector<uint64_t> chunks(rank), grid(rank);
  for (size_t d = 0; d < rank; ++d) {
    const uint64_t extent = std::max<uint64_t>(output.shape[d], 1);
    // Coordinates and other one-dimensional variables are small: one chunk.
    auto it = options.chunks.find(output.dims[d]);
    if (rank < 2) {
      chunks[d] = extent;
    } else if (it != options.chunks.end()) {
      chunks[d] = std::min(it->second, extent);
    } else {
      chunks[d] = std::clamp<uint64_t>(
          output.default_chunks.empty() ? extent : output.default_chunks[d], 1, extent);
    }
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
  meta.fill_value = output.fill ? *output.fill
                                : parse_fill_value(output.dtype.is_float() ? Json("NaN") : Json(0),
                                                   output.dtype, false);
  meta.codecs = codec_chain(output, options, chunks);
  std::vector<std::optional<std::string>> names(output.dims.begin(), output.dims.end());
  meta.dimension_names = names;
  meta.attributes = output.attributes;
  meta.validate();
  output.write_chunk = grid;
  output.inner_chunk = chunks;
}

uint64_t chunks_along(const Output& output, size_t d) {
  return ceil_div(output.shape[d], output.write_chunk[d]);
}

uint64_t count_units(const Output& output, const UnitPlan& plan) {
  if (output.shape.empty()) return 1;
  uint64_t units = ceil_div(output.shape[0], plan.rows);
  if (plan.split_dim == 0) return units;
  for (size_t d = 1; d < plan.split_dim; ++d) units *= chunks_along(output, d);
  return units * ceil_div(chunks_along(output, plan.split_dim), plan.block);
}

// The output indices unit `unit` covers: always whole chunks (or shards), so each is written once.
Box unit_box(const Output& output, const UnitPlan& plan, uint64_t unit) {
  const size_t rank = output.shape.size();
  Box box{std::vector<uint64_t>(rank, 0), output.shape};
  if (rank == 0) return box;
  uint64_t rest = unit;
  for (size_t d = plan.split_dim; d >= 1 && plan.split_dim > 0; --d) {
    const uint64_t step = output.write_chunk[d] * (d == plan.split_dim ? plan.block : 1);
    const uint64_t n = ceil_div(output.shape[d], step);
    box.start[d] = rest % n * step;
    box.count[d] = std::min(step, output.shape[d] - box.start[d]);
    rest /= n;
  }
  box.start[0] = rest * plan.rows;
  box.count[0] = std::min(plan.rows, output.shape[0] - box.start[0]);
  return box;
}

// The intersection of a piece with a box, as counts per output dimension (empty: none).
std::optional<Box> overlap(const Piece& piece, const Box& box) {
  Box part{box.start, box.count};
  for (size_t d = 0; d < box.start.size(); ++d) {
    const uint64_t lo = std::max(box.start[d], piece.out_lo[d]);
    const uint64_t hi = std::min(box.start[d] + box.count[d], piece.out_hi[d]);
    if (lo >= hi) return std::nullopt;
    part.start[d] = lo;
    part.count[d] = hi - lo;
  }
  return part;
}

// Working memory a thread may hold while it reads one chunk of a Zarr input for this unit: the
// encoded bytes, plus the decoded chunk where it cannot be decoded straight into the unit's buffer.
uint64_t zarr_read_bytes(const Output& output, const UnitPlan& plan, const Piece& piece,
                         const Box& part) {
  const Variable& variable = *piece.variable;
  const uint64_t item = variable.dtype.size();
  std::vector<uint64_t> count(variable.rank(), 1);
  bool identity = true;
  for (size_t s = 0; s < variable.rank(); ++s) {
    if (piece.follows[s] < 0) continue;
    count[s] = part.count[size_t(piece.follows[s])];
    identity = identity && piece.index_of[s].empty();
  }
  // Whole chunks of the input along every dimension, in every unit?
  auto aligned = [&](const std::vector<uint64_t>& chunk) {
    for (size_t s = 0; s < variable.rank(); ++s) {
      if (count[s] == variable.shape[s]) continue;
      if (piece.follows[s] < 0) return chunk[s] == 1;
      const size_t o = size_t(piece.follows[s]);
      uint64_t step = output.shape[o];
      if (o == 0) step = plan.rows;
      if (plan.split_dim > 0 && o >= 1 && o < plan.split_dim) step = output.write_chunk[o];
      if (plan.split_dim > 0 && o == plan.split_dim) step = output.write_chunk[o] * plan.block;
      if (count[s] % chunk[s] != 0 || step % chunk[s] != 0 || piece.out_lo[o] % chunk[s] != 0)
        return false;
    }
    return true;
  };
  uint64_t chunk_bytes = item, stored_bytes = item;
  for (size_t s = 0; s < variable.rank(); ++s) {
    chunk_bytes *= std::min(piece.read_chunk[s], variable.shape[s]);
    stored_bytes *= std::min(piece.stored_chunk[s], variable.shape[s]);
  }
  const bool contiguous = is_contiguous(piece.read_chunk, count);
  if (piece.read_chunk == piece.stored_chunk) {
    const bool direct = identity && aligned(piece.read_chunk) && contiguous;
    return encoded_bound(chunk_bytes) + (direct ? 0 : chunk_bytes);
  }
  if (identity && aligned(piece.stored_chunk)) {  // whole shards: read and decoded at once
    return encoded_bound(stored_bytes) +
           (is_contiguous(piece.stored_chunk, count) ? 0 : stored_bytes) + chunk_bytes;
  }
  return encoded_bound(chunk_bytes) + chunk_bytes + 64 * 1024;  // index, inner chunk, decoded
}

// The memory of one unit under `plan` (its buffers) and of each thread's working buffers.
std::pair<uint64_t, uint64_t> estimate(const Output& output, const UnitPlan& plan) {
  const Box box = unit_box(output, plan, 0);
  const uint64_t out_size = output.dtype.size();
  uint64_t extra = 0, read_thread = 0;
  for (const Piece& piece : output.pieces) {
    auto part = overlap(piece, box);
    if (!part) continue;
    const uint64_t n = part->elements();
    bool single_run = true;
    for (const auto& indices : piece.index_of) {
      for (size_t i = 1; i < indices.size(); ++i)
        single_run = single_run && indices[i] == indices[i - 1] + 1;
    }
    const bool contiguous = single_run && is_contiguous(part->count, box.count);
    const bool direct = !piece.cf.active && contiguous;
    extra = std::max(extra, (direct ? 0 : n * piece.variable->dtype.size()) +
                                (piece.cf.active && !contiguous ? n * out_size : 0));
    if (!piece.read_chunk.empty())
      read_thread = std::max(read_thread, zarr_read_bytes(output, plan, piece, *part));
  }
  uint64_t write_bytes = out_size, inner_bytes = out_size;
  std::vector<uint64_t> written(output.shape.size());
  for (size_t d = 0; d < output.shape.size(); ++d) {
    written[d] = std::min(output.write_chunk[d], std::max<uint64_t>(output.shape[d], 1));
    write_bytes *= written[d];
    inner_bytes *= std::min(output.inner_chunk[d], std::max<uint64_t>(output.shape[d], 1));
  }
  const bool sharded = output.write_chunk != output.inner_chunk;
  const bool direct_write = written == output.write_chunk && is_contiguous(written, box.count);
  // The chunk gathered from the unit's buffer (a reused scratch buffer, like the read's), its
  // encoding, and for a shard the encoded inner chunks besides the assembled shard.
  const uint64_t write_scratch = direct_write ? 0 : write_bytes;
  const uint64_t write_encoded =
      encoded_bound(write_bytes) +
      (sharded ? encoded_bound(write_bytes) + 2 * encoded_bound(inner_bytes) : 0);
  const uint64_t thread_bytes = std::max(read_thread, write_scratch) + write_encoded;
  return {box.elements() * out_size + extra + kUnitOverhead, thread_bytes};
}

// Chooses how to cut an output into units so that one unit and every thread's working buffers fit
// `budget`: first whole rows of the input's chunks (no chunk decoded twice), then rows of output
// chunks, then blocks of chunks along the next dimensions, down to a single chunk.
void plan_units(Output& output, uint64_t budget, size_t threads) {
  std::vector<UnitPlan> candidates;
  if (output.shape.empty()) {
    candidates.push_back({});
  } else {
    const uint64_t row = output.write_chunk[0];
    uint64_t rows = row;
    for (const Piece& piece : output.pieces) {
      for (size_t s = 0; s < piece.follows.size() && !piece.stored_chunk.empty(); ++s) {
        if (piece.follows[s] == 0 && piece.index_of[s].empty())
          rows = std::lcm(rows, piece.stored_chunk[s]);
      }
    }
    if (rows > row && rows <= 64 * row) candidates.push_back({rows, 0, 0});
    candidates.push_back({row, 0, 0});
    for (size_t d = 1; d < output.shape.size(); ++d) {
      const uint64_t n = chunks_along(output, d);
      if (n <= 1) continue;
      for (uint64_t block = ceil_div(n, 2);; block = ceil_div(block, 2)) {
        candidates.push_back({row, d, block});
        if (block == 1) break;
      }
    }
  }
  uint64_t need = 0;
  for (const UnitPlan& plan : candidates) {
    auto [unit_bytes, thread_bytes] = estimate(output, plan);
    need = unit_bytes + threads * thread_bytes;
    if (need <= budget) {
      output.plan = plan;
      output.units = count_units(output, plan);
      output.unit_bytes = unit_bytes;
      output.thread_bytes = thread_bytes;
      return;
    }
  }
  throw Error(output.name + ": --max-memory " + memory_size(budget, Round::kDown) +
              " is too small: one chunk (or shard) of " + output.name +
              " with the working buffers of " + std::to_string(threads) +
              (threads == 1 ? " thread" : " threads") + " needs " + memory_size(need, Round::kUp) +
              "; give --max-memory " + memory_size(need, Round::kUp) +
              " or more (or fewer --threads, or smaller --chunks/--shards)");
}

// Reads the part of `piece` inside `box` into `values` (the box's buffer, output data type).
void read_piece(const Piece& piece, const Box& box, uint8_t* values, size_t out_size,
                std::vector<uint8_t>& raw, std::vector<uint8_t>& decoded) {
  auto part = overlap(piece, box);
  if (!part) return;
  const Variable& variable = *piece.variable;
  const size_t rank = variable.rank(), out_rank = box.count.size();
  // Runs of consecutive source indices along each source dimension.
  struct Run {
    uint64_t source_start, length, out_start;
  };
  std::vector<std::vector<Run>> runs(rank);
  for (size_t s = 0; s < rank; ++s) {
    if (piece.follows[s] < 0) {
      runs[s].push_back({piece.index_of[s].at(0), 1, 0});
      continue;
    }
    const size_t o = size_t(piece.follows[s]);
    const uint64_t lo = part->start[o], hi = lo + part->count[o];
    if (piece.index_of[s].empty()) {
      runs[s].push_back({lo - piece.out_lo[o], hi - lo, lo});
      continue;
    }
    for (uint64_t i = lo; i < hi; ++i) {
      const uint64_t source = piece.index_of[s][i - piece.out_lo[o]];
      if (!runs[s].empty() && runs[s].back().source_start + runs[s].back().length == source &&
          runs[s].back().out_start + runs[s].back().length == i) {
        ++runs[s].back().length;
      } else {
        runs[s].push_back({source, 1, i});
      }
    }
  }
  std::vector<size_t> pick(rank, 0);
  std::vector<uint64_t> start(rank), count(rank), tmp_shape(out_rank), dst_start(out_rank);
  for (;;) {
    uint64_t elements = 1;
    for (size_t o = 0; o < out_rank; ++o) {
      tmp_shape[o] = 1;
      dst_start[o] = part->start[o] - box.start[o];  // dimensions no source dimension runs along
    }
    for (size_t s = 0; s < rank; ++s) {
      const Run& run = runs[s][pick[s]];
      start[s] = run.source_start;
      count[s] = run.length;
      elements *= run.length;
      if (piece.follows[s] >= 0) {
        const size_t o = size_t(piece.follows[s]);
        tmp_shape[o] = run.length;
        dst_start[o] = run.out_start - box.start[o];
      }
    }
    uint8_t* dst = values + element_offset(dst_start, box.count) * out_size;
    const bool contiguous = is_contiguous(tmp_shape, box.count);
    const std::vector<uint64_t> zero(out_rank, 0);
    if (!piece.cf.active && contiguous) {
      // The same data type: read straight into place.
      piece.source->read(variable, start, count, dst);
    } else {
      raw.resize(elements * variable.dtype.size());
      piece.source->read(variable, start, count, raw.data());
      if (contiguous) {
        piece.cf.apply(raw.data(), dst, elements);
      } else {
        const uint8_t* from = raw.data();
        if (piece.cf.active) {
          decoded.resize(elements * out_size);
          piece.cf.apply(raw.data(), decoded.data(), elements);
          from = decoded.data();
        }
        copy_box(from, BoxRef{tmp_shape, zero}, values, BoxRef{box.count, dst_start}, tmp_shape,
                 out_size);
      }
    }
    size_t s = rank;
    while (s > 0) {
      --s;
      if (++pick[s] < runs[s].size()) break;
      pick[s] = 0;
      if (s == 0) return;
    }
    if (rank == 0) return;
  }
}

// Reads, decodes and writes one unit; returns the decoded bytes written.
uint64_t run_unit(const Output& output, const zarr::Array& array, const Box& box) {
  const size_t out_size = output.dtype.size();
  std::vector<uint8_t> values(box.elements() * out_size), raw, decoded;
  for (const Piece& piece : output.pieces)
    read_piece(piece, box, values.data(), out_size, raw, decoded);
  raw = {};
  decoded = {};
  zarr::Selection selection;
  for (size_t d = 0; d < box.start.size(); ++d)
    selection.push_back({box.start[d], box.start[d] + box.count[d], 1});
  array.write(selection, values.data());
  return values.size();
}

// Admits units while the memory they hold stays within the capacity (one unit is always
// admitted when none runs, so a unit larger than the capacity still makes progress).
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t capacity) : capacity_(capacity) {}

  void acquire(uint64_t bytes) {
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] { return units_ == 0 || in_use_ + bytes <= capacity_; });
    in_use_ += bytes;
    ++units_;
    peak_ = std::max(peak_, in_use_);
    max_units_ = std::max(max_units_, units_);
  }
  void release(uint64_t bytes) {
    {
      std::lock_guard lock(mutex_);
      in_use_ -= bytes;
      --units_;
    }
    released_.notify_all();
  }
  uint64_t peak() const { return peak_; }
  uint64_t max_units() const { return max_units_; }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  uint64_t capacity_;
  uint64_t in_use_ = 0, peak_ = 0, units_ = 0, max_units_ = 0;
};

Json plan_json(const UnitPlan& plan) {
  return Json::array({plan.rows, plan.split_dim, plan.block});
}

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
  // A level within what the library takes: zstd's negative (fast) levels to 22, gzip and blosc
  // 0 to 9.
  auto level = [&](std::string_view text, int fallback, int lowest, int highest) {
    if (text.empty()) return fallback;
    int value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw Error("--codec " + std::string(spec) + ": the level must be an integer");
    }
    if (value < lowest || value > highest) {
      throw Error("--codec " + std::string(spec) + ": the level must be from " +
                  std::to_string(lowest) + " to " + std::to_string(highest));
    }
    return value;
  };
  if (name == "none" && rest.empty()) return Json(nullptr);
  if (name == "zstd") {
    return {{"name", "zstd"},
            {"configuration", {{"level", level(rest, 3, -131072, 22)}, {"checksum", false}}}};
  }
  if (name == "gzip")
    return {{"name", "gzip"}, {"configuration", {{"level", level(rest, 6, 0, 9)}}}};
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
              {"clevel", level(clevel, 5, 0, 9)},
              {"shuffle", "shuffle"},
              {"typesize", dtype.size()},
              {"blocksize", 0}}}};
  }
  throw Error("--codec " + std::string(spec) +
              ": unknown codec (use zstd[:LEVEL], blosc[:CNAME[:LEVEL]], gzip[:LEVEL] or none)");
}

std::pair<std::string, std::vector<std::string>> parse_dim_values(std::string_view text,
                                                                  std::string_view what) {
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0 || equals + 1 == text.size()) {
    throw Error(std::string(what) + ": expected DIM=V1,V2,..., got '" + std::string(text) + "'");
  }
  std::pair<std::string, std::vector<std::string>> result{std::string(text.substr(0, equals)), {}};
  std::string_view rest = text.substr(equals + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (!item.empty()) result.second.emplace_back(item);
  }
  if (result.second.empty())
    throw Error(std::string(what) + " " + result.first + ": no values given");
  return result;
}

uint64_t parse_memory_size(std::string_view text, std::string_view what) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},       {"B", 1.0},    {"K", 0x1p10},   {"KIB", 0x1p10}, {"M", 0x1p20},
      {"MIB", 0x1p20}, {"G", 0x1p30}, {"GIB", 0x1p30}, {"T", 0x1p40},   {"TIB", 0x1p40},
      {"KB", 1e3},     {"MB", 1e6},   {"GB", 1e9},     {"TB", 1e12}};
  auto it = kUnits.find(unit);
  if (ec != std::errc() || it == kUnits.end() || !(value > 0) || value * it->second > 0x1p62) {
    throw Error(std::string(what) + ": expected a size such as 512MiB, 2GiB or 1.5G, got '" +
                std::string(text) + "'");
  }
  return static_cast<uint64_t>(value * it->second);
}

ConvertResult convert(const ConvertOptions& options) {
  const std::string verb = options.rechunk ? "rechunk" : "convert";
  if (options.inputs.empty()) throw Error(verb + ": no input given");
  if (options.output.empty()) throw Error(verb + ": no output given");
  if (!is_local_path(options.output)) {
    // Its progress record, resume and --overwrite work on a local directory.
    throw UnsupportedError(verb + ": the output \"" + options.output +
                           "\" is not a local directory path; write it locally, then upload it");
  }
  if (options.max_memory == 0) throw Error("--max-memory must be positive");
  compressor_codec(options.codec, DataType{DataTypeId::kFloat32});  // fail early on a bad spec
  std::error_code ec;
  const fs::path out_path(strip_file_scheme(options.output));
  // An input inside the output would be removed by --overwrite, or overwritten; an output
  // inside an input would overwrite part of it.
  auto canonical = [&](const std::string& path) {
    return without_trailing_separator(fs::weakly_canonical(strip_file_scheme(path), ec));
  };
  auto holds = [](const fs::path& outer, const fs::path& inner) {
    return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first ==
           outer.end();
  };
  const fs::path out_canonical = canonical(options.output);
  for (const auto& input : options.inputs) {
    if (!is_local_path(input)) continue;
    const fs::path in = canonical(input);
    if (holds(out_canonical, in)) {
      throw Error(options.output + ": the output is (or holds) the input " + input +
                  "; write to another path");
    }
    if (holds(in, out_canonical)) {
      throw Error(options.output + ": the output lies inside the input " + input +
                  "; write to another path");
    }
  }

  // Inputs.
  std::vector<std::unique_ptr<Source>> sources;
  for (const auto& input : options.inputs) sources.push_back(open_source(input));
  const Source& first = *sources[0];
  if (options.rechunk && (sources.size() != 1 || !dynamic_cast<const ZarrSource*>(&first))) {
    throw Error(
        "rechunk: takes one Zarr store (use zfeed convert for netCDF input or to join several)");
  }
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
  auto used_list = [&] {
    return join(std::vector<std::string>(used_dims.begin(), used_dims.end()));
  };
  if (options.stack) used_dims.insert(std::string(kStackDim));
  for (const auto* sizes : {&options.chunks, &options.shards}) {
    for (const auto& [dim, size] : *sizes) {
      if (!used_dims.count(dim)) {
        throw Error((sizes == &options.chunks ? "--chunks" : "--shards") +
                    std::string(": no dimension '") + dim +
                    "' in the variables converted (they have " + used_list() + ")");
      }
    }
  }

  // Selections along dimensions: source indices in the order asked for.
  const auto lengths0 = dimension_lengths(first);
  std::map<std::string, std::vector<uint64_t>> picked;
  for (const auto& [dim, values] : options.sel) {
    if (options.isel.count(dim)) throw Error("--sel and --isel both select along " + dim);
    if (!used_dims.count(dim) || dim == kStackDim) {
      throw Error("--sel: no dimension '" + dim + "' in the variables converted (they have " +
                  used_list() + ")");
    }
    const Variable* coordinate = first.find(dim);
    if (!coordinate || !coordinate->is_coordinate()) {
      throw Error("--sel " + dim + ": " + first.path() + " has no coordinate variable '" + dim +
                  "' to match values against (select by index with --isel)");
    }
    const std::vector<double> coords = coordinate_values(first, *coordinate);
    for (const auto& text : values) {
      double want = 0;
      auto [end, parse_ec] = std::from_chars(text.data(), text.data() + text.size(), want);
      if (parse_ec != std::errc() || end != text.data() + text.size()) {
        throw Error("--sel " + dim + "=" + text + ": not a number");
      }
      auto it = std::find_if(coords.begin(), coords.end(), [&](double c) {
        return std::fabs(c - want) <= 1e-6 * std::max(1.0, std::fabs(want));
      });
      if (it == coords.end()) {
        std::vector<std::string> have;
        for (size_t i = 0; i < coords.size() && i < 20; ++i)
          have.push_back(format_value(coords[i]));
        if (coords.size() > 20) have.push_back("...");
        throw Error("--sel " + dim + "=" + text + ": dimension " + dim + " has no value " + text +
                    " in " + first.path() + " (it has " + join(have) + ")");
      }
      picked[dim].push_back(uint64_t(it - coords.begin()));
    }
  }
  for (const auto& [dim, indices] : options.isel) {
    if (!used_dims.count(dim) || dim == kStackDim) {
      throw Error("--isel: no dimension '" + dim + "' in the variables converted (they have " +
                  used_list() + ")");
    }
    for (uint64_t index : indices) {
      if (index >= lengths0.at(dim)) {
        throw Error("--isel " + dim + "=" + std::to_string(index) + ": out of range (" + dim +
                    " has " + std::to_string(lengths0.at(dim)) + " values, indices from 0)");
      }
    }
    if (indices.empty()) throw Error("--isel " + dim + ": no indices given");
    picked[dim] = indices;
  }

  // Several inputs: they must agree on every dimension but the one they are joined along.
  const std::string& concat = options.concat_dim;
  if (sources.size() > 1) {
    if (picked.count(concat)) {
      throw UnsupportedError("--sel/--isel along " + concat +
                             ", the dimension the inputs are joined along, is not supported");
    }
    for (size_t i = 1; i < sources.size(); ++i) {
      auto lengths = dimension_lengths(*sources[i]);
      if (!lengths.count(concat)) {
        throw Error(sources[i]->path() + ": no dimension '" + concat +
                    "' to join the inputs along");
      }
      for (const auto& dim : used_dims) {
        if (dim == concat || (options.stack && dim == kStackDim)) continue;
        auto it = lengths.find(dim);
        if (it == lengths.end() || it->second != lengths0.at(dim)) {
          throw Error("mismatched grids: dimension " + dim + " has length " +
                      std::to_string(lengths0.at(dim)) + " in " + first.path() + " but " +
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

  // Joined inputs follow one another along the dimension they are joined along: each input's
  // coordinate values start past the last of the input before, all one way (the same input given
  // twice, or files out of order, would repeat or shuffle the times). Inputs whose values are
  // encoded differently are refused below, by their units.
  if (sources.size() > 1) {
    const Variable* first_coordinate = first.find(concat);
    double direction = 0;
    std::optional<double> last;
    for (size_t i = 0; first_coordinate && first_coordinate->is_coordinate() && i < sources.size();
         ++i) {
      const Variable* coordinate = sources[i]->find(concat);
      if (!coordinate || !coordinate->is_coordinate() ||
          coordinate->attributes.value("units", Json()) !=
              first_coordinate->attributes.value("units", Json())) {
        break;
      }
      const std::vector<double> values = coordinate_values(*sources[i], *coordinate);
      if (values.empty()) continue;
      if (!direction && values.size() > 1) direction = values[1] > values[0] ? 1 : -1;
      if (last) {
        const double step = values.front() - *last;
        if (!direction && step != 0) direction = step > 0 ? 1 : -1;
        if (step * direction <= 0) {
          std::ostringstream text;
          text << "mismatched inputs: " << concat << " of " << sources[i]->path() << " starts at "
               << values.front() << ", not " << (direction < 0 ? "before" : "after") << " the last "
               << concat << " of " << sources[i - 1]->path() << " (" << *last
               << "): give the inputs in " << concat << " order, each once";
          throw Error(text.str());
        }
      }
      last = values.back();
    }
  }

  // A variable not along the join dimension (2-D latitude and longitude, a static field) is
  // written once, from the first input: every other input that has it must hold the same values,
  // or the output's would be those of one file only.
  auto require_same_in_every_input = [&](const Variable& variable) {
    std::optional<std::vector<uint8_t>> values0;
    for (size_t i = 1; i < sources.size(); ++i) {
      const Variable* other = sources[i]->find(variable.name);
      if (!other) continue;
      const bool same_layout = other->dims == variable.dims && other->shape == variable.shape &&
                               other->dtype == variable.dtype;
      if (same_layout && !values0) values0 = read_all(first, variable);
      if (!same_layout || read_all(*sources[i], *other) != *values0) {
        throw Error("mismatched inputs: " + variable.name + ", which is not along " + concat +
                    ", differs between " + first.path() + " and " + sources[i]->path() +
                    " (it would be written from the first input alone)");
      }
    }
  };
  // One input's share of a variable: the rows [offset, offset + length) along the first dimension.
  struct Part {
    const Source* source;
    const Variable* variable;
    uint64_t offset, length;
  };
  auto parts_of = [&](const Variable& variable) {
    const bool joined = sources.size() > 1 && std::find(variable.dims.begin(), variable.dims.end(),
                                                        concat) != variable.dims.end();
    if (joined && variable.dims[0] != concat) {
      throw UnsupportedError(variable.name + ": joining along " + concat +
                             " needs it to be the first dimension");
    }
    std::vector<Part> parts;
    uint64_t offset = 0;
    for (size_t i = 0; i < (joined ? sources.size() : 1); ++i) {
      const Variable* piece = sources[i]->find(variable.name);
      if (!piece)
        throw Error(sources[i]->path() + ": no variable '" + variable.name + "' to join with " +
                    first.path());
      // Same dims, so same rank; a scalar (rank 0) has no extents past the first to compare.
      if (piece->dims != variable.dims || piece->dtype != variable.dtype ||
          (variable.rank() > 0 &&
           !std::equal(piece->shape.begin() + 1, piece->shape.end(), variable.shape.begin() + 1))) {
        throw Error("mismatched inputs: " + variable.name +
                    " differs in dimensions, shape or data type between " + first.path() + " and " +
                    sources[i]->path());
      }
      // Values "since" a date join only where every input counts from the same date, in the same
      // unit and calendar: files that each count from their own start would repeat the times.
      if (joined && i > 0) {
        for (const char* key : {"units", "calendar"}) {
          const Json mine = piece->attributes.value(key, Json());
          const Json theirs = variable.attributes.value(key, Json());
          const Json& units = variable.attributes.value("units", Json());
          if (units.is_string() && units.get<std::string>().find(" since ") != std::string::npos &&
              mine != theirs) {
            throw Error("mismatched inputs: " + variable.name + " has " + key + " " +
                        theirs.dump() + " in " + first.path() + " and " + mine.dump() + " in " +
                        sources[i]->path() +
                        ": joined values need one encoding (write the inputs with the same time "
                        "units, or convert them one by one)");
          }
        }
      }
      const uint64_t length = variable.rank() == 0 ? 0 : piece->shape[0];
      parts.push_back({sources[i].get(), piece, offset, length});
      offset += length;
    }
    if (!joined) require_same_in_every_input(variable);
    return parts;
  };
  // The decoding of a part: CF as xarray does it, or none when rechunking.
  auto decoding_of = [&](const Source& source, const Variable& variable) {
    if (!options.rechunk) return plan_cf_decoding(variable, source.path());
    CfDecoding none;
    none.input = none.output = variable.dtype;
    none.attributes = variable.attributes;
    return none;
  };
  auto add_zarr_chunks = [&](Piece& piece) {
    if (auto array = zarr_array_of(*piece.source, *piece.variable)) {
      piece.read_chunk = array->read_chunk_shape();
      piece.stored_chunk = array->metadata().chunk_shape;
    }
  };
  // The output shape of a variable: selections applied, joined inputs summed along the first.
  auto shape_of = [&](const Variable& variable, const std::vector<Part>& parts) {
    std::vector<uint64_t> shape = variable.shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (auto it = picked.find(variable.dims[d]); it != picked.end()) shape[d] = it->second.size();
    }
    if (parts.size() > 1) shape[0] = parts.back().offset + parts.back().length;
    return shape;
  };
  auto index_of = [&](const std::string& dim) {
    auto it = picked.find(dim);
    return it == picked.end() ? std::vector<uint64_t>() : it->second;
  };

  std::vector<Output> outputs;
  // A variable written as its own array.
  auto add_plain = [&](const Variable& variable) {
    Output output;
    output.name = variable.name;
    output.dims = variable.dims;
    const auto parts = parts_of(variable);
    output.shape = shape_of(variable, parts);
    for (const Part& part : parts) {
      Piece piece;
      piece.source = part.source;
      piece.variable = part.variable;
      piece.cf = decoding_of(*part.source, *part.variable);
      piece.out_lo.assign(variable.rank(), 0);
      piece.out_hi = output.shape;
      if (parts.size() > 1) {
        piece.out_lo[0] = part.offset;
        piece.out_hi[0] = part.offset + part.length;
      }
      for (size_t s = 0; s < variable.rank(); ++s) {
        piece.follows.push_back(int(s));
        piece.index_of.push_back(index_of(variable.dims[s]));
      }
      add_zarr_chunks(piece);
      if (!output.pieces.empty() && piece.cf.output != output.pieces[0].cf.output) {
        throw Error("mismatched inputs: " + variable.name + " decodes to different data types in " +
                    first.path() + " and " + part.source->path());
      }
      output.pieces.push_back(std::move(piece));
    }
    const Piece& head = output.pieces[0];
    output.dtype = head.cf.output;
    output.attributes = head.cf.attributes;
    if (options.rechunk) {
      if (auto array = zarr_array_of(*head.source, *head.variable)) {
        const auto& meta = array->metadata();
        // The values stay packed, so their mask must stay too: a v2 store written by xarray
        // holds _FillValue as its fill_value alone, which the v3 output's attributes must say.
        output.attributes = zarr::cf_attributes(meta);
        output.fill = meta.fill_value.is_null ? parse_fill_value(Json(0), meta.dtype, false)
                                              : meta.fill_value;
        output.default_chunks = head.read_chunk;
      }
    }
    outputs.push_back(std::move(output));
    result.variables.push_back(variable.name);
  };

  if (!options.stack) {
    for (const Variable* variable : selected) add_plain(*variable);
  } else {
    std::vector<const Variable*> data;
    for (const Variable* variable : selected) {
      if (!variable->is_coordinate()) data.push_back(variable);
    }
    if (data.empty()) throw Error("--stack: no data variables to stack");
    auto stack_dims = [](const Variable& v) {
      return std::vector<std::string>{v.dims[0], v.dims[v.rank() - 2], v.dims[v.rank() - 1]};
    };
    if (data[0]->rank() != 3 && data[0]->rank() != 4) {
      throw Error("--stack: " + data[0]->name + " has dimensions (" + join(data[0]->dims) +
                  "); stacked variables need (time, lat, lon) or (time, level, lat, lon): choose "
                  "them with --variables");
    }
    const std::vector<std::string> dims = stack_dims(*data[0]);
    for (const Variable* variable : data) {
      if ((variable->rank() != 3 && variable->rank() != 4) || stack_dims(*variable) != dims) {
        throw Error("--stack: " + variable->name + " has dimensions (" + join(variable->dims) +
                    ") but every stacked variable needs (" + dims[0] + ", [level,] " + dims[1] +
                    ", " + dims[2] + "): choose the variables with --variables");
      }
    }
    // Coordinates of the stack's dimensions, as usual.
    for (const Variable* variable : selected) {
      if (variable->is_coordinate() && std::count(dims.begin(), dims.end(), variable->name))
        add_plain(*variable);
    }
    // The channels: a variable without a level is one; one with a level is one per level.
    Output stacked;
    stacked.name = std::string(kStackName);
    stacked.dims = {dims[0], std::string(kStackDim), dims[1], dims[2]};
    stacked.dtype = DataType{DataTypeId::kFloat32};
    std::vector<std::string> names;
    std::vector<uint64_t> shape;
    for (const Variable* variable : data) {
      const auto parts = parts_of(*variable);
      const auto var_shape = shape_of(*variable, parts);
      shape = {var_shape[0], 0, var_shape[var_shape.size() - 2], var_shape.back()};
      std::vector<uint64_t> levels{0};
      std::vector<std::string> suffixes{""};
      if (variable->rank() == 4) {
        const std::string& level_dim = variable->dims[1];
        levels = index_of(level_dim);
        if (levels.empty()) {
          levels.resize(variable->shape[1]);
          std::iota(levels.begin(), levels.end(), 0);
        }
        const Variable* coordinate = first.find(level_dim);
        std::vector<double> values;
        if (coordinate && coordinate->is_coordinate())
          values = coordinate_values(first, *coordinate);
        suffixes.clear();
        for (uint64_t level : levels) {
          suffixes.push_back(
              "_" + (values.empty() ? std::to_string(level) : format_value(values[level])));
        }
      }
      for (size_t k = 0; k < levels.size(); ++k) {
        const uint64_t channel = names.size();
        names.push_back(variable->name + suffixes[k]);
        for (const Part& part : parts) {
          Piece piece;
          piece.source = part.source;
          piece.variable = part.variable;
          piece.cf = decoding_of(*part.source, *part.variable);
          // Every channel is float32: a cast where the values are not decoded to float32 already.
          if (piece.cf.output.id != DataTypeId::kFloat32) {
            piece.cf.active = true;
            piece.cf.output = DataType{DataTypeId::kFloat32};
          }
          piece.out_lo = {parts.size() > 1 ? part.offset : 0, channel, 0, 0};
          piece.out_hi = {parts.size() > 1 ? part.offset + part.length : shape[0], channel + 1,
                          shape[2], shape[3]};
          const size_t rank = variable->rank();
          for (size_t s = 0; s < rank; ++s) {
            if (rank == 4 && s == 1) {
              piece.follows.push_back(-1);
              piece.index_of.push_back({levels[k]});
            } else {
              piece.follows.push_back(s == 0 ? 0 : int(s + 4 - rank));
              piece.index_of.push_back(index_of(variable->dims[s]));
            }
          }
          add_zarr_chunks(piece);
          stacked.pieces.push_back(std::move(piece));
        }
      }
    }
    shape[1] = names.size();
    stacked.shape = shape;
    stacked.attributes = {{"variables", names}};
    stacked.default_chunks = {1, shape[1], shape[2], shape[3]};
    outputs.push_back(std::move(stacked));
    result.variables.push_back(std::string(kStackName));
  }
  for (Output& output : outputs) plan_layout(output, options);

  // The arguments a resumed run must repeat (not --max-memory: a resumed run may change it).
  Json arguments = Json::object();
  Json inputs = Json::array();
  for (const auto& input : options.inputs) {
    if (!is_local_path(input)) {
      inputs.push_back(input);
      continue;
    }
    // "./in.zarr/" is "in.zarr", as is "file://$PWD/in.zarr": a resumed run names its inputs as
    // it likes.
    inputs.push_back(without_trailing_separator(fs::absolute(strip_file_scheme(input))).string());
  }
  arguments["verb"] = verb;
  arguments["inputs"] = inputs;
  arguments["chunks"] = options.chunks;
  arguments["shards"] = options.shards;
  arguments["codec"] = options.codec;
  arguments["variables"] = options.variables;
  arguments["concat_dim"] = concat;
  if (!options.sel.empty()) arguments["sel"] = options.sel;
  if (!options.isel.empty()) arguments["isel"] = options.isel;
  if (options.stack) arguments["stack"] = true;

  // The units, within the memory budget.
  std::optional<ThreadPool> own_pool;
  ThreadPool& pool = options.threads == 0 || options.threads == ThreadPool::shared().size()
                         ? ThreadPool::shared()
                         : own_pool.emplace(options.threads);
  const size_t threads = pool.size();
  for (Output& output : outputs) plan_units(output, options.max_memory, threads);

  // The output: new, resumed, or replaced with --overwrite. A store that --overwrite replaces
  // stays whole until the new one is complete (written beside it, then swapped in).
  finish_interrupted_swap(out_path);
  fs::path write_path = out_path;
  bool replacing = false;
  auto read_record = [&](const fs::path& directory) -> std::optional<Json> {
    if (!fs::is_regular_file(directory / std::string(kProgressKey), ec)) return std::nullopt;
    std::optional<Json> document =
        ProgressRecord::read(*make_file_store(directory.string()), std::string(kProgressKey));
    if (document && document->contains("arguments") && (*document)["arguments"].is_object() &&
        !(*document)["arguments"].contains("verb")) {
      (*document)["arguments"]["verb"] = "convert";
    }
    return document;
  };
  std::optional<Json> previous;
  if (fs::exists(out_path, ec)) {
    std::optional<Json> record = read_record(out_path);
    if (options.overwrite) {
      if (!is_store_or_empty(out_path)) {
        throw Error(
            options.output +
            ": exists and is not a Zarr store or an empty directory; refusing to replace it");
      }
      if (record || fs::is_empty(out_path, ec)) {
        // An unfinished output or an empty directory: nothing finished to keep.
        fs::remove_all(out_path, ec);
        if (ec) throw Error(options.output + ": cannot remove it: " + ec.message());
      } else {
        replacing = true;
        write_path = replacement_path(out_path);
        // An earlier --overwrite cut short resumes where its arguments are these; any other
        // directory there is zfeed's own unfinished work and starts over.
        std::optional<Json> earlier = read_record(write_path);
        if (earlier && earlier->value("arguments", Json()) == arguments) {
          previous = std::move(earlier);
        } else if (fs::exists(write_path, ec)) {
          fs::remove_all(write_path, ec);
          if (ec) throw Error(write_path.string() + ": cannot remove it: " + ec.message());
        }
      }
    } else if (record) {
      if (record->value("arguments", Json()) != arguments) {
        throw Error(options.output + ": holds an unfinished " +
                    (options.rechunk ? "rechunk" : "conversion") + " with other arguments (" +
                    record->value("arguments", Json()).dump() +
                    "); run it again with those, or pass --overwrite");
      }
      previous = std::move(record);
    } else {
      std::string also;
      if (fs::exists(replacement_path(out_path), ec)) {
        also = " (an earlier --overwrite was cut short: its unfinished store " +
               replacement_path(out_path).string() + " resumes with --overwrite)";
      }
      throw Error(options.output + ": already exists; pass --overwrite to replace it" + also);
    }
  }
  FileStoreOptions store_options;
  store_options.create = true;
  std::shared_ptr<Store> store = make_file_store(write_path.string(), store_options);
  ProgressRecord progress(store, std::string(kProgressKey), verb, arguments);
  if (previous) {
    // Keep the units a previous run planned where they fit this run's budget (then its finished
    // units count); otherwise that output starts over with this run's plan.
    for (Output& output : outputs) {
      std::optional<UnitPlan> recorded;
      if (auto plan = ProgressRecord::recorded_plan(*previous, output.name);
          plan && plan->size() == 3) {
        recorded = UnitPlan{plan->at(0).get<uint64_t>(), plan->at(1).get<size_t>(),
                            plan->at(2).get<uint64_t>()};
      }
      if (recorded && !(*recorded == output.plan) && count_units(output, *recorded) > 0) {
        auto [unit_bytes, thread_bytes] = estimate(output, *recorded);
        if (unit_bytes + threads * thread_bytes <= options.max_memory) {
          output.plan = *recorded;
          output.units = count_units(output, *recorded);
          output.unit_bytes = unit_bytes;
          output.thread_bytes = thread_bytes;
        }
      }
      progress.load(*previous, output.name, plan_json(output.plan));
    }
    remove_stale_temporaries(write_path);
  }
  for (const Output& output : outputs) progress.set_plan(output.name, plan_json(output.plan));
  progress.save();  // first: the output is marked incomplete before anything else is written

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
    Box box;
  };
  std::vector<Unit> pending;
  ConvertProgress state;
  uint64_t thread_bytes = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Output& output = outputs[o];
    thread_bytes = std::max(thread_bytes, output.thread_bytes);
    for (uint64_t u = 0; u < output.units; ++u) {
      ++state.units_total;
      if (progress.is_done(output.name, u)) {
        ++state.units_resumed;
        continue;
      }
      Box box = unit_box(output, output.plan, u);
      state.bytes_todo += box.elements() * output.dtype.size();
      pending.push_back({o, u, std::move(box)});
    }
  }
  state.units_done = state.units_resumed;
  // The threads' working buffers are set aside; the units share the rest.
  result.thread_bytes = threads * thread_bytes;
  MemoryBudget budget(
      options.max_memory > result.thread_bytes ? options.max_memory - result.thread_bytes : 0);
  std::mutex mutex;
  pool.parallel_for(pending.size(), [&](size_t i) {
    const Unit& unit = pending[i];
    const Output& output = outputs[unit.output];
    budget.acquire(output.unit_bytes);
    uint64_t bytes = 0;
    try {
      bytes = run_unit(output, *arrays[unit.output], unit.box);
    } catch (const Error&) {
      budget.release(output.unit_bytes);
      std::string where = output.name;
      if (!unit.box.start.empty()) {
        where += " (rows " + std::to_string(unit.box.start[0]) + ".." +
                 std::to_string(unit.box.start[0] + unit.box.count[0]) + ")";
      }
      rethrow_with_context(where);
    } catch (...) {
      budget.release(output.unit_bytes);
      throw;
    }
    budget.release(output.unit_bytes);
    std::lock_guard lock(mutex);
    progress.mark_done(output.name, unit.index);
    ++state.units_done;
    state.bytes_done += bytes;
    if (options.on_progress) options.on_progress(state);
  });

  // Last: the group with its attributes and the consolidated metadata, then the record goes.
  zarr::Group group = zarr::Group::create(store, "", 3, first.attributes());
  group.set_attributes(first.attributes());
  group.consolidate();
  store->erase(kProgressKey);
  if (replacing) swap_in_replacement(out_path, write_path);
  result.units_total = state.units_total;
  result.units_resumed = state.units_resumed;
  result.bytes_written = state.bytes_done;
  result.peak_unit_bytes = budget.peak();
  result.max_units_in_flight = budget.max_units();
  return result;
}

ConvertResult rechunk(ConvertOptions options) {
  options.rechunk = true;
  return convert(options);
}

}  // namespace zfeed::ingest

// zfeed_read_limit: the machine's limit for reading one Zarr array, the yardstick of the read
// benchmark (bench/read_bench.py). It does only what no reader can avoid:
//
//   compressed (bytes + zstd, plain or inside sharding_indexed): every chunk's zstd frame (for a
//     sharded array: each inner chunk's frame, located through the shard index) is loaded into
//     memory first, untimed; then the frames are decompressed by the zstd library alone
//     (ZSTD_decompressDCtx into a preallocated, pre-faulted buffer) on all cores: std::thread,
//     one ZSTD_DCtx per thread, chunks handed out by an atomic counter. Timed.
//   uncompressed (bytes only): open + pread + close of each chunk's file (or the inner chunk's
//     byte range of its shard) into a preallocated, pre-faulted buffer, on all cores. Timed.
//
// for two patterns: "whole" (every read chunk of the array) and "sample" (a list of single read
// chunks: the same random sample the other readers use, from --sample FILE or --random K).
// A read chunk is a chunk, or an inner chunk where the array is sharded. The sample (and with
// --serial-whole the whole array) is also timed on one thread ("serial": one chunk after
// another, the most a reader that issues one 1-chunk read at a time can reach when a chunk's
// single zstd frame cannot be split across cores). MB/s counts decoded bytes (10^6 bytes
// per MB); each figure is the best of --reps repetitions after one untimed warm-up.
//
//   zfeed_read_limit PATH [--sample FILE | --random K [--seed S]] [--reps N] [--threads T]
//                    [--serial-whole] [--json OUT]
//   zfeed_read_limit GROUP --units FILE [--output-budget-mib M] [--reps N] [--threads T]
//                    [--json OUT]
//
// FILE holds one read-chunk grid index per line, its coordinates separated by spaces or commas
// ("17 0 0"). The JSON result goes to stdout (and to OUT); a short summary to stderr.
//
// --units (the loader benchmark, python/zfeed/bench.py): GROUP is a Zarr group and each line of
// FILE is "ARRAY i j k", a read chunk of the array ARRAY inside it; a line may repeat (a chunk
// decoded once per use). All the listed chunks, of every array, are decoded in one parallel pass
// ("units" in the JSON); frames that repeat are held in memory once, and the decoded values go to
// an output buffer of at most M MiB (default 256) whose slots are reused round robin, as a loader
// reuses its batch buffers. Nothing else is measured.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zfeed/codec/sharding.h"
#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"

namespace {

using zfeed::ByteRange;
using zfeed::Bytes;
using zfeed::Error;
using zfeed::Json;

// One read chunk: where its stored bytes are and how many bytes it decodes to.
struct Unit {
  std::string file;     // absolute path of the chunk or shard file
  uint64_t offset = 0;  // byte range inside the file
  uint64_t length = 0;
  uint64_t decoded = 0;  // decoded bytes (the full read chunk)
  bool missing = false;  // not stored: a reader fills it; the limit skips it
};

struct Layout {
  bool compressed = false;
  std::vector<uint64_t> read_grid;   // read chunks per dimension over the whole array
  std::vector<uint64_t> read_shape;  // shape of one read chunk
  uint64_t read_bytes = 0;           // decoded bytes of one read chunk
  std::string codecs;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "zfeed_read_limit: " << why << "\n"
            << "usage: zfeed_read_limit PATH [--sample FILE | --random K [--seed S]] [--reps N] "
               "[--threads T] [--serial-whole] [--json OUT]\n"
            << "       zfeed_read_limit GROUP --units FILE [--output-budget-mib M] [--reps N] "
               "[--threads T] [--json OUT]\n";
  std::exit(2);
}

// Accepts a chain of bytes (native) optionally followed by zstd; returns true if zstd is there.
bool check_chain(const zfeed::CodecChain& chain) {
  const auto& codecs = chain.codecs();
  bool ok = !codecs.empty() && codecs[0]->name() == "bytes" &&
            chain.is_identity() == (codecs.size() == 1);
  if (ok && codecs.size() == 2 && codecs[1]->name() != "zstd") ok = false;
  if (!ok || codecs.size() > 2) {
    throw Error("the limit handles bytes or bytes + zstd chunks only, this array has " +
                chain.describe());
  }
  return codecs.size() == 2;
}

std::vector<uint64_t> unravel(uint64_t linear, const std::vector<uint64_t>& grid) {
  std::vector<uint64_t> index(grid.size());
  for (size_t d = grid.size(); d-- > 0;) {
    index[d] = linear % grid[d];
    linear /= grid[d];
  }
  return index;
}

uint64_t ravel(const std::vector<uint64_t>& index, const std::vector<uint64_t>& grid) {
  uint64_t linear = 0;
  for (size_t d = 0; d < grid.size(); ++d) linear = linear * grid[d] + index[d];
  return linear;
}

// Resolves every read chunk of the array (in C order over the read-chunk grid) to a byte range.
std::vector<Unit> resolve_all(const zfeed::zarr::Array& array, const std::string& root,
                              Layout& layout) {
  const auto& meta = array.metadata();
  const zfeed::CodecChain& chain = array.codecs();
  const zfeed::ShardingCodec* sharding = chain.sharding();
  const zfeed::CodecChain& leaf = sharding ? sharding->inner() : chain;
  if (sharding && sharding->inner().sharding())
    throw Error("nested sharding is not handled by the limit");
  layout.compressed = check_chain(leaf);
  layout.codecs = chain.describe();
  layout.read_shape = leaf.spec().shape;
  layout.read_bytes = leaf.spec().num_bytes();
  const size_t rank = meta.rank();
  std::vector<uint64_t> chunk_grid(rank);
  std::vector<uint64_t> per_shard(rank, 1);
  if (sharding) per_shard = sharding->chunks_per_shard();
  layout.read_grid.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    chunk_grid[d] = (meta.shape[d] + meta.chunk_shape[d] - 1) / meta.chunk_shape[d];
    layout.read_grid[d] = chunk_grid[d] * per_shard[d];
  }
  uint64_t total = 1;
  for (uint64_t n : layout.read_grid) total *= n;
  std::vector<Unit> units(total);
  uint64_t chunks = 1;
  for (uint64_t n : chunk_grid) chunks *= n;
  const auto& store = *array.store();
  for (uint64_t c = 0; c < chunks; ++c) {
    std::vector<uint64_t> chunk_index = unravel(c, chunk_grid);
    std::string key = array.chunk_key(chunk_index);
    std::string file = root + "/" + key;
    auto size = store.size(key);
    if (!sharding) {
      Unit& unit = units[c];
      unit.file = file;
      unit.decoded = layout.read_bytes;
      unit.missing = !size;
      unit.length = size.value_or(0);
      continue;
    }
    zfeed::ShardIndex index;
    if (size) {
      Bytes index_bytes;
      ByteRange range = sharding->index_at_end() ? ByteRange::suffix(sharding->index_size())
                                                 : ByteRange::range(0, sharding->index_size());
      store.get_into(key, range, index_bytes);
      index = sharding->decode_index(index_bytes, *size);
    }
    for (uint64_t i = 0; i < sharding->num_inner_chunks(); ++i) {
      std::vector<uint64_t> inner = unravel(i, per_shard);
      std::vector<uint64_t> read_index(rank);
      for (size_t d = 0; d < rank; ++d) read_index[d] = chunk_index[d] * per_shard[d] + inner[d];
      uint64_t linear = ravel(read_index, layout.read_grid);
      Unit& unit = units[linear];
      unit.file = file;
      unit.decoded = layout.read_bytes;
      unit.missing = !size || index.is_empty(i);
      if (!unit.missing) {
        unit.offset = index.offset(i);
        unit.length = index.nbytes(i);
      }
    }
  }
  return units;
}

std::vector<std::vector<uint64_t>> read_sample_file(const std::string& path, size_t rank) {
  std::ifstream in(path);
  if (!in) usage("cannot read sample file " + path);
  std::vector<std::vector<uint64_t>> sample;
  std::string line;
  while (std::getline(in, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream fields(line);
    std::vector<uint64_t> index;
    uint64_t value;
    while (fields >> value) index.push_back(value);
    if (index.empty()) continue;
    if (index.size() != rank)
      usage("sample line \"" + line + "\" does not have " + std::to_string(rank) + " indices");
    sample.push_back(index);
  }
  return sample;
}

// splitmix64: a seeded sample for standalone use (read_bench.py passes its own list instead).
std::vector<std::vector<uint64_t>> random_sample(size_t count, uint64_t seed,
                                                 const std::vector<uint64_t>& grid) {
  uint64_t total = 1;
  for (uint64_t n : grid) total *= n;
  std::vector<std::vector<uint64_t>> sample;
  uint64_t state = seed;
  for (size_t i = 0; i < count; ++i) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    sample.push_back(unravel(z % total, grid));
  }
  return sample;
}

// A buffer that is written once before timing, so that no page fault lands in the timed part.
Bytes prefaulted(uint64_t size) {
  Bytes buffer(size);
  if (size > 0) std::memset(buffer.data(), 0, size);
  return buffer;
}

void read_range(const Unit& unit, uint8_t* out) {
  int fd = ::open(unit.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(unit.file + ": cannot open: " + std::strerror(errno));
  uint64_t done = 0;
  while (done < unit.length) {
    ssize_t got =
        ::pread(fd, out + done, unit.length - done, static_cast<off_t>(unit.offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ::close(fd);
      throw Error(unit.file + ": short read");
    }
    done += static_cast<uint64_t>(got);
  }
  ::close(fd);
}

double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct Measure {
  double seconds = 0;
  double cpu_seconds = 0;  // user + system CPU time of the process in the best repetition
  uint64_t decoded_bytes = 0;
  uint64_t stored_bytes = 0;
  size_t chunks = 0;
  size_t threads = 0;
  double mbps() const { return seconds > 0 ? decoded_bytes / seconds / 1e6 : 0; }
};

// Runs `work(i)` for i in [0, n) on `threads` threads (the calling thread is one of them).
template <typename Work>
double run_parallel(size_t n, size_t threads, Work&& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mutex;
  auto loop = [&](size_t thread) {
    try {
      for (;;) {
        size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= n || failed.load(std::memory_order_relaxed)) break;
        work(thread, i);
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(failure_mutex);
      failure = e.what();
      failed = true;
    }
  };
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(loop, t);
  loop(0);
  for (auto& thread : pool) thread.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) throw Error(failure);
  return seconds;
}

// Times reading (and decoding) `units` on `threads` threads, best of `reps` after a warm-up.
// Units that name the same stored bytes share one frame in memory. With `output_budget` 0 each
// unit has its own slot in the output buffer (a whole read lands in one array); otherwise the
// slots fit in `output_budget` bytes (at least one per thread) and are reused round robin.
Measure measure(const std::vector<Unit>& units, bool compressed, size_t threads, int reps,
                uint64_t output_budget = 0) {
  Measure m;
  m.threads = threads;
  std::vector<const Unit*> present;
  uint64_t largest = 0;
  for (const Unit& unit : units) {
    if (unit.missing) continue;
    present.push_back(&unit);
    m.decoded_bytes += unit.decoded;
    m.stored_bytes += unit.length;
    largest = std::max(largest, unit.decoded);
  }
  m.chunks = present.size();
  std::vector<uint64_t> out_offsets;
  uint64_t out_size = 0;
  if (output_budget == 0) {
    for (const Unit* unit : present) {
      out_offsets.push_back(out_size);
      out_size += unit->decoded;
    }
  } else {
    const uint64_t slots = std::max<uint64_t>(
        threads,
        std::min<uint64_t>(present.size(), output_budget / std::max<uint64_t>(1, largest)));
    for (size_t i = 0; i < present.size(); ++i) out_offsets.push_back((i % slots) * largest);
    out_size = std::min<uint64_t>(slots, present.size()) * largest;
  }
  Bytes out = prefaulted(out_size);
  std::vector<std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)>> contexts;
  for (size_t t = 0; t < threads; ++t) contexts.emplace_back(ZSTD_createDCtx(), &ZSTD_freeDCtx);

  std::function<void(size_t, size_t)> work;
  std::vector<Bytes> frames;
  std::vector<size_t> frame_of(present.size());
  if (compressed) {
    // Load every distinct frame first (untimed), each in its own buffer as a reader would hold it.
    std::map<std::pair<std::string, uint64_t>, size_t> frame_index;
    std::vector<const Unit*> distinct;
    for (size_t i = 0; i < present.size(); ++i) {
      auto [at, added] =
          frame_index.try_emplace({present[i]->file, present[i]->offset}, distinct.size());
      if (added) distinct.push_back(present[i]);
      frame_of[i] = at->second;
    }
    frames.resize(distinct.size());
    run_parallel(distinct.size(), threads, [&](size_t, size_t i) {
      frames[i] = Bytes(distinct[i]->length);
      read_range(*distinct[i], frames[i].data());
    });
    work = [&](size_t thread, size_t i) {
      const Bytes& frame = frames[frame_of[i]];
      size_t size = ZSTD_decompressDCtx(contexts[thread].get(), out.data() + out_offsets[i],
                                        present[i]->decoded, frame.data(), frame.size());
      if (ZSTD_isError(size) || size != present[i]->decoded) {
        throw Error(present[i]->file + ": zstd frame did not decode to " +
                    std::to_string(present[i]->decoded) + " bytes" +
                    (ZSTD_isError(size) ? std::string(" (") + ZSTD_getErrorName(size) + ")" : ""));
      }
    };
  } else {
    work = [&](size_t, size_t i) {
      if (present[i]->length != present[i]->decoded)
        throw Error(present[i]->file + ": size differs from the chunk's");
      read_range(*present[i], out.data() + out_offsets[i]);
    };
  }
  double best = 0;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    double cpu = cpu_seconds();
    double seconds = run_parallel(present.size(), threads, work);
    cpu = cpu_seconds() - cpu;
    if (rep >= 0 && (best == 0 || seconds < best)) {
      best = seconds;
      m.cpu_seconds = cpu;
    }
  }
  m.seconds = best;
  return m;
}

// The --units list: "ARRAY i j k" per line, each resolved through its array in the group.
std::vector<Unit> read_units_file(const std::string& file,
                                  const std::shared_ptr<zfeed::Store>& store,
                                  const std::string& root, Layout& layout) {
  std::ifstream in(file);
  if (!in) usage("cannot read units file " + file);
  struct Resolved {
    Layout layout;
    std::vector<Unit> units;
  };
  std::map<std::string, Resolved> arrays;
  std::vector<Unit> listed;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream fields(line);
    std::string name;
    if (!(fields >> name)) continue;
    auto found = arrays.find(name);
    if (found == arrays.end()) {
      Resolved resolved;
      auto array = zfeed::zarr::Array::open(store, name);
      resolved.units = resolve_all(array, root, resolved.layout);
      if (!first && resolved.layout.compressed != layout.compressed) {
        throw Error("the arrays of --units mix compressed and uncompressed chunks");
      }
      if (first) layout = resolved.layout;
      first = false;
      found = arrays.emplace(name, std::move(resolved)).first;
    }
    const Resolved& resolved = found->second;
    std::vector<uint64_t> index;
    uint64_t value;
    while (fields >> value) index.push_back(value);
    if (index.size() != resolved.layout.read_grid.size()) {
      usage("units line \"" + line + "\" does not have " +
            std::to_string(resolved.layout.read_grid.size()) + " indices for " + name);
    }
    for (size_t d = 0; d < index.size(); ++d) {
      if (index[d] >= resolved.layout.read_grid[d])
        usage("units line \"" + line + "\" is outside the chunk grid");
    }
    listed.push_back(resolved.units[ravel(index, resolved.layout.read_grid)]);
  }
  if (listed.empty()) usage("units file " + file + " lists no chunks");
  return listed;
}

Json to_json(const Measure& m) {
  return {{"mbps", m.mbps()},
          {"seconds", m.seconds},
          {"cpu_seconds", m.cpu_seconds},
          {"decoded_bytes", m.decoded_bytes},
          {"stored_bytes", m.stored_bytes},
          {"chunks", m.chunks},
          {"threads", m.threads}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, sample_file, units_file, json_out;
  uint64_t output_budget_mib = 256;
  size_t random_count = 0;
  uint64_t seed = 0;
  int reps = 3;
  bool serial_whole = false;
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--sample") {
      sample_file = value();
    } else if (arg == "--units") {
      units_file = value();
    } else if (arg == "--output-budget-mib") {
      output_budget_mib = std::max<uint64_t>(1, std::stoull(value()));
    } else if (arg == "--random") {
      random_count = std::stoul(value());
    } else if (arg == "--seed") {
      seed = std::stoull(value());
    } else if (arg == "--reps") {
      reps = std::max(1, std::stoi(value()));
    } else if (arg == "--threads") {
      threads = std::max<size_t>(1, std::stoul(value()));
    } else if (arg == "--serial-whole") {
      serial_whole = true;
    } else if (arg == "--json") {
      json_out = value();
    } else if (arg == "-h" || arg == "--help") {
      usage("measures the read limit of the machine for one array");
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option " + arg);
    } else if (path.empty()) {
      path = arg;
    } else {
      usage("one PATH only");
    }
  }
  if (path.empty()) usage("PATH is required");
  try {
    auto store = zfeed::make_file_store(path);
    std::string root = store->url().substr(std::string("file://").size());
    if (!units_file.empty()) {
      Layout layout;
      std::vector<Unit> listed = read_units_file(units_file, store, root, layout);
      Measure units = measure(listed, layout.compressed, threads, reps, output_budget_mib << 20);
      Json result;
      result["path"] = path;
      result["kind"] = layout.compressed
                           ? "zstd decompression (ZSTD_decompressDCtx) of frames in memory"
                           : "open + pread of the stored bytes into memory";
      result["threads"] = threads;
      result["reps"] = reps;
      result["output_budget_mib"] = output_budget_mib;
      result["units"] = to_json(units);
      std::cerr << "limit " << path << ": " << units.chunks << " chunks, "
                << static_cast<int>(units.mbps()) << " MB/s decoded on " << threads << " threads\n";
      std::string text = result.dump(2);
      std::cout << text << "\n";
      if (!json_out.empty()) std::ofstream(json_out) << text << "\n";
      return 0;
    }
    auto array = zfeed::zarr::Array::open(store, "");
    Layout layout;
    std::vector<Unit> all = resolve_all(array, root, layout);

    std::vector<std::vector<uint64_t>> sample;
    if (!sample_file.empty()) {
      sample = read_sample_file(sample_file, layout.read_grid.size());
    } else if (random_count > 0) {
      sample = random_sample(random_count, seed, layout.read_grid);
    }
    std::vector<Unit> sampled;
    for (const auto& index : sample) {
      for (size_t d = 0; d < index.size(); ++d) {
        if (index[d] >= layout.read_grid[d]) usage("sample index out of the read-chunk grid");
      }
      sampled.push_back(all[ravel(index, layout.read_grid)]);
    }

    Json result;
    result["path"] = path;
    result["codecs"] = layout.codecs;
    result["kind"] = layout.compressed
                         ? "zstd decompression (ZSTD_decompressDCtx) of frames in memory"
                         : "open + pread of the stored bytes into memory";
    result["read_chunk_shape"] = layout.read_shape;
    result["read_chunk_bytes"] = layout.read_bytes;
    result["threads"] = threads;
    result["reps"] = reps;
    Measure whole = measure(all, layout.compressed, threads, reps);
    result["whole"] = to_json(whole);
    if (serial_whole) result["whole_serial"] = to_json(measure(all, layout.compressed, 1, reps));
    std::cerr << "limit " << path << ": whole " << static_cast<int>(whole.mbps()) << " MB/s on "
              << threads << " threads";
    if (!sampled.empty()) {
      Measure part = measure(sampled, layout.compressed, threads, reps);
      Measure serial = measure(sampled, layout.compressed, 1, reps);
      result["sample"] = to_json(part);
      result["sample_serial"] = to_json(serial);
      std::cerr << ", sample of " << sampled.size() << ": " << static_cast<int>(part.mbps())
                << " MB/s (" << static_cast<int>(serial.mbps()) << " MB/s on one thread)";
    }
    std::cerr << "\n";
    std::string text = result.dump(2);
    std::cout << text << "\n";
    if (!json_out.empty()) {
      std::ofstream out(json_out);
      out << text << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "zfeed_read_limit: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

// The record that makes a long write resumable: the arguments of the run, each output's plan of
// units, and the units finished, kept as a key of the output store while it is written (convert,
// rechunk, synth). A run started again with the same arguments skips the finished units; the
// writer removes the record last, so while it exists the output is incomplete.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "zfeed/store/store.h"
#include "zfeed/util/json.h"

namespace zfeed::ingest {

class ProgressRecord {
 public:
  // `key`: where the record lives in `store`; `what`: the writer's name, said in the record.
  ProgressRecord(std::shared_ptr<Store> store, std::string key, std::string what, Json arguments)
      : store_(std::move(store)),
        key_(std::move(key)),
        what_(std::move(what)),
        arguments_(std::move(arguments)) {}

  // The record at `key` in `store`, if there is one.
  static std::optional<Json> read(Store& store, const std::string& key);

  // The finished units of the output `name`, if its recorded plan is `plan`.
  void load(const Json& document, const std::string& name, const Json& plan);
  static std::optional<Json> recorded_plan(const Json& document, const std::string& name);
  void set_plan(const std::string& name, Json plan) { plans_[name] = std::move(plan); }
  bool is_done(const std::string& name, uint64_t unit) const;
  // Records the unit and saves the record.
  void mark_done(const std::string& name, uint64_t unit);
  void save() const;

 private:
  // Disjoint [first, stop) ranges by first, merged with their neighbours as units come: the
  // record stays small however many units there are, and writing it costs the ranges (units
  // finish about in order), not the units.
  using Ranges = std::map<uint64_t, uint64_t>;
  static void add(Ranges& ranges, uint64_t unit);

  std::shared_ptr<Store> store_;
  std::string key_, what_;
  Json arguments_;
  Json plans_ = Json::object();
  std::map<std::string, Ranges> done_;
};

}  // namespace zfeed::ingest

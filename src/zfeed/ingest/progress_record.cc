#include "zfeed/ingest/progress_record.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "zfeed/util/error.h"

namespace zfeed::ingest {

namespace {

bool unsigned_numbers(const Json& list) {
  return list.is_array() && std::all_of(list.begin(), list.end(),
                                        [](const Json& n) { return n.is_number_unsigned(); });
}

// The form save() writes: {"arguments": {...}, "plans": {name: [n, ...]}, "done": {name: [[first,
// stop], ...]}}.
bool well_formed(const Json& document) {
  if (!document.is_object() || !document.value("arguments", Json()).is_object()) return false;
  const Json plans = document.value("plans", Json::object());
  const Json done = document.value("done", Json::object());
  if (!plans.is_object() || !done.is_object()) return false;
  for (const auto& [name, plan] : plans.items()) {
    if (!unsigned_numbers(plan)) return false;
  }
  for (const auto& [name, ranges] : done.items()) {
    if (!ranges.is_array()) return false;
    for (const Json& range : ranges) {
      if (!unsigned_numbers(range) || range.size() != 2 ||
          range[0].get<uint64_t>() > range[1].get<uint64_t>()) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

std::optional<Json> ProgressRecord::read(Store& store, const std::string& key) {
  auto bytes = store.get(key);
  if (!bytes) return std::nullopt;
  const std::string where = store.url() + "/" + key;
  Json document = parse_json(
      std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), where);
  if (!well_formed(document)) {
    throw Error(where +
                ": not a progress record as zfeed writes it (arguments, plans and done ranges); "
                "remove it to start the output over, or pass --overwrite");
  }
  if (!document.contains("done")) document["done"] = Json::object();
  return document;
}

void ProgressRecord::load(const Json& document, const std::string& name, const Json& plan) {
  const Json plans = document.value("plans", Json::object());
  if (!plans.contains(name) || plans[name] != plan) return;
  for (const auto& range : document.at("done").value(name, Json::array())) {
    const uint64_t first = range.at(0).get<uint64_t>(), stop = range.at(1).get<uint64_t>();
    for (uint64_t u = first; u < stop; ++u) add(done_[name], u);
  }
}

std::optional<Json> ProgressRecord::recorded_plan(const Json& document, const std::string& name) {
  const Json plans = document.value("plans", Json::object());
  if (!plans.contains(name)) return std::nullopt;
  return plans[name];
}

bool ProgressRecord::is_done(const std::string& name, uint64_t unit) const {
  auto it = done_.find(name);
  if (it == done_.end()) return false;
  auto range = it->second.upper_bound(unit);  // the first range starting past unit
  return range != it->second.begin() && unit < std::prev(range)->second;
}

void ProgressRecord::mark_done(const std::string& name, uint64_t unit) {
  add(done_[name], unit);
  save();
}

void ProgressRecord::save() const {
  Json done = Json::object();
  for (const auto& [name, ranges] : done_) {
    Json list = Json::array();
    for (const auto& [first, stop] : ranges) list.push_back(Json::array({first, stop}));
    done[name] = list;
  }
  Json document = {{"zfeed", what_ + " progress: the output is incomplete while this file exists"},
                   {"arguments", arguments_},
                   {"plans", plans_},
                   {"done", done}};
  std::string text = document.dump(1);
  store_->set(key_, ByteView(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void ProgressRecord::add(Ranges& ranges, uint64_t unit) {
  auto next = ranges.upper_bound(unit);
  if (next != ranges.begin()) {
    auto before = std::prev(next);
    if (unit < before->second) return;  // already there
    if (unit == before->second) {
      before->second = unit + 1;
      if (next != ranges.end() && next->first == unit + 1) {
        before->second = next->second;
        ranges.erase(next);
      }
      return;
    }
  }
  if (next != ranges.end() && next->first == unit + 1) {
    const uint64_t stop = next->second;
    ranges.erase(next);
    ranges.emplace(unit, stop);
    return;
  }
  ranges.emplace(unit, unit + 1);
}

}  // namespace zfeed::ingest

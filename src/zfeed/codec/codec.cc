#include "zfeed/codec/codec.h"

#include <cstring>
#include <map>
#include <mutex>

#include "zfeed/codec/sharding.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, CodecFactory, std::less<>> factories;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

uint64_t ChunkSpec::num_elements() const {
  uint64_t count = 1;
  for (uint64_t extent : shape) count *= extent;
  return count;
}

std::string chunk_size_mismatch(uint64_t size, const ChunkSpec& spec) {
  std::string shape;
  for (uint64_t extent : spec.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(extent);
  return "chunk holds " + std::to_string(size) + " bytes, expected " +
         std::to_string(spec.num_bytes()) + " for shape [" + shape + "] of " +
         std::string(spec.dtype.name());
}

std::string Codec::describe() const {
  Json json = to_json();
  std::string text = name();
  if (json.contains("configuration") && !json["configuration"].empty()) {
    text += "(";
    bool first = true;
    for (const auto& [key, value] : json["configuration"].items()) {
      if (!first) text += ", ";
      first = false;
      text += key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
    }
    text += ")";
  }
  return text;
}

void register_codec(std::string name, CodecFactory factory) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.factories.insert_or_assign(std::move(name), std::move(factory));
}

bool is_codec_registered(std::string_view name) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  return reg.factories.find(name) != reg.factories.end();
}

std::vector<std::string> registered_codecs() {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : reg.factories) names.push_back(name);
  return names;
}

CodecConfig::CodecConfig(std::string codec, const Json& configuration)
    : codec_(std::move(codec)), configuration_(configuration) {
  if (!configuration_.is_object())
    fail("configuration must be an object, got " + configuration_.dump());
}

void CodecConfig::fail(std::string_view why) const {
  throw Error("codec " + codec_ + ": " + std::string(why));
}

const Json* CodecConfig::find(std::string_view field) const {
  auto it = configuration_.find(field);
  return it == configuration_.end() ? nullptr : &*it;
}

const Json& CodecConfig::require(std::string_view field) const {
  const Json* value = find(field);
  if (value == nullptr) fail("missing required field \"" + std::string(field) + "\"");
  return *value;
}

int64_t CodecConfig::integer(std::string_view field, int64_t low, int64_t high,
                             std::optional<int64_t> fallback) const {
  const Json* value = find(field);
  if (value == nullptr) {
    if (fallback) return *fallback;
    require(field);
  }
  if (!value->is_number_integer() && !value->is_number_unsigned()) {
    fail("\"" + std::string(field) + "\" must be an integer, got " + value->dump());
  }
  if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(INT64_MAX)) {
    fail("\"" + std::string(field) + "\" is out of range: " + value->dump());
  }
  int64_t number = value->get<int64_t>();
  if (number < low || number > high) {
    fail("\"" + std::string(field) + "\" must be in " + std::to_string(low) + ".." +
         std::to_string(high) + ", got " + std::to_string(number));
  }
  return number;
}

std::string CodecConfig::string(std::string_view field, std::optional<std::string> fallback) const {
  const Json* value = find(field);
  if (value == nullptr) {
    if (fallback) return *fallback;
    require(field);
  }
  if (!value->is_string())
    fail("\"" + std::string(field) + "\" must be a string, got " + value->dump());
  return value->get<std::string>();
}

void CodecConfig::reject_unknown(std::initializer_list<std::string_view> known) const {
  for (const auto& [key, value] : configuration_.items()) {
    bool is_known = false;
    for (auto name : known) is_known = is_known || key == name;
    if (is_known) continue;
    if (value.is_object() && value.contains("must_understand") &&
        value["must_understand"] == false) {
      continue;
    }
    fail("unknown configuration field \"" + key + "\"");
  }
}

CodecChain CodecChain::from_json(const Json& codecs, const ChunkSpec& spec) {
  if (!codecs.is_array()) throw Error("codecs must be an array, got " + json_type_name(codecs));
  if (codecs.empty()) throw Error("codecs must not be empty: an array->bytes codec is required");
  CodecChain chain;
  chain.spec_ = spec;
  ChunkSpec current = spec;
  static const Json kEmpty = Json::object();
  for (size_t index = 0; index < codecs.size(); ++index) {
    const Json& entry = codecs[index];
    std::string name;
    const Json* configuration = &kEmpty;
    if (entry.is_string()) {
      name = entry.get<std::string>();
    } else if (entry.is_object() && entry.contains("name") && entry["name"].is_string()) {
      name = entry["name"].get<std::string>();
      for (const auto& [key, value] : entry.items()) {
        if (key != "name" && key != "configuration" && key != "must_understand") {
          throw Error("codecs[" + std::to_string(index) + "] (" + name + "): unknown field \"" +
                      key + "\"");
        }
      }
      if (entry.contains("configuration")) configuration = &entry["configuration"];
    } else {
      throw Error("codecs[" + std::to_string(index) + "] must be an object with a \"name\", got " +
                  entry.dump());
    }
    CodecFactory factory;
    {
      auto& reg = registry();
      std::lock_guard lock(reg.mutex);
      auto it = reg.factories.find(name);
      if (it == reg.factories.end()) throw UnsupportedError("unsupported codec \"" + name + "\"");
      factory = it->second;
    }
    std::shared_ptr<Codec> codec = factory(*configuration, current);
    chain.all_.push_back(codec);
    switch (codec->kind()) {
      case CodecKind::kArrayToArray: {
        if (chain.array_to_bytes_) {
          throw Error("codec chain out of order: array->array codec \"" + name +
                      "\" after the array->bytes codec");
        }
        auto a2a = std::static_pointer_cast<const ArrayToArrayCodec>(codec);
        chain.array_to_array_specs_.push_back(current);
        current = a2a->encoded_spec(current);
        chain.array_to_array_.push_back(std::move(a2a));
        break;
      }
      case CodecKind::kArrayToBytes:
        if (chain.array_to_bytes_) {
          throw Error("codec chain has two array->bytes codecs (\"" +
                      chain.array_to_bytes_->name() + "\" and \"" + name + "\")");
        }
        chain.array_to_bytes_ = std::static_pointer_cast<const ArrayToBytesCodec>(codec);
        chain.array_to_bytes_spec_ = current;
        break;
      case CodecKind::kBytesToBytes:
        if (!chain.array_to_bytes_) {
          throw Error("codec chain out of order: bytes->bytes codec \"" + name +
                      "\" before the array->bytes codec");
        }
        chain.bytes_to_bytes_.push_back(std::static_pointer_cast<const BytesToBytesCodec>(codec));
        break;
    }
  }
  if (!chain.array_to_bytes_)
    throw Error("codec chain has no array->bytes codec (such as \"bytes\")");
  return chain;
}

Json CodecChain::to_json() const {
  Json codecs = Json::array();
  for (const auto& codec : all_) codecs.push_back(codec->to_json());
  return codecs;
}

std::string CodecChain::describe() const {
  std::string text;
  for (const auto& codec : all_) {
    if (!text.empty()) text += " > ";
    text += codec->describe();
  }
  return text;
}

bool CodecChain::is_identity() const {
  return array_to_array_.empty() && bytes_to_bytes_.empty() &&
         array_to_bytes_->is_native_layout(array_to_bytes_spec_);
}

const ShardingCodec* CodecChain::sharding() const {
  if (!array_to_array_.empty() || !bytes_to_bytes_.empty()) return nullptr;
  return dynamic_cast<const ShardingCodec*>(array_to_bytes_.get());
}

std::optional<uint64_t> CodecChain::encoded_size() const {
  if (!array_to_array_.empty()) return std::nullopt;
  auto size = array_to_bytes_->encoded_size(array_to_bytes_spec_);
  for (const auto& codec : bytes_to_bytes_) {
    if (!size) return std::nullopt;
    size = codec->encoded_size(*size);
  }
  return size;
}

std::optional<uint64_t> CodecChain::max_encoded_size() const {
  auto size = array_to_bytes_->max_encoded_size(array_to_bytes_spec_);
  for (const auto& codec : bytes_to_bytes_) {
    if (!size) return std::nullopt;
    size = codec->max_encoded_size(*size);
  }
  return size;
}

Bytes CodecChain::encode(const uint8_t* chunk) const {
  Bytes scratch[2];
  const uint8_t* current = chunk;
  for (size_t i = 0; i < array_to_array_.size(); ++i) {
    Bytes& target = scratch[i % 2];
    target.resize(array_to_array_specs_[i].num_bytes());
    array_to_array_[i]->encode(current, array_to_array_specs_[i], target.data());
    current = target.data();
  }
  Bytes encoded = array_to_bytes_->encode(current, array_to_bytes_spec_);
  for (const auto& codec : bytes_to_bytes_) encoded = codec->encode(encoded);
  return encoded;
}

void CodecChain::decode(ByteView encoded, uint8_t* out) const {
  // Bound (or exact size) of the input to each bytes->bytes codec's decode, in chain order.
  const size_t n = bytes_to_bytes_.size();
  const bool direct =
      n > 0 && array_to_array_.empty() && array_to_bytes_->is_native_layout(array_to_bytes_spec_);
  ByteView current = encoded;
  Bytes storage[2];
  if (n > 0) {
    std::vector<std::optional<uint64_t>> exact(n);
    std::vector<uint64_t> bound(n);
    std::optional<uint64_t> size = array_to_bytes_->encoded_size(array_to_bytes_spec_);
    // A shard's bound counts its index and each inner chunk's overhead (many small inner chunks
    // make a shard larger than its values); else a generous one.
    uint64_t limit = size ? *size
                          : array_to_bytes_->max_encoded_size(array_to_bytes_spec_)
                                .value_or(array_to_bytes_spec_.num_bytes() * 2 + (1u << 20));
    for (size_t i = 0; i < n; ++i) {
      exact[i] = size;
      bound[i] = limit;
      size = size ? bytes_to_bytes_[i]->encoded_size(*size) : std::nullopt;
      limit = bytes_to_bytes_[i]->max_encoded_size(limit);
    }
    for (size_t i = n; i-- > 0;) {
      const auto& codec = bytes_to_bytes_[i];
      if (auto view = codec->decode_view(current)) {
        current = *view;
        continue;
      }
      if (i == 0 && direct) {
        codec->decode_into(current, {out, static_cast<size_t>(array_to_bytes_spec_.num_bytes())});
        return;
      }
      Bytes& target = storage[i % 2];
      if (exact[i]) {
        target.resize(*exact[i]);
        codec->decode_into(current, target.mutable_view());
      } else {
        target = codec->decode(current, bound[i]);
      }
      current = target.view();
    }
  }
  if (array_to_array_.empty()) {
    array_to_bytes_->decode(current, array_to_bytes_spec_, out);
    return;
  }
  Bytes arrays[2];
  arrays[0].resize(array_to_bytes_spec_.num_bytes());
  array_to_bytes_->decode(current, array_to_bytes_spec_, arrays[0].data());
  const uint8_t* source = arrays[0].data();
  for (size_t j = array_to_array_.size(); j-- > 0;) {
    uint8_t* target = out;
    if (j > 0) {
      Bytes& next = arrays[(array_to_array_.size() - j) % 2];
      next.resize(array_to_array_specs_[j].num_bytes());
      target = next.data();
    }
    array_to_array_[j]->decode(source, array_to_array_specs_[j], target);
    source = target;
  }
}

bool CodecChain::can_decode_prefix() const {
  if (!array_to_bytes_ || !array_to_array_.empty() ||
      !array_to_bytes_->is_native_layout(array_to_bytes_spec_)) {
    return false;
  }
  for (size_t i = 1; i < bytes_to_bytes_.size(); ++i) {
    if (!bytes_to_bytes_[i]->only_checks()) return false;
  }
  return bytes_to_bytes_.empty() || bytes_to_bytes_[0]->only_checks() ||
         bytes_to_bytes_[0]->can_decode_prefix();
}

bool CodecChain::prefix_saves_work() const {
  return can_decode_prefix() && !bytes_to_bytes_.empty() && bytes_to_bytes_[0]->can_decode_prefix();
}

bool CodecChain::decode_prefix(ByteView encoded, uint8_t* out, uint64_t size) const {
  if (!can_decode_prefix() || size > array_to_bytes_spec_.num_bytes()) return false;
  // Only checking codecs (crc32c) outside the one compressor, which must stop early.
  ByteView current = encoded;
  for (size_t i = bytes_to_bytes_.size(); i-- > 0;) {
    if (auto view = bytes_to_bytes_[i]->decode_view(current)) {
      current = *view;
      continue;
    }
    return i == 0 && bytes_to_bytes_[0]->decode_prefix(current, {out, static_cast<size_t>(size)});
  }
  if (current.size() != array_to_bytes_spec_.num_bytes()) {
    throw Error("chunk holds " + std::to_string(current.size()) + " bytes, expected " +
                std::to_string(array_to_bytes_spec_.num_bytes()));
  }
  std::memcpy(out, current.data(), size);
  return true;
}

}  // namespace zfeed

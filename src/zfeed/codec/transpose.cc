// transpose (array->array): permutes the chunk's dimensions. encoded.shape[i] =
// decoded.shape[order[i]]. Spec: zarr-specs docs/v3/codecs/transpose.
#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

// out[e] = in[d] where e_i = d_{order[i]}, walking the encoded array in C order.
void permute(const uint8_t* in, const std::vector<uint64_t>& in_shape,
             const std::vector<size_t>& order, uint8_t* out, size_t item) {
  const size_t rank = in_shape.size();
  std::vector<uint64_t> in_strides(rank);
  uint64_t stride = item;
  for (size_t d = rank; d-- > 0;) {
    in_strides[d] = stride;
    stride *= in_shape[d];
  }
  std::vector<uint64_t> out_shape(rank), step(rank);
  for (size_t i = 0; i < rank; ++i) {
    out_shape[i] = in_shape[order[i]];
    step[i] = in_strides[order[i]];
  }
  uint64_t total = 1;
  for (uint64_t extent : out_shape) total *= extent;
  if (total == 0) return;
  if (rank == 0) {
    std::memcpy(out, in, item);
    return;
  }
  std::vector<uint64_t> index(rank, 0);
  uint64_t offset = 0;
  const uint64_t inner = rank ? out_shape[rank - 1] : 1;
  const uint64_t inner_step = rank ? step[rank - 1] : 0;
  for (uint64_t done = 0; done < total; done += inner) {
    const uint8_t* source = in + offset;
    for (uint64_t i = 0; i < inner; ++i) {
      std::memcpy(out, source, item);
      out += item;
      source += inner_step;
    }
    for (size_t d = rank - 1; d-- > 0;) {
      offset += step[d];
      if (++index[d] < out_shape[d]) break;
      offset -= step[d] * out_shape[d];
      index[d] = 0;
    }
  }
}

class TransposeCodec final : public ArrayToArrayCodec {
 public:
  explicit TransposeCodec(std::vector<size_t> order) : order_(std::move(order)) {
    inverse_.resize(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) inverse_[order_[i]] = i;
  }

  std::string name() const override { return "transpose"; }
  Json to_json() const override {
    return {{"name", "transpose"}, {"configuration", {{"order", order_}}}};
  }

  ChunkSpec encoded_spec(const ChunkSpec& decoded) const override {
    ChunkSpec encoded = decoded;
    for (size_t i = 0; i < order_.size(); ++i) encoded.shape[i] = decoded.shape[order_[i]];
    return encoded;
  }

  void encode(const uint8_t* decoded, const ChunkSpec& spec, uint8_t* encoded) const override {
    permute(decoded, spec.shape, order_, encoded, spec.dtype.size());
  }

  void decode(const uint8_t* encoded, const ChunkSpec& spec, uint8_t* decoded) const override {
    permute(encoded, encoded_spec(spec).shape, inverse_, decoded, spec.dtype.size());
  }

 private:
  std::vector<size_t> order_;
  std::vector<size_t> inverse_;
};

std::shared_ptr<Codec> make_transpose(const Json& configuration, const ChunkSpec& spec) {
  CodecConfig config("transpose", configuration);
  config.reject_unknown({"order"});
  const Json& order_json = config.require("order");
  const size_t rank = spec.shape.size();
  std::vector<size_t> order;
  if (order_json.is_string()) {
    // The pre-release "C"/"F" forms, still found in old stores.
    std::string text = order_json.get<std::string>();
    if (text != "C" && text != "F")
      config.fail("\"order\" must be a permutation, got \"" + text + "\"");
    for (size_t i = 0; i < rank; ++i) order.push_back(text == "C" ? i : rank - 1 - i);
  } else if (order_json.is_array()) {
    std::vector<bool> seen(rank, false);
    for (const auto& entry : order_json) {
      if (!entry.is_number_integer() || entry.get<int64_t>() < 0 || entry.get<uint64_t>() >= rank ||
          seen[entry.get<size_t>()]) {
        config.fail("\"order\" must be a permutation of 0.." + std::to_string(rank) + "-1, got " +
                    order_json.dump());
      }
      seen[entry.get<size_t>()] = true;
      order.push_back(entry.get<size_t>());
    }
    if (order.size() != rank) {
      config.fail("\"order\" has " + std::to_string(order.size()) + " entries for a " +
                  std::to_string(rank) + "-dimensional chunk");
    }
  } else {
    config.fail("\"order\" must be an array, got " + order_json.dump());
  }
  return std::make_shared<TransposeCodec>(std::move(order));
}

ZFEED_REGISTER_CODEC("transpose", make_transpose);

}  // namespace
}  // namespace zfeed

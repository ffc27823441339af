// Helpers for the codec unit tests (included by *_test.cc only).
#pragma once

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "zfeed/codec/codec.h"
#include "zfeed/util/testing.h"

namespace zfeed::testing {

inline ChunkSpec make_spec(DataTypeId id, std::vector<uint64_t> shape, FillValue fill = {}) {
  return ChunkSpec{DataType{id}, std::move(shape), fill};
}

inline CodecChain make_chain(std::string_view codecs_json, const ChunkSpec& spec) {
  return CodecChain::from_json(Json::parse(codecs_json), spec);
}

// Chunk-sized values that compress somewhat (a ramp with noise in the low byte).
inline Bytes sample_chunk(const ChunkSpec& spec, uint64_t seed = 1) {
  return pseudo_random_bytes(spec.num_bytes(), seed, /*smooth=*/true);
}

// Encodes `values` with `chain`, decodes the result, and checks that the values come back.
// Returns the encoded bytes.
inline Bytes expect_round_trip(const CodecChain& chain, const Bytes& values) {
  Bytes encoded = chain.encode(values.data());
  Bytes decoded(chain.spec().num_bytes());
  chain.decode(encoded, decoded.data());
  EXPECT_EQ(decoded.size(), values.size());
  EXPECT_TRUE(same_bytes(decoded.data(), values.data(), values.size()))
      << "round trip through " << chain.describe() << " changed the values";
  return encoded;
}

// Decodes `encoded` with `chain` and returns the error message ("" and a failure if none).
inline std::string decode_error(const CodecChain& chain, ByteView encoded) {
  Bytes out(chain.spec().num_bytes());
  return error_of([&] { chain.decode(encoded, out.data()); });
}

}  // namespace zfeed::testing

// Shared helpers for zfeed's libFuzzer targets (fuzz/*_fuzz.cc). A zfeed::Error is the expected
// answer to bad input; anything else (a crash, a sanitizer report, another exception type, a
// hang, a huge allocation, a broken invariant checked below) is a finding.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "zfeed/codec/codec.h"
#include "zfeed/util/bytes.h"
#include "zfeed/util/error.h"
#include "zfeed/util/json.h"

namespace zfeed::fuzz {

// The most any target lets a decoder produce: more is a decompression bomb and must be an error.
inline constexpr uint64_t kMaxDecodedBytes = uint64_t{1} << 20;

// Runs `body`; a zfeed::Error is the expected outcome for bad input. Other exceptions propagate
// out of LLVMFuzzerTestOneInput, which libFuzzer reports as a crash ("uncaught exception").
template <typename Body>
bool expect_error_or_success(Body&& body) {
  try {
    body();
    return true;
  } catch (const zfeed::Error&) {
    return false;
  }
}

// The zfeed::Error message `body` throws, or "" when it succeeds.
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
    return {};
  } catch (const zfeed::Error& e) {
    return e.what()[0] ? e.what() : "(empty error message)";
  }
}

// A broken invariant: report it and abort so that libFuzzer saves the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "zfeed fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool condition, const std::string& what) {
  if (!condition) finding(what);
}

inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// A bytes->bytes codec built through the registry, as metadata would name it. The chain is
// [bytes, <codec>] over a 1-D uint8 chunk of `chunk_bytes` (the bytes codec only anchors it).
struct BytesCodecUnderTest {
  CodecChain chain;
  std::shared_ptr<const BytesToBytesCodec> codec;
};

inline BytesCodecUnderTest make_bytes_codec(const Json& codec_json, uint64_t chunk_bytes) {
  ChunkSpec spec{DataType{DataTypeId::kUInt8}, {chunk_bytes}, {}};
  Json codecs = Json::array({Json{{"name", "bytes"}}, codec_json});
  BytesCodecUnderTest out;
  out.chain = CodecChain::from_json(codecs, spec);
  out.codec = std::dynamic_pointer_cast<const BytesToBytesCodec>(out.chain.codecs().back());
  if (!out.codec) finding("codec " + codec_json.dump() + " is not a bytes->bytes codec");
  return out;
}

// The fuzz body shared by every bytes->bytes decoder target:
//  1. decode(data, bound) must return at most `bound` bytes or throw zfeed::Error (no bomb);
//  2. where it succeeds, decode_into an exact-size buffer must give the same bytes, and
//     decode_into a buffer one byte short must be an error;
//  3. where it succeeds, encode then decode must give the bytes back;
//  4. the whole chain decodes the input into a fixed-size chunk (the path reads take);
//  5. decode_prefix (where the codec can stop early) gives the first bytes of what decode gives,
//     fails for more than decode gives, and never writes past its buffer on any input.
inline void fuzz_bytes_codec(const BytesCodecUnderTest& under_test, const uint8_t* data,
                             size_t size) {
  const BytesToBytesCodec& codec = *under_test.codec;
  const std::string name = codec.name();
  ByteView input(data, size);

  Bytes decoded;
  bool ok = expect_error_or_success([&] { decoded = codec.decode(input, kMaxDecodedBytes); });
  if (ok) {
    check(decoded.size() <= kMaxDecodedBytes,
          name + ": decode returned " + std::to_string(decoded.size()) + " bytes, over the bound");
    Bytes exact(decoded.size());
    std::string into_error = error_of([&] { codec.decode_into(input, exact.mutable_view()); });
    check(into_error.empty(), name + ": decode gave " + std::to_string(decoded.size()) +
                                  " bytes but decode_into that size failed: " + into_error);
    check(same_bytes(exact.data(), decoded.data(), decoded.size()),
          name + ": decode and decode_into differ");
    if (decoded.size() > 0) {
      Bytes short_buffer(decoded.size() - 1);
      bool short_ok =
          expect_error_or_success([&] { codec.decode_into(input, short_buffer.mutable_view()); });
      check(!short_ok, name + ": decode_into a buffer one byte short succeeded");
    }
    Bytes reencoded = codec.encode(decoded);
    Bytes again;
    bool round_ok =
        expect_error_or_success([&] { again = codec.decode(reencoded, kMaxDecodedBytes); });
    check(round_ok, name + ": decoding its own encoding failed");
    check(
        again.size() == decoded.size() && same_bytes(again.data(), decoded.data(), decoded.size()),
        name + ": encode/decode round trip changed the bytes");
  }

  const uint64_t chunk_bytes = under_test.chain.spec().num_bytes();
  Bytes out(chunk_bytes);
  expect_error_or_success([&] { under_test.chain.decode(input, out.data()); });

  for (uint64_t want :
       {uint64_t{1}, uint64_t{4096}, decoded.size() / 2, decoded.size(), decoded.size() + 1}) {
    if (want > kMaxDecodedBytes) continue;
    Bytes prefix(want);
    bool supported = false;
    const bool prefix_ok = expect_error_or_success(
        [&] { supported = codec.decode_prefix(input, prefix.mutable_view()); });
    if (!ok || !prefix_ok || !supported) {
      check(!(ok && want <= decoded.size() && !prefix_ok),
            name + ": decode succeeded but decode_prefix of " + std::to_string(want) +
                " bytes failed");
      continue;
    }
    check(want <= decoded.size(), name + ": decode_prefix gave " + std::to_string(want) +
                                      " bytes of a stream that decodes to " +
                                      std::to_string(decoded.size()));
    check(same_bytes(prefix.data(), decoded.data(), want),
          name + ": decode_prefix differs from the start of decode");
  }
}

}  // namespace zfeed::fuzz

// zfeed's error type: every failure a user can cause (bad metadata, corrupt chunks, missing keys)
// is a zfeed::Error whose message names where it happened and what was wrong.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zfeed {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A feature zfeed does not implement (an unknown codec or data type).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// A key or node that does not exist.
class NotFoundError : public Error {
 public:
  using Error::Error;
};

// A wait given a stop check ended because the check said so (Ctrl-C in Python): nothing failed,
// and the call may be made again.
class InterruptedError : public Error {
 public:
  using Error::Error;
};

// A value whose size is not the one expected (a chunk too short or too long for its shape),
// with both sizes, so a caller that knows what the value is can say so.
class SizeMismatchError : public Error {
 public:
  SizeMismatchError(const std::string& message, uint64_t found_size, uint64_t expected_size)
      : Error(message), size(found_size), expected(expected_size) {}
  uint64_t size, expected;
};

// Rethrows the exception in flight with `context` ("store/key") put in front of its message,
// keeping its type. Use in a catch block.
[[noreturn]] void rethrow_with_context(std::string_view context);

}  // namespace zfeed

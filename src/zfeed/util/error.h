// zfeed's error type: every failure a user can cause (bad metadata, corrupt chunks, missing keys)
// is a zfeed::Error whose message names where it happened and what was wrong.
#pragma once

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

// Rethrows the exception in flight with `context` ("store/key") put in front of its message,
// keeping its type. Use in a catch block.
[[noreturn]] void rethrow_with_context(std::string_view context);

}  // namespace zfeed

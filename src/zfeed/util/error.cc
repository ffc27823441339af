#include "zfeed/util/error.h"

#include <exception>
#include <new>
#include <nlohmann/json.hpp>

namespace zfeed {

[[noreturn]] void rethrow_with_context(std::string_view context) {
  const std::string prefix = std::string(context) + ": ";
  try {
    throw;
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(prefix + e.what());
  } catch (const NotFoundError& e) {
    throw NotFoundError(prefix + e.what());
  } catch (const Error& e) {
    throw Error(prefix + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw Error(prefix + "malformed metadata (" + e.what() + ")");
  } catch (const std::bad_alloc&) {
    throw Error(prefix + "out of memory");
  }
}

}  // namespace zfeed

// Errors inside te-core: C++ code throws te::Error; every C entry point runs its body through
// te::guard(), which turns the exception into a status and the thread-local te_last_error() text.
// Exceptions never cross the C ABI.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "te/status.h"

namespace te {

class Error : public std::runtime_error {
 public:
  Error(te_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  te_status status() const { return status_; }

 private:
  te_status status_;
};

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(te_status status, Args&&... args) {
  throw Error(status, concat(std::forward<Args>(args)...));
}

// Records the message for te_last_error() on this thread.
void set_last_error(const std::string& message);

// Runs `body` (which may throw) and converts the outcome to a status for the C API.
template <typename F>
te_status guard(const char* function, F&& body) noexcept {
  try {
    body();
    return TE_SUCCESS;
  } catch (const Error& e) {
    set_last_error(concat(function, ": ", e.what()));
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(concat(function, ": internal error: ", e.what()));
    return TE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(concat(function, ": internal error: unknown exception"));
    return TE_ERROR_INTERNAL;
  }
}

}  // namespace te

#define TE_CHECK_ARG(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) ::te::fail(TE_ERROR_INVALID_ARGUMENT, __VA_ARGS__);             \
  } while (0)

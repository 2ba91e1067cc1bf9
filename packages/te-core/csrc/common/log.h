// te-core's logging (te/log.h): INFO messages, each kind at most once per process.
#pragma once

#include <string>

namespace te {

// Whether `key` is seen for the first time in this process (thread-safe; records it).
bool log_key_is_new(const std::string& key);

// Logs `message` at INFO: to the handler set by te_set_log_handler, else to stderr when
// TE_LOG_LEVEL allows.
void log_info(const std::string& message);

// Logs make_message() at INFO the first time `key` is seen; later calls do nothing. The message
// is built only then: the callers sit on per-call paths (a GEMM's fallback), where formatting a
// long message every call would cost more than the check.
template <typename MakeMessage>
void log_info_once(const std::string& key, MakeMessage&& make_message) {
  if (log_key_is_new(key)) log_info(make_message());
}

}  // namespace te

// te-core's logging (te/log.h): INFO messages, each kind at most once per process.
#pragma once

#include <string>

namespace te {

// Logs `message` at INFO the first time `key` is seen (thread-safe); later calls do nothing.
void log_info_once(const std::string& key, const std::string& message);

}  // namespace te

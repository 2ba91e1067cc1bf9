#include "common/error.h"

#include "te/status.h"

namespace {
thread_local std::string last_error;
}

namespace te {
void set_last_error(const std::string& message) { last_error = message; }
}  // namespace te

extern "C" {

const char* te_last_error(void) { return last_error.c_str(); }

const char* te_status_name(te_status status) {
  switch (status) {
    case TE_SUCCESS: return "TE_SUCCESS";
    case TE_ERROR_INVALID_ARGUMENT: return "TE_ERROR_INVALID_ARGUMENT";
    case TE_ERROR_UNSUPPORTED: return "TE_ERROR_UNSUPPORTED";
    case TE_ERROR_CUDA: return "TE_ERROR_CUDA";
    case TE_ERROR_INTERNAL: return "TE_ERROR_INTERNAL";
  }
  return "TE_ERROR_UNKNOWN";
}

int te_version(void) { return TE_VERSION; }

}  // extern "C"

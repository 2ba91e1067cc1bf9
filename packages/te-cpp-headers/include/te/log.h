/* te C API: where te-core's log messages go.
 *
 * te-core logs rarely: once per kind of event, at INFO, when it takes a slower path than the one
 * asked for (a fused GEMM epilogue cuBLASLt has no kernel for, a format without a native path on
 * this GPU). Nothing else is printed by the library.
 *
 * Default destination: stderr, for messages at or above the level named by the environment
 * variable TE_LOG_LEVEL ("debug", "info", "warning" (the default), "error"), read once. A handler
 * set here receives every message instead, whatever TE_LOG_LEVEL says (te_core's Python package
 * installs one that forwards to Python's `logging` under the logger "te"). */
#ifndef TE_LOG_H_
#define TE_LOG_H_

#include <stdint.h>

#include "te/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Python logging's numbers, so a forwarding handler can pass the level through. */
typedef enum te_log_level {
  TE_LOG_DEBUG = 10,
  TE_LOG_INFO = 20,
  TE_LOG_WARNING = 30,
  TE_LOG_ERROR = 40
} te_log_level;

/* Called on the thread that logs, possibly concurrently from several threads; `message` is valid
 * only during the call. Must not call back into te. */
typedef void (*te_log_handler)(int32_t level, const char* message, void* user_data);

/* Installs `handler` (NULL restores the default). Not synchronized with messages being logged on
 * other threads: install it once, at start-up. */
TE_API void te_set_log_handler(te_log_handler handler, void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* TE_LOG_H_ */

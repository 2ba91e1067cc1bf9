/* te C API: status codes and the thread-local error message.
 *
 * Every te entry point returns a te_status. On anything but TE_SUCCESS, te_last_error() returns a
 * message for the calling thread that names the argument, what was expected and what was given.
 * No entry point aborts the process or lets a C++ exception escape. */
#ifndef TE_STATUS_H_
#define TE_STATUS_H_

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TE_BUILDING_LIBRARY)
#define TE_API __attribute__((visibility("default")))
#else
#define TE_API
#endif

typedef enum te_status {
  TE_SUCCESS = 0,
  /* null pointer, wrong dtype, shape, device, alignment or scaling mode: the caller's mistake */
  TE_ERROR_INVALID_ARGUMENT = 1,
  /* a well-formed request this build or this device cannot run (no CUDA, unimplemented mode) */
  TE_ERROR_UNSUPPORTED = 2,
  /* a CUDA runtime call or kernel launch failed; the message carries CUDA's own text */
  TE_ERROR_CUDA = 3,
  TE_ERROR_INTERNAL = 4
} te_status;

/* The message of the last failed call on this thread ("" if none has failed). The pointer stays
 * valid until the next te call on this thread. */
TE_API const char* te_last_error(void);

/* A short fixed name for a status ("TE_ERROR_INVALID_ARGUMENT", ...). */
TE_API const char* te_status_name(te_status status);

/* te-core's version as major * 10000 + minor * 100 + patch, for checks at run time against the
 * TE_VERSION the caller compiled with. */
#define TE_VERSION 100
TE_API int te_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TE_STATUS_H_ */

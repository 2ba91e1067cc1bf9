// Opens cuBLASLt with dlopen and resolves the functions te uses (see cublaslt.h for the search
// order and why). Loaded once; the handle is never closed (the library lives as long as the
// process, as the frameworks' own copies do).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cublaslt.h"

namespace te {
namespace cuda {
namespace {

// The directory holding libte_core.so (empty if unknown).
std::string own_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_dir), &info) == 0 || info.dli_fname == nullptr) return {};
  std::string p = info.dli_fname;
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? std::string() : p.substr(0, slash);
}

struct Loaded {
  CublasLtApi api{};
  std::string path;
  std::string error;  // non-empty: loading failed with this message
};

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

Loaded load() {
  Loaded out;
  std::vector<std::string> tried;
  void* lib = nullptr;
  auto attempt = [&](const std::string& what, int flags) {
    if (lib != nullptr) return;
    dlerror();
    lib = dlopen(what.c_str(), flags);
    if (lib != nullptr) {
      out.path = what;
    } else {
      const char* e = dlerror();
      tried.push_back(what + ((flags & RTLD_NOLOAD) ? " (already loaded?)" : "") + ": " +
                      (e ? e : "not found"));
    }
  };
  if (const char* env = std::getenv("TE_CUBLASLT_PATH"); env != nullptr && env[0] != '\0') {
    attempt(env, RTLD_NOW | RTLD_LOCAL);
  }
  for (const char* soname : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
    attempt(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  }
  const std::string dir = own_dir();
  if (!dir.empty()) {
    // <site-packages>/te_core/lib/libte_core.so -> <site-packages>/nvidia/...
    attempt(dir + "/../../nvidia/cu13/lib/libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    attempt(dir + "/../../nvidia/cublas/lib/libcublasLt.so.12", RTLD_NOW | RTLD_LOCAL);
  }
  attempt("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
  attempt("libcublasLt.so.12", RTLD_NOW | RTLD_LOCAL);
  attempt("/usr/local/cuda/lib64/libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
  attempt("/usr/local/cuda/lib64/libcublasLt.so.12", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::string msg =
        "cuBLASLt (libcublasLt.so.13 or .so.12) was not found, so GEMMs on CUDA tensors cannot "
        "run. Install the nvidia-cublas wheel (pip install nvidia-cublas) or a CUDA toolkit, or "
        "set TE_CUBLASLT_PATH to a libcublasLt.so. Tried:";
    for (const auto& t : tried) msg += "\n  " + t;
    out.error = msg;
    return out;
  }
  CublasLtApi& a = out.api;
  std::string missing;
  resolve(lib, "cublasLtGetVersion", a.GetVersion, missing);
  resolve(lib, "cublasLtGetStatusString", a.GetStatusString, missing);
  resolve(lib, "cublasLtCreate", a.Create, missing);
  resolve(lib, "cublasLtMatmulDescCreate", a.MatmulDescCreate, missing);
  resolve(lib, "cublasLtMatmulDescDestroy", a.MatmulDescDestroy, missing);
  resolve(lib, "cublasLtMatmulDescSetAttribute", a.MatmulDescSetAttribute, missing);
  resolve(lib, "cublasLtMatrixLayoutCreate", a.MatrixLayoutCreate, missing);
  resolve(lib, "cublasLtMatrixLayoutDestroy", a.MatrixLayoutDestroy, missing);
  resolve(lib, "cublasLtMatmulPreferenceCreate", a.MatmulPreferenceCreate, missing);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", a.MatmulPreferenceDestroy, missing);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", a.MatmulPreferenceSetAttribute, missing);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", a.MatmulAlgoGetHeuristic, missing);
  resolve(lib, "cublasLtMatmulAlgoConfigGetAttribute", a.MatmulAlgoConfigGetAttribute, missing);
  resolve(lib, "cublasLtMatmul", a.Matmul, missing);
  if (!missing.empty()) {
    out.error = "cuBLASLt at " + out.path + " lacks " + missing + " (te needs cuBLAS 12 or newer)";
    return out;
  }
  a.version = a.GetVersion();
  if (a.version < 120000) {
    out.error = "cuBLASLt at " + out.path + " is version " + std::to_string(a.version) +
                "; te needs cuBLAS 12 or newer";
  }
  return out;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const Loaded loaded = [] {
    Loaded l = load();
    l.api.path = l.path;
    return l;
  }();
  if (!loaded.error.empty()) fail(TE_ERROR_UNSUPPORTED, loaded.error);
  return loaded.api;
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const char* name = nullptr;
  try {
    name = cublaslt().GetStatusString(s);
  } catch (...) {
  }
  fail(TE_ERROR_CUDA, what, ": ", name ? name : "cuBLAS error ", name ? "" : std::to_string(s));
}

}  // namespace cuda
}  // namespace te

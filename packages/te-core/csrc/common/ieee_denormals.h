// IEEE denormal handling for the CPU backend's calls (used by dispatch() in validate.h).
#pragma once

#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace te {

// Callers may run with denormals flushed: XLA's CPU runtime does (x86 MXCSR FTZ|DAZ, aarch64
// FPCR.FZ), and torch.set_flush_denormal(True) does. te's CPU backend is the bit-exact reference
// for the CUDA kernels and must see fp32 subnormals as IEEE says (amax of 1e-40 is 1e-40, not 0; a
// subnormal times a large scale is a normal number), so every CPU kernel call runs with IEEE
// denormals and restores the caller's mode on return.
class ScopedIeeeDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedIeeeDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~kFlushBits); }
  ~ScopedIeeeDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_;
#elif defined(__aarch64__)
  ScopedIeeeDenormals() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t ieee = saved_ & ~kFlushBits;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
  }
  ~ScopedIeeeDenormals() { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_)); }

 private:
  static constexpr uint64_t kFlushBits = (uint64_t{1} << 24) | (uint64_t{1} << 19);  // FZ | FZ16
  uint64_t saved_;
#endif
  ScopedIeeeDenormals(const ScopedIeeeDenormals&) = delete;
  ScopedIeeeDenormals& operator=(const ScopedIeeeDenormals&) = delete;
};

}  // namespace te

// Fp32Weights (norm_row.cuh): gamma / beta as the fp32 values the norm kernels use.
#include "cuda/norm_row.cuh"

namespace te {
namespace cuda {
namespace norm {
namespace {

__device__ __forceinline__ float load1(const void* p, int32_t dtype, int64_t i) {
  if (dtype == TE_DTYPE_FLOAT32) return static_cast<const float*>(p)[i];
  if (dtype == TE_DTYPE_FLOAT16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__global__ void __launch_bounds__(256)
    fp32_weights_kernel(const void* gamma, int32_t gamma_dtype, const void* beta, int32_t beta_dtype,
                        bool zero_centered, int64_t cols, WeightPieces pieces, float* gamma_out,
                        float* beta_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t c = i;  // the column copied to i
  if (pieces.x > 0) {
    if (i >= pieces.width) return;
    // 32-bit: a copy in pieces holds at most 512 threads x 8 chunks x 8 columns.
    const int n = static_cast<int>(i), piece = n / 4, jq = piece / pieces.x;
    c = ((jq / 2) * pieces.x + piece % pieces.x) * 8 + (jq % 2) * 4 + n % 4;
  } else if (i >= cols) {
    return;
  }
  const bool in = c < cols;  // padding of the pieces: 0, as the kernels' masked loads read it
  const float g = in ? load1(gamma, gamma_dtype, c) : 0.0f;
  gamma_out[i] = zero_centered && in ? __fadd_rn(1.0f, g) : g;
  if (beta_out != nullptr) beta_out[i] = beta == nullptr ? -0.0f : in ? load1(beta, beta_dtype, c) : 0.0f;
}

// 16-bit pieces (WeightPieces::dtype16): thread t's chunk j is one 16-byte piece at index j * X + t,
// i.e. columns 8 (j * X + t) .. + 7, so the pieces are the natural layout padded to the kernel's
// width: the source bits copied, 0 past the row, and -0 (0x8000 in bf16 and fp16 alike) for an
// absent beta (beta_out nullptr: no beta pieces, RMSNorm's).
__global__ void __launch_bounds__(256)
    pieces16_kernel(const uint16_t* gamma, const uint16_t* beta, int64_t cols, int64_t width,
                    uint16_t* gamma_out, uint16_t* beta_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  const bool in = i < cols;
  gamma_out[i] = in ? gamma[i] : 0;
  if (beta_out != nullptr) beta_out[i] = beta == nullptr ? 0x8000 : in ? beta[i] : 0;
}

// 16-bit pieces the caller's own arrays already are: aligned, beta there where the pieces hold
// one, no padding.
bool pieces16_as_is(const void* gamma, const void* beta, int64_t cols, WeightPieces pieces) {
  return aligned(gamma, 16) && (!pieces.beta || (beta != nullptr && aligned(beta, 16))) &&
         cols == pieces.width;
}

// gamma's length in the scratch, rounded up to 4 floats so beta after it starts 16-byte aligned.
int64_t padded(int64_t n) { return (n + 3) / 4 * 4; }

// 0 where the kernels read the caller's own arrays (usable_as_is: natural-layout fp32 ones).
size_t scratch_bytes(const void* gamma, const void* beta, int64_t cols, WeightPieces pieces, bool usable_as_is) {
  if (pieces.x > 0 && pieces.dtype16 != 0)
    return pieces16_as_is(gamma, beta, cols, pieces)
               ? 0
               : sizeof(uint16_t) * (pieces.beta ? 2 : 1) * static_cast<size_t>(pieces.width);
  if (usable_as_is) return 0;
  return sizeof(float) * static_cast<size_t>(padded(pieces.x > 0 ? pieces.width : cols)) *
         (beta != nullptr || (pieces.x > 0 && pieces.beta) ? 2 : 1);
}

}  // namespace

Fp32Weights::Fp32Weights(const void* gamma, int32_t gamma_dtype, const void* beta, int32_t beta_dtype,
                         bool zero_centered, int64_t cols, WeightPieces pieces, cudaStream_t stream)
    : scratch_(scratch_bytes(gamma, beta, cols, pieces,
                             pieces.x == 0 && !zero_centered && usable(gamma, gamma_dtype) &&
                                 (beta == nullptr || usable(beta, beta_dtype))),
               stream, "norm scratch"),
      gamma_(static_cast<const float*>(gamma)),
      beta_(static_cast<const float*>(beta)) {
  if (scratch_.as<float>() == nullptr) return;
  if (pieces.x > 0 && pieces.dtype16 != 0) {
    uint16_t* g = scratch_.as<uint16_t>();
    uint16_t* b = g + pieces.width;  // width is a multiple of 8: 16-byte aligned
    const int64_t blocks = ceil_div(pieces.width, 256);
    pieces16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<const uint16_t*>(gamma), static_cast<const uint16_t*>(beta), cols, pieces.width, g,
        pieces.beta ? b : nullptr);
    check_launch("pieces16_kernel");
    gamma_ = reinterpret_cast<const float*>(g);
    beta_ = pieces.beta ? reinterpret_cast<const float*>(b) : nullptr;
    return;
  }
  const int64_t n = pieces.x > 0 ? pieces.width : cols;
  float* g = scratch_.as<float>();
  // 16-byte aligned, as the kernels load it.
  float* b = beta != nullptr || (pieces.x > 0 && pieces.beta) ? g + padded(n) : nullptr;
  const int64_t blocks = ceil_div(n, 256);
  if (blocks > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "fp32_weights_kernel: H too large");
  fp32_weights_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      gamma, gamma_dtype, beta, beta_dtype, zero_centered, cols, pieces, g, b);
  check_launch("fp32_weights_kernel");
  gamma_ = g;
  beta_ = b;
}

}  // namespace norm
}  // namespace cuda
}  // namespace te

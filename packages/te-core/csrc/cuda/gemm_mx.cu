// te_gemm with MXFP8 / NVFP4 operands on CUDA: block dequantization, then the BF16 GEMM.
//
// Contract (te/gemm.h): the API hands each operand's copy with K contiguous (A [M, K], B [N, K])
// with its byte scales and, for NVFP4, its global amax. Each is dequantized by dequantize_mx.cu
// into BF16 scratch from te's stream-ordered pool (cuda/scratch.cuh, so nothing
// synchronizes), exactly the values the CPU reference multiplies (cpu/gemm.cpp rounds each
// dequantized element to BF16 too), and te::cuda::gemm runs the BF16 x BF16 product with fp32
// accumulation and the requested epilogue through cuBLASLt. NVFP4 copies carrying the Hadamard
// transform are multiplied as stored (the API requires it on both operands or neither).
//
// Not fast: two extra passes over the operands and a BF16 GEMM at half the FP8 rate, logged once
// at INFO. Blackwell (compute capability 10.x) has native kernels for both formats (cuBLASLt
// scale modes CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 and VEC16_UE4M3, with alpha carrying
// NVFP4's two global scales); te does not use them yet: they need the scale tables swizzled into
// cuBLASLt's 128x4-tile order (te's tables are padded to whole tiles for this, te/tensor.h) and
// cannot be verified on the Hopper test machine, so every GPU takes this path for now.
#include <string>

#include "common/kernels_mx.h"
#include "common/log.h"
#include "common/validate.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/scratch.cuh"

namespace te {
namespace cuda {
namespace {


// Dequantizes operand `op`, stored [rows, k], into BF16 `out`.
void to_bf16(const GemmOperand& op, int64_t rows, int64_t k, void* out, cudaStream_t stream) {
  MxDequantizeArgs d{};
  d.scaling_mode = op.scaling_mode;
  d.data = static_cast<const uint8_t*>(op.data);
  d.data_dtype = op.dtype;
  d.transposed = false;
  d.scale_inv = op.mx_scale_inv;
  d.scale_ld = op.scale_ld;
  d.global_amax = op.global_amax;
  d.undo_rht = false;
  d.rows = rows;
  d.cols = k;
  d.output = out;
  d.out_dtype = TE_DTYPE_BFLOAT16;
  dequantize_mx(d, stream);
}

GemmOperand bf16_operand(void* data, bool trans) {
  GemmOperand o{};
  o.data = data;
  o.dtype = TE_DTYPE_BFLOAT16;
  o.scaling_mode = TE_SCALING_PER_TENSOR;
  o.trans = trans;
  return o;
}

}  // namespace

void gemm_mx(const GemmArgs& g, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
  const std::string mode = scaling_mode_name(g.a.scaling_mode);
  log_info_once(concat("gemm-mx ", mode, " ", major, ".", minor), [&] {
    return concat("te_gemm: ", mode, " operands on compute capability ", major, ".", minor,
                  " run by block dequantization to BF16 and a BF16 cuBLASLt GEMM: the same "
                  "numbers as te's CPU reference, but not fast (two extra passes over the "
                  "operands, BF16 tensor-core rate). Logged once per format and GPU.");
  });
  const size_t a_bytes = static_cast<size_t>(g.m) * static_cast<size_t>(g.k) * 2;
  const size_t b_bytes = static_cast<size_t>(g.n) * static_cast<size_t>(g.k) * 2;
  Scratch a(a_bytes, stream, "te scratch (te_gemm: BF16 copy of A)");
  Scratch b(b_bytes, stream, "te scratch (te_gemm: BF16 copy of B)");
  if (a_bytes > 0) to_bf16(g.a, g.m, g.k, a.as<void>(), stream);
  if (b_bytes > 0) to_bf16(g.b, g.n, g.k, b.as<void>(), stream);
  GemmArgs h = g;
  h.a = bf16_operand(a.as<void>(), false);  // [M, K]
  h.b = bf16_operand(b.as<void>(), true);   // [N, K]
  gemm(h, stream);
}

}  // namespace cuda
}  // namespace te

// The reference GEMM: D[M, N] = alpha op(A) op(B) + beta D, then the epilogue (te/gemm.h).
//
// 1. Dequantize each operand to fp32 while packing it: op(A) as Ap [M, K] and op(B) as Bp [K, N].
//    An element is float(q) * scale_inv (one fp32 multiply), or the high-precision value itself;
//    MXFP8/NVFP4 elements are block-dequantized and rounded to BF16 (te/gemm.h).
// 2. Accumulate in fp32: acc[i, j] = sum over k of Ap[i, k] * Bp[k, j], each output's sum in
//    increasing k with one fp32 accumulator. The i-k-j loop (blocked over j and k so a panel of
//    Bp stays in cache) keeps that order while vectorizing across j.
// 3. v = alpha * acc + beta * D_old (D_old read in D's dtype, and not read at all when beta = 0,
//    as BLAS does), then the epilogue in fp32, then the output conversion: fp32/fp16/bf16 by RNE;
//    FP8 as amax = max(amax, max |v|) (NaN propagates), q = convert(v * scale),
//    scale_inv = 1 / scale.
//
// Block scales. The API hands over the copy with K contiguous and the te/tensor.h layout of that
// copy. Written in the coordinates (sr, sc) of the *stored* data, both copies' layouts are the
// same formula: 1-D scale_inv[(sc / 128) * ld + sr] (1x128 blocks along the stored rows: the
// column-wise copy's blocks are the source's 128x1 blocks), 2-D scale_inv[(sr / 128) * ld +
// sc / 128] (the column-wise table is the row-wise one transposed). So the kernel need not know
// which copy it reads.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "common/scaling.h"
#include "cpu/fp_convert.h"
#include "cpu/mx_convert.h"
#include "te/gemm.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kBlock = 128;  // Float8BlockScaling
constexpr int64_t kTileJ = 512;  // output columns per panel: a 2 KiB row segment of acc
constexpr int64_t kTileK = 128;  // rows of Bp per panel: 128 x 512 fp32 = 256 KiB

bool is_fp8(int32_t dtype) {
  return dtype == TE_DTYPE_FLOAT8_E4M3 || dtype == TE_DTYPE_FLOAT8_E5M2;
}

// Element (sr, sc) of an operand stored [rows, cols], as fp32. MXFP8/NVFP4 elements are the
// block-dequantized value rounded to BF16, the operands te's emulated block-scaled GEMM feeds to
// the BF16 product on every backend.
float element(const GemmOperand& op, const MxCopy& mx, int64_t cols, int64_t sr, int64_t sc) {
  const int64_t i = sr * cols + sc;
  if (op.scaling_mode == TE_SCALING_MXFP8_1D || op.scaling_mode == TE_SCALING_NVFP4_1D) {
    return bf16_to_float(float_to_bf16(mx.at(sr, sc)));
  }
  if (!is_fp8(op.dtype)) return load_as_float(op.data, op.dtype, i);
  float scale_inv;
  switch (op.scaling_mode) {
    case TE_SCALING_BLOCK_1D: scale_inv = op.scale_inv[(sc / kBlock) * op.scale_ld + sr]; break;
    case TE_SCALING_BLOCK_2D:
      scale_inv = op.scale_inv[(sr / kBlock) * op.scale_ld + sc / kBlock];
      break;
    default: scale_inv = op.scale_inv[0];
  }
  return fp8_to_float(static_cast<const uint8_t*>(op.data)[i], op.dtype) * scale_inv;
}

// Packs op(X) [rows_out, cols_out] row-major into `out`. The operand is stored [rows_out,
// cols_out], or [cols_out, rows_out] if `trans`. Walks the stored data in order.
void pack(const GemmOperand& op, bool trans, int64_t rows_out, int64_t cols_out, float* out) {
  const int64_t stored_rows = trans ? cols_out : rows_out;
  const int64_t stored_cols = trans ? rows_out : cols_out;
  const bool nvfp4 = op.scaling_mode == TE_SCALING_NVFP4_1D;
  const MxCopy mx{op.scaling_mode, static_cast<const uint8_t*>(op.data), op.dtype,
                  op.mx_scale_inv, op.scale_ld, stored_cols,
                  nvfp4 ? nvfp4_decode_scale(*op.global_amax) : 0.0f};
  for (int64_t sr = 0; sr < stored_rows; ++sr) {
    for (int64_t sc = 0; sc < stored_cols; ++sc) {
      const float v = element(op, mx, stored_cols, sr, sc);
      if (trans) {
        out[sc * cols_out + sr] = v;
      } else {
        out[sr * cols_out + sc] = v;
      }
    }
  }
}

// gelu and its derivative, the tanh approximation, in fp32.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

float gelu(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  return 0.5f * x * (1.0f + t);
}

float dgelu(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  const float dt = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x) * (1.0f - t * t);
  return 0.5f * (1.0f + t) + 0.5f * x * dt;
}

}  // namespace

void gemm(const GemmArgs& args, void* /*stream*/) {
  const int64_t m = args.m, n = args.n, k = args.k;
  std::vector<float> ap(static_cast<size_t>(m * k));
  std::vector<float> bp(static_cast<size_t>(k * n));
  // op(A) [M, K]; op(B) [K, N]. A's `trans` means stored [K, M]; B's means stored [N, K].
  pack(args.a, args.a.trans, m, k, ap.data());
  pack(args.b, args.b.trans, k, n, bp.data());

  std::vector<float> acc(static_cast<size_t>(m * n), 0.0f);
  for (int64_t j0 = 0; j0 < n; j0 += kTileJ) {
    const int64_t j1 = j0 + kTileJ < n ? j0 + kTileJ : n;
    for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
      const int64_t k1 = k0 + kTileK < k ? k0 + kTileK : k;
      for (int64_t i = 0; i < m; ++i) {
        float* out = acc.data() + i * n;
        const float* arow = ap.data() + i * k;
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float av = arow[kk];
          const float* brow = bp.data() + kk * n;
          for (int64_t j = j0; j < j1; ++j) out[j] += av * brow[j];
        }
      }
    }
  }

  const bool fp8_out = is_fp8(args.d_dtype);
  const float scale = fp8_out ? *args.d_scale : 1.0f;
  float amax = 0.0f;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t idx = i * n + j;
      float v = args.alpha * acc[idx];
      // beta = 0 never reads D (an FP8 output always has beta = 0), so garbage there is harmless.
      if (args.beta != 0.0f) v += args.beta * load_as_float(args.d, args.d_dtype, idx);
      if (args.bias != nullptr) v += load_as_float(args.bias, args.bias_dtype, j);
      if (args.epilogue == TE_EPILOGUE_GELU_AUX) {
        store_from_float(args.aux, args.aux_dtype, idx, v);
        v = gelu(v);
      } else if (args.epilogue == TE_EPILOGUE_DGELU) {
        v *= dgelu(load_as_float(args.aux, args.aux_dtype, idx));
      }
      if (fp8_out) {
        amax = nan_max(amax, std::fabs(v));
        static_cast<uint8_t*>(args.d)[idx] = float_to_fp8(v * scale, args.d_dtype);
      } else {
        store_from_float(args.d, args.d_dtype, idx, v);
      }
    }
  }
  if (fp8_out) {
    if (args.d_amax != nullptr) *args.d_amax = nan_max(*args.d_amax, amax);
    if (args.d_scale_inv != nullptr) *args.d_scale_inv = 1.0f / scale;
  }

  if (args.epilogue == TE_EPILOGUE_BGRAD) {
    // Row sums of the dequantized op(A), in k order.
    for (int64_t i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) s += ap[i * k + kk];
      store_from_float(args.bias_grad, args.bias_grad_dtype, i, s);
    }
  }
}

}  // namespace cpu
}  // namespace te

// Per-tensor FP8 quantization, delayed or current scaling (NUMERICS.md), with the optional fused
// transpose. q = convert(float(x) * scale), one fp32 multiply then a saturating round to nearest
// even; each present scale_inv gets 1 / scale.
//
// Delayed: *scale is read; *amax, if present, becomes max(*amax, amax(x)) with NaN propagating,
// so every quantization of a step lands in the same history slot.
// Current: amax(x) is written to *amax (or *amax is read, with use_existing_amax), the scale comes
// from compute_scale_from_amax and is written to *scale if present.
#include <cstdint>

#include "common/kernels.h"
#include "common/scaling.h"
#include "cpu/fp_convert.h"

namespace te {
namespace cpu {
namespace {

// Both copies are written from the same q in one pass over tiles, so the transposed writes stay
// within a few cache lines.
constexpr int64_t kTile = 32;

}  // namespace

void quantize_per_tensor(const PerTensorQuantizeArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  float scale;
  if (args.current) {
    if (!args.use_existing_amax) amax(args.input, args.in_dtype, rows * cols, args.amax, nullptr);
    scale = compute_scale_from_amax(*args.amax, fp8_max(args.out_dtype), args.force_pow2_scales,
                                    args.amax_epsilon);
    if (args.scale) *args.scale = scale;
  } else {
    scale = *args.scale;
    if (args.amax) {
      float tensor_amax;
      amax(args.input, args.in_dtype, rows * cols, &tensor_amax, nullptr);
      *args.amax = nan_max(*args.amax, tensor_amax);
    }
  }

  auto* rowwise = static_cast<uint8_t*>(args.rowwise);
  auto* columnwise = static_cast<uint8_t*>(args.columnwise);
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = c0 + kTile < cols ? c0 + kTile : cols;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t q =
              float_to_fp8(load_as_float(args.input, args.in_dtype, r * cols + c) * scale,
                           args.out_dtype);
          if (rowwise) rowwise[r * cols + c] = q;
          if (columnwise) columnwise[c * rows + r] = q;
        }
      }
    }
  }

  const float scale_inv = 1.0f / scale;
  if (args.rowwise_scale_inv) *args.rowwise_scale_inv = scale_inv;
  if (args.columnwise_scale_inv) *args.columnwise_scale_inv = scale_inv;
}

}  // namespace cpu
}  // namespace te

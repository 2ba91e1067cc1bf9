// MXFP8 / NVFP4 dequantization, the reference: out[r][c] = round(value) with the value of
// cpu/mx_convert.h's MxCopy (MXFP8 float(q) * 2^(e-127), NVFP4 (q * s_block) * s_global in fp32).
// From the column-wise copy [cols, rows] the output is transposed back; one carrying the Hadamard
// transform (undo_rht) is put through rht_inverse in runs of 16 along its stored rows first.
#include <cstdint>

#include "common/kernels_mx.h"
#include "common/mx_scaling.h"
#include "cpu/fp_convert.h"
#include "cpu/mx_convert.h"

namespace te {
namespace cpu {

void dequantize_mx(const MxDequantizeArgs& a, void* /*stream*/) {
  const int64_t R = a.transposed ? a.cols : a.rows;  // the stored copy's shape
  const int64_t C = a.transposed ? a.rows : a.cols;
  const MxCopy copy{a.scaling_mode, a.data, a.data_dtype, a.scale_inv, a.scale_ld, C,
                    a.scaling_mode == TE_SCALING_NVFP4_1D ? nvfp4_decode_scale(*a.global_amax)
                                                          : 0.0f};
  // Stored (i, j) is output (i, j), or output (j, i) for the column-wise copy.
  auto store = [&](int64_t i, int64_t j, float v) {
    store_from_float(a.output, a.out_dtype, a.transposed ? j * a.cols + i : i * a.cols + j, v);
  };
  for (int64_t i = 0; i < R; ++i) {
    if (a.undo_rht) {
      for (int64_t j0 = 0; j0 < C; j0 += 16) {
        float v[16];
        for (int k = 0; k < 16; ++k) v[k] = copy.at(i, j0 + k);
        rht_inverse(v);
        for (int k = 0; k < 16; ++k) store(i, j0 + k, v[k]);
      }
    } else {
      for (int64_t j = 0; j < C; ++j) store(i, j, copy.at(i, j));
    }
  }
}

}  // namespace cpu
}  // namespace te

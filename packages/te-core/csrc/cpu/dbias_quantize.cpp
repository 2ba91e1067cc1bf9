// Bias gradient fused with the gradient's quantization: dbias = column sums of the input in fp32
// (rows in index order), and the quantization is the reference quantize kernel itself on the
// input, so the FP8 bytes equal te_quantize's.
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "cpu/fp_convert.h"
#include "cpu/fused_output.h"

namespace te {
namespace cpu {

void dbias_quantize(const DbiasQuantizeArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  std::vector<float> sum(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sum[c] += load_as_float(args.input, args.in_dtype, r * cols + c);
  for (int64_t c = 0; c < cols; ++c) store_from_float(args.dbias, args.dbias_dtype, c, sum[c]);
  if (args.out.kind == kFusedPerTensor) {
    quantize_per_tensor(args.out.per_tensor, nullptr);
  } else {
    quantize_block(args.out.block, nullptr);
  }
}

}  // namespace cpu
}  // namespace te

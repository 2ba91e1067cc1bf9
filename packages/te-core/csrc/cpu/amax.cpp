// amax = max |x| over a fp32/fp16/bf16 buffer; NaN anywhere makes it NaN (so a corrupted step never
// silently moves a scale), and an empty buffer gives 0.
#include <cmath>

#include "common/kernels.h"
#include "common/scaling.h"
#include "cpu/fp_convert.h"

namespace te {
namespace cpu {

void amax(const void* input, int32_t in_dtype, int64_t numel, float* amax, void* /*stream*/) {
  float m = 0.0f;
  for (int64_t i = 0; i < numel; ++i) m = nan_max(m, std::fabs(load_as_float(input, in_dtype, i)));
  *amax = m;
}

}  // namespace cpu
}  // namespace te

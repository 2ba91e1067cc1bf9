// The C API's MXFP8 / NVFP4 paths (te/tensor.h, te/quantize.h): validation of a quantize
// destination and of a dequantize source, and the kernel arguments they produce.
#pragma once

#include <cstdint>
#include <string>

#include "common/kernels_mx.h"
#include "te/quantize.h"

namespace te {

struct MxQuantizePlan {
  bool nvfp4;
  Mxfp8QuantizeArgs mxfp8;
  Nvfp4QuantizeArgs nvfp4_args;
};

// te_quantize into an MXFP8_1D / NVFP4_1D `output` (named "output", config "config").
MxQuantizePlan plan_quantize_mx(const te_tensor& source, te_quantized_tensor* output,
                                const te_quant_config* config);

// te_dequantize of an MXFP8_1D / NVFP4_1D `input` (named "input") into `output`, whose
// descriptor, dtype and struct size the caller has checked.
void dequantize_mx_tensor(const te_quantized_tensor& input, te_tensor* output, void* stream);

// Checks an E2M1 copy stored [rows, cols]: each stored row must start on a byte.
void check_e2m1_rows(const std::string& name, int64_t stored_cols, const char* dim);

}  // namespace te

/* Quantizes a small matrix to FP8 E4M3 on the CPU with current scaling and checks the result
 * against values worked out by hand; then checks that bad input gives an error, not a crash.
 * Prints "te quantize_app: ok" and exits 0 on success. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "te/te.h"

static te_tensor cpu_tensor(void* data, int32_t dtype, int32_t ndim, const int64_t* shape) {
  te_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  for (int32_t i = 0; i < ndim; ++i) t.shape[i] = shape[i];
  t.device.type = TE_DEVICE_CPU;
  return t;
}

static int fail(const char* what) {
  printf("te quantize_app: FAILED: %s (te_last_error: %s)\n", what, te_last_error());
  return 1;
}

int main(void) {
  /* 2x3 input; amax 3.5, so scale = 448 / 3.5 = 128 exactly and every value is representable. */
  float x[6] = {1.0f, -2.0f, 0.5f, 3.5f, 0.0f, -0.25f};
  unsigned char q[6], qt[6];
  float amax = -1.0f, scale = -1.0f, scale_inv = -1.0f, scale_inv_t = -1.0f;
  const int64_t shape[2] = {2, 3}, shape_t[2] = {3, 2}, one[1] = {1};

  if (te_version() != TE_VERSION) return fail("te_version() differs from the header's TE_VERSION");
  te_tensor input = cpu_tensor(x, TE_DTYPE_FLOAT32, 2, shape);
  te_quantized_tensor out = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
  out.rowwise_data = cpu_tensor(q, TE_DTYPE_FLOAT8_E4M3, 2, shape);
  out.rowwise_scale_inv = cpu_tensor(&scale_inv, TE_DTYPE_FLOAT32, 1, one);
  out.columnwise_data = cpu_tensor(qt, TE_DTYPE_FLOAT8_E4M3, 2, shape_t);
  out.columnwise_scale_inv = cpu_tensor(&scale_inv_t, TE_DTYPE_FLOAT32, 1, one);
  out.amax = cpu_tensor(&amax, TE_DTYPE_FLOAT32, 1, one);
  out.scale = cpu_tensor(&scale, TE_DTYPE_FLOAT32, 1, one);
  te_quant_config config = te_quant_config_init();
  config.compute_scale = 1;
  if (te_quantize(&input, &out, &config, NULL) != TE_SUCCESS) return fail("te_quantize");

  /* E4M3 (bias 7) bytes of x * 128: 2^7 -> 0x70; -2^8 -> 0xF8; 2^6 -> 0x68; 448 = 1.75 * 2^8 ->
   * 0x7E; 0 -> 0x00; -2^5 -> 0xE0 */
  const unsigned char expected[6] = {0x70, 0xF8, 0x68, 0x7E, 0x00, 0xE0};
  if (amax != 3.5f || scale != 128.0f) return fail("amax/scale");
  if (scale_inv != 1.0f / 128.0f || scale_inv_t != scale_inv) return fail("scale_inv");
  for (int i = 0; i < 6; ++i) {
    if (q[i] != expected[i]) return fail("row-wise data");
  }
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      if (qt[c * 2 + r] != expected[r * 3 + c]) return fail("column-wise (transposed) data");
    }
  }
  float back[6];
  te_tensor dq = cpu_tensor(back, TE_DTYPE_FLOAT32, 2, shape);
  if (te_dequantize(&out, &dq, NULL) != TE_SUCCESS) return fail("te_dequantize");
  for (int i = 0; i < 6; ++i) {
    if (back[i] != x[i]) return fail("dequantized values");
  }

  /* Errors: a NULL input and a wrong data shape are reported, never a crash. */
  if (te_quantize(NULL, &out, &config, NULL) != TE_ERROR_INVALID_ARGUMENT ||
      strstr(te_last_error(), "input") == NULL) {
    return fail("NULL input not reported");
  }
  out.rowwise_data.shape[1] = 4;
  if (te_quantize(&input, &out, &config, NULL) != TE_ERROR_INVALID_ARGUMENT ||
      strstr(te_last_error(), "output->rowwise_data.shape") == NULL) {
    return fail("wrong row-wise shape not reported");
  }
  printf("te quantize_app: ok\n");
  return 0;
}

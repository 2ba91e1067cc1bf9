/* te C API: data types, scaling modes, and the tensor descriptors every entry point takes.
 *
 * Forward compatibility. te_tensor is a frozen plain struct: a dense row-major buffer is fully
 * described by pointer, dtype, shape and device, and it is embedded by value in the structs below,
 * so it never grows. The structs that will grow (te_quantized_tensor, te_quant_config) begin with
 * `struct_size`, which the caller sets to sizeof() of the struct it was compiled with (the *_init()
 * helpers do this). te-core reads only the fields that size covers and gives later fields their
 * defaults, so a program built against an older header keeps working with a newer library, and a
 * newer program gets a clear error from an older library instead of reading past the struct.
 * Plain structs rather than opaque handles: descriptors live on the caller's stack or in a cache,
 * and an op call allocates nothing and makes no extra calls to fill a handle. */
#ifndef TE_TENSOR_H_
#define TE_TENSOR_H_

#include <stddef.h>
#include <stdint.h>

#include "te/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TE_MAX_DIMS 8

/* Element types. Fields holding one are int32_t, so the struct layout does not depend on how a
 * compiler sizes enums. */
typedef enum te_dtype {
  TE_DTYPE_FLOAT32 = 0,
  TE_DTYPE_FLOAT16 = 1,
  TE_DTYPE_BFLOAT16 = 2,
  TE_DTYPE_FLOAT8_E4M3 = 3, /* OCP E4M3 "fn": no inf, max 448 */
  TE_DTYPE_FLOAT8_E5M2 = 4, /* OCP E5M2: inf and NaN, max 57344 */
  TE_DTYPE_FLOAT4_E2M1 = 5, /* two per byte, first element in the low nibble */
  TE_DTYPE_FLOAT8_E8M0 = 6, /* scale: byte e means 2^(e-127), 0xFF is NaN */
  TE_DTYPE_INT32 = 7,
  TE_DTYPE_INT64 = 8,
  TE_DTYPE_UINT8 = 9
} te_dtype;

typedef enum te_scaling_mode {
  TE_SCALING_PER_TENSOR = 0, /* one fp32 scale for the whole tensor (delayed or current scaling) */
  TE_SCALING_BLOCK_1D = 1,   /* Float8BlockScaling 1x128 along rows, fp32 scales */
  TE_SCALING_BLOCK_2D = 2,   /* Float8BlockScaling 128x128 tiles, fp32 scales */
  TE_SCALING_MXFP8_1D = 3,   /* OCP MXFP8: 1x32 blocks, E8M0 scales */
  TE_SCALING_NVFP4_1D = 4    /* NVFP4: 1x16 blocks, E4M3 scales + fp32 global scale */
} te_scaling_mode;

typedef enum te_device_type { TE_DEVICE_CPU = 0, TE_DEVICE_CUDA = 1 } te_device_type;

typedef struct te_device {
  int32_t type;  /* te_device_type */
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} te_device;

/* A dense, row-major (C-contiguous) buffer. `shape` counts logical elements (for E2M1, elements,
 * not bytes). `data` must be aligned to the element size; te reads it with wider loads only where
 * the address allows. Where an argument is optional, a zeroed descriptor (data == NULL, ndim 0)
 * means "absent". Zero-size tensors (a 0 in the shape) are allowed with any data pointer, NULL
 * included: an op on them writes no elements. */
typedef struct te_tensor {
  void* data;
  int64_t shape[TE_MAX_DIMS];
  int32_t ndim;  /* 0..TE_MAX_DIMS; 0 is a scalar with one element */
  int32_t dtype; /* te_dtype */
  te_device device;
} te_tensor;

/* A quantized tensor: up to two copies of the data, each with its decode scales.
 * For an input of logical shape [..., K] viewed as a matrix of M = numel / K rows and K columns:
 *
 *   mode         rowwise_data  rowwise_scale_inv                  columnwise_data  columnwise_scale_inv
 *   PER_TENSOR   [..., K]      fp32 [1]                           [K, M]           fp32 [1]
 *   BLOCK_1D     [..., K]      fp32 [ceil(K/128), roundup(M,4)]   [K, M]           fp32 [ceil(M/128), roundup(K,4)]
 *   BLOCK_2D     [..., K]      fp32 [ceil(M/128), roundup(ceil(K/128),4)]   [K, M]  fp32 [ceil(K/128), roundup(ceil(M/128),4)]
 *   MXFP8_1D     [..., K]      E8M0 [roundup(M,128), roundup(ceil(K/32),4)]   [K, M]  E8M0 [roundup(K,128), roundup(ceil(M/32),4)]
 *   NVFP4_1D     [..., K] E2M1 E4M3 [roundup(M,128), roundup(ceil(K/16),4)]   [K, M] E2M1  E4M3 [roundup(K,128), roundup(ceil(M/16),4)]
 *
 * Column-wise data is the transposed copy a GEMM needs for the transposed use of the operand
 * (Hopper's FP8 GEMM takes only the TN layout). Block scales of BLOCK_1D/2D are stored transposed,
 * with the leading dimension padded to a multiple of 4 (16 bytes): the layout cuBLASLt's
 * block-scaled GEMM reads. te never writes the padding. te_quantized_shape() computes every shape
 * above.
 *
 * MXFP8_1D and NVFP4_1D (NUMERICS.md "MXFP8BlockScaling", "NVFP4BlockScaling"). Data is FP8
 * (E4M3/E5M2) for MXFP8 and E2M1 for NVFP4; each copy has one scale per block of 32 (MXFP8) or 16
 * (NVFP4) consecutive elements along its own rows, so the column-wise copy [K, M] is the row-wise
 * layout of a separate quantization of the source's transpose (its blocks are the source's 32x1 /
 * 16x1 columns). Scales are one byte each (E8M0: 2^(e-127), 0xFF NaN; NVFP4: E4M3), row-major,
 * NOT transposed: the scale of stored element (r, c) is scale_inv[r * ld + c / block], ld =
 * scale_inv.shape[1]. The table is padded to a multiple of 128 rows and 4 columns, the tile of
 * the scale layout Blackwell's block-scaled GEMM reads (cuBLASLt swizzles 128x4 tiles, so a
 * padded table converts to it by a permutation into a buffer of the same size); te never writes
 * the padding and never reads it.
 * E2M1 data packs two elements per byte, the first in the low nibble, over the copy's row-major
 * element order; a stored row must hold an even number of elements (K even for the row-wise copy,
 * M even for the column-wise one) so that every row starts on a byte. An E2M1 buffer of shape
 * [..., K] is numel / 2 bytes.
 * NVFP4 has a second, global scale per copy: `amax` is fp32 [2], the global amax each copy was
 * encoded with (amax[0] row-wise, amax[1] column-wise; they differ only when the column-wise copy
 * carries the Hadamard transform, whose amax is taken after it). The decode scale is derived:
 * S_enc = 2688 / amax (448 * 6; amax 0 or inf -> 1, +inf result -> FLT_MAX, NaN stays NaN),
 * s_global = 1 / S_enc, x ~ q * s_block * s_global. `scale` is unused (NULL) for NVFP4.
 *
 * `amax` and `scale` are fp32 [1] in PER_TENSOR mode, absent (data == NULL) in the block modes
 * and MXFP8_1D, and as above for NVFP4_1D. Either copy may be absent (data == NULL); a quantize
 * call writes the copies that are present.
 *
 * Versions: `columnwise_rht` was appended after te-core 0.1.0; a caller compiled against the 0.1.0
 * header (struct_size without it) gets 0. */
typedef struct te_quantized_tensor {
  uint32_t struct_size; /* sizeof(te_quantized_tensor) as compiled by the caller */
  int32_t scaling_mode; /* te_scaling_mode */
  te_tensor rowwise_data;
  te_tensor rowwise_scale_inv;
  te_tensor columnwise_data;
  te_tensor columnwise_scale_inv;
  te_tensor amax;
  te_tensor scale;
  /* NVFP4_1D only: 1 when the column-wise copy holds the random Hadamard transform of the source
   * along M (each run of 16 consecutive elements of a stored row multiplied by
   * (1/4) diag(s) H16, NUMERICS.md), 0 when it holds the source itself. It describes the data, so
   * it is read by every op that touches the copy: te_quantize applies the transform (M a multiple
   * of 16), te_dequantize undoes it, te_gemm requires it on both operands of a contraction or on
   * neither (the transforms cancel in the product only in pairs). */
  int32_t columnwise_rht;
} te_quantized_tensor;

typedef enum te_quantized_part {
  TE_PART_ROWWISE_DATA = 0,
  TE_PART_ROWWISE_SCALE_INV = 1,
  TE_PART_COLUMNWISE_DATA = 2,
  TE_PART_COLUMNWISE_SCALE_INV = 3
} te_quantized_part;

static inline te_quantized_tensor te_quantized_tensor_init(int32_t scaling_mode) {
  te_quantized_tensor t;
  unsigned char* p = (unsigned char*)&t;
  for (size_t i = 0; i < sizeof(t); ++i) p[i] = 0;
  t.struct_size = (uint32_t)sizeof(te_quantized_tensor);
  t.scaling_mode = scaling_mode;
  return t;
}

/* The shape of one part of a quantized tensor whose high-precision source has shape
 * shape[0..ndim). Writes out_shape[0..*out_ndim). Fails for an unknown mode or part. */
TE_API te_status te_quantized_shape(int32_t scaling_mode, int32_t part, const int64_t* shape,
                                    int32_t ndim, int64_t* out_shape, int32_t* out_ndim);

/* Bits per element of a dtype: 32, 16, 8, or 4 for E2M1. */
TE_API te_status te_dtype_bits(int32_t dtype, int32_t* bits);

#ifdef __cplusplus
}
#endif

#endif /* TE_TENSOR_H_ */

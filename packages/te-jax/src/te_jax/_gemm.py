"""gemm: te_gemm (te/gemm.h) over te-core's XLA FFI handler te_gemm_ffi.

Semantics are te_gemm's, row-major: D = op(A) op(B) (+ D), op(A) [M, K], op(B) [K, N], with
A = x, B = w. trans_a = False: x is [M, K]; True: x is [K, M]. trans_b = True (the default): w is
[N, K] (a dense layer's weight, TE's layout); False: w is [K, N]. Leading dims of an operand
flatten into its rows. So a Linear layer's three GEMMs are

    y  = gemm(x, w)                                  # fprop: x [.., K], w [N, K]
    dx = gemm(dy, w, trans_b=False)                  # dgrad: dy [.., N], w [N, K]
    dw = gemm(dy, x, trans_a=True, trans_b=False)    # wgrad: dy [T, N], x [T, K] -> [N, K]

FP8 operands are ScaledTensors from te_jax.quantize. te's FP8 GEMM reads both operands with K
contiguous, so the layout decides the copy: x's row-wise copy unless trans_a, w's row-wise copy
if trans_b, otherwise the column-wise one (quantize(..., columnwise=True)). Only that copy goes
to te-core (the FFI handler's `*_columnwise` attributes say which), so a jitted program keeps no
unused copy alive for the GEMM. MXFP8 and NVFP4 operands (both of one family) go the same way;
te_gemm multiplies them by block dequantization to BF16 and an fp32-accumulated BF16 product on
every backend (te/gemm.h), the numerics Blackwell's native kernels would give.

Checked here, at trace time: what te-core cannot see (Python-level argument types, flag
combinations that pick the epilogue, a missing FP8 copy before the call is built, the
accumulate_into buffer that XLA aliases to D). Dtypes and shapes of the operands, bias and
pre-activation are te_gemm's to check; its message comes back as a JaxRuntimeError.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from te_core import _C, _ops

from te_jax import _dtypes, _ffi, _fused
from te_jax._scaled_tensor import ScaledTensor

_EPILOGUE = {name.lower(): int(value) for name, value in _C.Epilogue.__members__.items()}
_MODES = {**_ops.SCALING_MODES, **_ops.MX_SCALING_MODES}
_PER_TENSOR = _MODES["per_tensor"]
_F32 = np.dtype(jnp.float32)


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def _split_arg(use_split_accumulator) -> int:
    """te_gemm_config.use_split_accumulator of the Python argument: None is te's default (-1)."""
    if use_split_accumulator is None:
        return -1
    return int(_check_flag(use_split_accumulator, "use_split_accumulator"))


def _array(value, name: str) -> jax.Array:
    if isinstance(value, ScaledTensor):
        raise TypeError(f"{name}: expected a high-precision array, got a ScaledTensor")
    if isinstance(value, jax.Array):
        return value
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a jax array, got {type(value).__name__}") from None


class _Operand:
    """One operand as the handler takes it: the copy te reads, its scale_inv, the source's shape
    and scaling mode, whether that copy is the column-wise one, and for NVFP4 the global amaxes
    and whether the copy carries the Hadamard transform."""

    def __init__(self, value, name: str, trans: bool, rowwise_wanted: bool):
        self.amax = None
        self.rht = False
        if isinstance(value, ScaledTensor):
            self.shape = tuple(value.shape)
            self.mode = _MODES[value.scaling_mode]
            self.columnwise = not rowwise_wanted
            self.data = value.columnwise_data if self.columnwise else value.data
            self.scale_inv = value.columnwise_scale_inv if self.columnwise else value.scale_inv
            self.dq_dtype = value.dq_dtype
            if self.mode == _ops.NVFP4:
                self.amax = value.amax
                self.rht = self.columnwise and value.columnwise_rht
            if self.data is None:
                flag = f"trans_{'a' if name == 'x' else 'b'}={trans}"
                if self.columnwise:
                    raise ValueError(
                        f"{name}: {flag} reads the column-wise FP8 copy (te's FP8 GEMM needs K "
                        f"contiguous), but this ScaledTensor has none; quantize {name} with "
                        "columnwise=True"
                    )
                raise ValueError(
                    f"{name}: {flag} reads the row-wise FP8 copy, but this ScaledTensor has "
                    "none; quantize it with rowwise=True"
                )
        else:
            self.data = _array(value, name)
            self.shape = tuple(self.data.shape)
            self.mode = _PER_TENSOR
            self.columnwise = False
            self.scale_inv = None
            self.dq_dtype = np.dtype(self.data.dtype)


def gemm(
    x,
    w,
    *,
    bias=None,
    out_dtype=None,
    accumulate_into=None,
    gelu: bool = False,
    bias_grad: bool = False,
    gelu_input=None,
    use_split_accumulator: bool | None = None,
    trans_a: bool = False,
    trans_b: bool = True,
):
    """D = op(x) op(w) through te_gemm; by default ``x @ w.T (+ bias)``, a dense layer with
    ``w`` [N, K].

    Row-major te_gemm semantics (te/gemm.h): op(x) is [M, K] (x stored [M, K], or [K, M] with
    ``trans_a``), op(w) is [K, N] (w stored [N, K] with ``trans_b``, the default, or [K, N]).
    Leading dims of an operand flatten into its rows; without ``trans_a`` the result keeps x's
    leading dims, ``[..., N]``, otherwise it is [M, N]. Accumulation is fp32.

    Args:
      x, w: jax arrays of one dtype (float32, bfloat16, float16), or both ScaledTensors from
        te_jax.quantize (FP8 per_tensor E4M3/E5M2, not both E5M2; or block-scaled with at most
        one block_2d operand; or both mxfp8_1d, or both nvfp4_1d, where a column-wise copy with
        the Hadamard transform meets only another). The layout picks the FP8 copy: x's row-wise copy unless
        ``trans_a``, w's row-wise copy if ``trans_b``, the column-wise one otherwise; a
        ScaledTensor without it raises ValueError (quantize with ``columnwise=True``).
      bias: [N], added to every row (the output's dtype or float32).
      out_dtype: float32, bfloat16 or float16. Default: ``accumulate_into``'s dtype if given,
        else x's dtype (a ScaledTensor's source dtype).
      accumulate_into: an array shaped like the result: returns ``accumulate_into + op(x)
        op(w)`` (te_gemm with beta = 1, e.g. into an fp32 main_grad). Functional: the argument
        is not modified; under jit with the argument donated, XLA accumulates in its buffer.
      gelu: returns ``(gelu(pre), pre)``, ``pre = op(x) op(w) (+ bias)``, gelu the tanh
        approximation (jax.nn.gelu(approximate=True)); ``pre`` is what ``gelu_input`` takes back.
      bias_grad: returns ``(D, dbias)`` with ``dbias[i] = sum_k op(x)[i, k]``: in the wgrad
        layout (x = dy, ``trans_a=True``) that is ``dy.sum(0)``, the bias gradient, in D's dtype.
      gelu_input: the saved pre-activation, shaped like the result: returns
        ``(op(x) op(w)) * gelu'(gelu_input)`` (the dgrad through a gelu).
      use_split_accumulator: FP8 only: True promotes partial sums to fp32 often (accurate), False
        is cuBLASLt's fast accumulation; None is te's default (True).
      trans_a, trans_b: the layouts above.

    At most one of bias / gelu (which may take a bias), bias_grad, gelu_input: te_gemm runs one
    epilogue. Works under jax.jit (everything but the arrays is static); under vmap the GEMM
    runs once per batch element.
    """
    trans_a = _check_flag(trans_a, "trans_a")
    trans_b = _check_flag(trans_b, "trans_b")
    gelu = _check_flag(gelu, "gelu")
    bias_grad = _check_flag(bias_grad, "bias_grad")
    split = _split_arg(use_split_accumulator)

    a = _Operand(x, "x", trans_a, rowwise_wanted=not trans_a)
    b = _Operand(w, "w", trans_b, rowwise_wanted=trans_b)

    if bias_grad and (bias is not None or gelu or gelu_input is not None):
        raise ValueError(
            "bias_grad: expected no bias, gelu or gelu_input with bias_grad=True (te_gemm runs "
            "one epilogue: BGRAD)"
        )
    if gelu_input is not None and (bias is not None or gelu):
        raise ValueError(
            "gelu_input: expected no bias or gelu with gelu_input (te_gemm runs one epilogue: DGELU)"
        )
    if gelu:
        epilogue = _EPILOGUE["gelu_aux"]
    elif bias_grad:
        epilogue = _EPILOGUE["bgrad"]
    elif gelu_input is not None:
        epilogue = _EPILOGUE["dgelu"]
    elif bias is not None:
        epilogue = _EPILOGUE["bias"]
    else:
        epilogue = _EPILOGUE["default"]

    m, n, _ = _ops.gemm_dims(a.shape, b.shape, trans_a, trans_b)
    lead = a.shape[:-1] if (not trans_a and a.shape) else (m,)
    out_shape = tuple(lead) + (n,)

    if accumulate_into is not None:
        accumulate_into = _array(accumulate_into, "accumulate_into")
        acc_dtype = _dtypes.as_dtype(accumulate_into.dtype, "accumulate_into.dtype", _dtypes.SOURCE)
        if tuple(accumulate_into.shape) != out_shape:
            raise ValueError(
                f"accumulate_into: expected the result's shape {out_shape}, got "
                f"{tuple(accumulate_into.shape)}"
            )
        if out_dtype is None:
            out_dtype = acc_dtype
    if out_dtype is None:
        out_dtype = a.dq_dtype
    out = _dtypes.as_dtype(out_dtype, "out_dtype", _dtypes.SOURCE)
    if accumulate_into is not None and acc_dtype != out:
        raise TypeError(
            f"accumulate_into: expected out_dtype's {out.name} (te accumulates into D in D's "
            f"dtype), got {acc_dtype.name}"
        )
    if bias is not None:
        bias = _array(bias, "bias")
    if gelu_input is not None:
        gelu_input = _array(gelu_input, "gelu_input")

    d, aux, dbias = _gemm(
        a.data,
        a.scale_inv,
        b.data,
        b.scale_inv,
        bias,
        gelu_input,
        None if accumulate_into is None else jnp.reshape(accumulate_into, (m, n)),
        a.amax,
        b.amax,
        a_shape=a.shape,
        b_shape=b.shape,
        a_mode=a.mode,
        b_mode=b.mode,
        a_columnwise=a.columnwise,
        b_columnwise=b.columnwise,
        a_rht=a.rht,
        b_rht=b.rht,
        trans_a=trans_a,
        trans_b=trans_b,
        out=_dtypes.to_te(out),
        epilogue=epilogue,
        split=split,
    )
    d = jnp.reshape(d, out_shape)
    if gelu:
        return d, jnp.reshape(aux, out_shape)
    if bias_grad:
        return d, jnp.reshape(dbias, tuple(lead))
    return d


@functools.partial(
    jax.jit,
    static_argnames=(
        "a_shape",
        "b_shape",
        "a_mode",
        "b_mode",
        "a_columnwise",
        "b_columnwise",
        "a_rht",
        "b_rht",
        "trans_a",
        "trans_b",
        "out",
        "epilogue",
        "split",
    ),
)
def _gemm(
    a_data,
    a_scale_inv,
    b_data,
    b_scale_inv,
    bias,
    aux_in,
    d_in,
    a_amax,
    b_amax,
    *,
    a_shape,
    b_shape,
    a_mode,
    b_mode,
    a_columnwise,
    b_columnwise,
    a_rht,
    b_rht,
    trans_a,
    trans_b,
    out,
    epilogue,
    split,
):
    # Absent operands are [0] placeholders; the handler knows them from the attributes (a
    # scale_inv from the data's dtype or mode, bias from has_bias, aux_in from the epilogue, d_in
    # from beta, the amaxes from the modes). d_in is aliased to D so that beta = 1 reads it.
    m, n, _ = _ops.gemm_dims(a_shape, b_shape, trans_a, trans_b)
    specs = _ops.gemm_outputs(
        m,
        n,
        out,
        aux=epilogue == _EPILOGUE["gelu_aux"],
        bias_grad=epilogue == _EPILOGUE["bgrad"],
        bias_grad_dtype=out,
    )
    absent = jnp.zeros(_ops.ABSENT_SHAPE, _F32)
    accumulate = d_in is not None
    return _ffi.call(
        _ffi.GEMM,
        specs,
        a_data,
        absent if a_scale_inv is None else a_scale_inv,
        b_data,
        absent if b_scale_inv is None else b_scale_inv,
        absent if bias is None else bias,
        absent if aux_in is None else aux_in,
        d_in if accumulate else absent,
        absent if a_amax is None else a_amax,
        absent if b_amax is None else b_amax,
        aliases={6: 0} if accumulate else None,
        a_scaling_mode=np.int32(a_mode),
        b_scaling_mode=np.int32(b_mode),
        a_columnwise=np.bool_(a_columnwise),
        b_columnwise=np.bool_(b_columnwise),
        trans_a=np.bool_(trans_a),
        trans_b=np.bool_(trans_b),
        alpha=np.float32(1.0),
        beta=np.float32(1.0 if accumulate else 0.0),
        epilogue=np.int32(epilogue),
        has_bias=np.bool_(bias is not None),
        use_split_accumulator=np.int32(split),
        a_columnwise_rht=np.bool_(a_rht),
        b_columnwise_rht=np.bool_(b_rht),
    )


def gemm_gelu_fp8(
    x,
    w,
    fp8: _fused.Fp8Out,
    scale,
    *,
    bias=None,
    aux_dtype=None,
    gelu_input=None,
    bias_grad: bool = False,
    use_split_accumulator: bool | None = None,
    trans_a: bool = False,
    trans_b: bool = True,
):
    """An MLP's GEMM with gelu fused, quantized under delayed scaling: te_gemm's GELU_AUX or
    DGELU with a per-tensor FP8 output (te/gemm.h), one te-core call the backend may run as one
    kernel.

    x, w: per-tensor FP8 ScaledTensors, laid out as in ``gemm``; op(x) [M, K], op(w) [K, N].
    fp8: the output's format (``delayed`` per-tensor, row-wise and optionally column-wise);
    scale: its fp32 [1] delayed scale.
    Without ``gelu_input`` (FC1): pre = op(x) op(w) (+ bias [N]) rounded to ``aux_dtype``
    (default: x's source dtype); returns (gelu(pre) as a ScaledTensor [M, N], pre, None), the
    same bytes as ``gemm`` then te's activation forward with that output.
    With ``gelu_input`` (FC2's dgrad; the saved pre [M, N]): g = op(x) op(w) rounded to
    gelu_input's dtype; returns (g * gelu'(gelu_input) as a ScaledTensor, None, dbias [N] in
    gelu_input's dtype if ``bias_grad`` else None), the bytes of te's activation backward of g.
    The ScaledTensor's amax is this call's alone.
    """
    trans_a = _check_flag(trans_a, "trans_a")
    trans_b = _check_flag(trans_b, "trans_b")
    a = _Operand(x, "x", trans_a, rowwise_wanted=not trans_a)
    b = _Operand(w, "w", trans_b, rowwise_wanted=trans_b)
    for name, op in (("x", a), ("w", b)):
        if op.mode != _PER_TENSOR or op.scale_inv is None:
            raise TypeError(f"{name}: expected a per-tensor FP8 ScaledTensor")
    if not (fp8.delayed and fp8.per_tensor and fp8.rowwise):
        raise ValueError(f"fp8: expected a delayed per-tensor output with its row-wise copy, got {fp8}")
    m, n, _ = _ops.gemm_dims(a.shape, b.shape, trans_a, trans_b)
    dgelu = gelu_input is not None
    if dgelu:
        gelu_input = _array(gelu_input, "gelu_input")
        aux_dtype = np.dtype(gelu_input.dtype)
    else:
        if bias_grad:
            raise ValueError("bias_grad: expected False without gelu_input (only DGELU writes it)")
        aux_dtype = a.dq_dtype if aux_dtype is None else aux_dtype
    aux_dtype = _dtypes.as_dtype(aux_dtype, "aux_dtype", _dtypes.SOURCE)
    if bias is not None:
        if dgelu:
            raise ValueError("bias: expected None with gelu_input (DGELU adds no bias)")
        bias = _array(bias, "bias")
    parts = _gemm_act(
        a.data,
        a.scale_inv,
        b.data,
        b.scale_inv,
        bias,
        gelu_input,
        _fused.as_scale(scale),
        m=m,
        n=n,
        a_columnwise=a.columnwise,
        b_columnwise=b.columnwise,
        trans_a=trans_a,
        trans_b=trans_b,
        fp8=fp8,
        aux_dtype=aux_dtype,
        dgelu=dgelu,
        bias_grad=_check_flag(bias_grad, "bias_grad"),
        split=_split_arg(use_split_accumulator),
    )
    d = _fused.assemble(parts[:6], (m, n), aux_dtype, fp8, scale)
    return d, (None if dgelu else parts[6]), (parts[7] if bias_grad else None)


@functools.partial(
    jax.jit,
    static_argnames=(
        "m",
        "n",
        "a_columnwise",
        "b_columnwise",
        "trans_a",
        "trans_b",
        "fp8",
        "aux_dtype",
        "dgelu",
        "bias_grad",
        "split",
    ),
)
def _gemm_act(
    a_data,
    a_scale_inv,
    b_data,
    b_scale_inv,
    bias,
    gelu_input,
    scale,
    *,
    m,
    n,
    a_columnwise,
    b_columnwise,
    trans_a,
    trans_b,
    fp8,
    aux_dtype,
    dgelu,
    bias_grad,
    split,
):
    aux = _dtypes.to_te(aux_dtype)
    absent_spec = _ops.TensorSpec(_ops.ABSENT_SHAPE, aux)
    mn = _ops.TensorSpec((m, n), aux)
    specs = _fused.output_specs((m, n), aux_dtype, fp8) + (
        absent_spec if dgelu else mn,
        _ops.TensorSpec((n,) if bias_grad else _ops.ABSENT_SHAPE, aux),
        mn if dgelu else absent_spec,
    )
    absent = jnp.zeros(_ops.ABSENT_SHAPE, _F32)
    return _ffi.call(
        _ffi.GEMM_ACT,
        specs,
        a_data,
        a_scale_inv,
        b_data,
        b_scale_inv,
        absent if bias is None else bias,
        absent if gelu_input is None else gelu_input,
        scale,
        jnp.zeros((1,), _F32),  # this call's amax: te_gemm max-accumulates into it
        aliases={7: 4},
        a_columnwise=np.bool_(a_columnwise),
        b_columnwise=np.bool_(b_columnwise),
        trans_a=np.bool_(trans_a),
        trans_b=np.bool_(trans_b),
        epilogue=np.int32(_EPILOGUE["dgelu" if dgelu else "gelu_aux"]),
        has_bias=np.bool_(bias is not None),
        has_bias_grad=np.bool_(bias_grad),
        use_split_accumulator=np.int32(split),
        columnwise=np.bool_(fp8.columnwise),
    )

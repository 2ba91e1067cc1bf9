"""te_jax.flax attention on a CUDA device in bfloat16 against the same calls on te's CPU backend
in fp32: (a) DotProductAttention over packed rows (qkv_layout 'thd_thd_thd', GQA,
'padding_causal') described by a SequenceDescriptor, forward and gradients; (b) decode steps of
a 2-layer TransformerLayer stack through its KV cache (rotary embeddings, T5 biases, GQA).

Both sides get the same values: inputs and parameters are drawn in fp32, rounded to bfloat16,
and the CPU reference computes in fp32 from the rounded values. What differs is bfloat16
arithmetic (8 mantissa bits: a rounding is <= 2^-9 relative) in the projections, the logits,
the probabilities and the outputs: normwise a few 1e-3 per op. Bounds (normwise relative error):
2e-2 for the attention's output, 5e-2 for its gradients (a backward chains three more bf16
products), 3e-2 for the stack's update y - x after two layers. A wrong mask, segment or cache
slot moves whole rows: errors near 1.

Run on the GPU machine:
  PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/gpu/test_jax_attention_gpu.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jax_devices import CPU, GPU, SKIP_WITHOUT_GPU
from te_jax.attention import SequenceDescriptor
from te_jax.flax import DotProductAttention, TransformerLayer

pytestmark = SKIP_WITHOUT_GPU

F32, BF16 = jnp.float32, jnp.bfloat16


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _bf16_values(seed, shape, scale=1.0):
    """fp32 numbers that bfloat16 holds exactly (numpy: nothing runs on a device yet)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return np.asarray(jnp.asarray(x, BF16).astype(F32))


def _run(fn, args, device, dtype):
    """jit(fn) on ``device`` with the floating leaves of ``args`` cast to ``dtype``."""
    cast = jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, args
    )
    return jax.device_get(jax.jit(fn)(*jax.device_put(cast, device)))


# ---- (a) DotProductAttention, THD ----

B, S, H, G, D = 2, 96, 8, 2, 64
# row 0: sequences of 37 and 50 tokens, 9 padding; row 1: 13, 20 and 60 tokens, 3 padding
IDS = np.zeros((B, S), np.int32)
IDS[0, :37], IDS[0, 37:87] = 1, 2
IDS[1, :13], IDS[1, 13:33], IDS[1, 33:93] = 1, 2, 3
SEQLENS = np.array([[37, 50, -1], [13, 20, 60]], np.int32)
OFFSETS = np.array([[0, 37, -1, -1], [0, 13, 33, 93]], np.int32)


@pytest.mark.parametrize("descriptor", ["seqlens_and_offsets", "segment_ids"])
def test_dpa_thd_bf16_gpu_matches_fp32_cpu(descriptor):
    model = DotProductAttention(
        D, H, num_gqa_groups=G, attn_mask_type="padding_causal", qkv_layout="thd_thd_thd"
    )
    q, k, v = (_bf16_values(i, (B, S, n, D)) for i, n in enumerate((H, G, G)))
    w = _bf16_values(3, (B, S, H, D))
    seqs = (SEQLENS, OFFSETS) if descriptor == "seqlens_and_offsets" else (IDS,)

    def f(q, k, v, w, seqs):
        desc = (
            SequenceDescriptor.from_seqlens_and_offsets(*seqs)
            if descriptor == "seqlens_and_offsets"
            else SequenceDescriptor.from_segment_ids_and_pos(*seqs)
        )

        def loss(q, k, v):
            out = model.apply({}, q, k, v, desc, deterministic=True)
            return jnp.sum(out.astype(F32) * w.astype(F32)), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    want, want_grads = _run(f, (q, k, v, w, seqs), CPU, F32)
    got, got_grads = _run(f, (q, k, v, w, seqs), GPU, BF16)
    assert got.dtype == BF16
    assert rel(got, want) <= 2e-2, rel(got, want)
    for name, g, c in zip("qkv", got_grads, want_grads, strict=True):
        assert rel(g, c) <= 5e-2, (name, rel(g, c))
    pad = IDS == 0
    assert np.all(np.asarray(got, np.float32)[pad] == 0.0) and np.all(want[pad] == 0.0)


# ---- (b) TransformerLayer decode steps ----

HIDDEN, LENGTH, STEPS = 256, 16, 6


class Stack(nn.Module):
    @nn.compact
    def __call__(self, x, decode=False):
        for i in range(2):
            x = TransformerLayer(HIDDEN, 512, 8, num_gqa_groups=2, enable_rotary_pos_emb=True,
                                 hidden_dropout=0.0, attention_dropout=0.0, intermediate_dropout=0.0,
                                 name=f"layer_{i}")(x, deterministic=True, decode=decode)  # fmt: skip
        return x


def _stack_and_inputs(seed: int):
    """The two-layer stack, bf16-exact inputs [2, LENGTH, HIDDEN] and parameters (fp32 values
    that bf16 holds exactly, so both devices start from the same numbers)."""
    model = Stack()
    x = _bf16_values(4 + seed, (2, LENGTH, HIDDEN))
    with jax.default_device(CPU):
        params = nn.unbox(model.init(jax.random.PRNGKey(seed), jnp.asarray(x))["params"])
    params = jax.tree_util.tree_map(lambda a: np.asarray(jnp.asarray(a, BF16).astype(F32)), params)
    return model, x, params


def test_transformer_layer_decode_bf16_gpu_matches_fp32_cpu():
    model, x, params = _stack_and_inputs(0)

    def f(params, x):
        full = model.apply({"params": params}, x)
        _, mut = model.apply({"params": params}, jnp.zeros_like(x), decode=True, mutable=["cache"])

        def step(cache, token):
            out, mut = model.apply(
                {"params": params, "cache": cache}, token[:, None], decode=True, mutable=["cache"]
            )
            return mut["cache"], out[:, 0]

        cache, outs = jax.lax.scan(step, mut["cache"], jnp.swapaxes(x[:, :STEPS], 0, 1))
        return full, jnp.swapaxes(outs, 0, 1), cache

    full, want, want_cache = _run(f, (params, x), CPU, F32)
    got_full, got, got_cache = _run(f, (params, x), GPU, BF16)
    np.testing.assert_allclose(want, full[:, :STEPS], rtol=2e-5, atol=2e-5)  # the CPU's own check
    x_steps = x[:, :STEPS]
    assert rel(np.asarray(got, np.float32) - x_steps, want - x_steps) <= 3e-2
    assert rel(np.asarray(got_full, np.float32)[:, :STEPS] - x_steps, want - x_steps) <= 3e-2
    for i in range(2):
        gc, wc = got_cache[f"layer_{i}"]["attention"], want_cache[f"layer_{i}"]["attention"]
        assert int(gc["cache_index"]) == STEPS and gc["cached_key"].dtype == BF16
        assert gc["cached_key"].shape == wc["cached_key"].shape == (2, LENGTH, 2, HIDDEN // 8)
        for name in ("cached_key", "cached_value"):
            assert rel(gc[name][:, :STEPS], wc[name][:, :STEPS]) <= 2e-2
            assert np.all(np.asarray(gc[name], np.float32)[:, STEPS:] == 0.0)  # slots not written yet


def test_transformer_layer_chunked_decode_bf16_gpu_matches_fp32_cpu():
    """Steps of several tokens (3, 1, 2: a chunked prompt, then decoding) on the GPU in bf16
    against the same steps on the CPU in fp32, which equal the full forward (the CPU's own check)."""
    model, x, params = _stack_and_inputs(1)

    def f(params, x):
        full = model.apply({"params": params}, x)
        _, mut = model.apply({"params": params}, jnp.zeros_like(x), decode=True, mutable=["cache"])
        cache, outs, at = mut["cache"], [], 0
        for n in (3, 1, 2):
            out, mut = model.apply(
                {"params": params, "cache": cache}, x[:, at : at + n], decode=True, mutable=["cache"]
            )
            cache, at = mut["cache"], at + n
            outs.append(out)
        return full, jnp.concatenate(outs, axis=1)

    full, want = _run(f, (params, x), CPU, F32)
    _, got = _run(f, (params, x), GPU, BF16)
    np.testing.assert_allclose(want, full[:, :6], rtol=2e-5, atol=2e-5)
    x_steps = x[:, :6]
    assert rel(np.asarray(got, np.float32) - x_steps, want - x_steps) <= 3e-2

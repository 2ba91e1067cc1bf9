"""benchmarks/decode.py refuses a head layout that cannot be grouped before it needs a GPU, and its
plain-torch peer decodes as te.TransformerLayer does with a te.InferenceParams cache."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCH / "decode.py"


def test_groups_not_dividing_heads_is_refused():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--hidden", "64", "--heads", "4", "--groups", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--groups divide --heads" in r.stderr


def test_torch_peer_decodes_like_te_with_a_kv_cache(monkeypatch):
    """The peer (CPU, fp32) against te.TransformerLayer holding the same weights, step by step
    from an empty cache: the same computation, so the benchmark compares like with like."""
    monkeypatch.syspath_prepend(str(BENCH))
    from decode import TorchLayer

    h, f, heads, groups, b, steps = 32, 64, 4, 2, 3, 5
    d = h // heads
    torch.manual_seed(0)
    peer = TorchLayer(h, f, heads, groups, b, steps, device="cpu", dtype=torch.float32)
    layer = te.TransformerLayer(
        h, f, heads, num_gqa_groups=groups, hidden_dropout=0.0, attention_dropout=0.0, layer_number=1,
        attn_input_format="bshd", device="cpu",
    ).eval()  # fmt: skip
    for p in peer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    with torch.no_grad():
        att, mlp = layer.self_attention.layernorm_qkv, layer.layernorm_mlp
        att.layer_norm_weight.copy_(peer.ln1.weight)
        att.layer_norm_bias.copy_(peer.ln1.bias)
        # the peer's QKV output is [queries | keys | values]: te's separate weights
        sizes = (h, groups * d, groups * d)
        for name, w, bias in zip(
            ("query", "key", "value"), peer.qkv.weight.split(sizes), peer.qkv.bias.split(sizes), strict=True
        ):
            getattr(att, f"{name}_weight").copy_(w)
            getattr(att, f"{name}_bias").copy_(bias)
        layer.self_attention.proj.weight.copy_(peer.proj.weight)
        layer.self_attention.proj.bias.copy_(peer.proj.bias)
        mlp.layer_norm_weight.copy_(peer.ln2.weight)
        mlp.layer_norm_bias.copy_(peer.ln2.bias)
        mlp.fc1_weight.copy_(peer.fc1.weight)
        mlp.fc1_bias.copy_(peer.fc1.bias)
        mlp.fc2_weight.copy_(peer.fc2.weight)
        mlp.fc2_bias.copy_(peer.fc2.bias)
    params = te.InferenceParams(b, steps, groups, d, torch.float32, device="cpu")
    with torch.no_grad():
        for pos in range(steps):
            x = torch.randn(b, 1, h)
            params.pre_step(OrderedDict((i, 1) for i in range(b)))
            got = layer(x, self_attn_mask_type="padding_causal", inference_params=params)
            torch.testing.assert_close(got, peer(x, pos), rtol=1e-5, atol=1e-5)

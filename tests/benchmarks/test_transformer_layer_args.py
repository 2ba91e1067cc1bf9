"""benchmarks/transformer_layer.py refuses a head count that does not divide the hidden size
before it needs a GPU, and its plain-torch peer is the layer te.TransformerLayer computes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCH / "transformer_layer.py"


def test_heads_not_dividing_hidden_is_refused():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--hidden", "64", "--heads", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--heads 3 must divide --hidden 64" in r.stderr


def test_torch_peer_computes_te_transformer_layer(monkeypatch):
    """The peer (on the CPU, fp32) against te.TransformerLayer holding the same weights: the same
    block, so the benchmark's ratio compares like with like."""
    monkeypatch.syspath_prepend(str(BENCH))
    from transformer_layer import TorchLayer

    h, f, heads, s, b = 32, 64, 4, 6, 2
    torch.manual_seed(0)
    peer = TorchLayer(h, f, heads, device="cpu", dtype=torch.float32)
    layer = te.TransformerLayer(
        h, f, heads, hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True, device="cpu"
    )
    for p in peer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    with torch.no_grad():
        att, mlp = layer.self_attention, layer.layernorm_mlp
        att.layernorm_qkv.layer_norm_weight.copy_(peer.ln1.weight)
        att.layernorm_qkv.layer_norm_bias.copy_(peer.ln1.bias)
        # the peer's QKV output is [heads, 3, d] per token: te's interleaved layout with one
        # query head per key/value group
        att.layernorm_qkv.weight.copy_(peer.qkv.weight)
        att.layernorm_qkv.bias.copy_(peer.qkv.bias)
        att.proj.weight.copy_(peer.proj.weight)
        att.proj.bias.copy_(peer.proj.bias)
        mlp.layer_norm_weight.copy_(peer.ln2.weight)
        mlp.layer_norm_bias.copy_(peer.ln2.bias)
        mlp.fc1_weight.copy_(peer.fc1.weight)
        mlp.fc1_bias.copy_(peer.fc1.bias)
        mlp.fc2_weight.copy_(peer.fc2.weight)
        mlp.fc2_bias.copy_(peer.fc2.bias)
    x = torch.randn(s, b, h)
    torch.testing.assert_close(layer(x), peer(x), rtol=1e-5, atol=1e-5)

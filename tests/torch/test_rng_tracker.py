"""te.CudaRNGStatesTracker (TE's and Megatron's named RNG states) on the CPU generator: forks draw
their own reproducible streams and leave the generator's own state as they found it."""

import pytest
import te_torch as te
import torch


def test_forks_draw_their_own_streams_and_restore_the_generator():
    t = te.CudaRNGStatesTracker(device="cpu")
    assert not t.is_initialized()
    t.add("model-parallel-rng", 123)
    t.add("expert-parallel-rng", 456)
    assert t.is_initialized()
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with t.fork():
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), outside)  # the default generator is untouched
    with t.fork():
        b = torch.rand(4)  # the state advanced: the next draw continues the stream
    with t.fork("expert-parallel-rng"):
        e = torch.rand(4)
    g = torch.Generator().manual_seed(123)
    assert torch.equal(a, torch.rand(4, generator=g)) and torch.equal(b, torch.rand(4, generator=g))
    assert torch.equal(e, torch.rand(4, generator=torch.Generator().manual_seed(456)))


def test_states_round_trip_for_a_replay():
    t = te.CudaRNGStatesTracker(device="cpu")
    t.add("model-parallel-rng", 7)
    saved = t.get_states()
    with t.fork():
        first = torch.rand(3)
    t.set_states(saved)
    with t.fork():
        again = torch.rand(3)
    assert torch.equal(first, again)
    t.reset()
    assert not t.is_initialized() and t.get_states() == {}
    t.add("model-parallel-rng", 7)  # the seed is free again after reset


def test_misuse_says_what_was_expected():
    t = te.CudaRNGStatesTracker(device="cpu")
    t.add("model-parallel-rng", 1)
    with pytest.raises(ValueError, match="seed 1 was already added"):
        t.add("other", 1)
    with pytest.raises(ValueError, match="a state named 'model-parallel-rng' was already added"):
        t.add("model-parallel-rng", 2)
    with pytest.raises(KeyError, match=r"no state named 'data'; add it first with add\('data', seed\)"):
        with t.fork("data"):
            pass
    with pytest.raises(TypeError, match="seed: expected an int, got '3'"):
        t.add("x", "3")
    with pytest.raises(TypeError, match="states: expected a dict name -> state tensor"):
        t.set_states([1])
    with pytest.raises(ValueError, match="device: expected 'cuda', 'cpu' or None, got 'meta'"):
        te.CudaRNGStatesTracker(device="meta")
    assert te.distributed.CudaRNGStatesTracker is te.CudaRNGStatesTracker
    assert te.distributed.checkpoint is te.checkpoint

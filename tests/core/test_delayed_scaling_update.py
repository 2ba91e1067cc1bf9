"""te_delayed_scaling_update: step by step against hand-computed histories and scales, and against
the oracle on random histories of many tensors in one call."""

import _oracle as O
import numpy as np
import pytest
from _buffers import assert_float_equal, rng_for, tensor
from te_core import _C

MAX, MOST_RECENT = int(_C.AmaxComputeAlgo.MAX), int(_C.AmaxComputeAlgo.MOST_RECENT)
FLT_MAX = float(O.FLT_MAX)
nan, inf = np.nan, np.inf


def update(histories, scales, fp8_max=448.0, margin=0.0, algo=MAX):
    _C.delayed_scaling_update(
        [tensor(h) for h in histories], [tensor(s) for s in scales], fp8_max, margin, algo
    )


def test_hand_computed_sequence_max_many_tensors():
    """Three tensors in one call: [4, 3], [3] and [1, 2] histories, six steps, algo max."""
    a, sa = np.zeros((4, 3), np.float32), np.ones(3, np.float32)
    b, sb = np.zeros(3, np.float32), np.ones(1, np.float32)
    c, sc = np.zeros((1, 2), np.float32), np.ones(2, np.float32)
    amax_a = [[2, 0, 1], [8, nan, inf], [1, 4, 0.5], [0.5, 0, 0.25], [0, 1, 2], [3e-38, 0, 0]]
    amax_b = [1e-38, 7, 0.875, 2, 1, 0]
    amax_c = [[2, 0], [4, nan], [0, 8], [inf, 1], [0.5, 0.5], [1, 1]]
    # Written out by hand from NUMERICS.md (window of L = 4 steps for a, 3 for b, 1 for c):
    want_sa = [[224, 1, 448], [56, 1, 448], [56, 1, 448], [56, 1, 448], [56, 1, 448], [448, 112, 224]]
    want_sb = [FLT_MAX, 64, 64, 64, 224, 224]  # 448 / 1e-38 overflows -> FLT_MAX
    want_sc = [[224, 1], [112, 1], [112, 56], [112, 448], [896, 896], [448, 448]]
    # a's history after each update (rows = steps back; the newest amax sits at the end)
    want_a = [
        [[0, 0, 0], [0, 0, 0], [0, 0, 0], [2, 0, 1]],
        [[0, 0, 0], [0, 0, 0], [2, 0, 1], [8, nan, inf]],
        [[0, 0, 0], [2, 0, 1], [8, nan, inf], [1, 4, 0.5]],
        [[0, 0, 0], [8, nan, inf], [1, 4, 0.5], [0.5, 0, 0.25]],
        [[0, 0, 0], [1, 4, 0.5], [0.5, 0, 0.25], [0, 1, 2]],
        [[0, 0, 0], [0.5, 0, 0.25], [0, 1, 2], [3e-38, 0, 0]],
    ]
    # Note step 2 -> 3: after step 2's roll the oldest row, step 1's amaxes, is at index 1 and
    # leaves the window at step 5; written out: a[1] after step 3 is step 1's row.
    for k in range(6):
        a[0], b[0], c[0] = amax_a[k], amax_b[k], amax_c[k]
        update([a, b, c], [sa, sb, sc])
        assert_float_equal(sa, np.array(want_sa[k], np.float32), f"step {k + 1} scales of a")
        assert_float_equal(sb, np.array([want_sb[k]], np.float32), f"step {k + 1} scale of b")
        assert_float_equal(sc, np.array(want_sc[k], np.float32), f"step {k + 1} scales of c")
        assert_float_equal(a, np.array(want_a[k], np.float32), f"step {k + 1} history of a")
        assert (c == 0).all(), "an L = 1 history is all zeros after every update"
        assert b[0] == 0 and b[-1] == np.float32(amax_b[k])


def test_hand_computed_sequence_most_recent_with_margin():
    h, s = np.zeros((3, 2), np.float32), np.ones(2, np.float32)
    steps = [[4, 1], [2, 0], [nan, 8]]
    # scale = 57344 / amax / 2^1, from this step's amax only; 0 and NaN keep the old scale
    want = [[7168, 28672], [14336, 28672], [14336, 3584]]
    want_h = [[[0, 0], [0, 0], [4, 1]], [[0, 0], [4, 1], [2, 0]], [[0, 0], [2, 0], [nan, 8]]]
    for k in range(3):
        h[0] = steps[k]
        update([h], [s], fp8_max=57344.0, margin=1.0, algo=MOST_RECENT)
        assert_float_equal(s, np.array(want[k], np.float32), f"step {k + 1}")
        assert_float_equal(h, np.array(want_h[k], np.float32), f"history step {k + 1}")


def test_margin_does_not_overflow_early():
    """448 / amax overflows fp32 here but (448 / 2) / amax does not: the scale is the finite
    quotient, not FLT_MAX (the fp32 value nearest (fp8_max / amax) / 2^margin)."""
    amax = np.float32(448.0) / np.float32(1.5) / O.FLT_MAX  # 448 / amax = 1.5 * FLT_MAX
    h, s = np.array([amax], np.float32), np.ones(1, np.float32)
    update([h], [s], margin=1.0)
    want = np.float32(np.float64(224.0) / np.float64(amax))
    assert np.isfinite(want) and want < O.FLT_MAX
    assert s[0] == want


def test_margin_values():
    for margin, want in [(0.0, 112.0), (2.0, 28.0), (-1.0, 224.0), (3.0, 14.0)]:
        h, s = np.array([4.0, 0.0], np.float32), np.ones(1, np.float32)
        update([h], [s], margin=margin)
        assert s[0] == want, margin


@pytest.mark.parametrize("bad", [0.0, inf, -inf, nan])
@pytest.mark.parametrize("algo", [MAX, MOST_RECENT])
def test_unusable_amax_keeps_old_scale(bad, algo):
    h = np.array([[bad], [0.0]], np.float32)
    s = np.array([3.25], np.float32)
    update([h], [s], algo=algo)
    assert s[0] == np.float32(3.25)
    assert_float_equal(h, np.array([[0.0], [bad]], np.float32), "rolled")


@pytest.mark.parametrize("algo", [MAX, MOST_RECENT])
@pytest.mark.parametrize("margin", [0.0, 1.0, 3.0])
def test_random_histories_against_oracle(algo, margin):
    rng = rng_for("dsu", algo, margin)
    hs, ss = [], []
    for i in range(40):
        L = int(rng.integers(1, 20))
        shape = (L,) if i % 3 == 0 else (L, int(rng.integers(1, 9)))
        h = np.exp2(rng.uniform(-140, 40, shape)).astype(np.float32)
        m = rng.random(shape)
        h[m < 0.05] = 0.0
        h[(m >= 0.05) & (m < 0.07)] = np.inf
        h[(m >= 0.07) & (m < 0.09)] = np.nan
        hs.append(h)
        ss.append(rng.uniform(0.1, 10.0, 1 if h.ndim == 1 else shape[1]).astype(np.float32))
    want = [
        O.delayed_scaling_update(h, s, 448.0, margin, "max" if algo == MAX else "most_recent")
        for h, s in zip(hs, ss, strict=True)
    ]
    update(hs, ss, 448.0, margin, algo)
    for i, ((wh, ws), h, s) in enumerate(zip(want, hs, ss, strict=True)):
        assert_float_equal(s, ws, f"scales[{i}]")
        assert_float_equal(h, wh, f"amax_histories[{i}]")


def test_e5m2_max_and_empty_call():
    h, s = np.array([[1.0, 2.0]], np.float32), np.ones(2, np.float32)
    update([h], [s], fp8_max=57344.0)
    assert s.tolist() == [57344.0, 28672.0]
    _C.delayed_scaling_update([], [], 448.0)  # no tensors: nothing to do


def random_group(rng, count: int):
    hs, ss = [], []
    for i in range(count):
        L = int(rng.integers(1, 12))
        shape = (L,) if i % 2 else (L, int(rng.integers(1, 6)))
        h = np.exp2(rng.uniform(-20, 20, shape)).astype(np.float32)
        h[rng.random(shape) < 0.1] = 0.0
        hs.append(h)
        ss.append(rng.uniform(0.1, 10.0, 1 if h.ndim == 1 else shape[1]).astype(np.float32))
    return hs, ss


@pytest.mark.parametrize(
    "sizes", [(2, 1), (3, 0, 2), (40, 30)]
)  # one small launch; an empty group; 64 at a time
def test_groups_in_one_call_against_oracle(sizes):
    """te_delayed_scaling_update_groups: each group keeps its own fp8_max, margin and algo (a
    step's forward E4M3 and backward E5M2 histories in one launch), three steps through one
    DelayedScalingUpdate, against the oracle per group."""
    rng = rng_for("dsu groups", sizes)
    params = [(448.0, 0.0, "max"), (57344.0, 1.0, "most_recent"), (448.0, 2.0, "most_recent")]
    groups = [random_group(rng, n) for n in sizes]
    want = [([h.copy() for h in hs], [s.copy() for s in ss]) for hs, ss in groups]
    upd = _C.DelayedScalingUpdate(
        [
            (
                [tensor(h) for h in hs],
                [tensor(s) for s in ss],
                fp8_max,
                margin,
                MAX if algo == "max" else MOST_RECENT,
            )
            for (hs, ss), (fp8_max, margin, algo) in zip(groups, params, strict=False)
        ]
    )
    for step in range(3):
        for (hs, ss), (fp8_max, margin, algo) in zip(want, params, strict=False):
            for i, (h, s) in enumerate(zip(hs, ss, strict=True)):
                hs[i], ss[i] = O.delayed_scaling_update(h, s, fp8_max, margin, algo)
        upd()
        for g, ((hs, ss), (whs, wss)) in enumerate(zip(groups, want, strict=True)):
            for i in range(len(hs)):
                assert_float_equal(ss[i], wss[i], f"step {step + 1} groups[{g}].scales[{i}]")
                assert_float_equal(hs[i], whs[i], f"step {step + 1} groups[{g}].amax_histories[{i}]")
        for hs, _ in groups:  # the next step's amaxes
            for h in hs:
                h.reshape(h.shape[0], -1)[0] = rng.uniform(0.5, 4.0)
        for (hs, _), (whs, _) in zip(groups, want, strict=True):
            for h, wh in zip(hs, whs, strict=True):
                wh[...] = h
    _C.DelayedScalingUpdate([])()  # no groups: nothing to do


def next_groups(groups, params, with_amaxes):
    """te_delayed_scaling_next_groups over numpy groups [(histories, scales, amaxes)]: returns the
    fresh next histories and scales (NaN-poisoned before the call)."""
    outs, args = [], []
    for (hs, ss, am), (fp8_max, margin, algo) in zip(groups, params, strict=True):
        nh = [np.full(h.shape, np.nan, np.float32) for h in hs]
        ns = [np.full(s.shape, np.nan, np.float32) for s in ss]
        outs.append((nh, ns))
        args.append(
            (
                [tensor(h) for h in hs],
                [tensor(s) for s in ss],
                [tensor(a) for a in am] if with_amaxes else None,
                [tensor(h) for h in nh],
                [tensor(s) for s in ns],
                fp8_max,
                margin,
                MAX if algo == "max" else MOST_RECENT,
            )
        )
    _C.delayed_scaling_next(args)
    return outs


@pytest.mark.parametrize("with_amaxes", [True, False], ids=["amaxes", "no_amaxes"])
@pytest.mark.parametrize("sizes", [(2, 1), (3, 0, 2), (40, 30)])
def test_next_groups_out_of_place_against_oracle(sizes, with_amaxes):
    """te_delayed_scaling_next_groups (te_jax's update): this step's amaxes folded into
    history[0] (NaN propagating), then the update, written to fresh buffers; the inputs keep
    their bytes."""
    rng = rng_for("dsu next", sizes, with_amaxes)
    params = [(448.0, 0.0, "max"), (57344.0, 1.0, "most_recent"), (448.0, 2.0, "most_recent")]
    groups = []
    for n in sizes:
        hs, ss = random_group(rng, n)
        am = []
        for h in hs:
            a = np.exp2(rng.uniform(-20, 20, h.shape[1:] or (1,))).astype(np.float32)
            a[rng.random(a.shape) < 0.2] = 0.0
            a[rng.random(a.shape) < 0.1] = np.nan
            a[rng.random(a.shape) < 0.1] = np.inf
            am.append(a)
        groups.append((hs, ss, am))
    before = [
        ([h.copy() for h in hs], [s.copy() for s in ss], [a.copy() for a in am]) for hs, ss, am in groups
    ]
    outs = next_groups(groups, params[: len(sizes)], with_amaxes)
    for g, ((hs, ss, am), (nh, ns), (fp8_max, margin, algo)) in enumerate(
        zip(groups, outs, params, strict=False)
    ):
        for i in range(len(hs)):
            h = hs[i].copy()
            if with_amaxes:
                first = h.reshape(h.shape[0], -1)[0]
                a = am[i].reshape(-1)
                first[...] = np.where(np.isnan(first) | np.isnan(a), np.nan, np.maximum(first, a))
            wh, ws = O.delayed_scaling_update(h, ss[i], fp8_max, margin, algo)
            assert_float_equal(ns[i], ws, f"groups[{g}] next_scales[{i}]")
            assert_float_equal(nh[i], wh, f"groups[{g}] next_amax_histories[{i}]")
    for (hs, ss, am), (bh, bs, ba) in zip(groups, before, strict=True):
        for t, b in zip(hs + ss + am, bh + bs + ba, strict=True):
            assert_float_equal(t, b, "an input (read, never written)")


def test_next_groups_hand_computed():
    """One [3] history: amax 5 joins history[0] = 2; max over (5, 1, 4) = 5 gives 448 / 5."""
    h, s, a = np.array([2.0, 1.0, 4.0], np.float32), np.array([7.0], np.float32), np.array([5.0], np.float32)
    [(nh, ns)] = next_groups([([h], [s], [a])], [(448.0, 0.0, "max")], True)
    assert nh[0].tolist() == [0.0, 4.0, 5.0]
    assert ns[0][0] == np.float32(448.0) / np.float32(5.0)
    [(nh, ns)] = next_groups([([h], [s], [a])], [(448.0, 0.0, "most_recent")], True)
    assert ns[0][0] == np.float32(448.0) / np.float32(5.0) and nh[0].tolist() == [0.0, 4.0, 5.0]
    [(nh, ns)] = next_groups([([h], [s], [np.array([np.nan], np.float32)])], [(448.0, 0.0, "max")], True)
    assert ns[0][0] == 7.0 and np.isnan(nh[0][2])  # NaN keeps the old scale and enters the window


def test_next_groups_errors():
    h, s, a = np.zeros(4, np.float32), np.ones(1, np.float32), np.ones(1, np.float32)
    ok_h, ok_s = np.zeros(4, np.float32), np.zeros(1, np.float32)

    def call(nh, ns, am=a):
        _C.delayed_scaling_next(
            [([tensor(h)], [tensor(s)], [tensor(am)], [tensor(nh)], [tensor(ns)], 448.0, 0.0, MAX)]
        )

    with pytest.raises(ValueError, match=r"next\[0\]\.next_amax_histories\[0\]\.shape: expected \[4\]"):
        call(np.zeros(3, np.float32), ok_s)
    with pytest.raises(ValueError, match=r"next\[0\]\.next_scales\[0\]"):
        call(ok_h, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"next\[0\]\.amaxes\[0\]"):
        call(ok_h, ok_s, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="overlaps an input"):
        _C.delayed_scaling_next(
            [([tensor(h)], [tensor(s)], None, [tensor(h)], [tensor(ok_s)], 448.0, 0.0, MAX)]
        )
    with pytest.raises(ValueError, match="overlap; expected separate buffers"):
        _C.delayed_scaling_next(
            [([tensor(h)], [tensor(s)], None, [tensor(ok_h)], [tensor(ok_h[:1])], 448.0, 0.0, MAX)]
        )
    with pytest.raises(ValueError, match=r"groups\[0\]: expected 1 scales"):
        _C.delayed_scaling_next([([tensor(h)], [], None, [tensor(ok_h)], [tensor(ok_s)], 448.0, 0.0, MAX)])
    _C.delayed_scaling_next([])  # no groups: nothing to do


def test_prepared_update_refuses_shared_buffers():
    """DelayedScalingUpdate checks once, when it is made, that no history or scale is listed
    twice or overlaps another (te_delayed_scaling_check_groups): a history listed twice rolled
    twice per step ([0, 0, 2, 0] instead of [0, 0, 0, 2]) and a scale inside a history was lost."""
    h = np.array([2, 0, 0, 0], np.float32)
    s1, s2 = np.ones(1, np.float32), np.ones(1, np.float32)
    with pytest.raises(
        ValueError, match=r"groups\[0\]\.amax_histories\[1\] and groups\[0\]\.amax_histories\[0\]"
    ):
        _C.DelayedScalingUpdate([([tensor(h), tensor(h)], [tensor(s1), tensor(s2)], 448.0, 0.0, MAX)])
    # across groups, a scale that is a history's element
    with pytest.raises(ValueError, match=r"groups\[1\]\.scales\[0\] and groups\[0\]\.amax_histories\[0\]"):
        _C.DelayedScalingUpdate(
            [([tensor(h)], [tensor(s1)], 448.0, 0.0, MAX), ([tensor(s2)], [tensor(h[1:2])], 448.0, 0.0, MAX)]
        )
    assert (h == [2, 0, 0, 0]).all()  # nothing ran
    # side by side in one buffer is fine, and the update runs
    buf = np.zeros(5, np.float32)
    buf[0] = 2.0
    upd = _C.DelayedScalingUpdate([([tensor(buf[:4])], [tensor(buf[4:])], 448.0, 0.0, MAX)])
    upd()
    assert buf.tolist() == [0, 0, 0, 2, 224]

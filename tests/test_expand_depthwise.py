"""fused_expand_depthwise (a 1x1 expand conv and the depthwise conv that reads it, one op) against TensorFlow's
own ops in float64 (tf.nn.conv2d 1x1 + bias + activation, tf.nn.depthwise_conv2d + bias + activation), over
edge shapes, both strategies, both targets; its float16 plan against a bound propagated stage by stage.

Tolerance (float32): sums of at most Cin + 1 (expansion) and KH * KW + 1 (depthwise) terms of unit-scale
inputs and 1/sqrt(fan_in)-scaled weights, in another order than TF's: a few ulps of O(1) partial sums, so
``conftest.ACCUMULATION`` (1e-5 absolute and relative, 2x margin at K = 1000) holds; hard-swish and sigmoid
add a few ulps of their own (``conftest.TRANSCENDENTAL``'s exp), inside the same bound.
"""

import zlib

import numpy as np
import pytest

from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.runtime.plan import op_plan, run_op

from conftest import ACCUMULATION
from half_math import gamma

# (N, H, W, Cin, Cexp, KH, KW, stride, padding, dilation, activation, dw_activation)
CASES = [
    (1, 9, 7, 8, 12, 3, 3, 2, "SAME", 1, "relu", "relu6"),            # odd sizes, stride 2 SAME
    (2, 11, 6, 5, 7, 5, 5, 1, "VALID", 1, "hard_swish", "hard_swish"),  # batch 2, channels not multiples of 4
    (1, 16, 16, 32, 128, 5, 5, 1, "SAME", 1, "hard_swish", "hard_swish"),   # selfie segmentation's block
    (1, 13, 9, 4, 8, 3, 3, 1, "SAME", 2, "relu6", "linear"),          # dilation 2
    (3, 6, 10, 8, 16, 1, 3, 2, "SAME", 1, "linear", "sigmoid"),       # a 1x3 filter, batch 3
    (1, 10, 5, 12, 20, 3, 1, 1, "VALID", 1, "relu", "tanh"),          # a 3x1 filter
    (1, 1, 1, 4, 8, 3, 3, 1, "SAME", 1, "relu", "relu"),              # 1x1 image: every tap but the centre padding
]
_IDS = [f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-e{c[4]}-k{c[5]}x{c[6]}-s{c[7]}-{c[8]}-d{c[9]}-{c[10]}-{c[11]}" for c in CASES]
SCHEDULES = {"gpu": {"target": "gpu"}, "cpu": {"target": "cpu"},
             "gpu_staged": {"target": "gpu", "strategy": "staged"},
             "cpu_one_dispatch": {"target": "cpu", "strategy": "expand_dw"}}


def _act(name):
    import tensorflow as tf

    return {"relu": tf.nn.relu, "relu6": tf.nn.relu6, "hard_swish": lambda v: v * tf.nn.relu6(v + 3) / 6,
            "linear": lambda v: v, "sigmoid": tf.sigmoid, "tanh": tf.tanh}[name]


def _arrays(case, half=False):
    n, h, w, cin, cexp, kh, kw = case[:7]
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    arrays = [rng.standard_normal((n, h, w, cin)), rng.standard_normal((cin, cexp)) / np.sqrt(cin),
              0.1 * rng.standard_normal(cexp), rng.standard_normal((kh, kw, cexp)) / np.sqrt(kh * kw),
              0.1 * rng.standard_normal(cexp)]
    return [a.astype(np.float16 if half else np.float32).astype(np.float32) for a in arrays]


def _attrs(case):
    *_, stride, padding, dilation, act, dw_act = case
    return {"strides": [stride, stride], "padding": padding, "dilations": [dilation, dilation],
            "activation": act, "dw_activation": dw_act}


def _expand(x, ew, eb):
    import tensorflow as tf

    return tf.nn.conv2d(x, ew[None, None], 1, "VALID") + eb


def _depthwise(e, dw, case):
    import tensorflow as tf

    *_, stride, padding, dilation, _, _ = case
    return tf.nn.depthwise_conv2d(e, dw[..., None], [1, stride, stride, 1], padding, dilations=[dilation, dilation])


def _reference(case, x, ew, eb, dw, db):
    """The op with TensorFlow's ops in float64."""
    x, ew, eb, dw, db = (a.astype(np.float64) for a in (x, ew, eb, dw, db))
    e = _act(case[10])(_expand(x, ew, eb))
    return _act(case[11])(_depthwise(e, dw, case) + db).numpy()


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_fused_expand_depthwise_matches_tf(device, case, schedule):
    cin, cexp = case[3], case[4]
    if SCHEDULES[schedule].get("strategy") == "expand_dw" and (cin % 4 or cexp % 4):
        with pytest.raises(KernelError, match="fused_expand_depthwise: strategy 'expand_dw' needs"):
            kernel_class("fused_expand_depthwise")([TensorSpec(a.shape) for a in _arrays(case)],
                                                   {**_attrs(case), **SCHEDULES[schedule]})
        return
    arrays = _arrays(case)
    (y,) = run_op(device, "fused_expand_depthwise", arrays, {**_attrs(case), **SCHEDULES[schedule]})
    ref = _reference(case, *arrays)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, **ACCUMULATION)


def test_default_strategy_is_one_dispatch_on_small_gpu_maps():
    """One dispatch on a GPU where the channels are multiples of 4 and the expansion is small (the measured
    cases: MediaPipe selfie segmentation's blocks); two on the software adapter, with channels that are not
    multiples of 4, and past 2**23 expand multiply-adds (where the staged convs measured faster)."""
    def programs(shape, cexp, target):
        specs = [TensorSpec(shape), TensorSpec((shape[3], cexp)), TensorSpec((cexp,)), TensorSpec((3, 3, cexp)),
                 TensorSpec((cexp,))]
        return [p.name for p in kernel_class("fused_expand_depthwise")(specs, {"target": target}).programs()]
    assert programs((1, 16, 16, 32), 128, "gpu") == ["fused_expand_depthwise"]
    assert programs((1, 128, 128, 16), 16, "gpu") == ["fused_expand_depthwise"]
    assert len(programs((1, 16, 16, 32), 128, "cpu")) == 2
    assert len(programs((1, 16, 16, 30), 128, "gpu")) == 2
    assert len(programs((32, 56, 56, 24), 144, "gpu")) == 2
    # no tile's halo and weights fit workgroup memory (1024 input channels): two dispatches, not an error
    assert len(programs((1, 1, 1, 1024), 8, "gpu")) == 2
    specs = [TensorSpec((1, 1, 1, 1024)), TensorSpec((1024, 8)), TensorSpec((8,)), TensorSpec((3, 3, 8)),
             TensorSpec((8,))]
    with pytest.raises(KernelError, match="fused_expand_depthwise: strategy 'expand_dw': no tile .* give strategy "
                                          "'staged'"):
        kernel_class("fused_expand_depthwise")(specs, {"strategy": "expand_dw"})


def test_strides_of_numpy_ints_are_taken(device):
    arrays = _arrays(CASES[0])
    attrs = {**_attrs(CASES[0]), "strides": np.int64(2), "dilations": np.array([1, 1])}
    (y,) = run_op(device, "fused_expand_depthwise", arrays, attrs)
    np.testing.assert_allclose(y, _reference(CASES[0], *arrays), **ACCUMULATION)


def test_empty_batch_has_no_dispatch_and_an_empty_output(device):
    arrays = _arrays(CASES[0])
    arrays[0] = arrays[0][:0]
    (y,) = run_op(device, "fused_expand_depthwise", arrays, _attrs(CASES[0]))
    assert y.shape == (0, 5, 4, 12) and y.dtype == np.float32


@pytest.mark.parametrize("shapes, attrs, message", [
    ([(1, 5, 5, 4), (3, 8), (8,), (3, 3, 8), (8,)], {}, r"weights do not fit 4 input channels"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 6), (8,)], {}, r"dw_w \[KH, KW, Cexp\]"),
    ([(1, 5, 5, 0), (0, 8), (8,), (3, 3, 8), (8,)], {}, "needs input channels"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"activation": "swoosh"}, "activation: unsupported"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"dw_activation": "leaky_relu"}, "has a parameter"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"padding": "FULL"}, "padding must be 'SAME' or 'VALID'"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"strides": [0, 1]}, "strides must be 2 ints >= 1"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"strides": 2.0}, "strides must be 2 ints >= 1"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"dilations": True}, "dilations must be 2 ints >= 1"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8), (8,)], {"strategy": "tiled"}, "strategy must be one of"),
    ([(1, 5, 5, 4), (4, 8), (8,), (3, 3, 8)], {}, "expects 5 inputs"),
])
def test_bad_shapes_and_attributes_are_named(shapes, attrs, message):
    with pytest.raises(KernelError, match=message) as err:
        kernel_class("fused_expand_depthwise")([TensorSpec(s) for s in shapes], attrs).programs()
    assert "fused_expand_depthwise" in str(err.value)


@pytest.mark.parametrize("strategy", ["staged", "expand_dw"])
@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=[_IDS[0], _IDS[3]])
def test_float16_plan_within_its_bound(device, case, strategy):
    """precision="float16": the output stored as float16, and where the staged strategy keeps the expanded
    tensor in a scratch buffer, that tensor too (half size), as the unfused graph's would be; sums in float32.

    Against TensorFlow in float64 on the same float16-representable inputs, each stage's worst case propagated
    elementwise into the next, with ``eps = 2**-10`` (one f16 ulp: WGSL lets a conversion to f16 round to
    either neighbour), ``2**-14`` per f16 store (subnormals may be flushed) and ``gamma(n, 2**-24)`` for a
    float32 sum of ``n`` terms (Higham 3.1); the cases' activations are 1-Lipschitz:

    - expanded ``e``: ``de = gamma(cin + 1) (|x| @ |ew| + |eb|)`` plus, where it is stored (staged),
      ``eps |e| + 2**-14``;
    - output ``y``: ``dw(de, |dw|) + gamma(kh kw + 1) (dw(|e| + de, |dw|) + |db|)``, then one f16 store."""
    arrays = _arrays(case, half=True)
    attrs = {**_attrs(case), "target": "gpu", "strategy": strategy}
    plan = op_plan(device, "fused_expand_depthwise", arrays, attrs, precision="float16")
    plan.run()
    got = plan.read(plan.graph.outputs[0])
    np.testing.assert_array_equal(got, got.astype(np.float16).astype(np.float32))   # stored as float16
    scratch = [plan.buffer_records[i]["size"] for i in plan.scratch_buffers[0]]
    n, h, w, cin, cexp = case[:5]
    # f16: 2 bytes a value (buffers are padded to 16 bytes)
    assert scratch == ([-(-n * h * w * cexp * 2 // 16) * 16] if strategy == "staged" else [])

    eps, flush, u32 = 2.0 ** -10, 2.0 ** -14, 2.0 ** -24
    x, ew, eb, dw, db = (a.astype(np.float64) for a in arrays)
    e = _act(case[10])(_expand(x, ew, eb)).numpy()
    de = gamma(cin + 1, u32) * _expand(np.abs(x), np.abs(ew), np.abs(eb)).numpy()
    if strategy == "staged":
        de += eps * np.abs(e) + flush
    d = _act(case[11])(_depthwise(e, dw, case) + db).numpy()
    sd = _depthwise(np.abs(e) + de, np.abs(dw), case).numpy() + np.abs(db)
    dd = _depthwise(de, np.abs(dw), case).numpy() + gamma(case[5] * case[6] + 1, u32) * sd
    bound = dd + eps * (np.abs(d) + dd) + flush
    err = np.abs(got.astype(np.float64) - d)
    assert (err <= bound).all(), f"worst {float((err / bound).max()):.3g} of the bound"
    assert float(bound.max()) < 0.05 * float(np.abs(d).max())   # the bound itself says something

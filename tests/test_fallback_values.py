"""What the CPU fallback does with values no runtime should run, with empty outputs and with custom ops.

- Run-time shape values (SLICE's begin and size, RESHAPE's shape, TRANSPOSE's perm...) that TensorFlow refuses
  eagerly are refused with a KernelError naming the op, its index and the value (tflfuse.runtime.validate), and
  never handed to LiteRT's CPU interpreter, which clamps some (XNNPACK's SLICE of constant begin and size) and
  computes something for others (TRANSPOSE with perm [0, 0]); valid
  values give LiteRT's builtin kernels' results, on the GPU or through the fallback.
- A CPU segment's empty output comes back as an empty array (LiteRT's get_tensor fails on it).
- A custom op that LiteRT's builtin op resolver runs (TFLite_Detection_PostProcess) falls back where its GPU
  kernel refuses it; one with invalid options is refused instead.
- The reasons fallback_ops gives are those of the invoke's own plan.

Tolerances: the ops move data and one ADD/MUL by a constant follows each: conftest's ELEMENTWISE (one rounding);
the SUM of three terms: conftest's ACCUMULATION. Detection outputs as tests/test_detection_postprocess.py.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter, OpResolverType
from conftest import ACCUMULATION, ELEMENTWISE

import tflfuse
from tflfuse.kernels import KernelError


def _convert(fn, *specs) -> bytes:
    f = tf.function(fn, input_signature=list(specs), autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _f(shape, name="x"):
    return tf.TensorSpec(shape, tf.float32, name=name)


def _i(shape, name):
    return tf.TensorSpec(shape, tf.int32, name=name)


def _builtin(model: bytes) -> LiteRTInterpreter:
    lite = LiteRTInterpreter(model_content=model,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    lite.allocate_tensors()
    return lite


def _run(interp, x, values) -> None:
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], x if d["dtype"] == np.float32 else np.asarray(values.pop(0), np.int32))
    interp.invoke()


#: name -> (the function, its int32 inputs' shapes, their values, the op's index in the file, tolerance); x is
#: float32 [2, 3]. Whether the values are valid is TensorFlow's answer, asked in the test.
CASES = {
    "slice_out_of_range": (lambda x, b, s: tf.slice(x, b, s) + 1.0, [[2], [2]], [[1, 1], [2, 2]], 0, ELEMENTWISE),
    "slice_negative_size": (lambda x, b, s: tf.slice(x, b, s) + 1.0, [[2], [2]], [[0, 0], [-2, 3]], 0, ELEMENTWISE),
    "slice": (lambda x, b, s: tf.slice(x, b, s) + 1.0, [[2], [2]], [[1, 1], [1, -1]], 0, ELEMENTWISE),
    "reshape_zero": (lambda x, s: tf.reshape(x, s) * 2.0, [[2]], [[0, 6]], 0, ELEMENTWISE),
    "reshape_two_stretch": (lambda x, s: tf.reshape(x, s) * 2.0, [[2]], [[-1, -1]], 0, ELEMENTWISE),
    "reshape": (lambda x, s: tf.reshape(x, s) * 2.0, [[2]], [[-1, 2]], 0, ELEMENTWISE),
    "transpose_repeated": (lambda x, p: tf.transpose(x, p) - 1.0, [[2]], [[0, 0]], 0, ELEMENTWISE),
    "transpose_negative": (lambda x, p: tf.transpose(x, p) - 1.0, [[2]], [[-1, 0]], 0, ELEMENTWISE),
    "sum_axis_out_of_range": (lambda x, a: tf.reduce_sum(x, a) + 1.0, [[1]], [[2]], 0, ACCUMULATION),
    "sum": (lambda x, a: tf.reduce_sum(x, a) + 1.0, [[1]], [[-1]], 0, ACCUMULATION),
    "pad_negative": (lambda x, p: tf.pad(x, p) * 3.0, [[2, 2]], [[[0, -1], [0, 0]]], 0, ELEMENTWISE),
    "tile_negative": (lambda x, m: tf.tile(x, m) + 1.0, [[2]], [[1, -1]], 0, ELEMENTWISE),
    "topk_past_the_row": (lambda x, k: tf.math.top_k(x, k)[0] - 1.0, [[]], [4], 0, ELEMENTWISE),
    "expand_dims_out_of_range": (lambda x, a: tf.expand_dims(x, a) + 1.0, [[]], [3], 0, ELEMENTWISE),
}


@pytest.mark.parametrize("name", list(CASES))
def test_run_time_shape_values_against_tensorflow(rng, name):
    """Values TensorFlow refuses eagerly: a KernelError naming the op, its index and the value, with or without
    the CPU fallback (never LiteRT's clamped or made-up result); values it takes: LiteRT's builtin kernels' result
    (plus TensorFlow's own, a third opinion)."""
    fn, shapes, values, index, tol = CASES[name]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    try:
        want = np.asarray(fn(tf.constant(x), *[tf.constant(v, tf.int32) for v in values]))
    except tf.errors.InvalidArgumentError:
        want = None
    model = _convert(fn, _f([2, 3]), *[_i(s, f"v{k}") for k, s in enumerate(shapes)])
    op = tflfuse.model.Model(model).op_name(0, index)
    for fallback in (True, False):
        ours = tflfuse.Interpreter(model_content=model, cpu_fallback=fallback)
        ours.allocate_tensors()
        if want is None:
            with pytest.raises(KernelError, match=rf"^{op} \(operator {index} of subgraph 0\): ") as err:
                _run(ours, x, list(values))
            assert "\n" not in str(err.value)
            if fallback:   # the refusal says why it does not fall back, and names the value
                assert "an invalid input" in str(err.value), str(err.value)
            continue
        _run(ours, x, list(values))
        lite = _builtin(model)
        _run(lite, x, list(values))
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        ref = lite.get_tensor(lite.get_output_details()[0]["index"])
        assert got.shape == ref.shape == want.shape
        np.testing.assert_allclose(got, ref, **tol)
        np.testing.assert_allclose(got, want, **tol)


def test_constant_repeated_perm_that_litert_runs():
    """TRANSPOSE with the constant perm [1, 1] (the converter folds such ops away, so the file is built here):
    LiteRT's builtin kernel gives a [3, 3] tensor of the [2, 3] input without a word; TensorFlow refuses it; the
    GPU kernel refuses it and it does not fall back."""
    from tflite_builder import build, t

    model = build([t((2, 3)), t((2,), type="INT32", data=np.array([1, 1], np.int32)), t((3, 3))],
                  [dict(op="TRANSPOSE", inputs=[0, 1], outputs=[2])], [0], [2])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    lite = _builtin(model)
    lite.set_tensor(lite.get_input_details()[0]["index"], x)
    lite.invoke()
    assert lite.get_tensor(lite.get_output_details()[0]["index"]).shape == (3, 3)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.transpose(x, [1, 1])
    with pytest.raises(KernelError, match=r"^TRANSPOSE \(operator 0 of subgraph 0\): .*an invalid input.*\[1, 1\]"):
        tflfuse.Interpreter(model_content=model).allocate_tensors()


def test_xnnpack_clamps_what_the_builtin_kernels_refuse():
    """Why the fallback's LiteRT interpreters use the builtin kernels alone (tflfuse.runtime.fallback.OP_RESOLVER):
    a SLICE of constant begin [1, 1] and size [2, 2] of a [2, 3] tensor (what a segment's file holds once the plan
    is specialised on run-time values) comes back clamped from XNNPACK, and refused by the builtin kernel, as
    TensorFlow refuses it."""
    from tflite_builder import build, t

    from tflfuse.runtime.fallback import OP_RESOLVER

    model = build([t((2, 3)), t((2,), type="INT32", data=np.array([1, 1], np.int32)),
                   t((2,), type="INT32", data=np.array([2, 2], np.int32)), t((2, 2))],
                  [dict(op="SLICE", inputs=[0, 1, 2], outputs=[3])], [0], [3])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    xnn = LiteRTInterpreter(model_content=model)
    xnn.allocate_tensors()
    xnn.set_tensor(xnn.get_input_details()[0]["index"], x)
    xnn.invoke()
    np.testing.assert_array_equal(xnn.get_tensor(xnn.get_output_details()[0]["index"]), [[4.0, 5.0]])   # clamped
    with pytest.raises(RuntimeError, match="Invalid begin and size"):
        _builtin(model).invoke()
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.slice(x, [1, 1], [2, 2])
    assert OP_RESOLVER == "BUILTIN_WITHOUT_DEFAULT_DELEGATES"


# ---- empty outputs of CPU segments ------------------------------------------------------------------------------
@pytest.mark.parametrize("then_gpu", [False, True], ids=["output", "read_by_gpu"])
def test_empty_cpu_output(rng, then_gpu):
    """RANGE (no GPU kernel) of n = 0 is empty: a model output as an empty int32 array of shape [0] (LiteRT's own
    get_tensor fails on it: "Invalid tensor size"), or read by GPU ops, as LiteRT and TensorFlow give it; then
    n = 4 again."""
    if then_gpu:
        fn, specs = (lambda x, n: tf.cast(tf.range(n), tf.float32) * 2.0 + tf.reduce_sum(x)), [_f([3]), _i([], "n")]
    else:
        fn, specs = (lambda n: tf.range(n)), [_i([], "n")]
    model = _convert(fn, *specs)
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    assert [op for _, op, _ in ours.fallback_ops] == ["RANGE"]
    x = rng.standard_normal(3).astype(np.float32)
    for n in (0, 4, 0):
        _run(ours, x, [n])
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        want = np.asarray(fn(tf.constant(x), tf.constant(n)) if then_gpu else fn(tf.constant(n)))
        assert got.shape == want.shape == (n,) and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, **ACCUMULATION)   # a SUM of 3 terms added to small integers
        if then_gpu:
            lite = _builtin(model)
            _run(lite, x, [n])
            np.testing.assert_allclose(got, lite.get_tensor(lite.get_output_details()[0]["index"]), **ELEMENTWISE)


# ---- the reasons of the last invoke's plan -------------------------------------------------------------------------
def test_refusal_reason_follows_the_run_time_shapes(rng):
    """A bool PAD (its GPU kernel takes float32 and int32) after a RESHAPE to run-time shapes: each plan's PAD falls
    back with its own input shape in the reason, [3, 4] then [4, 3] (not the first plan's)."""
    model = _convert(lambda x, s: tf.cast(tf.pad(tf.reshape(x, s) > 0.0, [[1, 0], [0, 1]]), tf.float32) * 2.0,
                     _f([2, 6]), _i([2], "s"))
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    x = rng.standard_normal((2, 6)).astype(np.float32)
    for shape in ([3, 4], [4, 3], [3, 4]):
        _run(ours, x, [shape])
        lite = _builtin(model)
        _run(lite, x, [shape])
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        np.testing.assert_array_equal(got, lite.get_tensor(lite.get_output_details()[0]["index"]))   # 0/1 doubled
        (index, op, reason), = ours.fallback_ops
        assert op == "PAD" and f"input shapes [{shape}" in reason, reason


# ---- custom ops LiteRT runs -----------------------------------------------------------------------------------------
def test_detection_postprocess_falls_back_where_its_kernel_refuses(device, rng, monkeypatch):
    """TFLite_Detection_PostProcess is in LiteRT's builtin op resolver: where its GPU kernel refuses it (a refusal
    made here by the kernel's check, as a GPU limit would) it runs on LiteRT's CPU interpreter, with LiteRT's
    results; with cpu_fallback=False the kernel's error is raised."""
    from test_detection_postprocess import BOXES, make_inputs, op_file, run_litert

    from tflfuse.kernels import kernel_class

    box, cls, anchors = make_inputs(rng, 9, 4)
    data = op_file(9, 4, anchors, {})
    cls_ = kernel_class("TFLite_Detection_PostProcess")
    check = cls_.check

    def refuse(self):
        check(self)
        raise self.fail("9 anchors are past this test's limit")

    monkeypatch.setattr(cls_, "check", refuse)
    ours = tflfuse.Interpreter(model_content=data, device=device)
    ours.allocate_tensors()
    (_, op, reason), = ours.fallback_ops
    assert op == "TFLite_Detection_PostProcess" and "9 anchors are past this test's limit" in reason, reason
    for d, value in zip(ours.get_input_details(), (box, cls)):
        ours.set_tensor(d["index"], value)
    ours.invoke()
    got = [ours.get_tensor(i) for i in (3, 4, 5, 6)]
    want = run_litert(data, [box, cls])
    num = int(want[3][0])
    assert num > 0 and got[3][0] == num
    np.testing.assert_allclose(got[0][0, :num], want[0][0, :num], **BOXES)   # the same kernel: equal in fact
    np.testing.assert_array_equal(got[1][0, :num], want[1][0, :num])
    np.testing.assert_array_equal(got[2][0, :num], want[2][0, :num])
    with pytest.raises(KernelError, match=r"TFLite_Detection_PostProcess \(operator 0 of subgraph 0\): .*limit"):
        tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False).allocate_tensors()


def test_detection_postprocess_with_invalid_options_does_not_fall_back(device, rng):
    """Regular NMS with max_classes_per_detection 0 (TFLite's kernel writes past its outputs) and an IoU threshold
    past 1 (TFLite refuses it): refused when the plan is made, naming the op, not run on LiteRT."""
    from test_detection_postprocess import make_inputs, op_file

    _, _, anchors = make_inputs(rng, 5, 4)
    for opts, what in ((dict(use_regular_nms=True, max_classes_per_detection=0), "max_classes_per_detection"),
                       (dict(nms_iou_threshold=1.5), "nms_iou_threshold")):
        with pytest.raises(KernelError, match=r"^TFLite_Detection_PostProcess \(operator 0 of subgraph 0\): ") as e:
            tflfuse.Interpreter(model_content=op_file(5, 4, anchors, opts), device=device).allocate_tensors()
        assert "an invalid input" in str(e.value) and what in str(e.value), str(e.value)


# ---- fused_bottleneck's tuning attributes -----------------------------------------------------------------------
@pytest.mark.parametrize("attrs,ignored", [
    ({"strategy": "staged", "tile": 4, "lanes": 2}, "lanes=2, tile=4"),
    ({"strategy": "tiled", "matmul_tile": "64x32/4x4/16"}, "matmul_tile='64x32/4x4/16'"),
    ({"strategy": "blocked", "splits": 2, "chunk": 4}, "splits=2"),
    ({"strategy": "tiled", "tile": 4, "lanes": 2}, None),
    ({"tile": 4, "lanes": 2}, None),   # no strategy named: the target's default takes what it reads
])
def test_bottleneck_attributes_of_another_strategy_warn(attrs, ignored):
    """A strategy named together with tuning attributes that only other strategies read: a warning naming them
    and the strategies that read them (the values do not depend on the strategy; the op still runs)."""
    from absl import logging as absl_logging

    from tflfuse.kernels import TensorSpec, kernel_class

    specs = [TensorSpec((1, 8, 8, 8)), TensorSpec((8, 48)), TensorSpec((48,)), TensorSpec((3, 3, 48)),
             TensorSpec((48,)), TensorSpec((48, 8)), TensorSpec((8,))]
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    catch = Catch()
    absl_logging.get_absl_logger().addHandler(catch)
    try:
        kernel_class("fused_bottleneck")(specs, {"expansion": 6, "target": "cpu", **attrs})
    finally:
        absl_logging.get_absl_logger().removeHandler(catch)
    lines = [m for m in seen if "ignores the tuning attribute" in m]
    if ignored is None:
        assert lines == []
    else:
        assert len(lines) == 1 and f"strategy {attrs['strategy']!r} ignores" in lines[0] and ignored in lines[0], lines

"""Unused outputs of fused ops are pruned by tflfuse.convert (tflfuse.passes.prune): a user's two-output
composite with one output used (the other becomes absent, -1), and composites.LSTM / GRU with
``return_state=True`` (or sequences) unused (the attributes are rewritten; an LSTM left with its sequence
alone becomes the builtin UNIDIRECTIONAL_SEQUENCE_LSTM). Each file is checked for dangling outputs and run
on tflfuse (the test device, llvmpipe where that is the adapter) and, in the composite form, on LiteRT's CPU
interpreter, against TensorFlow/Keras on the same model.

Tolerances (atol is the float32 floor: an output near 0 carries the absolute rounding of its O(1) terms,
~1e-7 per operation, not a relative error):

* TWO_OUT: one WGSL tanh (exp-based: ~1e-6 relative, conftest.TRANSCENDENTAL) or one product, then a
  FULLY_CONNECTED of K = 5 such terms summed in another order than TF's (a few ULP of O(1) sums):
  1e-5 absolute and relative leaves ~10x margin over both.
* RECURRENT (as tests/test_recurrent.py): per step F + U <= 11 products in another order and sigmoid/tanh
  (~1e-6 relative); the gates are contractive, so over T = 7 steps the error stays a few steps' worth:
  1e-5 on h, c in about [-2, 2] (measured ~3e-7 there). LiteRT's builtins differ from TF's by the same kind
  of reordering.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRT

import tflfuse
from composites.recurrent import GRU, LSTM
from tflfuse.annotate import composite, decode_attrs
from tflfuse.kernels.compose import register_composition
from tflfuse.model import Model
from tflfuse.passes.prune import prune_unused_outputs

TWO_OUT = dict(atol=1e-5, rtol=1e-5)
RECURRENT = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", autouse=True)
def _restore_kernel_registry():
    """The kernel registered here leaves the registry with this module (other tests list every key)."""
    from tflfuse.kernels import registry

    saved = dict(registry._KERNELS)
    register_composition("prune_test_two_out", _two_out_kernel, input_names=("x", "w"))
    yield
    registry._KERNELS.clear()
    registry._KERNELS.update(saved)


# ---- helpers ------------------------------------------------------------------------------------------------
def dangling(m: Model) -> list[tuple]:
    """(subgraph, operator, op name, tensor) of every op output that no op and no subgraph output reads, over
    the subgraphs that are not STABLEHLO_COMPOSITE decompositions (whose builtins are TFLite's own)."""
    found = []
    skip = m.decompositions()
    for sg in range(len(m.subgraphs)):
        if sg in skip:
            continue
        ops = range(len(m.subgraphs[sg].operators))
        read = {t for i in ops for t in m.op_inputs(sg, i)} | {int(t) for t in m.subgraphs[sg].outputs}
        found += [(sg, i, m.op_name(sg, i), t) for i in ops for t in m.op_outputs(sg, i) if t >= 0 and t not in read]
    return found


def run_tflfuse(tflite: bytes, inputs: dict, device) -> dict:
    return tflfuse.Interpreter(model_content=tflite, device=device).get_signature_runner("serving_default")(**inputs)


def run_litert(tflite: bytes, inputs: dict) -> dict:
    return LiteRT(model_content=tflite).get_signature_runner("serving_default")(**inputs)


def assert_matches(got: dict, want: dict, tol: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == np.float32, k
        np.testing.assert_allclose(got[k], want[k], **tol, err_msg=k)


# ---- (a) a user's composite with two outputs, one of them used -----------------------------------------------
@composite("prune_test_two_out", gain=1.0)
def two_out(x, w, *, gain):
    """``(x * w, tanh(x + w))`` over the last axis; its kernel is a composition of MUL, ADD and TANH."""
    return x * w * gain, tf.tanh(x + w) * gain


def _two_out_kernel(chain, x, w, *, gain):
    if gain != 1.0:   # the model below uses gain 1: the chain needs no scaling step
        raise ValueError(f"this test kernel computes gain 1 only, got {gain}")
    return chain.call("MUL", [x, w]), chain.call("TANH", [chain.call("ADD", [x, w])])


class TwoOut(keras.layers.Layer):
    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(int(shape[-1]),), initializer="zeros")
        self.w.assign(np.linspace(-0.8, 0.9, int(shape[-1])).astype(np.float32))

    def call(self, x):
        return two_out(x, self.w, gain=1.0)


def two_out_model(used: int):
    """clip(Dense(TwoOut(x)[used])): the converter writes the clip as MINIMUM + MAXIMUM, a pattern that
    `tflfuse fuse` rewrites."""
    x = keras.Input((4, 5), batch_size=2, name="x")
    y = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(3))(TwoOut()(x)[used])
    y = keras.ops.clip(y, -0.5, 0.7)
    return keras.Model(x, {"out": y})


@pytest.fixture(scope="module", params=[0, 1], ids=["first-used", "second-used"])
def two_out_case(request):
    model = two_out_model(request.param)
    inputs = {"x": np.random.default_rng(5).uniform(-2, 2, (2, 4, 5)).astype(np.float32)}
    want = {k: np.asarray(v) for k, v in model(inputs["x"]).items()}
    return dict(used=request.param, model=model, inputs=inputs, want=want)


def test_two_output_composite_unused_output_is_absent(two_out_case, device):
    result = tflfuse.convert(two_out_case["model"])
    assert result.report.ok and result.report.fused("prune_test_two_out") == 1
    m = Model(result.tflite)
    (op,) = [i for i, n in enumerate(m.op_names(0)) if n == "prune_test_two_out"]
    outs = m.op_outputs(0, op)
    assert len(outs) == 2 and outs[1 - two_out_case["used"]] == -1 and outs[two_out_case["used"]] >= 0
    assert dangling(m) == []
    assert_matches(run_tflfuse(result.tflite, two_out_case["inputs"], device), two_out_case["want"], TWO_OUT)

    # `tflfuse fuse` plans and rewrites a file with an absent output (here MINIMUM + MAXIMUM into a clip).
    assert {"MINIMUM", "MAXIMUM"} <= set(m.op_names(0))
    fused, _ = tflfuse.fuse(result.tflite)
    fm = Model(fused)
    assert "fused_clip" in fm.op_names(0) and fm.op_outputs(0, fm.op_names(0).index("prune_test_two_out")) == outs
    assert_matches(run_tflfuse(fused, two_out_case["inputs"], device), two_out_case["want"], TWO_OUT)


def test_two_output_composite_in_composite_form_keeps_the_output(two_out_case, device):
    """LiteRT's STABLEHLO_COMPOSITE kernel needs every output (it crashes on -1): the composite form keeps
    the unused one as a tensor nothing reads (the documented exception), and LiteRT and tflfuse run it."""
    result = tflfuse.convert(two_out_case["model"], fused_op_format="composite")
    assert result.report.ok and result.report.fused("prune_test_two_out") == 1
    m = Model(result.tflite)
    (op,) = [i for i in range(len(m.subgraphs[0].operators)) if m.composite(0, i) is not None]
    assert all(t >= 0 for t in m.op_outputs(0, op))
    assert dangling(m) == [(0, op, "STABLEHLO_COMPOSITE", m.op_outputs(0, op)[1 - two_out_case["used"]])]
    assert_matches(run_litert(result.tflite, two_out_case["inputs"]), two_out_case["want"], TWO_OUT)
    assert_matches(run_tflfuse(result.tflite, two_out_case["inputs"], device), two_out_case["want"], TWO_OUT)


def test_composite_form_of_an_absent_output_is_refused(two_out_case):
    from tflfuse.conversion import ConversionError
    from tflfuse.passes.portable import to_composite_format

    custom = tflfuse.convert(two_out_case["model"]).tflite
    with pytest.raises(ConversionError, match="absent output"):
        to_composite_format(custom)


# ---- (b) recurrent composites whose states (or sequence) are unused --------------------------------------------
def keras_pair(kind: str, n: int, t: int, f: int, u: int, use, **kwargs):
    """keras.layers.<kind> with random weights and composites.<kind> with the same ones, each in a model whose
    outputs are the layer outputs named in ``use`` (of ``y``, ``h``, ``c``: Keras' [output, *states])."""
    rng = np.random.default_rng(11)
    ref = getattr(keras.layers, kind)(u, **kwargs)
    ref.build((None, t, f))
    weights = [(rng.standard_normal(w.shape) * (1 / np.sqrt(w.shape[0]) if i < 2 else 0.3)).astype(np.float32)
               for i, w in enumerate(ref.get_weights())]
    ref.set_weights(weights)
    ours = (LSTM if kind == "LSTM" else GRU)(u, **kwargs)
    models = []
    for layer in (ref, ours):
        x = keras.Input((t, f), batch_size=n, name="x")
        out = dict(zip("yhc", layer(x)))
        models.append(keras.Model(x, {name: out[name] for name in use}))
    ours.set_weights(weights)
    inputs = {"x": rng.standard_normal((n, t, f)).astype(np.float32)}
    return models[1], inputs, {k: np.asarray(v) for k, v in models[0](inputs["x"]).items()}


def test_lstm_states_unused_becomes_the_builtin(device):
    """The issue's case: return_state=True, only the sequence used. The states go (return_state off), so the
    op is the builtin UNIDIRECTIONAL_SEQUENCE_LSTM in both forms, and LiteRT runs it as tflfuse does."""
    model, inputs, want = keras_pair("LSTM", 3, 7, 5, 6, "y", return_sequences=True, return_state=True)
    for fmt in ("custom", "composite"):
        result = tflfuse.convert(model, fused_op_format=fmt)
        assert result.report.ok and result.report.fused("fused_lstm") == 1
        m = Model(result.tflite)
        assert m.op_names(0) == ["UNIDIRECTIONAL_SEQUENCE_LSTM"] and len(m.subgraphs) == 1
        assert len(m.op_outputs(0, 0)) == 1 and dangling(m) == []
        assert_matches(run_tflfuse(result.tflite, inputs, device), want, RECURRENT)
        assert_matches(run_litert(result.tflite, inputs), want, RECURRENT)


RECURRENT_CASES = [  # (kind, layer kwargs, outputs used, attrs after pruning, positions absent in the custom form)
    ("LSTM", dict(return_sequences=True, return_state=True, go_backwards=True), "y",
     dict(return_sequences=True, return_state=False), []),
    ("LSTM", dict(return_sequences=True, return_state=True), "h",
     dict(return_sequences=False, return_state=False), []),
    ("LSTM", dict(return_sequences=True, return_state=True), "yc",
     dict(return_sequences=True, return_state=True), [1]),
    ("LSTM", dict(return_state=True), "c",
     dict(return_sequences=False, return_state=True), [0]),
    ("GRU", dict(return_sequences=True, return_state=True), "y",
     dict(return_sequences=True, return_state=False), []),
    ("GRU", dict(return_sequences=True, return_state=True, go_backwards=True), "h",
     dict(return_sequences=False, return_state=False), []),
]


@pytest.mark.parametrize("kind, kwargs, use, attrs, absent", RECURRENT_CASES,
                         ids=[f"{c[0]}-{'-'.join(k for k, v in c[1].items() if v)}-uses-{c[2]}"
                              for c in RECURRENT_CASES])
def test_recurrent_unused_outputs_are_pruned(device, kind, kwargs, use, attrs, absent):
    model, inputs, want = keras_pair(kind, 2, 7, 5, 6, use, **kwargs)
    name = f"fused_{kind.lower()}"

    result = tflfuse.convert(model)
    assert result.report.ok and result.report.fused(name) == 1
    m = Model(result.tflite)
    assert m.op_names(0) == [name] and dangling(m) == []
    got_attrs = decode_attrs(m.op_attrs(0, 0))
    assert {k: got_attrs[k] for k in attrs} == attrs
    outs = m.op_outputs(0, 0)
    assert [i for i, t in enumerate(outs) if t < 0] == absent
    assert_matches(run_tflfuse(result.tflite, inputs, device), want, RECURRENT)

    # unfuse expands the op, absent outputs included, into builtins that LiteRT runs.
    unfused, counts = tflfuse.unfuse(result.tflite)
    assert counts == {name: 1}
    assert_matches(run_litert(unfused, inputs), want, RECURRENT)

    # The composite form: the same attributes; an output the custom form drops as -1 stays (LiteRT needs it).
    portable = tflfuse.convert(model, fused_op_format="composite")
    assert portable.report.ok and portable.report.fused(name) == 1
    pm = Model(portable.tflite)
    assert pm.composite(0, 0).name == name and decode_attrs(pm.op_attrs(0, 0)) == got_attrs
    assert all(t >= 0 for t in pm.op_outputs(0, 0)) and len(pm.op_outputs(0, 0)) == len(outs)
    assert [t for *_, t in dangling(pm)] == [pm.op_outputs(0, 0)[i] for i in absent]
    assert_matches(run_litert(portable.tflite, inputs), want, RECURRENT)
    assert_matches(run_tflfuse(portable.tflite, inputs, device), want, RECURRENT)


# ---- the pass itself ----------------------------------------------------------------------------------------------
def test_pass_leaves_files_without_unused_outputs_alone():
    model, _, _ = keras_pair("LSTM", 1, 3, 2, 2, "yhc", return_sequences=True, return_state=True)
    tflite = tflfuse.convert(model).tflite
    m = Model(tflite)
    assert m.op_names(0) == ["fused_lstm"] and len(m.op_outputs(0, 0)) == 3
    again, pruned = prune_unused_outputs(tflite)
    assert again is tflite and not pruned

"""LSTM and GRU as one op: composites.recurrent against keras.layers.LSTM / keras.layers.GRU with the same
weights, the fused kernels (both strategies) and the builtin UNIDIRECTIONAL_SEQUENCE_LSTM (against Keras and
LiteRT's own kernel), conversion to exactly one op, and the refusals (masks, stateful layers).

Tolerance (RECURRENT): each step sums F + U <= ~520 products of O(1) values in another order than TF's (a few
ULP, ~1e-7), then applies sigmoid/tanh (WGSL's exp/tanh: ~1e-6 relative at most); the gates are contractive
(|d sigmoid| <= 1/4, |d tanh| <= 1, forget gate < 1), so per-step errors do not compound beyond a few
steps' worth: 1e-5 absolute on h, c in about [-2, 2] holds with ~30x margin (measured ~3e-7).
"""

import keras
import numpy as np
import pytest

import tflfuse
from composites.recurrent import GRU, LSTM, fused_lstm, gru, lstm
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec
from tflfuse.model import Model
from tflfuse.runtime.plan import run_op

RECURRENT = dict(atol=1e-5, rtol=1e-5)


# ---- references -------------------------------------------------------------------------------------------
def keras_layer(kind, units, features, rng, **kwargs):
    """keras.layers.LSTM/GRU with random weights (biases too, so every gate term matters)."""
    layer = getattr(keras.layers, kind)(units, **kwargs)
    layer.build((None, None, features))
    weights = []
    for i, w in enumerate(layer.get_weights()):   # kernel, recurrent_kernel, bias
        scale = 1.0 / np.sqrt(w.shape[0]) if i < 2 else 0.3
        weights.append((rng.standard_normal(w.shape) * scale).astype(np.float32))
    layer.set_weights(weights)
    return layer, weights


def keras_outputs(layer, x, state=None):
    out = layer(x, initial_state=state) if state is not None else layer(x)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def op_outputs(kind, ref, return_sequences, return_state):
    """Keras' [y, h, (c)] as the fused op gives them: h only with return_sequences."""
    if not return_state:
        return ref[:1]
    return [ref[0]] + ([ref[1]] if return_sequences else []) + ref[2:]


def state_of(kind, rng, n, u):
    h0 = rng.uniform(-0.8, 0.8, (n, u)).astype(np.float32)
    return [h0, rng.uniform(-1.5, 1.5, (n, u)).astype(np.float32)] if kind == "LSTM" else [h0]


# ---- the kernels, both strategies, against Keras ----------------------------------------------------------
CELLS = [("LSTM", {}), ("GRU", {"reset_after": True}), ("GRU", {"reset_after": False})]
SHAPES = [(1, 7, 5, 6), (3, 7, 6, 5)]        # (N, T, F, U): odd T, F and U not multiples of 4, batch 1 and 3
FLAGS = [  # (return_sequences, return_state, go_backwards, initial_state)
    (True, True, False, False),
    (False, True, True, True),
    (True, False, True, True),
    (False, False, False, False),
]


def _id(cell, shape, flags, strategy):
    names = ("seq", "state", "back", "init")
    return "-".join([cell[0] + ("" if not cell[1] or cell[1]["reset_after"] else "-noreset"),
                     "x".join(map(str, shape))] + [n for n, f in zip(names, flags) if f] + [strategy])


RUNS = [pytest.param(c, s, f, st, id=_id(c, s, f, st)) for c in CELLS for s in SHAPES for f in FLAGS
        for st in ("single", "stepwise")]


@pytest.mark.parametrize("cell, shape, flags, strategy", RUNS)
def test_kernel_matches_keras(device, rng, cell, shape, flags, strategy):
    (kind, extra), (n, t, f, u) = cell, shape
    seq, state, back, init = flags
    layer, weights = keras_layer(kind, u, f, rng, return_sequences=seq, return_state=state, go_backwards=back,
                                 **extra)
    x = rng.standard_normal((n, t, f)).astype(np.float32)
    s0 = state_of(kind, rng, n, u) if init else None
    expected = op_outputs(kind, keras_outputs(layer, x, s0), seq, state)
    attrs = dict(return_sequences=seq, return_state=state, go_backwards=back, initial_state=init,
                 strategy=strategy, **extra)
    inputs = [x] + weights + (s0 or [])
    constant = [False] + [True] * len(weights) + [False] * len(s0 or [])   # weights constant, states runtime
    got = run_op(device, f"fused_{kind.lower()}", inputs, attrs, constant=constant)
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, **RECURRENT)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("strategy", ["single", "stepwise"])
def test_kernel_without_bias_and_other_activations(device, rng, kind, strategy):
    layer, weights = keras_layer(kind, 9, 3, rng, use_bias=False, activation="relu",
                                 recurrent_activation="hard_sigmoid", return_sequences=True)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    expected = keras_outputs(layer, x)
    got = run_op(device, f"fused_{kind.lower()}", [x] + weights,
                 dict(use_bias=False, activation="relu", recurrent_activation="hard_sigmoid", return_sequences=True,
                      strategy=strategy))
    np.testing.assert_allclose(got[0], expected[0], **RECURRENT)


def test_strategy_choice():
    """single: one dispatch; stepwise past 256 units, and on the software adapter past its loop budget."""
    def kernel(n, t, f, u, **attrs):
        specs = [TensorSpec((n, t, f)), TensorSpec((f, 4 * u)), TensorSpec((u, 4 * u)), TensorSpec((4 * u,))]
        return kernel_class("fused_lstm")(specs, attrs)

    small = kernel(3, 7, 5, 6, return_sequences=True)
    assert small.strategy == "single" and len(small.programs()) == 1
    assert kernel(1, 4, 8, 300).strategy == "stepwise"
    assert kernel(1, 2000, 64, 64, target="gpu").strategy == "single"
    long = kernel(1, 2000, 64, 64, target="cpu")
    assert long.strategy == "stepwise"
    progs = long.programs()
    assert len(progs) == 2 + 2000 and len({p.source for p in progs[2:]}) == 1   # one pipeline for all steps
    assert max(p.loop_trips for p in progs) < 1 << 15
    with pytest.raises(KernelError, match="single-dispatch strategy needs U <= 256"):
        kernel(1, 4, 8, 300, strategy="single")


@pytest.mark.parametrize("t, f, u", [(300, 8, 260), (1300, 4, 100)])
def test_long_sequences_stepwise(device, rng, t, f, u):
    """Past 256 units, and past the single dispatch's loop budget on the software adapter (target cpu)."""
    layer, weights = keras_layer("LSTM", u, f, rng, return_state=True)
    x = rng.standard_normal((2, t, f)).astype(np.float32)
    y, h, c = keras_outputs(layer, x)
    got = run_op(device, "fused_lstm", [x] + weights, dict(return_state=True, target="cpu"))
    for g, e in zip(got, [y, c]):
        np.testing.assert_allclose(g, e, **RECURRENT)


# ---- the composites and layers ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_layer_takes_keras_weights(rng, kind):
    ref, weights = keras_layer(kind, 5, 7, rng, return_sequences=True, return_state=True)
    ours = (LSTM if kind == "LSTM" else GRU)(5, return_sequences=True, return_state=True)
    x = rng.standard_normal((2, 6, 7)).astype(np.float32)
    ours(x)
    ours.set_weights(weights)
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in weights]
    for g, e in zip(ours(x), keras_outputs(ref, x)):
        np.testing.assert_allclose(g, e, **RECURRENT)


def test_unit_forget_bias_initializer():
    layer = LSTM(3)
    layer.build((None, 4, 2))
    np.testing.assert_array_equal(layer.get_weights()[2], [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0])


def test_functions_set_use_bias_and_initial_state(rng):
    k, r, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 12), (3, 12), (12,)))
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    assert lstm(x, k, r, b).shape == (2, 3)
    assert gru(x, k[:, :9], r[:, :9], None, np.zeros((2, 3), np.float32), return_sequences=True).shape == (2, 5, 3)
    with pytest.raises(ValueError, match="use_bias=True and initial_state=False must match"):
        fused_lstm(x, k, r, None)
    with pytest.raises(ValueError, match="kernel"):
        lstm(x, k[:3], r, b)


@pytest.mark.parametrize("kwargs, match", [(dict(stateful=True), "stateful=True is not supported"),
                                           (dict(time_major=True), "time_major=True is not supported"),
                                           (dict(dropout=0.2), "dropout"),
                                           (dict(activation="softsign"), "activation='softsign'")])
def test_layer_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LSTM(4, **kwargs)


@pytest.mark.parametrize("masker", ["Masking", "Embedding"])
def test_mask_refused_at_conversion(masker):
    if masker == "Masking":
        inp = keras.Input((7, 5), batch_size=1)
        y = keras.layers.Masking()(inp)
    else:
        inp = keras.Input((7,), batch_size=1, dtype="int32")
        y = keras.layers.Embedding(10, 5, mask_zero=True)(inp)
    with pytest.warns(UserWarning, match="mask"):   # Keras' own warning when the model is built
        model = keras.Model(inp, GRU(4)(y))
    with pytest.raises(ValueError, match="carries a Keras mask"):
        tflfuse.convert(model)


# ---- conversion: one op, run on tflfuse and LiteRT --------------------------------------------------------
def convert_pair(rng, kind, n, t, f, u, initial_state=False, **kwargs):
    """A Keras model of keras.layers.<kind> and the same of ours (same weights), outputs as a dict."""
    ref, weights = keras_layer(kind, u, f, rng, **kwargs)
    ours = (LSTM if kind == "LSTM" else GRU)(u, **kwargs)
    models = []
    for layer in (ref, ours):
        x = keras.Input((t, f), batch_size=n, name="x")
        states = [keras.Input((u,), batch_size=n, name=f"s{i}") for i in range(2 if kind == "LSTM" else 1)] \
            if initial_state else []
        out = layer(x, initial_state=states) if states else layer(x)
        out = out if isinstance(out, (list, tuple)) else [out]
        models.append(keras.Model([x] + states, {f"out{i}": o for i, o in enumerate(out)}))
    ours.set_weights(weights)
    inputs = {"x": rng.standard_normal((n, t, f)).astype(np.float32)}
    if initial_state:
        inputs.update({f"s{i}": s for i, s in enumerate(state_of(kind, rng, n, u))})
    expected = {k: np.asarray(v) for k, v in models[0](inputs).items()}
    return models[1], inputs, expected


def run_signature(interp, inputs):
    return interp.get_signature_runner("serving_default")(**inputs)


CONVERSIONS = [  # (kind, N, T, F, U, initial_state, layer kwargs, the op in the .tflite)
    ("LSTM", 3, 7, 5, 6, False, dict(return_sequences=True), "UNIDIRECTIONAL_SEQUENCE_LSTM"),
    ("LSTM", 1, 7, 6, 5, False, dict(return_sequences=True, use_bias=False), "UNIDIRECTIONAL_SEQUENCE_LSTM"),
    ("LSTM", 1, 7, 5, 6, False, dict(), "fused_lstm"),
    ("LSTM", 3, 7, 5, 6, False, dict(return_sequences=True, return_state=True), "fused_lstm"),
    ("LSTM", 3, 7, 6, 5, True, dict(return_state=True), "fused_lstm"),
    ("LSTM", 1, 7, 5, 6, False, dict(return_sequences=True, go_backwards=True), "fused_lstm"),
    ("GRU", 3, 7, 5, 6, False, dict(return_sequences=True), "fused_gru"),
    ("GRU", 1, 7, 6, 5, True, dict(return_state=True, go_backwards=True, reset_after=False), "fused_gru"),
]


_CONVERSION_IDS = [f"{c[0]}-{c[1]}x{c[2]}x{c[3]}x{c[4]}-" + "-".join(sorted(c[6])) + ("-init" if c[5] else "")
                   for c in CONVERSIONS]


@pytest.mark.parametrize("kind, n, t, f, u, init, kwargs, op", CONVERSIONS, ids=_CONVERSION_IDS)
def test_converts_to_one_op(device, rng, kind, n, t, f, u, init, kwargs, op):
    model, inputs, expected = convert_pair(rng, kind, n, t, f, u, init, **kwargs)
    result = tflfuse.convert(model)
    assert Model(result.tflite).op_names(0) == [op] and len(Model(result.tflite).subgraphs) == 1
    assert result.report.fused(f"fused_{kind.lower()}") == 1
    interp = tflfuse.Interpreter(model_content=result.tflite, device=device)
    got = run_signature(interp, inputs)
    assert sorted(got) == sorted(expected)
    for k in expected:
        assert got[k].shape == expected[k].shape
        np.testing.assert_allclose(got[k], expected[k], **RECURRENT)
    again = run_signature(interp, inputs)      # every invoke starts from the initial state, as Keras does
    for k in expected:
        np.testing.assert_array_equal(again[k], got[k])
    if op == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        from ai_edge_litert.interpreter import Interpreter as LiteRT

        litert = LiteRT(model_content=result.tflite)
        first = run_signature(litert, inputs)
        for k in expected:
            np.testing.assert_allclose(first[k], expected[k], **RECURRENT)
        # LiteRT keeps the final state in the op's variable tensors: the next invoke continues from it
        # unless reset_all_variables() is called (tflfuse.passes.lstm documents this).
        litert.reset_all_variables()
        for k, v in run_signature(litert, inputs).items():
            np.testing.assert_allclose(v, expected[k], **RECURRENT)
        # The same call sequence on tflfuse (its reset is a no-op: no state outlives an invoke).
        interp.reset_all_variables()
        for k, v in run_signature(interp, inputs).items():
            np.testing.assert_array_equal(v, got[k])


def test_unused_outputs_are_not_in_the_op(rng):
    """return_sequences=False: the op has no [N, T, U] output; return_state without return_sequences: the
    state h is the output itself, so the op has two outputs (y, c), not three."""
    model, _, _ = convert_pair(rng, "LSTM", 2, 7, 5, 6, return_state=True)
    m = Model(tflfuse.convert(model).tflite)
    assert [m.tensor_shape(0, t) for t in m.op_outputs(0, 0)] == [(2, 6), (2, 6)]
    kernel = kernel_class("fused_lstm")([TensorSpec((2, 7, 5)), TensorSpec((5, 24)), TensorSpec((6, 24)),
                                         TensorSpec((24,))], {})
    outputs = {b.name for p in kernel.programs() for b in p.bindings if b.role[0] == "output"}
    assert outputs == {"y"} and "y[((n)" not in kernel.programs()[-1].source   # no per-step sequence write


def test_keras_lstm_converts_to_a_while_loop(rng):
    """The baseline this replaces: Keras 3's own LSTM becomes a WHILE loop over three subgraphs."""
    x = keras.Input((7, 5), batch_size=1)
    m = Model(tflfuse.convert(keras.Model(x, keras.layers.LSTM(6, return_sequences=True)(x))).tflite)
    ops = [name for sg in range(len(m.subgraphs)) for name in m.op_names(sg)]
    assert len(m.subgraphs) == 3 and "WHILE" in ops and len(ops) > 20


# ---- the builtin's variants, against LiteRT's kernel -------------------------------------------------------
def _lowered(rng, n=2, t=7, f=5, u=6):
    model, inputs, _ = convert_pair(rng, "LSTM", n, t, f, u, return_sequences=True)
    return Model(tflfuse.convert(model).tflite), inputs


@pytest.mark.parametrize("variant", ["cell_clip", "time_major"])
def test_builtin_variants_match_litert(device, rng, variant):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    m, inputs = _lowered(rng)
    op = m.m.subgraphs[0].operators[0]
    x = inputs["x"]
    if variant == "cell_clip":
        op.builtinOptions.cellClip = 0.3
    else:   # the same tensors read as [T, N, F] -> [T, N, U]
        op.builtinOptions.timeMajor = True
        for t in (op.inputs[0], op.outputs[0]):
            shape = m.m.subgraphs[0].tensors[t].shape
            m.m.subgraphs[0].tensors[t].shape = np.asarray([shape[1], shape[0], shape[2]], np.int32)
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    data = m.to_bytes()
    expected = run_signature(LiteRT(model_content=data), {"x": x})
    got = run_signature(tflfuse.Interpreter(model_content=data, device=device), {"x": x})
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], **RECURRENT)


def test_builtin_refuses_other_variants():
    u, f = 6, 5
    shapes = [(2, 7, f)] + [(u, f)] * 4 + [(u, u)] * 4 + [None] * 3 + [(u,)] * 4 + [None] * 8
    assert tflfuse.get_shader("UNIDIRECTIONAL_SEQUENCE_LSTM", shapes).output_shapes == ((2, 7, u),)
    peephole = list(shapes)
    peephole[10] = (u,)
    with pytest.raises(KernelError, match="cell_to_forget_weights"):
        tflfuse.get_shader("UNIDIRECTIONAL_SEQUENCE_LSTM", peephole)
    cifg = list(shapes)
    cifg[1] = None
    with pytest.raises(KernelError, match="CIFG"):
        tflfuse.get_shader("UNIDIRECTIONAL_SEQUENCE_LSTM", cifg)

"""Keras 3's own ``keras.layers.LSTM`` and ``keras.layers.GRU`` (not the project's composites), converted by the
stock ``tf.lite.TFLiteConverter.from_keras_model``: the converter writes each layer as a WHILE loop over a
cond and a body subgraph (and REVERSE_V2 around the backward half of a ``Bidirectional``), which tflfuse runs
(WHILE on LiteRT's CPU interpreter within the same invoke, see tflfuse/runtime/fallback.py), matched against
Keras itself on the same input.

Weights are random (seeded), biases too, so every gate term matters; sizes are odd and not multiples of 4,
at batch 1 and 3.

Tolerance (as tests/test_recurrent.py's RECURRENT): each step sums F + U products of O(1) values in another
order than TF's (a few ULP) and applies sigmoid/tanh; the gates are contractive, so errors do not compound:
1e-5 absolute and relative on outputs in about [-1, 1] (measured <= 2e-7).
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SEED
from tflfuse.model import Model

RECURRENT = dict(atol=1e-5, rtol=1e-5)


def keras_rnn_model(layer: str, kwargs: dict, bidirectional: bool, *, batch: int, steps: int, features: int,
                    units: int) -> keras.Model:
    """``[batch, steps, features]`` float32 -> the layer's output, with seeded random weights (biases too)."""
    keras.utils.set_random_seed(SEED)
    rnn = getattr(keras.layers, layer)(units, **kwargs)
    if bidirectional:
        rnn = keras.layers.Bidirectional(rnn)
    x = keras.Input((steps, features), batch_size=batch)
    model = keras.Model(x, rnn(x))
    rng = np.random.default_rng(SEED)
    model.set_weights([(rng.standard_normal(w.shape) * (1.0 / np.sqrt(w.shape[0]) if w.ndim == 2 else 0.3))
                       .astype(np.float32) for w in model.get_weights()])
    return model


def rnn_inputs(batch: int, steps: int, features: int) -> np.ndarray:
    return np.random.default_rng(SEED + 1).standard_normal((batch, steps, features)).astype(np.float32)


def _convert(model: keras.Model) -> bytes:
    with contextlib.redirect_stdout(io.StringIO()):   # the converter's SavedModel export prints its signature
        return tf.lite.TFLiteConverter.from_keras_model(model).convert()


CASES = [  # (layer, kwargs, bidirectional, batch, steps, features, units)
    ("LSTM", {}, False, 1, 7, 5, 6),
    ("LSTM", dict(return_sequences=True), False, 3, 5, 6, 3),
    ("LSTM", dict(return_sequences=True, go_backwards=True), False, 1, 6, 3, 5),
    ("LSTM", dict(return_sequences=True), True, 3, 7, 5, 6),
    ("GRU", {}, False, 3, 7, 5, 6),
    ("GRU", dict(return_sequences=True, reset_after=False), False, 1, 5, 6, 3),
    ("GRU", {}, True, 1, 7, 5, 6),
]


def _id(case):
    layer, kwargs, bi, n, t, f, u = case
    return "-".join([("Bidirectional-" if bi else "") + layer, *sorted(kwargs), f"{n}x{t}x{f}x{u}"])


@pytest.mark.parametrize("layer, kwargs, bidirectional, n, t, f, u", CASES, ids=[_id(c) for c in CASES])
def test_matches_keras(device, layer, kwargs, bidirectional, n, t, f, u):
    model = keras_rnn_model(layer, kwargs, bidirectional, batch=n, steps=t, features=f, units=u)
    data = _convert(model)
    ops = {name for sg in range(len(Model(data).subgraphs)) for name in Model(data).op_names(sg)}
    assert "WHILE" in ops, "the stock converter writes Keras' recurrent layers as WHILE loops"
    x = rnn_inputs(n, t, f)
    expected = np.asarray(model(x))
    interp = tflfuse.Interpreter(model_content=data, device=device)
    assert {name for _, name, _ in interp.fallback_ops} <= {"WHILE"}, interp.fallback_ops
    interp.allocate_tensors()
    (d,) = interp.get_input_details()
    interp.set_tensor(d["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.ptp(expected) > 0.2, "the outputs must spread for the comparison to mean something"
    print(f"{_id((layer, kwargs, bidirectional, n, t, f, u))}: err {np.max(np.abs(got - expected)):.3g}")
    np.testing.assert_allclose(got, expected, **RECURRENT)
    interp.invoke()                           # the loop starts from the zero state at every invoke, as Keras
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), got)

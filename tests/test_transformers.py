"""Transformer encoders built from Keras layers (``Embedding``, ``MultiHeadAttention``, ``LayerNormalization``,
``Dense`` with GELU), converted by the stock ``tf.lite.TFLiteConverter.from_keras_model`` and run on tflfuse,
matched against LiteRT's CPU interpreter on the same file.

Two models, with random weights (seeded): a BERT-style encoder (token and learned positional embeddings, an
attention mask from the padding ids, post-LayerNorm blocks, exact GELU, a tanh pooler over the first token) and
a ViT-style classifier (a patch convolution, a learned class token and positional embedding, pre-LayerNorm
blocks, tanh-approximated GELU, a classifier over the class token). The converter writes them with GATHER,
BATCH_MATMUL, SOFTMAX, MEAN, SQUARED_DIFFERENCE, RSQRT, GELU, SELECT, NOT_EQUAL, int32 ADD and friends.

Tolerance: ``max |tflfuse - LiteRT| <= REL * max |LiteRT|`` per output. Every output is a sum of at most
~``4 d`` products (the FFN) of LayerNorm-ed O(1) values, through a few blocks, in another order than
XNNPACK's, plus WGSL's exp (softmax) and the erfc fit of the exact GELU (3e-6 relative, see
tflfuse/kernels/wgsl.py). Measured <= 5.6e-7 of the output scale (both models, both batch sizes, on the
software adapter); REL = 2e-5 leaves a margin of ~35x for other adapters' exp and the fit.
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from conftest import SEED

#: See the module docstring.
REL = 2e-5


class _ClassToken(keras.layers.Layer):
    """Prepends a learned token to a sequence ``[N, T, D] -> [N, T + 1, D]`` and adds a learned positional
    embedding ``[T + 1, D]``."""

    def build(self, input_shape):
        _, t, d = input_shape
        self.token = self.add_weight(shape=(1, 1, d), initializer="random_normal", name="token")
        self.position = self.add_weight(shape=(1, t + 1, d), initializer="random_normal", name="position")

    def call(self, x):
        token = keras.ops.broadcast_to(self.token, (keras.ops.shape(x)[0], 1, self.token.shape[-1]))
        return keras.ops.concatenate([token, x], axis=1) + self.position


def bert_encoder(batch: int = 1, seq: int = 16, vocab: int = 97, d: int = 32, heads: int = 4, layers: int = 2,
                 ff: int = 64) -> keras.Model:
    """A BERT-style encoder: int32 ids ``[batch, seq]`` (0 is padding, masked out of the attention) ->
    (sequence output ``[batch, seq, d]``, tanh-pooled first token ``[batch, d]``). Seeded weights."""
    keras.utils.set_random_seed(SEED)
    ids = keras.Input((seq,), batch_size=batch, dtype="int32", name="ids")
    x = keras.layers.Embedding(vocab, d, embeddings_initializer="normal")(ids)
    positions = keras.layers.Embedding(seq, d, embeddings_initializer="normal")(keras.ops.arange(seq)[None])
    x = keras.layers.LayerNormalization(epsilon=1e-12)(x + positions)
    mask = keras.ops.not_equal(ids, 0)[:, None, :]            # [batch, 1, seq]: keys that are not padding
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(heads, d // heads)(x, x, attention_mask=mask)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + attention)
        h = keras.layers.Dense(ff, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + keras.layers.Dense(d)(h))
    pooled = keras.layers.Dense(d, activation="tanh")(x[:, 0])
    return keras.Model(ids, [x, pooled])


def vit_classifier(batch: int = 1, size: int = 32, patch: int = 8, d: int = 32, heads: int = 4, layers: int = 2,
                   ff: int = 64, classes: int = 10) -> keras.Model:
    """A ViT-style classifier: float32 images ``[batch, size, size, 3]`` -> logits ``[batch, classes]``.
    Seeded weights."""
    keras.utils.set_random_seed(SEED)
    image = keras.Input((size, size, 3), batch_size=batch, name="image")
    x = keras.layers.Conv2D(d, patch, strides=patch)(image)
    x = keras.layers.Reshape(((size // patch) ** 2, d))(x)
    x = _ClassToken(name="class_token")(x)
    for _ in range(layers):
        h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
        x = x + keras.layers.MultiHeadAttention(heads, d // heads)(h, h)
        h = keras.layers.LayerNormalization(epsilon=1e-6)(x)
        h = keras.ops.gelu(keras.layers.Dense(ff)(h), approximate=True)
        x = x + keras.layers.Dense(d)(h)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x)
    return keras.Model(image, keras.layers.Dense(classes)(x[:, 0]))


def bert_inputs(batch: int, seq: int, vocab: int = 97, seed: int = SEED) -> np.ndarray:
    """Token ids in [1, vocab) with the last quarter of each row but the first padded with 0."""
    ids = np.random.default_rng(seed).integers(1, vocab, (batch, seq)).astype(np.int32)
    ids[1:, -(seq // 4):] = 0
    return ids


def vit_inputs(batch: int, size: int, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (batch, size, size, 3)).astype(np.float32)


def convert(model: keras.Model) -> bytes:
    """The stock converter, float32, no optimizations (its SavedModel export's printout silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def run(interp, x: np.ndarray) -> list[np.ndarray]:
    """Sets the one input, invokes, returns the outputs in the order of ``get_output_details``."""
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


CASES = [("bert", 1, 16), ("bert", 3, 12), ("vit", 1, 32), ("vit", 2, 24)]


@pytest.mark.parametrize("kind, batch, n", CASES, ids=[f"{k}-batch{b}-{n}" for k, b, n in CASES])
def test_matches_litert(kind, batch, n, device):
    if kind == "bert":
        model, x = bert_encoder(batch, seq=n), bert_inputs(batch, n)
    else:
        model, x = vit_classifier(batch, size=n), vit_inputs(batch, n)
    data = convert(model)
    ours = tflfuse.Interpreter(model_content=data, device=device)
    assert ours.fallback_ops == [], "every op of the encoder runs on the GPU"
    got, ref = run(ours, x), run(LiteRTInterpreter(model_content=data), x)
    keras_out = [np.asarray(v) for v in model(x)] if kind == "bert" else [np.asarray(model(x))]
    assert len(got) == len(ref) == len(keras_out)
    for o, r in zip(got, ref):
        assert o.shape == r.shape and o.dtype == r.dtype == np.float32, (o.shape, r.shape, o.dtype)
        scale = float(np.max(np.abs(r)))
        assert scale > 0.1, "the outputs must not vanish for the comparison to mean something"
        print(f"{kind} batch {batch}: max|ref| {scale:.3g} err {np.max(np.abs(o - r)):.3g}")
        np.testing.assert_allclose(o, r, rtol=0, atol=REL * scale)
    # the file is the model: LiteRT agrees with Keras (TensorFlow) itself within the same bound
    for r, k in zip(sorted(ref, key=np.size), sorted(keras_out, key=np.size)):
        np.testing.assert_allclose(r, k, rtol=0, atol=REL * float(np.max(np.abs(k))))


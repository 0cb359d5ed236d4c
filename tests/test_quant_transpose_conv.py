"""int8 TRANSPOSE_CONV (tflfuse.kernels.quant.transpose_conv) in full-integer Keras models converted by
TensorFlow's converter with a seeded representative dataset (per-channel int8 filters, with and without bias;
stride 2 SAME and VALID, odd sizes, 5 to 19 output channels (not divisible by 4, and past LiteRT's 8-wide loop),
batch 2, a fused RELU; int8 and float I/O), run
on the GPU adapter (cpu_fallback=False) and by LiteRT's builtin kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES).

Tolerance: none. Every output element must equal LiteRT's: int32 sums and the same fixed-point requantization.
"""

import numpy as np
import pytest

from conftest import SEED
from test_quant_models import _run, _single

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers

MODELS = {
    "s2_same_bias": (lambda x: L.Conv2DTranspose(5, 3, strides=2, padding="same")(x), (2, 5, 7, 3), "int8"),
    "s2_valid_nobias": (lambda x: L.Conv2DTranspose(7, 3, strides=2, padding="valid", use_bias=False)(x),
                        (2, 4, 3, 6), "int8"),
    "s1_same_relu": (lambda x: L.Conv2DTranspose(6, (3, 2), padding="same", activation="relu")(x),
                     (2, 6, 5, 5), "int8"),
    "s2_k4_float_io": (lambda x: L.Conv2DTranspose(9, 4, strides=2, padding="same")(x), (2, 3, 5, 3), None),
    # LiteRT rounds the channels of its 8-wide loop halves up and the last Cout % 8 halves away from zero
    "s2_same_19": (lambda x: L.Conv2DTranspose(19, 3, strides=2, padding="same")(x), (2, 5, 6, 4), "int8"),
    "s1_valid_16_nobias": (lambda x: L.Conv2DTranspose(16, 2, padding="valid", use_bias=False)(x), (2, 5, 5, 7),
                           "int8"),
}


@pytest.fixture(scope="module")
def files():
    keras.utils.set_random_seed(SEED)
    return {name: _single(build, shape, io) for name, (build, shape, io) in MODELS.items()}


def _inputs(details, rng):
    return [(rng.standard_normal(d["shape"]) * 2).astype(np.float32) if d["dtype"] == np.float32
            else rng.integers(-128, 128, d["shape"]).astype(d["dtype"]) for d in details]


@pytest.mark.parametrize("name", list(MODELS))
def test_transpose_conv_matches_litert_bit_for_bit(files, device, name):
    import tflfuse
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from ai_edge_litert.interpreter import OpResolverType
    from tflfuse.model import Model

    data = files[name]
    assert "TRANSPOSE_CONV" in Model(data).op_names(0)
    ref = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    xs = _inputs(ref.get_input_details(), np.random.default_rng(SEED))
    want = _run(ref, xs)
    got = _run(tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False), xs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        differ = int((g != w).sum())
        assert differ == 0, f"{name}: {differ} of {w.size} elements differ from LiteRT"

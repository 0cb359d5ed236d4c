"""int8/uint8 activations and MUL (tflfuse.kernels.quant.activations) on the GPU adapter against LiteRT's builtin
kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES) on the same file: single-op files built on LiteRT's schema with chosen
scales and zero points (int8 and uint8, every one of the 256 input codes for the unary ops, odd shapes,
broadcasting, fused activations, negative and large LEAKY_RELU slopes), and full-integer Keras models converted by
TensorFlow's converter (int8 and uint8 I/O). Every file also runs with cpu_fallback=False: the op ran on the GPU.

Tolerance: none against LiteRT. Outputs are integers computed with LiteRT's own fixed-point arithmetic, or looked
up in a table built with the same float32 operations and C library functions as LiteRT's ``LUTPopulate``; every
element must be equal. As a third opinion, the dequantized outputs are compared with float64 NumPy of the op's
definition: within one output step for the requantizing ops and the tables (one rounding of the exact value, plus
the float32/fixed-point error of the multiplier, far below a step), and for HARD_SWISH within 3 steps (its 16-bit
fixed-point "relu-ish" factor carries 2^-15-relative errors, scaled by |x| / out_scale up to a few steps).
"""

import math

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
from conftest import SEED
from tflfuse.kernels import KernelError
from test_quant_models import _run, assert_falls_back
from tflite_builder import build, t

ACT = schema.ActivationFunctionType
INFO = {"int8": np.iinfo(np.int8), "uint8": np.iinfo(np.uint8)}
UNARY_SHAPE = (3, 11, 9)   # 297 elements: all 256 codes, then random ones


def _quant(scale, zero_point):
    q = schema.QuantizationParametersT()
    q.scale, q.zeroPoint = [float(s) for s in np.ravel(scale)], [int(z) for z in np.ravel(zero_point)]
    q.quantizedDimension = 0
    return q


def _file(op, inputs, output, options=None):
    """A one-op file: ``inputs`` are (shape, dtype, scale, zero point, constant data or None); ``output`` is
    (shape, dtype, scale, zero point)."""
    specs = list(inputs) + [tuple(output) + (None,)]
    tensors = [t(s, type=d.upper(), data=data) for s, d, _, _, data in specs]

    def edit(m):
        for tensor, (_, _, scale, zp, _) in zip(m.subgraphs[0].tensors, specs):
            tensor.quantization = _quant(scale, zp)

    o = dict(op=op, inputs=list(range(len(inputs))), outputs=[len(inputs)])
    if options:
        o["options"] = options
    runtime = [i for i, spec in enumerate(inputs) if spec[4] is None]
    return build(tensors, [o], runtime, [len(inputs)], edit=edit)


def _litert(data):
    return LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def _compare(data, xs, device):
    """Runs ``data`` on LiteRT and on tflfuse (every op on the GPU); asserts bit-for-bit equality."""
    want = _run(_litert(data), xs)
    got = _run(tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False), xs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        differ = int((g != w).sum())
        assert differ == 0, f"{differ} of {w.size} elements differ from LiteRT"
    return got


def _all_codes(dtype, shape, rng):
    """``shape`` (>= 256 elements) holding every code of ``dtype`` once in a random order, then random codes."""
    info = INFO[dtype]
    n = int(np.prod(shape))
    codes = np.concatenate([rng.permutation(np.arange(info.min, info.max + 1)),
                            rng.integers(info.min, info.max, n - 256, endpoint=True)])
    return codes.astype(dtype).reshape(shape)


def _deq(q, scale, zp):
    return (q.astype(np.float64) - zp) * scale


def _third_opinion(got, want_real, scale, zp, dtype, steps):
    """float64 NumPy: the output, dequantized, within ``steps`` output steps of the real result clamped to the
    type's representable range."""
    info = INFO[dtype]
    lo, hi = _deq(np.array([info.min, info.max]), scale, zp)
    err = np.abs(_deq(got, scale, zp) - np.clip(want_real, lo, hi)) / scale
    assert err.max() <= steps, f"max error {err.max():.3f} steps (allowed {steps})"


def _hard_swish(x):
    return x * np.clip(x + 3, 0, 6) / 6


UNARY_REAL = {
    "LOGISTIC": lambda x, _: 1 / (1 + np.exp(-x)), "TANH": lambda x, _: np.tanh(x),
    "GELU": lambda x, approximate: 0.5 * x * (1 + (np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)) if approximate
                                                  else np.vectorize(math.erf)(x / np.sqrt(2)))),
    "HARD_SWISH": lambda x, _: _hard_swish(x), "LEAKY_RELU": lambda x, a: np.where(x >= 0, x, a * x),
    "RELU": lambda x, _: np.maximum(x, 0), "RELU6": lambda x, _: np.clip(x, 0, 6),
    "RELU_N1_TO_1": lambda x, _: np.clip(x, -1, 1), "RELU_0_TO_1": lambda x, _: np.clip(x, 0, 1),
}

# (op, dtype, input scale, input zero point, output scale, output zero point, LEAKY_RELU alpha or GELU approximate)
UNARY = [
    ("LOGISTIC", "int8", 0.0625, 0, 1 / 256, -128, None),
    ("LOGISTIC", "int8", 0.031, -17, 1 / 256, -128, None),
    ("LOGISTIC", "uint8", 0.1, 131, 1 / 256, 0, None),
    ("LOGISTIC", "int8", 0.043, 9, 1 / 256, 3, None),          # a zero point LiteRT's table path takes as is
    ("GELU", "int8", 0.05, -10, 0.03, -90, False),
    ("GELU", "int8", 0.1, 20, 0.02, -110, True),                # approximate: the tanh form
    ("GELU", "uint8", 0.04, 128, 0.025, 10, False),
    ("TANH", "int8", 0.02, 4, 1 / 128, 0, None),
    ("TANH", "uint8", 0.045, 120, 1 / 128, 128, None),
    ("TANH", "int8", 0.01, -60, 0.005, -30, None),              # any output scale: clamped at the type's range
    ("HARD_SWISH", "int8", 0.05, 3, 0.04, -90, None),
    ("HARD_SWISH", "int8", 0.2, -10, 0.1, -100, None),          # "relu-ish" multiplier > 1: left shifts
    ("HARD_SWISH", "int8", 0.005, 20, 0.002, -60, None),        # < 1: a rounding right shift
    ("HARD_SWISH", "uint8", 0.07, 140, 0.05, 40, None),
    ("HARD_SWISH", "int8", 3 / 256, 0, 0.01, -70, None),        # a multiplier of exactly 1
    ("HARD_SWISH", "uint8", 0.00123, 242, 0.963, 106, None),    # output shift 16: int16 RoundingDivideByPOT's mask
    ("LEAKY_RELU", "int8", 0.05, -5, 0.04, 10, 0.2),
    ("LEAKY_RELU", "int8", 0.03, 12, 0.06, -7, -0.5),           # a negative slope: a negative multiplier
    ("LEAKY_RELU", "int8", 0.03, 12, 0.06, -7, -1.0),           # ... of -0.5: ties, rounded on its magnitude
    ("LEAKY_RELU", "uint8", 0.1, 100, 0.12, 90, 1.7),           # a slope above 1
    ("LEAKY_RELU", "int8", 0.05, 0, 0.01, 0, 0.0),
    ("RELU", "int8", 0.05, -3, 0.025, -128, None),
    ("RELU", "uint8", 0.04, 130, 0.5, 0, None),                 # requantized to a coarser scale (ties)
    ("RELU6", "int8", 0.05, 7, 0.0236, -128, None),
    ("RELU6", "uint8", 0.06, 128, 0.03, 3, None),
    ("RELU_N1_TO_1", "int8", 0.01, 2, 0.0079, 0, None),
    ("RELU_N1_TO_1", "uint8", 0.013, 127, 0.009, 128, None),
    ("RELU_0_TO_1", "int8", 0.01, -20, 0.004, -128, None),
    ("RELU_0_TO_1", "uint8", 0.008, 100, 0.005, 10, None),
    ("RELU", "int8", 0.05, 0, 0.05, 0, None),                   # equal parameters: a plain clamp
]


@pytest.mark.parametrize("op, dtype, s_in, z_in, s_out, z_out, alpha", UNARY,
                         ids=[f"{u[0]}-{u[1]}-{i}" for i, u in enumerate(UNARY)])
def test_unary_matches_litert_on_every_code(device, rng, op, dtype, s_in, z_in, s_out, z_out, alpha):
    options = (("LeakyReluOptions", {"alpha": alpha}) if op == "LEAKY_RELU" else
               ("GeluOptions", {"approximate": alpha}) if op == "GELU" else None)
    data = _file(op, [(UNARY_SHAPE, dtype, s_in, z_in, None)], (UNARY_SHAPE, dtype, s_out, z_out), options)
    x = _all_codes(dtype, UNARY_SHAPE, rng)
    (got,) = _compare(data, [x], device)
    real = UNARY_REAL[op](_deq(x, s_in, z_in), alpha)
    _third_opinion(got, real, s_out, z_out, dtype, 3 if op == "HARD_SWISH" else 1)


# (dtype, input shape, alpha shape, input (scale, zp), alpha (scale, zp), output (scale, zp))
PRELU = [
    ("int8", (2, 5, 7, 3), (1, 1, 3), (0.05, -4), (0.01, -20), (0.03, 6)),       # Keras PReLU, shared_axes [1, 2]
    ("int8", (2, 5, 7, 3), (5, 7, 3), (0.05, 10), (0.004, 3), (0.04, -2)),       # alpha per position
    ("int8", (3, 5, 7), (3, 5, 7), (0.02, 0), (0.02, 0), (0.02, 0)),             # the same shape: no broadcast
    ("uint8", (2, 4, 6, 5), (5,), (0.05, 128), (0.02, 100), (0.06, 120)),
    ("int8", (17,), (1,), (0.1, 1), (0.5, -100), (0.1, 1)),
]


@pytest.mark.parametrize("dtype, shape, ashape, qi, qa, qo", PRELU, ids=[f"prelu-{p[0]}-{i}" for i, p in
                                                                            enumerate(PRELU)])
def test_prelu_matches_litert(device, rng, dtype, shape, ashape, qi, qa, qo):
    info = INFO[dtype]
    alpha = rng.integers(info.min, info.max, ashape, endpoint=True).astype(dtype)
    data = _file("PRELU", [(shape, dtype, *qi, None), (ashape, dtype, *qa, alpha)], (shape, dtype, *qo))
    x = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    (got,) = _compare(data, [x], device)
    xr, ar = _deq(x, *qi), _deq(alpha, *qa)
    _third_opinion(got, np.where(xr >= 0, xr, xr * ar), *qo, dtype, 1)


# (dtype, a shape, b shape, a (scale, zp), b (scale, zp), output (scale, zp), fused activation, b constant)
MUL = [
    ("int8", (2, 6, 5, 3), (2, 1, 5, 3), (0.05, 3), (0.04, -7), (0.01, 2), "NONE", False),
    ("int8", (2, 6, 5, 3), (3,), (0.05, -1), (0.02, 5), (0.005, -128), "RELU", True),
    ("int8", (3, 7, 5), (3, 7, 5), (0.5, 0), (0.5, 10), (0.01, 0), "RELU6", False),   # multiplier 25: left shift
    ("int8", (4, 9), (1,), (0.03, 20), (0.07, -30), (0.004, 0), "RELU_N1_TO_1", False),
    ("uint8", (2, 5, 1, 3), (1, 1, 4, 1), (0.06, 128), (0.03, 120), (0.02, 130), "NONE", False),   # both broadcast
    ("uint8", (1, 2, 3, 2, 3, 5), (2, 1, 2, 1, 5), (0.02, 100), (0.05, 131), (0.01, 5), "RELU", False),   # rank 6
]


@pytest.mark.parametrize("dtype, ashape, bshape, qa, qb, qo, act, const", MUL,
                         ids=[f"mul-{m[0]}-{m[6]}-{i}" for i, m in enumerate(MUL)])
def test_mul_matches_litert(device, rng, dtype, ashape, bshape, qa, qb, qo, act, const):
    info = INFO[dtype]
    a = rng.integers(info.min, info.max, ashape, endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, bshape, endpoint=True).astype(dtype)
    out = tuple(np.broadcast_shapes(ashape, bshape))
    options = ("MulOptions", {"fusedActivationFunction": getattr(ACT, act)})
    data = _file("MUL", [(ashape, dtype, *qa, None), (bshape, dtype, *qb, b if const else None)],
                 (out, dtype, *qo), options)
    (got,) = _compare(data, [a] if const else [a, b], device)
    real = _deq(a, *qa) * _deq(b, *qb)
    lo, hi = {"NONE": (-np.inf, np.inf), "RELU": (0, np.inf), "RELU6": (0, 6), "RELU_N1_TO_1": (-1, 1)}[act]
    _third_opinion(got, np.clip(real, lo, hi), *qo, dtype, 1)


@pytest.mark.parametrize("op", ["LOGISTIC", "HARD_SWISH", "RELU6", "MUL"])
def test_empty_tensors(device, op):
    shape = (0, 3)
    inputs = [(shape, "int8", 0.1, 2, None)] + ([((3,), "int8", 0.2, -1, None)] if op == "MUL" else [])
    out_q = (1 / 256, -128) if op == "LOGISTIC" else (0.05, 3)
    data = _file(op, inputs, (shape, "int8", *out_q), ("MulOptions", {}) if op == "MUL" else None)
    xs = [np.zeros(shape, np.int8)] + ([np.arange(3, dtype=np.int8)] if op == "MUL" else [])
    (got,) = _compare(data, xs, device)
    assert got.shape == shape


# ---- models from TensorFlow's converter ---------------------------------------------------------------------

KERAS_OPS = {"LOGISTIC", "TANH", "HARD_SWISH", "LEAKY_RELU", "PRELU", "RELU6", "RELU_N1_TO_1", "MUL"}


@pytest.fixture(scope="module")
def keras_files():
    """One full-integer model of every activation on the same input (2, 9, 5, 3): 270 elements, so every int8
    code can occur), and a MUL of it by a (2, 9, 1, 3) input with a fused RELU; int8 and uint8 I/O."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from test_quant_models import _convert

    L = keras.layers
    keras.utils.set_random_seed(SEED)
    x, y = keras.Input((9, 5, 3), batch_size=2), keras.Input((9, 1, 3), batch_size=2)
    prelu = L.PReLU(shared_axes=[1, 2], alpha_initializer=keras.initializers.RandomUniform(-0.5, 1.5, seed=3))
    outs = [L.Activation("sigmoid")(x), L.Activation("tanh")(x), L.Activation("hard_swish")(x),
            L.LeakyReLU(negative_slope=0.3)(x), prelu(x), L.ReLU(max_value=6.0)(x),
            L.Lambda(lambda v: tf.clip_by_value(v, -1.0, 1.0))(x), L.ReLU()(L.Multiply()([x, y]))]
    model = keras.Model([x, y], outs)
    return {io: _convert(model, [(2, 9, 5, 3), (2, 9, 1, 3)], io=io) for io in ("int8", "uint8")}


@pytest.mark.parametrize("io", ["int8", "uint8"])
def test_converted_model_matches_litert(keras_files, device, io):
    data = keras_files[io]
    ref = _litert(data)
    ops = {o["op_name"] for o in ref._get_ops_details()}
    assert KERAS_OPS <= ops, f"the converter wrote {sorted(ops)}"   # each op under test is in the file
    ref.allocate_tensors()
    rng = np.random.default_rng(SEED)
    xs = [_all_codes(io, d["shape"], rng) if np.prod(d["shape"]) >= 256 else
          rng.integers(INFO[io].min, INFO[io].max, d["shape"], endpoint=True).astype(io)
          for d in ref.get_input_details()]
    got = _compare(data, xs, device)
    assert len(got) == 8 and all(g.dtype == np.dtype(io) for g in got)


# ---- bad input ----------------------------------------------------------------------------------------------

def _refused(data, device, match):
    with pytest.raises(KernelError, match=match):
        tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False).allocate_tensors()


def test_per_channel_mul_input_is_refused_naming_the_op(device):
    shape = (2, 3)
    data = _file("MUL", [(shape, "int8", [0.1, 0.2], [0, 0], None), (shape, "int8", 0.1, 0, None)],
                 (shape, "int8", 0.05, 0), ("MulOptions", {}))
    _refused(data, device, r"MUL: input 0 has per-channel quantization \(2 scales\)")


def test_logistic_output_scale_other_than_1_256_is_refused(device):
    data = _file("LOGISTIC", [((4,), "int8", 0.1, 0, None)], ((4,), "int8", 1 / 128, -128))
    _refused(data, device, r"LOGISTIC: the output scale must be 1/256")


def test_hard_swish_output_multiplier_above_one_is_refused(device):
    # (0.5 / 128) / 0.001 > 1: LiteRT's HardSwishPrepare refuses it too (output_multiplier_exponent <= 0)
    data = _file("HARD_SWISH", [((4,), "int8", 0.5, 0, None)], ((4,), "int8", 0.001, 0))
    _refused(data, device, r"HARD_SWISH: .*multipliers below 1")


def test_mixed_dtypes_are_refused(device):
    data = _file("RELU", [((5,), "int8", 0.1, 0, None)], ((5,), "uint8", 0.1, 128))
    _refused(data, device, r"RELU: input and output must have the same dtype")


def test_prelu_alpha_that_grows_the_input_is_refused(device, rng):
    data = _file("PRELU", [((3, 1), "int8", 0.1, 0, None), ((4,), "int8", 0.1, 0, np.ones(4, np.int8))],
                 ((3, 4), "int8", 0.1, 0))
    _refused(data, device, r"PRELU: alpha \[4\] broadcast against the input \[3, 1\] must give the input's shape")


@pytest.mark.parametrize("dtype, zp", [("int8", 5), ("uint8", 0)])
def test_mul_past_int16_is_refused_and_falls_back_exactly(device, rng, dtype, zp):
    """A multiplier of 0.5 * 0.5 / 0.001 = 250: products reach past int16, where LiteRT's vectorized MUL wraps
    (int8 with a nonzero output zero point, uint8 always); refused on the GPU, it runs on LiteRT's CPU instead."""
    info, shape = INFO[dtype], (2, 20)
    mid = 0 if dtype == "int8" else 128
    data = _file("MUL", [(shape, dtype, 0.5, mid, None), (shape, dtype, 0.5, mid, None)], (shape, dtype, 0.001, zp),
                 ("MulOptions", {}))
    xs = [rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype) for _ in range(2)]
    assert_falls_back(device, data, "MUL", r"MUL: a multiplier of 250 takes products past int16", xs)

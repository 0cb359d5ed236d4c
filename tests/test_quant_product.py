"""int8 matrix products tiled for a GPU (``tflfuse.kernels.quant.product``), against LiteRT's builtin kernels.

On a GPU, an int8 1x1 CONV_2D (stride 1, one group) or FULLY_CONNECTED with at least 2**17 outputs runs as the
float products' register-blocked tiles with i32 sums, its constant filter re-laid out HWIO / IO at load. The
software adapter's plans use the per-output loops (``target="cpu"``), so each model runs twice here: with the
GPU's schedules (the interpreter's target patched to ``"gpu"``, as tests/test_gemm_f16.py does) and with the
adapter's own. Shapes: depth and columns multiples of 4 (vec4 loads and stores) and not (17 -> 67: scalar
loads, partial tiles on every side), a FULLY_CONNECTED of 1,030 rows, batch 2, a fused RELU6; a windowed and a
grouped CONV_2D, which read the HWIO filter in the per-output loop; a FULLY_CONNECTED of 3 rows and a 1x1
CONV_2D of 25, whose sums a GPU's plan splits over lanes (depth 200 and 66: a tail past the unrolled groups).

Tolerance: none. Integer sums are exact in any order, and the requantization is the per-output kernels' own
(``q_mul_up``): every int8 output must equal LiteRT's bit for bit.
"""

import numpy as np
import pytest

import tflfuse
from ai_edge_litert.interpreter import Interpreter as LiteRT
from ai_edge_litert.interpreter import OpResolverType
from conftest import SEED
from tflfuse.runtime.interpreter import Interpreter as _Interpreter
from test_quant_models import _inputs, _run, _single

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
L = keras.layers

MODELS = {
    # rows 2 x 33 x 31 = 2046, depth 20, 100 columns: vec4 loads and stores, partial row and column tiles
    "conv_1x1_vec4_relu6": (lambda x: L.Conv2D(100, 1, activation="relu6")(x), (2, 33, 31, 20), True),
    # depth 17 and 67 columns: scalar loads and stores
    "conv_1x1_scalar": (lambda x: L.Conv2D(67, 1)(x), (2, 40, 30, 17), True),
    # 1030 rows x 132 columns: few output tiles, so a sliced tile (two slice groups of the depth)
    "dense_1030_rows": (lambda x: L.Dense(132)(x), (1030, 40), True),
    # a deep product with few output tiles: four slice groups
    "dense_sliced_deep": (lambda x: L.Dense(120)(x), (1100, 520), True),
    # fewer rows than a tile pays for (batch 1): on a GPU each sum split over lanes (a reduction_program)
    "dense_3_rows": (lambda x: L.Dense(37)(x), (3, 200), False),
    "conv_1x1_5x5": (lambda x: L.Conv2D(24, 1, activation="relu")(x), (1, 5, 5, 66), False),
    # HWIO filters read by the per-output loop: stride 2 SAME, and two groups
    "conv_3x3_s2_hwio": (lambda x: L.Conv2D(6, 3, strides=2, padding="same")(x), (2, 9, 7, 5), False),
    "conv_grouped_hwio": (lambda x: L.Conv2D(6, 3, groups=2, padding="same")(x), (2, 8, 8, 8), False),
}


@pytest.fixture(scope="module")
def files():
    keras.utils.set_random_seed(SEED)
    return {name: _single(build, shape) for name, (build, shape, _) in MODELS.items()}


def _tiled_programs(interp) -> int:
    return sum("var<workgroup> ta: array<vec4<i32>" in prog.source for prog, _, _ in interp._plan(0).steps)


@pytest.mark.parametrize("target", ["gpu", "cpu"])
@pytest.mark.parametrize("name", list(MODELS))
def test_matches_litert_bit_for_bit(files, device, monkeypatch, name, target):
    data = files[name]
    ref = LiteRT(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    ref.allocate_tensors()
    xs = _inputs(ref.get_input_details(), np.random.default_rng(SEED))
    (want,) = _run(ref, xs)
    monkeypatch.setattr(_Interpreter, "_target", lambda self: target)
    ours = tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False)
    (got,) = _run(ours, xs)
    tiled = MODELS[name][2] and target == "gpu"
    assert _tiled_programs(ours) == (1 if tiled else 0)
    sliced = sum("var<workgroup> red: array<vec4<i32>" in prog.source for prog, _, _ in ours._plan(0).steps)
    assert sliced == (1 if name in ("dense_1030_rows", "dense_sliced_deep") and target == "gpu" else 0)
    split = sum("var<workgroup> shares: array<i32" in prog.source for prog, _, _ in ours._plan(0).steps)
    assert split == (1 if name in ("dense_3_rows", "conv_1x1_5x5") and target == "gpu" else 0)
    assert got.shape == want.shape and got.dtype == want.dtype == np.int8
    differ = int((got != want).sum())
    assert differ == 0, f"{name} ({target}): {differ} of {want.size} elements differ from LiteRT"

"""Uniform blocks with arrays (``tflfuse.kernels.base.Uniform`` with a tuple value) and the int8 kernels' constant
tables (``tflfuse.kernels.quant.ops.Tables``: per-channel multipliers and shifts, lookup tables, scales).

References: the adapter's WGSL compiler, which lays the uniform block out by WGSL's rules (a shader reads each
member back, so a packing that disagrees with the layout shows as wrong values), and LiteRT's builtin int8
kernels for the models. Tolerance: none; values are copied or computed in integers, bit for bit.
"""

import numpy as np
import pytest

from conftest import SEED
from tflfuse.kernels.base import Binding, Program, Uniform, uniform_layout
from tflfuse.kernels.quant import ops as quant_ops
from tflfuse.kernels.wgsl import linear_main, prelude
from tflfuse.shader import ShaderInfo, _uniform_infos, run_shader
from test_quant_activations import _file
from test_quant_models import _single, assert_falls_back, assert_matches_litert

keras = pytest.importorskip("keras")
L = keras.layers

# scalars between arrays, array lengths not multiples of 4 (5, 3), an empty-ish array of 1
_UNIFORMS = (Uniform("a", "f32", 1.5), Uniform("ints", "i32", (-7, 2, 2**31 - 1, -2**31, 9)),
             Uniform("b", "u32", 4000000000), Uniform("c", "i32", -3),
             Uniform("floats", "f32", (0.25, -1e-30, 3.0e38)), Uniform("one", "u32", (77,)))


def test_layout_follows_wgsl_alignment():
    offsets, size = uniform_layout(_UNIFORMS)
    # a at 0; ints (2 vec4, align 16) at 16..48; b 48, c 52; floats (1 vec4) at 64..80; one at 80..96
    assert offsets == [0, 16, 48, 52, 64, 80] and size == 96


def test_the_adapter_reads_each_uniform_as_packed(device):
    """Each member is written to the output as its bits: the adapter's layout against our packing, through
    :func:`tflfuse.shader.run_shader` (which packs from a ShaderInfo's uniform records, as another runtime
    would)."""
    reads = ["bitcast<i32>(params.a)"]
    reads += [f"params.ints[{i // 4}][{i % 4}]" for i in range(5)]
    reads += ["bitcast<i32>(params.b)", "params.c"]
    reads += [f"bitcast<i32>(params.floats[0][{i}])" for i in range(3)] + ["bitcast<i32>(params.one[0][0])"]
    n = len(reads)
    binds = (Binding("y", ("output", 0), "read_write", "i32", 4 * n),)
    body = "\n".join(f"  if (idx == {i}u) {{ y[idx] = {r}; }}" for i, r in enumerate(reads))
    info = ShaderInfo("uniform_probe", prelude(binds, _UNIFORMS) + linear_main(64, n, body), "main", (64, 1, 1),
                      (1, 1, 1), ({"binding": 0, "name": "y", "role": ["output", 0], "access": "read_write",
                                   "type": "i32", "size": 4 * n},), _uniform_infos(_UNIFORMS), ((n,),))
    (got,) = run_shader(device, info, [])
    want = np.concatenate([np.float32([1.5]).view(np.int32), np.int32([-7, 2, 2**31 - 1, -2**31, 9]),
                           np.uint32([4000000000]).view(np.int32), np.int32([-3]),
                           np.float32([0.25, -1e-30, 3.0e38]).view(np.int32), np.int32([77])])
    np.testing.assert_array_equal(got, want)
    # and the plan's bytes (Program.uniform_bytes) are the same block
    prog = Program("uniform_probe", info.wgsl, (64, 1, 1), (1, 1, 1), (), _UNIFORMS)
    offsets = [u["offset"] for u in info.uniforms]
    assert len(prog.uniform_bytes()) == 96 and offsets == uniform_layout(_UNIFORMS)[0]
    assert np.frombuffer(prog.uniform_bytes(), np.int32)[4:9].tolist() == [-7, 2, 2**31 - 1, -2**31, 9]


MODELS = {
    # per-channel CONV_2D (multipliers and shifts), per-channel DEPTHWISE_CONV_2D over 3000 channels (TFLite's
    # depthwiseconv op test whose private arrays took minutes to compile), LOGISTIC's lookup table
    "conv_per_channel": lambda: _single(lambda x: L.Conv2D(37, 3, padding="same")(x), (2, 7, 6, 5)),
    "depthwise_3000": lambda: _single(lambda x: L.DepthwiseConv2D(3)(x), (1, 3, 3, 3000)),
    "logistic": lambda: _single(lambda x: keras.activations.sigmoid(L.Dense(9)(x)), (3, 6)),
}


@pytest.fixture(scope="module")
def files():
    keras.utils.set_random_seed(SEED)
    return {name: build() for name, build in MODELS.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_tables_are_uniforms_and_match_litert(files, device, name):
    """The tables are uniforms (no private array of literals in the WGSL); the values equal LiteRT's."""
    steps = assert_matches_litert(files[name], device, name)._plan(0).steps
    assert not any("var<private>" in prog.source for prog, _, _ in steps)
    assert any(u.is_array for prog, _, _ in steps for u in prog.uniforms)


def test_tables_past_the_uniform_block_fall_back_to_litert(device):
    """A per-channel FULLY_CONNECTED of 9,000 output channels: its multipliers and shifts (72,000 bytes) pass the
    64 KiB uniform block, and as private arrays the shader took minutes; refused naming the op, it runs on
    LiteRT's CPU and equals its builtin kernels."""
    rng = np.random.default_rng(SEED)
    cout, depth = 9000, 3
    ws = rng.uniform(0.001, 0.01, cout)
    data = _file("FULLY_CONNECTED", [((1, depth), "int8", 0.05, 2, None),
                                     ((cout, depth), "int8", ws, np.zeros(cout, int),
                                      rng.integers(-127, 128, (cout, depth)).astype(np.int8)),
                                     ((cout,), "int32", 0.05 * ws, np.zeros(cout, int),
                                      rng.integers(-3000, 3000, cout).astype(np.int32))],
                 ((1, cout), "int8", 0.05, -3))
    assert_falls_back(device, data, "FULLY_CONNECTED", r"FULLY_CONNECTED: 9000 output channels need 72000 bytes")


def test_layers_of_one_shape_share_one_pipeline():
    """Two per-channel int8 convolutions of the same shapes and other multipliers: one WGSL source (the
    pipeline cache's key), their tables in the uniforms."""
    from tflfuse.kernels.base import TensorSpec
    from tflfuse.model import Quantization

    def conv(scales):
        q = {"input_quantization": [Quantization((0.05,), (3,)), Quantization(tuple(scales), (0,) * 4, 0),
                                    Quantization((0.001,) * 4, (0,) * 4)],
             "output_quantization": [Quantization((0.1,), (-2,))], "output_dtype": "int8"}
        k = quant_ops.QuantizedConv2D([TensorSpec((1, 5, 5, 3), "int8"), TensorSpec((4, 3, 3, 3), "int8"),
                                       TensorSpec((4,), "int32")], q)
        (prog,) = k.programs()
        return prog

    a, b = conv([0.01, 0.02, 0.03, 0.04]), conv([0.011, 0.5, 0.003, 0.07])
    assert a.source == b.source and a.uniform_bytes() != b.uniform_bytes()

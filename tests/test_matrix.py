"""The float16 plan's matrix products on subgroup matrices (tflfuse.kernels.matrix) and the Dawn device that
runs them: every form compiles in Tint as Dawn compiles it for a GPU, and the options refuse what they cannot take.

The forms run only where an adapter has Dawn's ``chromium-experimental-subgroup-matrix`` (NVIDIA's tensor cores
through Vulkan); this machine's software adapter has none. Their values are checked on the GPU machine by
``benchmarks/dawn_matrix.py`` against LiteRT's CPU interpreter (``benchmarks/RESULTS-dawn-matrix.md``). Here, Dawn's
Null backend (no GPU; Tint validates every shader module and pipeline there) compiles them, in a process of their
own: Dawn's toggles (``allow_unsafe_apis``, which the feature needs) are set once per process, before its instance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import tflfuse
from tflfuse.kernels.matrix import MatrixTile, SubgroupMatrix, matrix_tile
from tflfuse.kernels.base import KernelError

#: A subgroup size Dawn's Null backend takes: its largest subgroup is 128 invocations and a workgroup's x size must be
#: a multiple of it (4 subgroups of 64, 2 x 2, make 256, its most invocations a workgroup).
_NULL_SUBGROUP = 64

#: (id, op, input shapes, attributes): products that take the tiled form on a GPU, including sizes that bite.
CASES = [
    ("conv1x1_b32_relu6", "CONV_2D", [(32, 28, 28, 32), (1, 1, 32, 192), (192,)],
     {"fused_activation_function": "RELU6", "filter_layout": "HWIO"}),
    ("conv1x1_24cols", "CONV_2D", [(32, 56, 56, 144), (1, 1, 144, 24), (24,)], {"filter_layout": "HWIO"}),
    # depth and columns not multiples of 4 (scalar staging loads and stores), rows not a multiple of the tile
    ("conv1x1_odd", "CONV_2D", [(3, 171, 257, 37), (1, 1, 37, 22), (22,)],
     {"fused_activation_function": "RELU", "filter_layout": "HWIO"}),
    # more tiles than 65,535 workgroups in one dimension
    ("conv1x1_tiles_past_65535", "CONV_2D", [(1, 2240, 2000, 32), (1, 1, 32, 24), (24,)], {"filter_layout": "HWIO"}),
    ("conv1x1_deep", "CONV_2D", [(32, 7, 7, 960), (1, 1, 960, 320), (320,)], {"filter_layout": "HWIO"}),
    ("fully_connected", "FULLY_CONNECTED", [(3000, 64), (64, 170), (170,)], {"weights_layout": "IO"}),
    ("batch_matmul", "BATCH_MATMUL", [(4, 700, 96), (1, 96, 260)], {}),
    # the fused bottleneck's expansion and projection, the depthwise conv computed in the projection's A staging
    ("bottleneck_b32", "fused_bottleneck", [(32, 14, 14, 64), (64, 384), (384,), (3, 3, 384), (384,), (384, 64),
                                            (64,)], {"expansion": 6, "stride": 1, "residual": True}),
    ("bottleneck_stride2", "fused_bottleneck", [(32, 28, 28, 32), (32, 192), (192,), (3, 3, 192), (192,),
                                                (192, 64), (64,)], {"expansion": 6, "stride": 2, "residual": False}),
]


def _shaders(key, shapes, attrs, subgroup=_NULL_SUBGROUP):
    return tflfuse.get_shader(key, shapes, {**attrs, "target": "gpu"}, precision="float16", subgroup_matrix=subgroup)


@pytest.fixture(scope="module")
def tint_results() -> dict:
    """Each case's programs compiled by Dawn's Null backend in a fresh process: case id -> list of (uses subgroup
    matrices, error or None)."""
    script = textwrap.dedent(f"""
        import json, os, sys
        os.environ["WGPU_BACKEND_TYPE"] = "Null"
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import wgpudawn
        from wgpudawn.backends.dawn import _extras_device
        from test_matrix import CASES, _shaders
        _extras_device.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
        adapter = wgpudawn.gpu.request_adapter_sync()
        device = adapter.request_device_sync(required_features=["chromium-experimental-subgroup-matrix", "shader-f16"])
        out = {{}}
        for case, key, shapes, attrs in CASES:
            rows = []
            for p in _shaders(key, shapes, attrs).programs:
                try:
                    module = device.create_shader_module(code=p.wgsl)
                    device.create_compute_pipeline(layout="auto", compute={{"module": module,
                                                                           "entry_point": p.entry_point}})
                    rows.append(["subgroupMatrixMultiplyAccumulate" in p.wgsl, None])
                except Exception as e:
                    rows.append(["subgroupMatrixMultiplyAccumulate" in p.wgsl, str(e)[:2000]])
            out[case] = rows
        print("RESULT" + json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[0][len("RESULT"):])


@pytest.mark.parametrize("case,key,shapes,attrs", CASES, ids=[c[0] for c in CASES])
def test_matrix_forms_compile_in_tint(case, key, shapes, attrs, tint_results):
    rows = tint_results[case]
    assert any(matrix for matrix, _ in rows), f"{case}: no program runs on subgroup matrices"
    for matrix, error in rows:
        assert error is None, f"{case}: {error}"


@pytest.mark.parametrize("case,key,shapes,attrs", CASES, ids=[c[0] for c in CASES])
def test_matrix_forms_leave_the_other_plans_alone(case, key, shapes, attrs):
    # the float32 plan and the float16 plan without subgroup matrices are the same text as before the form existed
    f32 = tflfuse.get_shader(key, shapes, {**attrs, "target": "gpu"})
    f16 = tflfuse.get_shader(key, shapes, {**attrs, "target": "gpu"}, precision="float16")
    on = _shaders(key, shapes, attrs)
    assert not any("subgroupMatrix" in p.wgsl for p in f32.programs + f16.programs)
    assert len(on.programs) == len(f16.programs)
    # the same buffers (names, roles, access, bytes) in the same order: the plan binds the matrix form's as the FMA
    # form's; an operand the form loads fragments from is declared array<f16> rather than array<vec4<f16>>
    def buffers(info):
        return [{k: v for k, v in x.items() if k != "type"} for x in info.bindings]
    for a, b in zip(on.programs, f16.programs):
        assert buffers(a) == buffers(b)
        assert all(x["type"] == y["type"] or (x["type"], y["type"]) == ("f16", "vec4<f16>")
                   for x, y in zip(a.bindings, b.bindings))


@pytest.mark.parametrize("shapes", [[(32, 112, 112, 32), (1, 1, 32, 16), (16,)],   # 16 columns
                                    [(32, 112, 112, 16), (1, 1, 16, 96), (96,)]])  # a depth of 16
def test_shallow_or_narrow_products_stay_on_the_fma_units(shapes):
    # use_matrices: measured slower on subgroup matrices (tflfuse/kernels/matrix.py)
    on = _shaders("CONV_2D", shapes, {"filter_layout": "HWIO"})
    f16 = tflfuse.get_shader("CONV_2D", shapes, {"filter_layout": "HWIO", "target": "gpu"}, precision="float16")
    assert [p.wgsl for p in on.programs] == [p.wgsl for p in f16.programs]


def test_matrix_form_follows_the_subgroup_size():
    # Dawn asks a workgroup's x size to be a multiple of the adapter's largest subgroup: 4 subgroups of it
    for size in (32, 64):
        programs = [p for p in _shaders(*CASES[0][1:], subgroup=size).programs if "subgroupMatrix" in p.wgsl]
        assert programs and all(p.workgroup_size == (4 * size, 1, 1) for p in programs)


@pytest.mark.parametrize("value", [0, -32, 1.5, True, "32"])
def test_get_shader_refuses_a_bad_subgroup_size(value):
    with pytest.raises(ValueError, match="subgroup_matrix"):
        _shaders(*CASES[0][1:], subgroup=value)


def test_get_shader_refuses_subgroup_matrices_in_float32():
    with pytest.raises(ValueError, match="float16"):
        tflfuse.get_shader(*CASES[0][1:3], {**CASES[0][3], "target": "gpu"}, subgroup_matrix=32)


def test_matrix_tile_fits_workgroup_memory_and_the_columns():
    for rows, depth, cols in [(401408, 32, 16), (100352, 24, 144), (6272, 96, 576), (1568, 960, 320), (9, 5, 3)]:
        t = matrix_tile(rows, depth, cols, SubgroupMatrix(32))
        assert t.workgroup_bytes() <= 16384
        assert t.tn <= max(16, 2 * cols)   # no tile more than half padding in its columns


@pytest.mark.parametrize("sizes", [(0, 1, 1, 1), (1, 1, 1, 1, 24), (1, 1, True, 1), (2.0, 1, 1, 1)])
def test_matrix_tile_refuses_what_does_not_map(sizes):
    with pytest.raises(KernelError, match="matrix tile"):
        MatrixTile(*sizes)


def test_device_refuses_an_unknown_backend(monkeypatch):
    with pytest.raises(ValueError, match=r"Device\(backend=...\).*'wgpu-native', 'dawn'"):
        tflfuse.Device(backend="metal")
    monkeypatch.setenv("TFLFUSE_WEBGPU", "webgl")
    with pytest.raises(ValueError, match="TFLFUSE_WEBGPU"):
        tflfuse.Device()


def test_wgpu_native_device_has_no_subgroup_matrices(device):
    assert device.backend == "wgpu-native" and device.subgroup_matrix is None


@pytest.mark.parametrize("text", ["2x2/2x2/32", "2x2/2x2/64/w", "4x1/1x1/16"])
def test_matrix_tile_names_parse_back(text):
    assert MatrixTile.parse(text).name == text


@pytest.mark.parametrize("text", ["2x2/2x2", "2x2/2x2/24", "0x2/2x2/32", "2x2/2x2/32/x", "２x2/2x2/32", None])
def test_matrix_tile_parse_refuses(text):
    with pytest.raises(KernelError, match="matrix tile"):
        MatrixTile.parse(text)


def test_subgroup_matrix_is_a_value():
    assert SubgroupMatrix(32) == SubgroupMatrix(32) and hash(SubgroupMatrix(32)) == hash(SubgroupMatrix(32))

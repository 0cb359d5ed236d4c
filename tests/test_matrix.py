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


def _in_dawn_null_process(body: str) -> str:
    """Runs ``body`` (Python, after tflfuse is imported, with Dawn's Null backend chosen and the Null adapter's
    missing configurations standing in as subgroup matrices of 32) in a fresh process; returns its stdout."""
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["WGPU_BACKEND_TYPE"] = "Null"
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import numpy as np
        import tflfuse
        from tflfuse.kernels.matrix import SubgroupMatrix
        from tflfuse.runtime import device as device_module
        device_module._subgroup_matrix = lambda device: SubgroupMatrix(32)
    """) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _pointwise_model() -> bytes:
    """A 1x1 CONV_2D of 64 x 64 pixels from 32 to 64 channels: a tiled product on a GPU (262,144 outputs)."""
    import numpy as np
    from tflite_builder import build, t

    w = (np.random.default_rng(0).standard_normal((64, 1, 1, 32)) * 0.2).astype(np.float32)
    tensors = [t((1, 64, 64, 32), name="x"), t((64, 1, 1, 32), data=w), t((64,), data=np.zeros(64, np.float32)),
               t((1, 64, 64, 64), name="y")]
    ops = [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3],
                options=("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1}))]
    return build(tensors, ops, [0], [3])


def test_dawn_plans_record_through_the_compiled_loop_whichever_device_comes_first(tmp_path):
    # The loop is opened with tflfuse's own cffi instance: a Dawn plan built first must leave it to both runtimes
    # (where the machine has a C compiler; where it has none, both record through cffi alike).
    out = _in_dawn_null_process(f"""
        from tflfuse.runtime import record
        os.environ["XDG_CACHE_HOME"] = {str(tmp_path)!r}
        from tflfuse.runtime.plan import run_op
        x = [np.ones(4, np.float32)] * 2
        dawn = tflfuse.Device(backend="dawn")
        run_op(dawn, "ADD", x)
        run_op(tflfuse.Device(), "ADD", x)
        print("LOOP", record._loaded["lib"] is not None, record._loaded["why"])
    """)
    from test_device import _compiler

    line = [s for s in out.splitlines() if s.startswith("LOOP")][0]
    assert line.startswith(f"LOOP {_compiler() is not None}"), line


def test_export_for_the_browser_keeps_the_fma_forms_on_a_dawn_device(tmp_path):
    # A browser has no subgroup matrices without a flag: a float16 plan exported from a Dawn device must not ask
    # for them (its shaders are those of wgpu-native's float16 plan).
    model = tmp_path / "pointwise.tflite"
    model.write_bytes(_pointwise_model())
    out = _in_dawn_null_process(f"""
        from pathlib import Path
        from tflfuse.web import export_web
        device = tflfuse.Device(backend="dawn")
        assert device.subgroup_matrix is not None
        export_web({str(model)!r}, {str(tmp_path / "web")!r}, precision="float16", target="gpu", device=device,
                   demo=False)
        it = tflfuse.Interpreter(model_path={str(model)!r}, device=device, precision="float16")
        it.allocate_tensors()
        print("PLAN", sum("subgroupMatrix" in p.source for p, _, _ in it._plan(0).steps))
        print("WEB", sum("subgroupMatrix" in f.read_text() for f in Path({str(tmp_path / "web")!r}).rglob("*.wgsl")))
    """)
    assert "PLAN 1" in out and "WEB 0" in out, out
    plan = json.loads((tmp_path / "web" / "plan.json").read_text())
    assert plan["requires"]["features"] == ["shader-f16"]


def test_a_lost_dawn_device_says_so():
    # Dawn's message for a lost device is "[Device] is lost.": the runtime turns it into DeviceLostError and
    # refuses every later call, as on wgpu-native
    out = _in_dawn_null_process("""
        device = tflfuse.Device(backend="dawn")
        it = tflfuse.Interpreter(model_content=__import__("test_matrix")._pointwise_model(), device=device)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], np.zeros((1, 64, 64, 32), np.float32))
        it.invoke()
        device.device.destroy()
        for _ in range(2):
            try:
                it.set_tensor(it.get_input_details()[0]["index"], np.zeros((1, 64, 64, 32), np.float32))
                it.invoke()
                print("NO ERROR")
            except tflfuse.DeviceLostError as e:
                print("LOST", "Make a new tflfuse.Device" in str(e))
        os._exit(0)   # wgpudawn may crash collecting objects of a destroyed device; nothing of ours is left to run
    """)
    assert out.count("LOST True") == 2, out


def test_dawn_plans_encode_submit_and_read_back_through_the_c_entry_points():
    # After the first command buffer (through wgpudawn's API, which raises for what Dawn refuses), a Dawn plan
    # records, submits and reads back through webgpu.h's C entry points, as on wgpu-native, waiting for its maps in
    # wgpuInstanceWaitAny: invokes with and without a read between them, a read long after the queue is done, then
    # a device lost while that path is in use. (The Null backend's buffers hold no computed values: shapes and
    # dtypes only; the values are checked on a GPU, benchmarks/dawn_matrix.py and benchmarks/run.py.)
    out = _in_dawn_null_process("""
        import time
        device = tflfuse.Device(backend="dawn")
        it = tflfuse.Interpreter(model_content=__import__("test_matrix")._pointwise_model(), device=device)
        it.allocate_tensors()
        x, y = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
        it.set_tensor(x, np.zeros((1, 64, 64, 32), np.float32))
        native = it._plan(0)._native
        print("NATIVE", native is not None and native._dawn)
        shapes = set()
        for i in range(6):
            it.invoke()
            if i % 2:
                time.sleep(0.05 if i == 5 else 0)
                got = it.get_tensor(y)
                shapes.add((got.shape, str(got.dtype)))
        print("SHAPES", sorted(shapes))
        device.device.destroy()
        try:
            it.invoke()
            it.get_tensor(y)
            print("NO ERROR")
        except tflfuse.DeviceLostError as e:
            print("LOST", "Make a new tflfuse.Device" in str(e))
        os._exit(0)   # wgpudawn may crash collecting objects of a destroyed device; nothing of ours is left to run
    """)
    assert "NATIVE True" in out and "SHAPES [((1, 64, 64, 64), 'float32')]" in out and "LOST True" in out, out


def test_dawn_read_backs_recover_from_interrupts_and_errors_stay_with_their_plan():
    # A KeyboardInterrupt inside the map's callback (cffi prints and swallows it) leaves the map done but its status
    # unknown: the read raises and unmaps, and the next one reads. A command Dawn refuses on the C path (a submit
    # with the read-back buffer still mapped) raises at that plan's invoke, not at another device's next call.
    out = _in_dawn_null_process("""
        model = __import__("test_matrix")._pointwise_model()

        def interpreter(device):
            it = tflfuse.Interpreter(model_content=model, device=device)
            it.allocate_tensors()
            it.set_tensor(0, np.zeros((1, 64, 64, 32), np.float32))
            for _ in range(2):
                it.invoke()
                it.get_tensor(it.get_output_details()[0]["index"])
            return it, it.get_output_details()[0]["index"]

        a, y = interpreter(tflfuse.Device(backend="dawn"))
        native = a._plan(0)._native
        real = native.lib

        class LosesTheStatus:
            def __getattr__(self, name):
                return getattr(real, name)

            def wgpuInstanceWaitAny(self, *args):
                status = real.wgpuInstanceWaitAny(*args)
                native._mapped[0] = None   # what an interrupt inside the callback leaves
                return status

        native.lib = LosesTheStatus()
        a.invoke()
        try:
            a.get_tensor(y)
        except RuntimeError as e:
            print("INTERRUPTED", "read it again" in str(e))
        native.lib = real
        for _ in range(2):
            a.invoke()
            print("READ", a.get_tensor(y).shape)
        b, _ = interpreter(tflfuse.Device(backend="dawn"))
        a.invoke()
        staging = a._plan(0)._staging[y]
        real.wgpuBufferMapAsync(staging._internal, real.WGPUMapMode_Read, 0, 16, native._map_info[0])
        try:
            a.invoke()   # submits the command buffer recorded ahead, which copies into the buffer being mapped
            print("NO ERROR")
        except Exception as e:
            print("REFUSED", type(e).__name__, "while pending map" in str(e))
        b.set_tensor(0, np.zeros((1, 64, 64, 32), np.float32))
        b.invoke()
        print("OTHER DEVICE", b.get_tensor(b.get_output_details()[0]["index"]).shape)
        os._exit(0)
    """)
    assert "INTERRUPTED True" in out and out.count("READ (1, 64, 64, 64)") == 2, out
    assert "REFUSED GPUValidationError True" in out and "OTHER DEVICE (1, 64, 64, 64)" in out, out


def _conv_chain_model(convs: int = 24) -> bytes:
    """``convs`` 1x1 CONV_2D with RELU in a chain over a 32 x 32 x 16 map: a plan of as many dispatches."""
    import numpy as np
    from tflite_builder import build, t

    rng = np.random.default_rng(0)
    tensors, ops = [t((1, 32, 32, 16), name="x")], []
    for k in range(convs):
        w = (rng.standard_normal((16, 1, 1, 16)) * 0.2).astype(np.float32)
        tensors += [t((16, 1, 1, 16), data=w), t((16,), data=np.zeros(16, np.float32)), t((1, 32, 32, 16))]
        n = len(tensors)
        ops.append(dict(op="CONV_2D", inputs=[n - 4 if k else 0, n - 3, n - 2], outputs=[n - 1],
                        options=("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1,
                                                   "fusedActivationFunction": 1})))
    return build(tensors, ops, [0], [len(tensors) - 1])


def test_interpreters_on_one_dawn_device_invoke_from_several_threads():
    # Dawn's implicit device synchronization (asked for where offered): without it, three threads invoking three
    # Interpreters of a 24-dispatch plan on one Dawn device crashed the process (a segfault in 2 of 3 runs)
    out = _in_dawn_null_process("""
        import threading
        device = tflfuse.Device(backend="dawn")
        print("FEATURE", "implicit-device-synchronization" in device.features)
        model = __import__("test_matrix")._conv_chain_model()
        its = []
        for precision in ("float32", "float16", "float32"):
            its.append(tflfuse.Interpreter(model_content=model, device=device, precision=precision))
            its[-1].allocate_tensors()
        done, errors = [], []

        def work(it):
            try:
                for i in range(60):
                    it.set_tensor(0, np.zeros((1, 32, 32, 16), np.float32))
                    it.invoke()
                    if i % 3 == 0:
                        assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (1, 32, 32, 16)
                done.append(it)
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(it,)) for it in its]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("DONE", len(done), errors)
    """)
    assert "FEATURE True" in out and "DONE 3 []" in out, out


@pytest.mark.parametrize("value", [2 ** 31, 2 ** 40, 3, 48, 256, 2])
def test_get_shader_refuses_subgroup_sizes_no_device_has(value):
    with pytest.raises(ValueError, match=r"one of \(4, 8, 16, 32, 64, 128\)"):
        _shaders(*CASES[0][1:], subgroup=value)


def test_get_shader_takes_numpy_ints_but_no_numpy_floats():
    import numpy as np

    assert any("subgroupMatrix" in p.wgsl for p in _shaders(*CASES[0][1:], subgroup=np.int64(32)).programs)
    with pytest.raises(ValueError, match="subgroup_matrix"):
        _shaders(*CASES[0][1:], subgroup=np.float32(32.0))


@pytest.mark.parametrize("args", [(0,), (48,), ("32",), (32.0,), (True,), (32, 1024), (32, 16384.0)])
def test_subgroup_matrix_refuses_what_no_device_has(args):
    with pytest.raises(ValueError):
        SubgroupMatrix(*args)


def test_matrix_tile_refuses_numpy_sizes_and_tiles_past_any_workgroup():
    import numpy as np

    for args in [(np.int64(2), 2, 2, 2), (16, 1, 1, 1), (1, 1, 8, 8), (2, 2, 2, 2, 512)]:
        with pytest.raises(KernelError, match="matrix tile"):
            MatrixTile(*args)


def test_library_tiles_hold_at_most_max_subgroups():
    from tflfuse.kernels.matrix import MAX_SUBGROUPS, MEASURED_MATRIX_TILES

    tiles = [MatrixTile.parse(v) for v in MEASURED_MATRIX_TILES.values()]
    tiles += [matrix_tile(r, d, c) for r, d, c in [(9, 40, 8), (9, 40, 24), (9, 40, 200), (9, 16, 200)]]
    assert all(t.subgroups <= MAX_SUBGROUPS for t in tiles)

"""benchmarks/run.py: its plot step (``--plot``), run as a user runs it (a subprocess on a results JSON), and
its pure functions (FLOP counting, the roofline, the report), imported."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels.base import TensorSpec
from tflite_builder import build, t


ROOT = Path(__file__).resolve().parents[1]


def _row(model, fused_ms, unfused_ms, litert_ms):
    return {"model": model, "batch": 1, "ops": 10, "dispatches": 5, "tflfuse_ms": fused_ms,
            "unfused_ms": unfused_ms, "litert_gpu_ms": litert_ms, "tflfuse_thr_ms": fused_ms / 2,
            "unfused_thr_ms": unfused_ms / 2}


def test_plot_writes_a_png(tmp_path):
    rows = [_row("a_fused", 0.4, 0.7, 0.8), _row("b_fused", 0.5, 0.9, 1.1),
            {"model": "a_unfused", "batch": 1, "ops": 12, "dispatches": 9, "tflfuse_ms": 0.7}]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    png = tmp_path / "plot.png"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), f"--plot={tmp_path / 'r.json'}",
                    f"--png={png}"], check=True, capture_output=True, timeout=300)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_refuses_results_without_fused_rows(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps([{"model": "a_unfused", "batch": 1, "tflfuse_ms": 0.7}]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), f"--plot={tmp_path / 'r.json'}",
                           f"--png={tmp_path / 'p.png'}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no fused rows" in proc.stderr
    assert not (tmp_path / "p.png").exists()


def _run_script(*args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), *args], capture_output=True,
                          text=True, timeout=300)


_GOOD = {"rows": [{"model": "a_unfused", "batch": 1, "ops": 12, "dispatches": 9, "tflfuse_ms": 0.7}],
         "meta": {"date": "2026-12-01 13:00 UTC", "adapter": "Test GPU [DiscreteGPU, Vulkan]", "driver": "1.0",
                  "versions": "tflfuse 0", "repeats": 10, "warmup": 2, "rounds": 2, "throughput_n": 100,
                  "throughput_repeats": 4, "peaks": {}}}


def test_table_rewrites_the_tables_from_saved_results(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(_GOOD))
    proc = _run_script(f"--table={tmp_path / 'r.json'}", f"--out={tmp_path / 'r.md'}")
    assert proc.returncode == 0, proc.stderr
    assert "| a_unfused | 1 | 12 | 9 | 0.70 |" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("content, message", [
    (None, "cannot be read as JSON (FileNotFoundError"),
    ("{", "cannot be read as JSON (JSONDecodeError"),
    ("[1, 2]", "not a --json_out file"),
    (json.dumps({**_GOOD, "rows": []}), "its 'rows' are empty"),
    (json.dumps({**_GOOD, "rows": [{"model": 3, "batch": 1}]}), "row 0 is not an object with a string 'model'"),
    (json.dumps({**_GOOD, "rows": [{**_GOOD["rows"][0], "tflfuse_ms": -1.0}]}), "NaN, infinite or negative"),
    (json.dumps({**_GOOD, "meta": {}}), "do not fit this version's tables (KeyError"),
    (json.dumps({**_GOOD, "rows": [{**_GOOD["rows"][0], "tflfuse_ms": "fast"}]}), "do not fit this version's"),
])
def test_table_refuses_bad_results_with_a_message_and_writes_nothing(tmp_path, content, message):
    if content is not None:
        (tmp_path / "r.json").write_text(content)
    proc = _run_script(f"--table={tmp_path / 'r.json'}", f"--out={tmp_path / 'r.md'}")
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.md").exists()


def test_table_takes_errors_that_are_not_finite(tmp_path):
    # an output that overflowed float16 has an infinite or NaN error: written by --json_out, read by --table
    row = {**_GOOD["rows"][0], "f16_ms": 0.5, "f16_rel_err": float("nan"), "dawn_f16_ms": 0.4,
           "dawn_f16_rel_err": float("inf")}
    (tmp_path / "r.json").write_text(json.dumps({**_GOOD, "rows": [row]}))
    proc = _run_script(f"--table={tmp_path / 'r.json'}", f"--out={tmp_path / 'r.md'}")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "r.md").read_text()
    assert "| nan |" in text and "| inf |" in text, text


def test_a_run_names_a_missing_adapter_in_one_line_and_times_on_wgpu_native_whatever_tflfuse_webgpu_says(tmp_path):
    proc = _run_script(f"--models={tmp_path}", "--adapter=no such adapter")
    assert proc.returncode == 2 and "no WebGPU adapter matching --adapter=no such adapter" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    model = build([t((1, 9, 9, 8)), t((1, 9, 9, 8))], [{"op": "RELU", "inputs": [0], "outputs": [1]}], [0], [1])
    (tmp_path / "relu.tflite").write_bytes(model)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), f"--models={tmp_path}",
                           "--select=relu", "--repeats=2", "--warmup=1", "--rounds=1", "--throughput_n=2",
                           "--throughput_repeats=1", "--nopeaks", "--notorch", "--nolitert_gpu",
                           f"--out={tmp_path / 'r.md'}"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TFLFUSE_WEBGPU": "dawn", "WGPU_BACKEND_TYPE": "Null"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "r.md").read_text()
    adapter = tflfuse.Device(backend="wgpu-native").describe()
    assert f"- adapter: {adapter};" in text and "Dawn" not in text.split("- adapter: ")[1].split("\n")[0], text


def test_table_will_not_overwrite_its_own_results(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(_GOOD))
    proc = _run_script(f"--table={tmp_path / 'r.json'}", f"--out={tmp_path / 'r.json'}")
    assert proc.returncode == 2 and "would overwrite the results it is read from" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text()) == _GOOD


# ---- the pure functions: FLOP counting, the roofline, the report ----------------------------------------
@pytest.fixture(scope="module")
def bench():
    """benchmarks/run.py as a module (it defines its flags only when run as a script)."""
    spec = importlib.util.spec_from_file_location("benchmarks_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _op(name, inputs, runtime=(), **shapes):
    """A one-op graph: tensors 0.. in ``shapes`` order (``t0=(...)``); those in ``runtime`` (and the last,
    the output) are runtime tensors, the rest constants."""
    specs, consts = {}, {}
    keys = sorted(shapes, key=lambda k: int(k[1:]))
    for k in keys:
        t = int(k[1:])
        if t in runtime or k == keys[-1]:
            specs[t] = TensorSpec(shapes[k])
        else:
            consts[t] = np.zeros(shapes[k], np.float32)
    graph = types.SimpleNamespace(specs=specs, consts=consts)
    return graph, types.SimpleNamespace(name=name, inputs=list(inputs), outputs=[int(keys[-1][1:])])


class TestOpFlops:
    def test_conv_2d_whatever_the_filter_layout(self, bench):
        # 1x8x8x3 -> 4 channels, 3x3, SAME: 64 pixels x 4 outputs x 27 MACs, 2 FLOPs each
        for filt in ((4, 3, 3, 3), (3, 3, 3, 4)):   # OHWI as in the file, HWIO as re-laid out for a GPU
            g, op = _op("CONV_2D", [0, 1, -1], runtime=(0,), t0=(1, 8, 8, 3), t1=filt, t2=(1, 8, 8, 4))
            assert bench.op_flops(g, op) == 2 * 64 * 4 * 27 == 13824
        g, op = _op("CONV_2D", [0, 1, 2], runtime=(0,), t0=(1, 8, 8, 3), t1=(4, 3, 3, 3), t2=(4,), t3=(1, 4, 4, 4))
        assert bench.op_flops(g, op) == 2 * 16 * 4 * 27   # stride 2, with a bias

    def test_depthwise_fully_connected_and_fused_convs(self, bench):
        g, op = _op("DEPTHWISE_CONV_2D", [0, 1, 2], runtime=(0,), t0=(1, 8, 8, 4), t1=(1, 3, 3, 4), t2=(4,),
                    t3=(1, 8, 8, 4))
        assert bench.op_flops(g, op) == 2 * 64 * 4 * 9
        g, op = _op("FULLY_CONNECTED", [0, 1, -1], runtime=(0,), t0=(2, 16), t1=(10, 16), t2=(2, 10))
        assert bench.op_flops(g, op) == 2 * 2 * 10 * 16
        g, op = _op("fused_conv2d", [0, 1, 2], runtime=(0,), t0=(1, 8, 8, 3), t1=(3, 3, 3, 4), t2=(4,),
                    t3=(1, 8, 8, 4))
        assert bench.op_flops(g, op) == 13824
        g, op = _op("fused_depthwise_conv2d", [0, 1], runtime=(0,), t0=(1, 8, 8, 4), t1=(3, 3, 4, 2),
                    t2=(1, 8, 8, 8))   # depth multiplier 2
        assert bench.op_flops(g, op) == 2 * 64 * 8 * 9
        # depthwise 3x3 over 4 channels, then 1x1 to 6, per output pixel
        g, op = _op("fused_separable_conv2d", [0, 1, 2], runtime=(0,), t0=(1, 8, 8, 4), t1=(3, 3, 4, 1),
                    t2=(1, 1, 4, 6), t3=(1, 8, 8, 6))
        assert bench.op_flops(g, op) == 2 * 64 * (4 * 9 + 4 * 6)

    def test_bottleneck(self, bench):
        # x [1, 8, 8, 4], expansion to 24, 3x3 depthwise stride 2, projection to 8
        shapes = dict(t0=(1, 8, 8, 4), t1=(4, 24), t2=(24,), t3=(3, 3, 24), t4=(24,), t5=(24, 8), t6=(8,))
        g, op = _op("fused_bottleneck", range(7), runtime=(0,), **shapes, t7=(1, 4, 4, 8))
        expand, depthwise, project = 64 * 4 * 24, 16 * 24 * 9, 16 * 24 * 8
        assert bench.op_flops(g, op) == 2 * (expand + depthwise + project) == 25344
        # with squeeze-excite (24 -> 6 -> 24): two layers for the image, the pool and the scaling
        g, op = _op("fused_bottleneck", range(11), runtime=(0,), **shapes, t7=(24, 6), t8=(6,), t9=(6, 24),
                    t10=(24,), t11=(1, 4, 4, 8))
        assert bench.op_flops(g, op) == 25344 + 2 * (144 + 144) + 2 * 16 * 24
        # no expansion: depthwise and projection only
        g, op = _op("fused_bottleneck", range(5), runtime=(0,), t0=(1, 8, 8, 24), t1=(3, 3, 24), t2=(24,),
                    t3=(24, 8), t4=(8,), t5=(1, 8, 8, 8))
        assert bench.op_flops(g, op) == 2 * (64 * 24 * 9 + 64 * 24 * 8)

    def test_elementwise_reductions_data_movement_and_fallback(self, bench):
        g, op = _op("ADD", [0, 1], runtime=(0, 1), t0=(1, 8, 8, 4), t1=(1, 8, 8, 4), t2=(1, 8, 8, 4))
        assert bench.op_flops(g, op) == 256
        g, op = _op("MEAN", [0, 1], runtime=(0,), t0=(1, 8, 8, 4), t1=(2,), t2=(1, 4))
        assert bench.op_flops(g, op) == 256
        g, op = _op("RESHAPE", [0, 1], runtime=(0,), t0=(1, 8, 8, 4), t1=(2,), t2=(1, 256))
        assert bench.op_flops(g, op) == 0
        g, op = _op("SOME_NEW_OP", [0], runtime=(0,), t0=(3, 5), t1=(5, 3))
        assert bench.op_flops(g, op) == 15

    @pytest.mark.parametrize("name", ["face_detection_short_range", "hand_landmark_lite", "selfie_segmentation"])
    def test_fusion_keeps_a_real_models_conv_flops(self, bench, name):
        """Lowered as for a GPU (re-laid-out weights) and fused, a MediaPipe model's convolution FLOPs stay the
        same: the fused ops' count is the sum of the convolutions they replace (a squeeze-excite's with its
        pool, MEAN or AVERAGE_POOL_2D, and scaling, MUL; a fused_matmul's with its FULLY_CONNECTED)."""
        import tflfuse
        from tflfuse import zoo
        from tflfuse.passes.fuse import PATTERNS
        from tflfuse.runtime.plan import lower

        names = set(sys.modules['roofline']._MACS) | {"fused_bottleneck", "fused_squeeze_excite", "MEAN", "AVERAGE_POOL_2D", "MUL",
                                                        "fused_matmul"}

        def conv_flops(data):
            graph = lower(tflfuse.Model(data), 0, target="gpu")
            return sum(bench.op_flops(graph, op) for op in graph.ops if op.name in names)

        data = zoo.fetch(name).read_bytes()
        unfused = conv_flops(data)
        assert unfused > 1e6
        # resize_conv moves a conv onto the resize's smaller input: fewer FLOPs by design
        keep = [p for p in PATTERNS if p != "resize_conv"]
        assert conv_flops(tflfuse.fuse(data, patterns=keep)[0]) == unfused
        moved = conv_flops(tflfuse.fuse(data)[0])
        assert moved < unfused if name == "selfie_segmentation" else moved == unfused


class TestRoofline:
    def test_bound_is_the_slower_of_memory_and_arithmetic(self, bench):
        assert sys.modules['roofline'].roofline_us(1e6, 1e9, 1000.0, 10.0) == pytest.approx(100.0)    # FLOP-bound: 1e9 / 1e13 s
        assert sys.modules['roofline'].roofline_us(1e9, 1e6, 1000.0, 10.0) == pytest.approx(1000.0)   # memory-bound: 1e9 / 1e12 s

    def test_percent(self, bench):
        assert sys.modules['roofline'].roofline_percent(200.0, 100.0) == pytest.approx(50.0)
        assert sys.modules['roofline'].roofline_percent(100.0, 100.0) == pytest.approx(100.0)
        assert np.isnan(sys.modules['roofline'].roofline_percent(0.0, 1.0))

    def test_by_kind_sums_each_ops_bound(self, bench):
        costs = [["CONV_2D", 10.0, 1e6, 1e9], ["CONV_2D", 30.0, 2e6, 0], ["ADD", 5.0, 1e6, 1e3]]
        kinds = bench.roofline_by_kind(costs, 1000.0, 10.0)
        assert list(kinds) == ["(model)", "CONV_2D", "ADD"]
        assert kinds["CONV_2D"]["bound_us"] == pytest.approx(100.0 + 2.0)
        assert kinds["CONV_2D"]["percent"] == pytest.approx(100 * 102 / 40)
        assert kinds["ADD"]["percent"] == pytest.approx(100 * 1.0 / 5.0)
        assert kinds["(model)"]["us"] == pytest.approx(45.0)
        assert kinds["(model)"]["bound_us"] == pytest.approx(103.0)


def test_fma_source_has_the_asked_chains(bench):
    import peaks   # benchmarks/peaks.py, on the path once run.py is imported

    src = peaks.fma_source("f16", 16, accumulators=8, unroll=4)
    assert src.startswith("enable f16;") and "vec4<f16>" in src
    assert src.count("= fma(") == 8 * 4 and "k < 4u" in src
    assert "enable f16" not in peaks.fma_source("f32", 16)
    with pytest.raises(ValueError, match="dtype"):
        peaks.fma_source("f64", 16)


def test_table_renders_skipped_peers_and_the_roofline(bench, tmp_path):
    costs = [["fused_bottleneck", 400.0, 4_000_000, 500_000_000], ["CONV_2D", 30.0, 1_000_000, 20_000_000]]
    rows = [
        {"model": "mobilenet_v2_fused", "batch": 1, "ops": 60, "dispatches": 54, "tflfuse_ms": 0.6,
         "tflfuse_thr_ms": 0.4, "unfused_ms": 0.7, "unfused_thr_ms": 0.5, "gpu_one_pass_ms": 0.37,
         "litert_gpu_ms": 1.0, "litert_gpu_thr_ms": 0.5, "torch_note": "PyTorch skipped: ImportError: no torch",
         "gpu_us_by_op": {"fused_bottleneck": 400.0, "CONV_2D": 30.0}, "op_costs": costs},
        {"model": "mobilenet_v2_unfused", "batch": 1, "ops": 70, "dispatches": 65, "tflfuse_ms": 0.7,
         "litert_gpu_note": "LiteRT WebGPU: RuntimeError: no adapter", "max_abs_err_vs_litert": 1e-6,
         "cpu_fallback_ops": 2},
    ]
    meta = {"date": "2026-12-01 13:00 UTC", "adapter": "Test GPU [DiscreteGPU, Vulkan]", "driver": "1.0",
            "versions": "tflfuse 0", "repeats": 10, "warmup": 2, "rounds": 2, "throughput_n": 100,
            "throughput_repeats": 4,
            "peaks": {"copy_gb_per_s": 1000.0, "f32_tflops": 10.0, "f16_note": "the adapter has no shader-f16"}}
    out = tmp_path / "r.md"
    bench.write_table(rows, meta, out)
    text = out.read_text()
    assert "copy 1000 GB/s" in text and "f32 FMA 10 TFLOP/s" in text and "no shader-f16" in text
    assert "| 1 | 0.60 | 0.40 | 0.70 | 0.50 | PyTorch skipped: ImportError: no torch |" in text
    assert "LiteRT WebGPU: RuntimeError: no adapter" in text
    assert "Ops on the CPU fallback (LiteRT's CPU interpreter inside tflfuse's invoke): mobilenet_v2_unfused " \
           "(batch 1): 2." in text
    # bound: bottleneck max(4 us, 50 us), CONV_2D max(1 us, 2 us); the model: 52 us against 370 us
    assert "| mobilenet_v2_fused | 1 | 430 | 370 | 52 | 14% |" in text
    assert "fused_bottleneck 12%, CONV_2D 6.7%" in text


def _product_tables(bench, tmp_path, peaks, products, f16_products=None) -> str:
    """The Markdown that write_table gives for an unfused MobileNetV2 row at batch 32 with these products."""
    row = {"model": "mobilenet_v2_unfused", "batch": 32, "ops": 70, "dispatches": 65, "tflfuse_ms": 3.0,
           "products": products}
    if f16_products:
        row["f16_products"] = f16_products
    meta = {"date": "2026-12-01 13:00 UTC", "adapter": "Test GPU [DiscreteGPU, Vulkan]", "driver": "1.0",
            "versions": "tflfuse 0", "repeats": 10, "warmup": 2, "rounds": 2, "throughput_n": 100,
            "throughput_repeats": 4, "peaks": peaks}
    out = tmp_path / "r.md"
    bench.write_table([row], meta, out)
    return out.read_text()


def test_product_table_gives_each_shape_against_the_fma_peak_and_its_roofline(bench, tmp_path):
    # two ops of 1000 x 100 x 200 (40 MFLOP, 1.28 MB each) at 10 us and 30 us, one of 10 x 100 x 10 at 1 us
    products = [[1000, 100, 200, 10.0], [1000, 100, 200, 30.0], [10, 100, 10, 1.0]]
    text = _product_tables(bench, tmp_path, {"copy_gb_per_s": 1000.0, "f32_tflops": 10.0}, products)
    # 40 MFLOP in 20 us on average: 2 TFLOP/s, 20% of 10; bound max(1.28 us, 4 us) = 4 us, 20% of 20 us
    assert "| 1000 x 100 x 200 | 2 | 20.0 | 2.0 | 20% | 20% |" in text
    # 20 kFLOP in 1 us: 0.02 TFLOP/s; bound max(8.4 kB / 1000 GB/s = 0.0084 us, 0.002 us): 0.84%
    assert "| 10 x 100 x 10 | 1 | 1.0 | 0.0 | 0.2% | 0.84% |" in text
    # all: 80.02 MFLOP in 41 us (1.95 TFLOP/s, 20%); bounds 4 + 4 + 0.0084 us against 41 us: 20%
    assert "| all | 3 | 41 in all | 2.0 | 20% | 20% |" in text


def test_float16_product_table_counts_two_bytes_an_element_against_the_f16_peak(bench, tmp_path):
    # 1000 x 100 x 200 (40 MFLOP, 0.64 MB in f16) at 4 us, against an f16 peak of 20 TFLOP/s and 100 GB/s
    text = _product_tables(bench, tmp_path, {"copy_gb_per_s": 100.0, "f32_tflops": 10.0, "f16_tflops": 20.0},
                           [[1000, 100, 200, 8.0]], [[1000, 100, 200, 4.0]])
    f32, f16 = text.split("in its float16 plan")
    # float32: 40 MFLOP in 8 us (5 TFLOP/s, 50% of 10); bound max(1.28 MB / 100 GB/s = 12.8 us, 4 us): 160%;
    # at the bound, 4 us of multiply-adds in 12.8: 31% of the peak, below target 4's 40%
    assert "| 1000 x 100 x 200 | 1 | 8.0 | 5.0 | 50% | 160% | 31% |" in f32
    assert "1 of these 1 shapes (1 of 1 ops) cannot reach 40% of the f32 FMA peak" in f32
    # float16: 10 TFLOP/s, 50% of 20; bound max(0.64 MB / 100 GB/s = 6.4 us, 2 us) against 4 us: 160%; 2 / 6.4
    assert "% of f16 FMA peak" in f16 and "| 1000 x 100 x 200 | 1 | 4.0 | 10.0 | 50% | 160% | 31% |" in f16
    assert "1000 x 100 x 200 (31%). All together the bound allows 31%." in f16


def test_product_table_names_no_shape_where_every_bound_allows_target_4(bench, tmp_path):
    # 1000 x 1000 x 1000: 2 GFLOP, 200 us at 10 TFLOP/s; 12 MB / 100 GB/s = 120 us: compute-bound, 100% at the bound
    text = _product_tables(bench, tmp_path, {"copy_gb_per_s": 100.0, "f32_tflops": 10.0}, [[1000, 1000, 1000, 400.0]])
    # 5 TFLOP/s: 50% of the peak, 50% of the 200 us bound, which allows 100%
    assert "| 1000 x 1000 x 1000 | 1 | 400.0 | 5.0 | 50% | 50% | 100% |" in text
    assert "cannot reach" not in text and "in its float16 plan" not in text


def test_int8_table_sets_each_int8_file_beside_its_float_twin_and_litert(bench, tmp_path):
    rows = [{"model": "mobilenet_v2_unfused_int8", "batch": 1, "ops": 70, "dispatches": 66, "tflfuse_ms": 0.9,
             "tflfuse_thr_ms": 0.6, "gpu_one_pass_ms": 0.5, "litert_gpu_ms": 1.8, "litert_gpu_thr_ms": 0.3,
             "max_abs_err_vs_litert": 3.9e-3, "cpu_fallback_ops": 0},
            {"model": "mobilenet_v2_unfused", "batch": 1, "ops": 70, "dispatches": 65, "tflfuse_ms": 0.6,
             "tflfuse_thr_ms": 0.4, "gpu_one_pass_ms": 0.25},
            {"model": "mobilenet_v3_small_int8", "batch": 1, "ops": 90, "dispatches": 80, "tflfuse_ms": 0.5,
             "litert_gpu_note": "LiteRT WebGPU: RuntimeError: no adapter", "cpu_fallback_ops": 1}]
    meta = {"date": "2026-12-01 13:00 UTC", "adapter": "Test GPU [DiscreteGPU, Vulkan]", "driver": "1.0",
            "versions": "tflfuse 0", "repeats": 10, "warmup": 2, "rounds": 2, "throughput_n": 100,
            "throughput_repeats": 4, "peaks": {}}
    out = tmp_path / "r.md"
    bench.write_table(rows, meta, out)
    text = out.read_text()
    # int8 / float: 0.9 / 0.6, 0.6 / 0.4, 0.5 / 0.25; int8 / LiteRT WebGPU: 0.9 / 1.8, 0.6 / 0.3
    assert ("| mobilenet_v2_unfused_int8 | 1 | 66 | 0.90 | 0.60 | 0.50 | 0.60, 0.40, 0.25 | 1.50x, 1.50x, 2.00x | "
            "1.80, 0.30 | 0.50x, 2.00x | 3.90e-03 | 0 |") in text
    # no float twin, no LiteRT WebGPU: the note instead
    assert "| mobilenet_v3_small_int8 | 1 | 80 | 0.50 |" in text and "no adapter" in text.split("int8 (full")[1]



def _dawn_meta(dawn, **peaks):
    return {"date": "2026-12-01 13:00 UTC", "adapter": "Test GPU [DiscreteGPU, Vulkan]", "driver": "1.0",
            "versions": "tflfuse 0", "repeats": 10, "warmup": 2, "rounds": 2, "throughput_n": 100,
            "throughput_repeats": 4, "peaks": peaks, **({"dawn": dawn} if dawn else {})}


def test_dawn_table_sets_dawn_f16_beside_wgpu_native_and_its_fused_speed_up(bench, tmp_path):
    """Rows with Dawn's float16 run render the table on Dawn (ratios to wgpu-native's float16 and float32 runs, the
    fused speed-up from the unfused twin's Dawn row, a model Dawn refused as its note) and its products' table, also
    from the saved results that --table reads."""
    fused = {"model": "mobilenet_v2_fused", "batch": 32, "ops": 60, "dispatches": 54, "tflfuse_ms": 5.0,
             "gpu_one_pass_ms": 4.8, "f16_ms": 4.0, "f16_thr_ms": 3.0, "f16_gpu_one_pass_ms": 3.0,
             "f16_rel_err": 1.2e-3,
             "dawn_f16_ms": 2.0, "dawn_f16_thr_ms": 1.5, "dawn_f16_gpu_one_pass_ms": 1.2, "dawn_f16_dispatches": 55,
             "dawn_f16_matrix_dispatches": 34, "dawn_f16_rel_err": 8e-4}
    unfused = {"model": "mobilenet_v2_unfused", "batch": 32, "ops": 70, "dispatches": 65, "tflfuse_ms": 6.0,
               "f16_ms": 5.0, "dawn_f16_ms": 3.0, "dawn_f16_thr_ms": 2.4, "dawn_f16_gpu_one_pass_ms": 1.8,
               "dawn_f16_dispatches": 66, "dawn_f16_matrix_dispatches": 34,
               "dawn_f16_products": [[1000, 100, 200, 2.0]]}
    refused = {"model": "hand_landmark_lite_fused", "batch": 1, "ops": 9, "dispatches": 9, "tflfuse_ms": 0.5,
               "dawn_f16_note": "Dawn float16: ShaderCompileError: no such builtin"}
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps({"rows": [fused, unfused, refused], "meta": _dawn_meta(
        "NVIDIA H100 [DiscreteGPU, Vulkan, Dawn, subgroup matrices]", copy_gb_per_s=100.0, f32_tflops=10.0,
        f16_tflops=20.0)}))
    data = bench._saved_results(str(saved))
    bench.write_table(data["rows"], data["meta"], tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "Each float model is timed in float16 on Dawn too" in text
    assert text.index("float16 on Dawn (`Device(backend=\"dawn\")`, NVIDIA H100 [DiscreteGPU, Vulkan, Dawn, subgroup "
                      "matrices]") > text.index("float16 (`precision=\"float16\"`")
    # Dawn / wgpu-native f16: 2.0 / 4.0, 1.5 / 3.0, 1.2 / 3.0; Dawn / wgpu-native f32 GPU: 1.2 / 4.8; fused speed-up
    # on Dawn: the twin's 1.8 / 1.2 (GPU) and 2.4 / 1.5 (thr.)
    assert ("| mobilenet_v2_fused | 32 | 2.00 | 1.50 | 1.20 | 34 / 55 | 0.50x, 0.50x, 0.40x | 0.25x | 1.50x, 1.60x | "
            "1.2e-03 | 8.0e-04 |") in text
    assert "| mobilenet_v2_unfused | 32 | 3.00 | 2.40 | 1.80 | 34 / 66 | 0.60x |  |  |  |  |" in text   # 3.0 / 5.0
    assert "| hand_landmark_lite_fused | 1 | Dawn float16: ShaderCompileError: no such builtin |" in text
    # its products: 40 MFLOP in 2 us, 20 TFLOP/s, 100% of the f16 FMA peak; bound max(0.64 MB / 100 GB/s = 6.4 us,
    # 2 us) against 2 us: 320%; at the bound 2 / 6.4: 31%
    dawn_products = text.split("in the float16 plan on Dawn")[1]
    assert "| 1000 x 100 x 200 | 1 | 2.0 | 20.0 | 100% | 320% | 31% |" in dawn_products
    assert "in its float16 plan" not in text   # no wgpu-native float16 products in these rows


def test_matrix_dispatches_counts_the_programs_on_subgroup_matrices(bench):
    """A float16 plan's 1x1 CONV_2D on subgroup matrices counts, its FMA form does not (the WGSL that
    tflfuse.kernels.matrix and the tiled product write, no GPU needed); both stay products for _product_sizes."""
    args = ("CONV_2D", [(32, 28, 28, 32), (1, 1, 32, 192), (192,)], {"filter_layout": "HWIO", "target": "gpu"})
    matrix = tflfuse.get_shader(*args, precision="float16", subgroup_matrix=32).wgsl
    fma = tflfuse.get_shader(*args, precision="float16").wgsl
    assert "var<workgroup> ta:" in matrix and "var<workgroup> ta:" in fma
    steps = [(types.SimpleNamespace(source=src), None, None) for src in (matrix, fma, matrix)]
    assert bench._matrix_dispatches(types.SimpleNamespace(steps=steps)) == 2

@pytest.mark.parametrize("dawn", ["not timed: NoAdapterError: no GPU adapter", None])
def test_dawn_table_says_why_no_model_ran_on_dawn(bench, tmp_path, dawn):
    """Rows without Dawn's keys render no table on Dawn: the line saying why where the run's meta says it was not
    timed, nothing where the meta has no word on Dawn (results saved before it)."""
    rows = [{"model": "m_unfused", "batch": 1, "ops": 3, "dispatches": 3, "tflfuse_ms": 0.7, "f16_ms": 0.6}]
    bench.write_table(rows, _dawn_meta(dawn), tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "| Dawn f16 ms |" not in text and "timed in float16 on Dawn too" not in text
    assert ("float16 on Dawn: not timed: NoAdapterError: no GPU adapter." in text) == bool(dawn)
    assert dawn or "Dawn" not in text


def test_dawn_device_is_made_only_where_asked_and_says_why_not(bench, monkeypatch):
    """--dawn (on by default) makes the Dawn device once; --nodawn, --nof16, the software adapter and a missing
    wgpudawn (blocked from importing here, whether or not this machine has it) give None and the report's line."""
    help_text = _run_script("--helpshort").stdout
    assert "--[no]dawn: Also time each float model in float16 on Dawn" in help_text
    assert re.search(r"--\[no\]dawn:[^-]*?\(default: 'true'\)", help_text, re.S), help_text
    gpu = types.SimpleNamespace(is_software=False)
    for dawn, f16, device, why in ((False, True, gpu, "--nodawn"), (True, False, gpu, "--nof16"),
                                   (True, True, types.SimpleNamespace(is_software=True), "the adapter is a software")):
        monkeypatch.setattr(bench, "FLAGS", types.SimpleNamespace(dawn=dawn, f16=f16, adapter=None))
        made, line = bench._dawn_device(device)
        assert made is None and line.startswith(f"not timed: {why}"), line
    monkeypatch.setattr(bench, "FLAGS", types.SimpleNamespace(dawn=True, f16=True, adapter=None))
    monkeypatch.setitem(sys.modules, "wgpudawn", None)
    made, line = bench._dawn_device(gpu)
    assert made is None and line.startswith("not timed: NoAdapterError: "), line

# ---- benchmarks/ort_webgpu.py: ONNX Runtime WebGPU beside tflfuse ------------------------------------------
@pytest.fixture(scope="module")
def ort_bench(bench):
    """benchmarks/ort_webgpu.py as a module (its flags defined only when run as a script)."""
    spec = importlib.util.spec_from_file_location("benchmarks_ort", ROOT / "benchmarks" / "ort_webgpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ort_table_renders_timed_and_skipped_rows(ort_bench, tmp_path):
    rows = [{"batch": 1, "ort": "onnxruntime-webgpu 1.27.0", "tflfuse_ms": 0.4, "tflfuse_thr_ms": 0.3,
             "ort_ms": 2.0, "ort_thr_ms": 1.5, "max_abs_diff": 1e-6},
            {"batch": 32, "ort": "onnxruntime 1.27.0: its WebGPU provider found no adapter (it fell back to CPU)",
             "tflfuse_ms": 1.9, "tflfuse_thr_ms": 1.5}]
    meta = {"date": "2026-12-04 06:21 UTC", "adapter": "Test GPU", "driver": "1.0", "repeats": 50,
            "throughput_n": 100, "rounds": 5}
    ort_bench.write_table(rows, meta, tmp_path / "o.md")
    text = (tmp_path / "o.md").read_text()
    assert "| 1 | 0.40 | 0.30 | 2.00 | 1.50 | 0.20x, 0.20x | 1.00e-06 |" in text
    assert "| 32 | 1.90 | 1.50 | onnxruntime 1.27.0: its WebGPU provider found no adapter" in text
    assert "latency the median of 50 runs" in text and "Test GPU; driver: 1.0" in text


def test_ort_session_names_a_missing_onnxruntime(ort_bench, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # import onnxruntime raises ImportError
    session, note = ort_bench._session(tmp_path / "m.onnx")
    assert session is None and note.startswith("onnxruntime-webgpu not installed")


# ---- benchmarks/shader_checks.py: trusted shaders beside checked ones -----------------------------------------
def test_shader_checks_compares_trusted_and_checked_devices(device):
    """The script's comparison on a small model (two devices of the test adapter): the same bits out, a GPU time
    and a throughput for each, and the table's row and ratio from them."""
    spec = importlib.util.spec_from_file_location("benchmarks_shader_checks",
                                                  ROOT / "benchmarks" / "shader_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 5)).astype(np.float32)
    model = build([t((1, 9, 7, 5)), t(w.shape, data=w), t((8,), data=np.zeros(8, np.float32)),
                   t((1, 5, 4, 8), name="y")],
                  [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3],
                        options=("Conv2DOptions", {"padding": 0, "strideH": 2, "strideW": 2}))], [0], [3])
    devices = {"trusted": tflfuse.Device(device.name, shader_checks=False),
               "checked": tflfuse.Device(device.name, shader_checks=True)}
    r = module.compare(model, devices, batch=2, rounds=1, n=2)
    assert r["max_diff"] == 0.0
    assert set(r["gpu_us"]) == set(r["thr_ms"]) == {"trusted", "checked"}
    assert all(v > 0 for v in [*r["gpu_us"].values(), *r["thr_ms"].values()])
    fixed = {"model": "conv", "batch": 2, "gpu_us": {"trusted": 80.0, "checked": 100.0},
             "thr_ms": {"trusted": 0.3, "checked": 0.25}, "max_diff": 0.0}
    text = module.table([fixed], "Test GPU", rounds=1, n=2)
    assert "| conv | 2 | 80.0 | 100.0 | 0.80x | 0.300 | 0.250 | 1.20x | 0.00e+00 |" in text
    assert "Geometric mean of the GPU ratios: 0.80x over 1 rows." in text and "adapter: Test GPU" in text


def test_readback_ab_times_each_spin_setting_on_one_interpreter(tmp_path):
    """benchmarks/readback_ab.py, run as a user runs it, on a one-op model at one round: a row per model with a
    time and a ratio per --spins setting, the first 1.000x. Its times say nothing here (the software adapter,
    which never polls first); only what it runs and writes is checked."""
    model = build([t((1, 9, 9, 8)), t((1, 9, 9, 8))], [{"op": "RELU", "inputs": [0], "outputs": [1]}], [0], [1])
    (tmp_path / "relu.tflite").write_bytes(model)
    out = tmp_path / "rb.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readback_ab.py"), f"--models={tmp_path}",
                           "--select=relu", "--rounds=1", "--invokes=2", "--spins=0,0.001", f"--out={out}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| model | spin 0 ms us | ratio | spin 1 ms us | ratio |" in text, text
    assert re.search(r"\| relu \| [0-9.]+ \| 1\.000x \| [0-9.]+ \| [0-9.]+x \|", text), text
    assert "A software adapter never polls first" in text   # the software adapter: the columns run the same code
    for spins in ("-1", "abc", "0,nan", "0,0.0"):
        bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readback_ab.py"), f"--spins={spins}"],
                             capture_output=True, text=True, timeout=600)
        assert bad.returncode != 0 and "--spins takes distinct finite non-negative numbers" in bad.stderr, spins
    none = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readback_ab.py"), f"--models={tmp_path}",
                           "--select=nothing*", f"--out={tmp_path / 'none.md'}"], capture_output=True, text=True,
                          timeout=600)
    assert none.returncode != 0 and "matches --select=nothing*; nothing written" in none.stderr, none.stderr[-2000:]
    assert not (tmp_path / "none.md").exists()


def test_native_commands_ab_times_both_paths_on_one_interpreter(tmp_path):
    """benchmarks/native_commands_ab.py, run as a user runs it, on a one-op model at one round: on wgpu-native (the
    software adapter here) a row with the C path's time, the Python API's and their ratio, or, on a machine that
    cannot compile the recording loop, the row that says so; and on Dawn's Null backend the same. Their times say
    nothing here; only what it runs and writes is checked."""
    model = build([t((1, 9, 9, 8)), t((1, 9, 9, 8))], [{"op": "RELU", "inputs": [0], "outputs": [1]}], [0], [1])
    (tmp_path / "relu.tflite").write_bytes(model)
    script = str(ROOT / "benchmarks" / "native_commands_ab.py")
    for env in ({}, {"TFLFUSE_WEBGPU": "dawn", "WGPU_BACKEND_TYPE": "Null"}):
        out = tmp_path / "nc.md"
        proc = subprocess.run([sys.executable, script, f"--models={tmp_path}", "--select=relu", "--rounds=1",
                               "--invokes=2", f"--out={out}"], capture_output=True, text=True, timeout=600,
                              env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-2000:]
        text = out.read_text()
        assert "| model | C us | Python API us | C / Python |" in text, text
        assert re.search(r"\| relu \| ([0-9.]+ \| [0-9.]+ \| [0-9.]+x|no C path [^|]+\| \| ) \|", text), text
    for bad in ("--rounds=0", "--batch=0", "--precision=float64", f"--out={tmp_path}"):
        proc = subprocess.run([sys.executable, script, bad], capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (bad, proc.stderr[-2000:])


def test_submit_split_ab_times_each_split_and_checks_its_outputs(tmp_path):
    """benchmarks/submit_split_ab.py, run as a user runs it, on a three-op model (three dispatches) at one round:
    a row per --splits entry, one command buffer first at 1.000x, a split at dispatch 1 timed, and quarters, which
    on three dispatches cut at dispatch 1 again, not timed twice; the script raises where a split's outputs differ
    from one buffer's, so a written table says they were equal bit for bit. On wgpu-native (the software adapter)
    and on Dawn's Null backend (nothing computed there). Its times say nothing here; only what it runs, checks and
    writes is."""
    x = t((1, 9, 9, 8))
    model = build([x, t((1, 9, 9, 8)), t((1, 9, 9, 8)), t((1, 9, 9, 8))],
                  [{"op": "RELU", "inputs": [0], "outputs": [1]}, {"op": "TANH", "inputs": [1], "outputs": [2]},
                   {"op": "LOGISTIC", "inputs": [2], "outputs": [3]}], [0], [3])
    (tmp_path / "chain.tflite").write_bytes(model)
    script = str(ROOT / "benchmarks" / "submit_split_ab.py")
    for backend, env in (("wgpu-native", {}), ("dawn", {"WGPU_BACKEND_TYPE": "Null"})):
        out = tmp_path / "ss.md"
        proc = subprocess.run([sys.executable, script, f"--models={tmp_path}", "--select=chain", "--batches=1",
                               f"--backends={backend}", "--precisions=float32", "--splits=0,1,q", "--rounds=1",
                               "--invokes=2", "--throughput_n=2", f"--out={out}"], capture_output=True, text=True,
                              timeout=600, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-2000:]
        text = out.read_text()
        row = rf"\| chain \| {backend} \| float32 \| 1 \| 3 \| [0-9.]* \| "
        assert re.search(row + r"0 \(one buffer\) \|( [0-9.]+ \|){4} 1\.000x \| 1\.000x \|", text), text
        assert re.search(row + r"1 \(0, 1\) \|( [0-9.]+ \|){4} [0-9.]+x \| [0-9.]+x \|", text), text
        assert re.search(row + r"q \(the same command buffers as another split, or one buffer: not timed\)", text)
    for bad in ("--splits=2", "--splits=0,0", "--splits=0,x", "--splits=0,1234567", "--batches=0", "--batches=\u00b2",
                "--select=", "--backends=vulkan", "--precisions=float64", "--rounds=0", f"--out={tmp_path}"):
        proc = subprocess.run([sys.executable, script, bad], capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (bad, proc.stderr[-2000:])


def _depthwise_model(path) -> None:
    """Writes a one-op model to ``path``: a 3x3 DEPTHWISE_CONV_2D over 8 channels of a 9x9 map, its weights exact
    in float16 (the strip schedule, which has an f16 form)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 3, 3, 8)).astype(np.float16).astype(np.float32)
    path.write_bytes(build([t((1, 9, 9, 8)), t((1, 3, 3, 8), data=w), t((1, 9, 9, 8))],
                           [{"op": "DEPTHWISE_CONV_2D", "inputs": [0, 1, -1], "outputs": [2],
                             "options": ("DepthwiseConv2DOptions", {"padding": 0, "strideW": 1, "strideH": 1,
                                                                    "depthMultiplier": 1})}], [0], [2]))


def test_upload_ab_times_three_plans_three_ways(tmp_path):
    """benchmarks/upload_ab.py, run as a user runs it, on a one-op model at one round and two batches: a row per
    plan (float32, float16 rounding its input on the GPU, float16 rounding it on the host), the GPU-rounding plan
    one dispatch more (FLOAT16_INPUT), each with its three times, GPU time and ratio to the host-rounding plan
    (1.000x for itself). Its times say nothing here (the software adapter); only what it runs and writes is
    checked."""
    model = build([t((1, 9, 9, 8)), t((1, 9, 9, 8))], [{"op": "RELU", "inputs": [0], "outputs": [1]}], [0], [1])
    (tmp_path / "relu.tflite").write_bytes(model)
    out = tmp_path / "up.md"
    script = str(ROOT / "benchmarks" / "upload_ab.py")
    proc = subprocess.run([sys.executable, script, f"--models={tmp_path}", "--select=relu", "--batches=1,3",
                           "--rounds=1", "--invokes=2", f"--out={out}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    times = r"( [0-9.]+ \|){3} ([0-9.]+|nan) \|"
    for batch in (1, 3):
        for plan, dispatches, ratio in (("float32", 1, r"[0-9.]+x"), ("float16, GPU rounding", 2, r"[0-9.]+x"),
                                        ("float16, host rounding", 1, r"1\.000x")):
            assert re.search(rf"\| relu \| {batch} \| {plan} \| {dispatches} \|{times} {ratio} \|", text), text
    bad = subprocess.run([sys.executable, script, "--batches=0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--batches takes positive integers" in bad.stderr, bad.stderr[-2000:]
    none = subprocess.run([sys.executable, script, f"--models={tmp_path}", "--select=nothing*",
                           f"--out={tmp_path / 'none.md'}"], capture_output=True, text=True, timeout=600)
    assert none.returncode != 0 and "matches --select=nothing*; nothing written" in none.stderr, none.stderr[-2000:]
    assert not (tmp_path / "none.md").exists()


def test_half_math_ab_times_each_setting_and_names_the_dispatches_that_differ(tmp_path):
    """benchmarks/half_math_ab.py, run as a user runs it, on a one-op model (a 3x3 DEPTHWISE_CONV_2D over 8
    channels: the strip schedule, whose f16 form the 'depthwise' setting takes) at one round: a table row per
    setting, and the depthwise dispatch listed among those whose program differs. Its times say nothing here
    (the software adapter); only what it runs and writes is checked."""
    _depthwise_model(tmp_path / "dw.tflite")
    out = tmp_path / "hm.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "half_math_ab.py"), f"--models={tmp_path}",
                           "--select=dw", "--batch=1", "--rounds=1", "--repeats=1", "--forms=depthwise,conv",
                           f"--out={out}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for setting in ("none", "depthwise", "conv", "all"):
        assert f"| {setting} | " in text
    # dispatch 0 rounds the float16 plan's input (FLOAT16_INPUT), the same program in every setting
    assert "| 1 | DEPTHWISE_CONV_2D |" in text and "| 0 | FLOAT16_INPUT |" not in text and "none against all" in text
    # each setting's output distance from none (none's own is 0), beside none's distance from float32
    assert re.search(r"\| none \| [0-9.]+ \| 1\.000x \| 0 \|", text), text
    assert re.search(r"The plan without the forms is [0-9.e-]+ of its output's largest value", text), text


def test_switch_ab_times_a_switch_off_and_on_and_names_the_dispatches_it_changes(tmp_path):
    """benchmarks/switch_ab.py, run as a user runs it, on a one-op model (a 3x3 DEPTHWISE_CONV_2D over 8 channels,
    in a float16 plan) with DEPTHWISE_HALF_MATH as the switch (its strips' f16 form): a row with both one-pass
    times and their ratio, and the depthwise dispatch listed as changed. Its times say nothing here (the software
    adapter); only what it runs and writes is checked. A switch that is not a module's boolean, and a selection
    of no model, stop it with a message. With ``MODULE:NAME=VALUE`` it sets a module's constant instead."""
    _depthwise_model(tmp_path / "dw.tflite")
    out = tmp_path / "ab.md"
    script = str(ROOT / "benchmarks" / "switch_ab.py")
    conv = "tflfuse.kernels.conv:"

    def ab(switch: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, script, f"--switch={switch}", *args], capture_output=True, text=True,
                              timeout=600)

    def timed(switch: str, batches: str, precision: str, atol: str) -> str:
        proc = ab(switch, f"--models={tmp_path}", "--select=dw", f"--batches={batches}", f"--precisions={precision}",
                  "--rounds=1", "--repeats=1", f"--atol={atol}", f"--out={out}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        text = out.read_text()
        for batch in batches.split(","):
            assert re.search(rf"\| dw \| {batch} \| {precision} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \| [0-9.e-]+ \|",
                             text), text
        return text
    text = timed(conv + "DEPTHWISE_HALF_MATH", "1,2", "float16", "0.05")
    # dispatch 0 rounds the float16 plan's input (FLOAT16_INPUT), which the switch leaves as it is
    assert "Dispatches the switch changes, dw at batch 1, float16" in text and "| 1 | DEPTHWISE_CONV_2D |" in text
    assert "FLOAT16_INPUT |" not in text
    # MODULE:NAME=VALUE sets a constant: the 3x3 depthwise conv past a 1-tap strip bound runs one invocation per
    # output instead of its strips, a changed dispatch
    text = timed(conv + "_STRIP_MAX_TAPS=1", "3", "float32", "1e-5")
    assert "Off: tflfuse.kernels.conv:_STRIP_MAX_TAPS = 49; on: tflfuse.kernels.conv:_STRIP_MAX_TAPS = 1 (the " \
           "library's value: 49)." in text and "| 0 | DEPTHWISE_CONV_2D |" in text, text
    # what is no switch of the library, a value of another type, no literal or the value already set stop it, as
    # does a selection of no model
    for spec, message in ((conv + "NO_SUCH_SWITCH", "is not a boolean switch"),
                          (conv + "_STRIP_MAX_TAPS=1.5", "holds int 49, got 1.5"),
                          (conv + "_STRIP_MAX_TAPS=many", "not a Python literal"),
                          (conv + "depthwise_strip=1", "is not a constant"),
                          (conv + "_STRIP_MAX_TAPS=49", "is 49 already: nothing to compare"),
                          ("tflfuse.kernels.conv", "takes MODULE:NAME"), (conv + "=1", "takes MODULE:NAME"),
                          ("os:sep='x'", "one of the library's")):
        bad = ab(spec)
        assert bad.returncode != 0 and message in bad.stderr, (spec, bad.stderr[-2000:])
    none = ab(conv + "DEPTHWISE_HALF_MATH", f"--models={tmp_path}", "--select=nothing*")
    assert none.returncode != 0 and "matches --select=nothing*" in none.stderr, none.stderr[-2000:]


def test_selection_picks_fused_twins_by_name_and_names_globs_that_pick_nothing(tmp_path):
    """benchmarks/selection.py: a NAME_unfused file's glob picks it and the fused twin made from it (before it); a
    glob of the twin's name picks the twin alone; a NAME_fused file of the folder's own is no twin; and a glob that
    picks no model stops the selection, naming that glob, before any model is read (a typo is not a silent hole in a
    table)."""
    spec = importlib.util.spec_from_file_location("benchmarks_selection", ROOT / "benchmarks" / "selection.py")
    selection = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(selection)
    for stem in ("m_unfused", "x_unfused", "x_fused"):
        _depthwise_model(tmp_path / f"{stem}.tflite")

    def names(*globs):
        return [name for name, _ in selection.selected_models(tmp_path, globs)]
    assert names("m_unfused") == ["m_fused", "m_unfused"]
    assert names("m_fused") == ["m_fused"]
    assert names("x_*") == ["x_fused", "x_unfused"]
    assert names("*_fused") == ["m_fused", "x_fused"]
    picked = dict(selection.selected_models(tmp_path, ["m_fused"]))
    assert tflfuse.Interpreter(model_content=picked["m_fused"]).get_input_details()[0]["shape"].tolist() == [1, 9, 9, 8]
    with pytest.raises(SystemExit, match=r"matches --select=nothing\*,hand_\*_fused; nothing written \("):
        next(selection.selected_models(tmp_path, ["m_*", "nothing*", "hand_*_fused"]))


def test_f16_bound_checks_its_usable_forms_and_cuts_the_floors_arithmetic(tmp_path):
    """benchmarks/f16_bound.py, run as a user runs it on one small product (odd sizes, 3 slices of 16): every form
    timed and the usable ones (float32, the library's float16 form, its partial sums carried across 2 and 4
    slices) checked against float64 by the script, which prints WRONG for one out of its bound; and the floor
    rewrite keeps a quarter of a slice's multiply-adds (one per pair of A and B loads)."""
    out = tmp_path / "f.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "f16_bound.py"), "--extra=300x40x72",
                           "--tiles=64x64/4x8/16", "--repeats=1", "--reps=1", "--warm_ms=0", f"--md_out={out}"],
                          capture_output=True, text=True, timeout=600)
    if "has no shader-f16" in proc.stdout:   # an adapter without f16 (Mesa's llvmpipe has it): nothing to compare
        assert proc.returncode == 1 and not out.exists(), proc.stderr[-2000:]
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WRONG" not in proc.stdout, proc.stdout
    text = out.read_text()
    row = re.search(r"\| 300 x 40 x 72 \| 64x64/4x8/16 \|(.*)\|", text)
    assert row and len(re.findall(r"[0-9.]+ \([0-9]+%\)", row.group(1))) == 7, text
    # the floor rewrite, in a process of its own (the script's absl flags would clash with tflfuse.cli's in this one)
    script = tmp_path / "floor_probe.py"
    script.write_text(r"""import re, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/benchmarks"]
import f16_bound
from tflfuse.kernels.gemm import MatmulTile
for form in ("f32", "f16_math"):
    source = f16_bound.programs(256, 64, 128, MatmulTile.parse("128x128/8x8/16"))[form].source
    steps = [line for line in source.split("\n") if f16_bound._STEP_FMA.fullmatch(line)]
    floor = f16_bound.floor_source(source)
    print(form, len(steps), len(re.findall(r"fma\(a\d, b\d, p|\+= a\d \* b\d;", floor)))
""")
    probe = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-2000:]
    for form in ("f32", "f16_math"):   # 16 steps of 8 x 8 / 4 vec4 multiply-adds, then one per pair of loads
        assert f"{form} {16 * 16} {16 * 4}" in probe.stdout, probe.stdout


def test_load_cost_writes_a_rate_per_source_and_ratio(tmp_path):
    """benchmarks/load_cost.py, run as a user runs it, with a small kernel: a row per --fmas value and a rate with
    its share of the FMA peak for each of the six loads (workgroup, uniform and storage memory, broadcast or
    distinct), and with --index a column for each way of forming a workgroup (or uniform) load's index. Its rates
    say nothing here (the software adapter); only what it runs and writes is checked; a --fmas or --index value out
    of range, a --steps that the constant form's unrolled body does not divide, or an --out that is a folder or in a
    folder that is not there, stops it at start-up with a message."""
    out = tmp_path / "lc.md"
    script = str(ROOT / "benchmarks" / "load_cost.py")
    proc = subprocess.run([sys.executable, script, "--fmas=1,3", "--steps=8", "--workgroups=2", "--repeats=1",
                           f"--out={out}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| multiply-adds per load | workgroup broadcast | workgroup distinct | uniform broadcast |" in text, text
    for fmas in (1, 3):
        assert re.search(rf"\| {fmas} \|( [0-9.e+-]+ \([0-9]+%\) \|){{6}}$", text, re.M), text
    bad = subprocess.run([sys.executable, script, "--fmas=0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--fmas takes integers from 1 to 32" in bad.stderr, bad.stderr[-2000:]
    proc = subprocess.run([sys.executable, script, "--fmas=2", "--steps=8", "--workgroups=2", "--repeats=1",
                           "--index=offset,nested", f"--out={out}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "| workgroup (offset) broadcast | workgroup (offset) distinct | workgroup (nested) broadcast |" in text, text
    assert re.search(r"\| 2 \|( [0-9.e+-]+ \([0-9]+%\) \|){8}$", text, re.M), text
    bad = subprocess.run([sys.executable, script, "--index=flat"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--index takes computed, offset, nested and constant" in bad.stderr, \
        bad.stderr[-2000:]
    # constant indices: a workgroup column and, beside the uniform computed one, a uniform column of their own
    proc = subprocess.run([sys.executable, script, "--fmas=2", "--steps=64", "--workgroups=2", "--repeats=1",
                           "--index=constant", f"--out={out}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert ("| workgroup (constant) broadcast | workgroup (constant) distinct | uniform broadcast | "
            "uniform distinct | uniform (constant) broadcast |") in text, text
    assert re.search(r"\| 2 \|( [0-9.e+-]+ \([0-9]+%\) \|){8}$", text, re.M), text
    bad = subprocess.run([sys.executable, script, "--index=constant", "--steps=8"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "the constant form takes a multiple of 64" in bad.stderr + bad.stdout, \
        bad.stderr[-2000:]
    for target in (tmp_path, tmp_path / "missing" / "lc.md"):   # a folder, a file in a folder that is not there
        bad = subprocess.run([sys.executable, script, f"--out={target}"], capture_output=True, text=True, timeout=600)
        assert bad.returncode != 0 and "--out must be a file (not a folder) in an existing folder" in bad.stderr, \
            bad.stderr[-2000:]
    # the header says how the kernels were compiled: --shader_checks, --noshader_checks (trusted where wgpu-native
    # offers it, as on this adapter)
    for flag, says in (("--shader_checks", "kernels with wgpu's runtime checks"),
                       ("--noshader_checks", "kernels trusted (no runtime checks)")):
        proc = subprocess.run([sys.executable, script, "--fmas=1", "--steps=8", "--workgroups=2", "--repeats=1", flag,
                               f"--out={out}"], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert out.read_text().splitlines()[0].endswith(says), out.read_text()[:300]


@pytest.mark.parametrize("target", ["gpu", "cpu"])
def test_sweep_stem_times_the_folded_block_against_the_two_ops(tmp_path, target):
    """benchmarks/sweep_stem.py, run as a user runs it on a small image: a row for the stem's CONV_2D and the block
    apart, one for the folded block's default and one per resident tile it takes, each folded output within float32
    rounding of the two ops' (sums of 27 + 9 + 32 products of unit scale: 1e-5), and a tile it refuses named with the
    reason, not timed. Its times say nothing here (the software adapter); only what it runs and writes is checked."""
    out, js = tmp_path / "stem.md", tmp_path / "stem.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_stem.py"), "--size=32", "--batches=1",
                           "--precisions=float32", "--repeats=1", "--reps=1", f"--target={target}",
                           "--tiles=8x8/8/r2p,16x16/8/r1p", f"--out={out}", f"--json_out={js}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(js.read_text())
    assert [r["plan"] for r in rows] == ["CONV_2D, then fused_bottleneck", "folded, default", "folded, 8x8/8/r2p"]
    # apart: the CONV_2D, then the block's one dispatch (or two, staged, on small maps on the software adapter)
    assert rows[0]["dispatches"] in (2, 3) and rows[2]["dispatches"] == 1 and rows[2]["strategy"] == "expand_dw"
    assert all(0 <= r["max_abs_diff"] < 1e-5 for r in rows), rows
    assert "16x16/8/r1p" in proc.stdout + proc.stderr and "invocations" in proc.stdout + proc.stderr
    text = out.read_text()
    assert f"target '{target}'" in text and "| 1 | float32 | folded, 8x8/8/r2p | expand_dw | 1 |" in text, text


def test_subgroup_matrix_probe_names_what_it_needs(tmp_path):
    """benchmarks/subgroup_matrix.py stops with one line, before any GPU work, where wgpudawn is missing (blocked
    from importing here, whether or not this machine has it) and where --out cannot be written."""
    script = ROOT / "benchmarks" / "subgroup_matrix.py"
    blocked = ("import runpy, sys; sys.modules['wgpudawn'] = None; sys.argv = [sys.argv[1], '--nofma']; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocked, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "needs wgpudawn: pip install wgpudawn==" in proc.stdout
    proc = subprocess.run([sys.executable, str(script), f"--out={tmp_path / 'missing' / 'r.md'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--out must be a file" in proc.stderr


@pytest.mark.parametrize("script,args", [("sweep_matrix.py", []), ("dawn_matrix.py", ["--models={models}"]),
                                         ("matrix_block.py", [])])
def test_dawn_benchmarks_stop_with_one_line_without_a_dawn_device(tmp_path, script, args):
    """benchmarks/sweep_matrix.py, dawn_matrix.py and matrix_block.py stop with one line, before any GPU work, where
    no Dawn device can be made (wgpudawn blocked from importing here, whether or not this machine has it)."""
    for name in ("mobilenet_v2_fused", "mobilenet_v2_unfused"):
        (tmp_path / f"{name}.tflite").write_bytes(b"")
    blocked = ("import runpy, sys; sys.modules['wgpudawn'] = None; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
    argv = [str(ROOT / "benchmarks" / script)] + [a.format(models=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, "-c", blocked, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "no Dawn device: " in proc.stderr and "needs the package wgpudawn" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("script,args,message", [
    ("sweep_matrix.py", ["--tiles=2x2/2x2/24"], "--tiles: matrix tile 2x2/2x2/24"),
    ("sweep_matrix.py", ["--tiles=8x8/1x1/16"], "at most 8 subgroups"),
    ("sweep_matrix.py", ["--batches=0"], "--batches must be a non-empty list of positive integers"),
    ("sweep_matrix.py", ["--batches=\u00b2"], "--batches must be a non-empty list of positive integers"),
    ("sweep_matrix.py", ["--batches="], "--batches must be a non-empty list of positive integers"),
    ("sweep_matrix.py", ["--repeats=0"], "--repeats must be at least 1"),
    ("sweep_matrix.py", ["--warm_ms=-5"], "--warm_ms must be from 0"),
    ("sweep_matrix.py", ["--only=784x32x192"], "--only: 784x32x192 not among MobileNetV2's products at batch 32"),
    ("matrix_block.py", ["--tiles=14x2/32"], "--tiles: matrix block tile '14x2/32' is not"),
    ("matrix_block.py", ["--tiles=14x2/32/4/p"], "is not 'THxTW/C/S'"),
    ("matrix_block.py", ["--batches=0"], "--batches must be a non-empty list of positive integers"),
    ("dawn_matrix.py", ["--models={missing}"], "--models must be a folder holding mobilenet_v2_fused.tflite"),
    ("dawn_matrix.py", [], "--models must be a folder holding"),
    ("dawn_matrix.py", ["--models={models}", "--n=0"], "--n must be at least 1"),
    ("dawn_matrix.py", ["--models={models}", "--rounds=0"], "--rounds must be at least 1"),
    ("dawn_matrix.py", ["--models={models}", "--batches="], "--batches must be a non-empty list"),
    ("dawn_matrix.py", ["--models={models}", "--out={missing}/r.md"], "--out must be a file"),
])
def test_dawn_benchmarks_refuse_bad_flags(tmp_path, script, args, message):
    for name in ("mobilenet_v2_fused", "mobilenet_v2_unfused"):
        (tmp_path / f"{name}.tflite").write_bytes(b"")
    argv = [a.format(models=tmp_path, missing=tmp_path / "missing") for a in args]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]



@pytest.mark.parametrize("n", [1, 8, 32])
def test_product_counts_are_mobilenet_v2s_products_with_their_repeats(n):
    # benchmarks/chain.py: the counted products are chain.products' (bar the classifier), 34 in MobileNetV2
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import chain

    counts = chain.product_counts(n)
    assert list(counts) == chain.products(n)[:-1] and chain.products(n)[-1] == (n, 1280, 1000)
    assert sum(counts.values()) == 34 and counts[n * 196, 64, 384] == 4 and counts[n * 3136, 24, 144] == 2


def test_matrix_block_forms_compile_in_tint_and_refuse_what_they_do_not_take():
    """benchmarks/matrix_block.py's one-dispatch block (a prototype the library does not run; its values are checked
    on a GPU by the benchmark itself, against float64 NumPy): its programs, with and without the vec4 depthwise
    read, with a residual and without, compile in Tint on Dawn's Null backend (64-invocation subgroups, 16 KiB of
    workgroup memory), and sizes it does not take raise KernelError."""
    script = f"""
import json, os, sys
os.environ["WGPU_BACKEND_TYPE"] = "Null"
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import wgpudawn
from wgpudawn.backends.dawn import _extras_device
import matrix_block as mb
from tflfuse.kernels import KernelError
from tflfuse.kernels.base import Binding
from tflfuse.kernels.half import half_storage
from tflfuse.kernels.matrix import SubgroupMatrix
_extras_device.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
device = wgpudawn.gpu.request_adapter_sync().request_device_sync(
    required_features=["chromium-experimental-subgroup-matrix", "shader-f16"])
unit, out = SubgroupMatrix(64), {{}}
for n, h, w, cin, ce, co, tile in [(3, 9, 7, 16, 96, 16, "7x2/16/4"), (3, 9, 7, 16, 96, 16, "7x2/16/4/v"),
                                    (2, 5, 11, 16, 48, 32, "3x3/16/2/v"), (1, 7, 7, 32, 64, 48, "2x2/32/4")]:
    g = dict(N=n, H=h, W=w, OH=h, OW=w, SH=1, SW=1, PT=1, PL=1, KH=3, KW=3)
    binds = tuple(Binding(v, ("input", i), "read", "f32", 64) for i, v in
                  enumerate(("x", "ew", "eb", "dw", "db", "pw", "pb"))) + (Binding("y", ("output", 0), "read_write",
                                                                                    "f32", 64),)
    res = f" + x[pix * {{co // 4}}u + co4]" if cin == co else ""
    prog = half_storage(mb.matrix_block_program("mb", binds, g, cin, ce, co, "relu6", "relu6",
                                                f"y[pix * {{co // 4}}u + co4] = acc + pb[co4]{{res}};", "", unit,
                                                mb.MatrixBlockTile.parse(tile)))
    try:
        module = device.create_shader_module(code=prog.source)
        device.create_compute_pipeline(layout="auto", compute={{"module": module, "entry_point": "main"}})
        out[f"{{h}}x{{w}}x{{cin}}/{{tile}}"] = None
    except Exception as e:
        out[f"{{h}}x{{w}}x{{cin}}/{{tile}}"] = str(e)[:2000]
g = dict(N=1, H=7, W=7, OH=7, OW=7, SH=1, SW=1, PT=1, PL=1, KH=3, KW=3)
refused = []
for args in [(g, 24, 144, 24, "7x1/16/4"), (g, 16, 48, 16, "7x1/32/4"), ({{**g, "SH": 2}}, 16, 96, 16, "7x1/16/4"),
             ({{**g, "H": 0, "OH": 0}}, 16, 96, 16, "7x1/16/4"), (g, 0, 0, 0, "7x1/16/4"),
             (g, 16, 96, 16, "14x14/16/4")]:
    try:
        mb.matrix_block_program("mb", (), args[0], *args[1:4], "relu6", "relu6", "", "", unit,
                                mb.MatrixBlockTile.parse(args[4]))
        refused.append(None)
    except KernelError as e:
        refused.append(str(e))
print("RESULT" + json.dumps({{"compiled": out, "refused": refused}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    found = json.loads(lines[0][len("RESULT"):])
    assert len(found["compiled"]) == 4 and all(v is None for v in found["compiled"].values()), found["compiled"]
    assert all(found["refused"]), found["refused"]
    assert "multiple of 16" in found["refused"][0] and "dividing the 48" in found["refused"][1]
    assert "stride 2x1" in found["refused"][2] and "geometry" in found["refused"][3]
    assert "positive int" in found["refused"][4] and "workgroup memory" in found["refused"][5]

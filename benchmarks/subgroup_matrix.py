"""Tensor cores through WebGPU: Dawn's subgroup matrices beside the FMA units, in one run.

    pip install wgpudawn==0.32.0.4
    python benchmarks/subgroup_matrix.py [--out=benchmarks/RESULTS-subgroup-matrix.md]

wgpu-native (tflfuse's runtime) refuses the adapter's ``cooperative-matrix`` feature. Dawn, the WebGPU
implementation of Chrome, offers the same hardware as its experimental ``chromium-experimental-subgroup-matrix``
feature (WGSL ``enable chromium_experimental_subgroup_matrix;``: ``subgroup_matrix_left/right/result`` types,
``subgroupMatrixLoad``, ``subgroupMatrixMultiplyAccumulate``, ``subgroupMatrixStore``; Dawn's
``docs/dawn/features/subgroup_matrix.md``), and ``wgpudawn`` puts Dawn behind wgpu-py's Python API. Dawn asks for
two toggles here: ``allow_unsafe_apis`` (experimental features) and, on NVIDIA's Vulkan driver,
``vulkan_enable_f16_on_nvidia`` (without it Dawn offers neither ``shader-f16`` nor f16 subgroup matrices there,
only int8 ones).

For each float16 configuration the adapter lists (``M x N x K``, result f16 or f32): a product ``[64, 64] x [64,
64]`` of float16 values, one subgroup per ``M x N`` tile of the output, checked against float64 NumPy; then the
rate of multiply-accumulates alone (each subgroup four independent accumulators, 2,048 steps, no memory traffic in
the loop), in TFLOP/s of wall-clock time over five dispatches of 8,448 subgroups (so a lower bound: the submit and
the read-back count too). Beside it, in the same process, the FMA peaks that tflfuse's benchmarks divide by
(:func:`peaks.fma_tflops`, wgpu-native, GPU time). A probe of the hardware: the float16 plan's products on
subgroup matrices (:mod:`tflfuse.kernels.matrix`) are timed by ``benchmarks/sweep_matrix.py``.
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from peaks import fma_tflops, report, validate_out_flags  # noqa: E402
from tflfuse.runtime.device import DAWN_TOGGLES  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
flags.DEFINE_bool("fma", True, "Also measure the FMA peaks through tflfuse's device (wgpu-native).")
validate_out_flags("out")

SIDE = 64                                 # the checked product: [SIDE, SIDE] x [SIDE, SIDE]
STEPS, GROUPS, DISPATCHES = 2048, 132 * 64, 5   # the rate: steps per subgroup, subgroups, dispatches


def product_source(m: int, n: int, k: int, result: str, subgroup: int) -> str:
    """WGSL of ``C = A @ B`` (``[SIDE, SIDE]`` row-major float16 ``A`` and ``B``, ``C`` of ``result``): one
    workgroup of one subgroup (``subgroup`` invocations, the configuration's subgroup size, which Dawn requires the
    workgroup's x size to be a multiple of) per ``m x n`` tile, the depth walked ``k`` at a time."""
    return f"""
enable chromium_experimental_subgroup_matrix;
enable f16;
@group(0) @binding(0) var<storage, read> A: array<f16>;
@group(0) @binding(1) var<storage, read> B: array<f16>;
@group(0) @binding(2) var<storage, read_write> C: array<{result}>;
@compute @workgroup_size({subgroup})
fn main(@builtin(workgroup_id) wid: vec3<u32>) {{
  let m0 = (wid.x / {SIDE // n}u) * {m}u;
  let n0 = (wid.x % {SIDE // n}u) * {n}u;
  var acc = subgroup_matrix_result<{result}, {n}, {m}>();
  for (var d = 0u; d < {SIDE}u; d += {k}u) {{
    let l = subgroupMatrixLoad<subgroup_matrix_left<f16, {k}, {m}>>(&A, m0 * {SIDE}u + d, false, {SIDE}u);
    let r = subgroupMatrixLoad<subgroup_matrix_right<f16, {n}, {k}>>(&B, d * {SIDE}u + n0, false, {SIDE}u);
    acc = subgroupMatrixMultiplyAccumulate(l, r, acc);
  }}
  subgroupMatrixStore(&C, m0 * {SIDE}u + n0, acc, false, {SIDE}u);
}}
"""


def rate_source(m: int, n: int, k: int, result: str, subgroup: int) -> str:
    """WGSL of the multiply-accumulate-bound kernel: per subgroup (one per workgroup, so that the store offsets
    are uniform) four accumulators, :data:`STEPS` steps each, then stored."""
    acc = "\n".join(f"  var c{i} = subgroup_matrix_result<{result}, {n}, {m}>();" for i in range(4))
    steps = "\n".join(f"    c{i} = subgroupMatrixMultiplyAccumulate(l, r, c{i});" for i in range(4))
    stores = "\n".join(f"  subgroupMatrixStore(&C, wid.x * {4 * m * n}u + {i * m * n}u, c{i}, false, {n}u);"
                       for i in range(4))
    return f"""
enable chromium_experimental_subgroup_matrix;
enable f16;
@group(0) @binding(0) var<storage, read> A: array<f16>;
@group(0) @binding(1) var<storage, read_write> C: array<{result}>;
@compute @workgroup_size({subgroup})
fn main(@builtin(workgroup_id) wid: vec3<u32>) {{
  let l = subgroupMatrixLoad<subgroup_matrix_left<f16, {k}, {m}>>(&A, 0u, false, {SIDE}u);
  let r = subgroupMatrixLoad<subgroup_matrix_right<f16, {n}, {k}>>(&A, {k}u, false, {SIDE}u);
{acc}
  for (var i = 0u; i < {STEPS}u; i++) {{
{steps}
  }}
{stores}
}}
"""


def _run(dev, source: str, buffers, groups: int, dispatches: int = 1) -> float:
    """Seconds of wall-clock time for ``dispatches`` dispatches of ``groups`` workgroups, read-back included."""
    module = dev.create_shader_module(code=source)
    pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)])
    start = time.perf_counter()
    encoder = dev.create_command_encoder()
    cpass = encoder.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    for _ in range(dispatches):
        cpass.dispatch_workgroups(groups, 1, 1)
    cpass.end()
    dev.queue.submit([encoder.finish()])
    dev.queue.read_buffer(buffers[-1], 0, 4)
    return time.perf_counter() - start


def main(argv):
    try:
        import wgpudawn as wgpu
        from wgpudawn.backends.dawn import _extras_device
        from wgpudawn.backends.dawn._extras_adapter import get_adapter_properties
    except ImportError:
        print("needs wgpudawn: pip install wgpudawn==0.32.0.4")
        return 1
    fma = {}
    if FLAGS.fma:   # first: wgpu-native's device, as tflfuse's benchmarks measure the peaks
        import tflfuse
        device = tflfuse.Device()
        fma = {"f32": fma_tflops(device, "f32")}
        if "shader-f16" in device.adapter.features:
            fma["f16"] = fma_tflops(device, "f16")
    _extras_device.set_instance_extras(backends=["Vulkan"], enable_toggles=list(DAWN_TOGGLES))
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:   # noqa: BLE001 (Dawn's message names what the adapter lacks)
        print(f"no Dawn adapter: {e}")
        return 1
    info = adapter.info
    configs = get_adapter_properties(adapter).get("subgroup_matrix_configs") or []
    lines = [f"# Subgroup matrices (Dawn) beside the FMA units: {info.get('device')}",
             "", f"`benchmarks/subgroup_matrix.py`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"wgpudawn {getattr(wgpu, '__version__', '?')}, Dawn's Vulkan backend, toggles {', '.join(DAWN_TOGGLES)}; "
             f"adapter {info.get('device')} ({info.get('adapter_type')}, driver {info.get('description', '?')}).",
             "", "Configurations the adapter lists: " + "; ".join(
                 f"{c['component_type']} -> {c['result_component_type']} {c['m']}x{c['n']}x{c['k']}" for c in configs)
             + ".", ""]
    if fma:
        lines += ["FMA peaks in the same run (wgpu-native, GPU time, `peaks.fma_tflops`): " + ", ".join(
            f"{t} {v:.1f} TFLOP/s" for t, v in fma.items()) + ".", ""]
    halves = [c for c in configs if c["component_type"] == "f16"]
    if not halves:
        lines.append("No float16 configuration: nothing to time.")
    else:
        wanted = [f for f in ("chromium-experimental-subgroup-matrix", "shader-f16") if f in adapter.features]
        dev = adapter.request_device_sync(required_features=wanted)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        rng = np.random.default_rng(0)
        a = rng.standard_normal((SIDE, SIDE)).astype(np.float16)
        b = rng.standard_normal((SIDE, SIDE)).astype(np.float16)
        want = a.astype(np.float64) @ b.astype(np.float64)
        ba = dev.create_buffer_with_data(data=a.tobytes(), usage=usage)
        bb = dev.create_buffer_with_data(data=b.tobytes(), usage=usage)
        lines += ["| M x N x K | result | max abs error of the [64, 64] x [64, 64] product (largest |value| "
                  f"{np.abs(want).max():.1f}) | multiply-accumulate rate, TFLOP/s (wall clock) |"
                  + (" / f16 FMA peak |" if "f16" in fma else ""),
                  "|---|---|---:|---:|" + ("---:|" if "f16" in fma else "")]
        for c in halves:
            m, n, k, result = c["m"], c["n"], c["k"], c["result_component_type"]
            size = 4 if result == "f32" else 2
            out = dev.create_buffer(size=SIDE * SIDE * size, usage=usage)
            if c["min_subgroup_size"] != c["max_subgroup_size"]:   # one subgroup per workgroup is not certain
                lines.append(f"| {m} x {n} x {k} | {result} | subgroup size varies "
                             f"({c['min_subgroup_size']}-{c['max_subgroup_size']}): not run | |")
                continue
            subgroup = c["max_subgroup_size"]
            _run(dev, product_source(m, n, k, result, subgroup), [ba, bb, out], (SIDE // m) * (SIDE // n))
            got = np.frombuffer(dev.queue.read_buffer(out), np.float32 if result == "f32" else np.float16)
            err = float(np.abs(got.reshape(SIDE, SIDE) - want).max())
            sums = dev.create_buffer(size=GROUPS * 4 * m * n * size, usage=usage)
            source = rate_source(m, n, k, result, subgroup)
            _run(dev, source, [ba, sums], GROUPS)   # compiled and warm
            seconds = min(_run(dev, source, [ba, sums], GROUPS, DISPATCHES) for _ in range(3))
            tflops = DISPATCHES * GROUPS * 4 * STEPS * 2 * m * n * k / seconds / 1e12
            ratio = f" {tflops / fma['f16']:.1f}x |" if "f16" in fma else ""
            lines.append(f"| {m} x {n} x {k} | {result} | {err:.2e} | {tflops:.0f} |{ratio}")
    return report(lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)

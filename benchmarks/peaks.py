"""The device's measured peaks, the yardsticks of the benchmarks' rooflines: the copy bandwidth and the FMA
rate of an FMA-bound WGSL kernel (f32, and f16 where the device has ``shader-f16``), GPU time from timestamp
queries (``tflfuse.runtime.plan.pass_gpu_us``). No flags: imported by the benchmark scripts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tflfuse.kernels.base import Binding, Program, linear_dispatch
from tflfuse.kernels.gemm import product_program
from tflfuse.kernels.half import half_storage
from tflfuse.runtime.plan import pass_gpu_us

__all__ = ["F16_ACCUMULATORS", "F32_ACCUMULATORS", "copy_bandwidth_gb_per_s", "fma_source", "fma_tflops",
           "measure_peaks", "recorder", "CHECK_ROWS", "check_ranges", "read_rows", "require_features",
           "validate_out_flags", "validate_sweep_flags"]


#: Rows of a product's output that the sweeps read back to check each form and tile: three runs of this many
#: rows (the first, the middle and the last, where the last partial tile is). Reading or writing the whole
#: output between timings, as sweep_gemm_forms.py did before 2026-12-04, kept the host busy for seconds while
#: the GPU idled, and an idle H200 clocks down (1980 to 345 MHz, ``nvidia-smi``;
#: :data:`tflfuse.runtime.profile.WARM_MS`): after about 15 transfers of 154 MB every dispatch ran 3-4x slower
#: (401408 x 16 x 96: 80 us, then 351 us). So clears run on the GPU and only these rows come back; the timing
#: itself now runs the same work untimed first (:func:`tflfuse.runtime.profile.warm_up`).
CHECK_ROWS = 256


def check_ranges(rows: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` row ranges of :data:`CHECK_ROWS` rows each that are read back and checked."""
    starts = {0, max(0, rows // 2 - CHECK_ROWS // 2), max(0, rows - CHECK_ROWS)}
    return [(r, min(rows, r + CHECK_ROWS)) for r in sorted(starts)]


def read_rows(device, buffer, rows: int, cols: int, dtype=np.float32) -> np.ndarray:
    """The rows of :func:`check_ranges` of a row-major ``[rows, cols]`` matrix of ``dtype`` (float32, or
    float16 as a float16 plan stores it) in device buffer ``buffer``, read back alone and concatenated, flat."""
    size = np.dtype(dtype).itemsize
    y = []
    for a, z in check_ranges(rows):
        start, nbytes = a * cols * size, (z - a) * cols * size
        lo = start // 4 * 4   # WebGPU reads whole 4-byte words
        raw = device.device.queue.read_buffer(buffer, lo, -(-(start + nbytes - lo) // 4) * 4)
        y.append(np.frombuffer(raw, dtype)[(start - lo) // size:][:(z - a) * cols])
    return np.concatenate(y)


def recorder(device, prog, buffers):
    """A ``record(cpass)`` function dispatching ``prog`` (a tflfuse Program) once over ``buffers``, bound in
    order as its bindings 0, 1, ..."""
    pipeline = device.pipeline(prog)
    group = device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)])

    def record(cpass) -> None:
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*prog.dispatch)
    return record


def copy_bandwidth_gb_per_s(device, mib: int = 512, repeats: int = 20) -> float:
    """GB/s of a vec4 copy kernel over ``mib`` MiB (at most the device's storage binding limit; one read and
    one write of each byte), GPU time from timestamps at the start and end of its compute pass, median of
    ``repeats``: the memory-bandwidth yardstick of the roofline."""
    nbytes = min(mib << 20, device.max_storage_binding) // 16 * 16
    vec4s = nbytes // 16
    binds = (Binding("x", ("input", 0), "read", "vec4<f32>", nbytes),
             Binding("y", ("output", 0), "read_write", "vec4<f32>", nbytes))
    source = f"""@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let i = ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * 256u + lidx;
  if (i < {vec4s}u) {{ y[i] = x[i]; }}
}}
"""
    prog = Program("copy", source, (256, 1, 1), linear_dispatch(vec4s, 256), binds)
    record = recorder(device, prog, [device.create_buffer(nbytes), device.create_buffer(nbytes)])
    return 2 * nbytes / pass_gpu_us(device, record, repeats) / 1e3


def fma_source(dtype: str, iterations: int, accumulators: int = 8, unroll: int = 4) -> str:
    """WGSL of the FMA-rate kernel: each invocation runs ``accumulators`` independent ``vec4<dtype>`` chains
    ``a = fma(a, m, c)`` for ``iterations`` steps (``unroll`` per loop trip), ``m`` and ``c`` read from a
    buffer so nothing folds, and writes their sum. 8 FLOPs per vec4 FMA (4 lanes, multiply and add)."""
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if iterations % unroll:
        raise ValueError(f"iterations ({iterations}) must be a multiple of unroll ({unroll})")
    t = f"vec4<{dtype}>"
    init = "\n".join(f"  var a{j} = {t}(p[2] + vec4<f32>(f32(i & 255u) * 1e-4 + {j * 0.01:.2f}));"
                     for j in range(accumulators))
    step = "\n".join(f"    a{j} = fma(a{j}, m, c);" for _ in range(unroll) for j in range(accumulators))
    total = " + ".join(f"a{j}" for j in range(accumulators))
    return f"""{'enable f16;' if dtype == 'f16' else ''}
@group(0) @binding(0) var<storage, read> p: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let i = wid.x * 256u + lidx;
  let m = {t}(p[0]);
  let c = {t}(p[1]);
{init}
  for (var k = 0u; k < {iterations // unroll}u; k++) {{
{step}
  }}
  y[i] = vec4<f32>({total});
}}
"""


def fma_tflops(device, dtype: str = "f32", workgroups: int = 132 * 64, iterations: int = 4096,
               repeats: int = 10, accumulators: int = 8) -> float:
    """TFLOP/s of :func:`fma_source` over ``workgroups`` workgroups of 256 invocations on the tflfuse Device
    ``device`` (it needs ``timestamp-query``, and ``shader-f16`` for ``"f16"``): GPU time from timestamps at
    the start and end of its compute pass, median of ``repeats``."""
    invocations = workgroups * 256
    # m, c (a -> c / (1 - m) = 1: no overflow, no denormals in f16), then the start value
    params = np.array([[0.5] * 4, [0.5] * 4, [0.25] * 4], np.float32)
    binds = (Binding("p", ("input", 0), "read", "vec4<f32>", params.nbytes),
             Binding("y", ("output", 0), "read_write", "vec4<f32>", invocations * 16))
    prog = Program(f"fma_{dtype}", fma_source(dtype, iterations, accumulators), (256, 1, 1), (workgroups, 1, 1),
                   binds)
    record = recorder(device, prog, [device.create_buffer(params.nbytes, data=params.tobytes()),
                                     device.create_buffer(invocations * 16)])
    return invocations * iterations * accumulators * 8 / pass_gpu_us(device, record, repeats) / 1e6


#: Independent vec4 chains per invocation of the f32 FMA kernel; the f16 kernel runs twice as many, so that
#: both hold the same register bytes and issue the same number of independent 32-bit FMA instructions
#: (a vec4<f16> is two packed f16x2 registers, a vec4<f32> four): 8 vec4<f16> chains, as before, left half
#: the f16 units' instruction-level parallelism unused next to f32's.
F32_ACCUMULATORS = 8
F16_ACCUMULATORS = 2 * F32_ACCUMULATORS


def measure_peaks(device) -> dict:
    """The device's copy bandwidth (``copy_gb_per_s``) and f32 / f16 FMA rate (``f32_tflops``,
    ``f16_tflops``; ``f16_note`` says where the f16 rate came from or why it is missing), from timestamp
    queries. The f16 rate is the better of :data:`F16_ACCUMULATORS` and :data:`F32_ACCUMULATORS` chains
    (``f16_tflops_by_chains`` holds both), so that an f16 product's share of it is comparable with an f32
    product's share of the f32 rate. On the software adapter the work shrinks (and stays inside its loop
    limit)."""
    software = device.is_software
    size = dict(workgroups=16, iterations=256, repeats=3) if software else {}
    peaks = {"copy_gb_per_s": copy_bandwidth_gb_per_s(device, *((32, 5) if software else ())),
             "f32_tflops": fma_tflops(device, "f32", accumulators=F32_ACCUMULATORS, **size)}
    if "shader-f16" in device.features:
        by_chains = {n: fma_tflops(device, "f16", accumulators=n, **size)
                     for n in dict.fromkeys((F16_ACCUMULATORS, F32_ACCUMULATORS))}
        peaks["f16_tflops"] = max(by_chains.values())
        peaks["f16_tflops_by_chains"] = {str(n): v for n, v in by_chains.items()}
        peaks["f16_note"] = f"the best of {', '.join(map(str, by_chains))} vec4<f16> chains per invocation"
    else:
        peaks["f16_note"] = "the adapter has no shader-f16"
    return peaks


def require_features(device, *features: str) -> None:
    """Raises ``SystemExit`` (one line naming the adapter and the feature) where the tflfuse Device ``device``
    lacks one of ``features`` (e.g. ``"timestamp-query"``, ``"shader-f16"``)."""
    for feature in features:
        if feature not in device.features:
            raise SystemExit(f"the adapter {device.describe()} has no {feature} feature, which this needs")


def report(lines: list[str], out: str | None) -> int:
    """Prints a benchmark's Markdown ``lines`` and writes them to the file ``out`` where given; returns 0, the
    script's exit status."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


def validate_out_flags(*names: str) -> None:
    """absl validators for the file flags ``names`` (e.g. ``"out"``): unset, or a file name (not a folder) in an
    existing folder that this user may write to, so that a run does not end in an OSError after all its timing."""
    import os

    from absl import flags

    def writable(v) -> bool:
        if v is None:
            return True
        path = Path(v).resolve()
        return bool(v) and not path.is_dir() and path.parent.is_dir() and os.access(path.parent, os.W_OK) and \
            (not path.exists() or os.access(path, os.W_OK))

    for name in names:
        flags.register_validator(name, writable, f"--{name} must be a file (not a folder) in an existing folder "
                                                 f"this user may write to")


def validate_sweep_flags(forms) -> None:
    """absl validators for the product sweeps' shared flags, so that a bad value stops the run at start-up with
    one line: ``--tiles`` (each :meth:`~tflfuse.kernels.gemm.MatmulTile.parse`), ``--forms`` (a non-empty
    list of ``forms``), ``--batches`` (positive ints), ``--warm_ms`` (0 to
    :data:`tflfuse.runtime.profile.MAX_WARM_MS`), ``--repeats`` and ``--reps`` (at least 1)."""
    from absl import flags

    from tflfuse.kernels import KernelError
    from tflfuse.kernels.gemm import MatmulTile

    def tiles(names, workgroup_bytes=None) -> bool:
        from tflfuse.kernels import gemm
        bound = gemm._WG_BYTES
        gemm._WG_BYTES = workgroup_bytes or bound   # a sweep's --workgroup_bytes, where it has one
        try:
            for name in names:
                MatmulTile.parse(name)
        except KernelError as e:
            raise flags.ValidationError(f"--tiles: {e}") from None
        finally:
            gemm._WG_BYTES = bound
        return True

    if "workgroup_bytes" in flags.FLAGS:
        flags.register_multi_flags_validator(["tiles", "workgroup_bytes"],
                                             lambda v: tiles(v["tiles"], v["workgroup_bytes"]))
    else:
        flags.register_validator("tiles", tiles)
    flags.register_validator("forms", lambda v: bool(v) and set(v) <= set(forms),
                             f"--forms must be a non-empty list of {', '.join(forms)}")
    validate_timing_flags()


def validate_timing_flags() -> None:
    """absl validators for the timing flags the sweeps share: ``--batches`` (a non-empty list of positive
    integers in ASCII digits), ``--warm_ms`` (0 to :data:`tflfuse.runtime.profile.MAX_WARM_MS`), ``--repeats``
    and ``--reps`` (at least 1)."""
    from absl import flags

    from tflfuse.runtime.profile import MAX_WARM_MS

    validate_batches_flag()
    flags.register_validator("warm_ms", lambda v: 0 <= v <= MAX_WARM_MS,
                             f"--warm_ms must be from 0 to {MAX_WARM_MS:g}")
    validate_counts("repeats", "reps")


def validate_batches_flag() -> None:
    """An absl validator for ``--batches``: a non-empty list of positive integers in ASCII digits."""
    from absl import flags

    flags.register_validator("batches", lambda v: bool(v) and all(b.isascii() and b.isdigit() and int(b) > 0
                                                                   for b in v),
                             "--batches must be a non-empty list of positive integers")


def validate_counts(*names: str) -> None:
    """absl validators: each integer flag of ``names`` at least 1."""
    from absl import flags

    for name in names:
        flags.register_validator(name, lambda v: v >= 1, f"--{name} must be at least 1")


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def programs(rows: int, depth: int, cols: int, tile) -> dict[str, Program]:
    """The three forms of ``y = x @ w + b`` on ``tile`` (a :class:`~tflfuse.kernels.gemm.MatmulTile`), bound x, w,
    b, y: ``f32`` (the float32 plan's program), ``f16_storage`` (its tensors as f16, arithmetic f32) and
    ``f16_math`` (the float16 plan's form: f16 slices and multiply-adds, f32 across the depth)."""
    binds = (Binding("x", ("input", 0), "read", "f32", rows * depth * 4),
             Binding("w", ("input", 1), "read", "f32", depth * cols * 4),
             Binding("b", ("input", 2), "read", "f32", cols * 4),
             Binding("y", ("output", 0), "read_write", "f32", rows * cols * 4))
    f32 = product_program("gemm", binds, rows, depth, cols, "x", "w", "y", "y[idx] = acc + b[col];", tile=tile)
    plain = Program(**{f.name: getattr(f32, f.name) for f in dataclasses.fields(Program)})   # no f16 math form
    return {"f32": f32, "f16_storage": half_storage(plain), "f16_math": half_storage(f32)}


def _bytes(a: np.ndarray, half: bool) -> bytes:
    if not half:
        return a.astype(np.float32).tobytes()
    h = a.astype(np.float16).ravel()
    return (np.concatenate([h, np.zeros(1, np.float16)]) if h.size % 2 else h).tobytes()


def run_form(device, prog: Program, arrays, rows: int, cols: int, repeats: int, reps: int, warm_ms: float):
    """(GPU microseconds, the output's checked rows (:func:`check_ranges`) as float64) of ``prog`` over ``arrays``
    (x, w, b): :func:`~tflfuse.runtime.plan.pass_gpu_us` with ``repeats``, ``reps`` and ``warm_ms``."""
    half = "f16" in prog.bindings[-1].elem_type
    bufs = [device.create_buffer(len(_bytes(a, half)), data=_bytes(a, half)) for a in arrays]
    out = device.create_buffer(prog.bindings[-1].size)
    record = recorder(device, prog, bufs + [out])
    # The GPU clocks down while the CPU computes the references: pass_gpu_us keeps it busy for --warm_ms first
    # (tflfuse.runtime.profile.WARM_MS).
    us = pass_gpu_us(device, record, repeats, reps=reps, warm_ms=warm_ms)
    # whole-output reads would slow the GPU down (peaks.CHECK_ROWS)
    return us, read_rows(device, out, rows, cols, np.float16 if half else np.float32).astype(np.float64)

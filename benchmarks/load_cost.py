"""What a vec4 load costs beside vec4 multiply-adds, by where it reads: workgroup memory, a uniform buffer or a
storage buffer, every lane of a subgroup at one address (a broadcast) or each at its own.

    python benchmarks/load_cost.py [--fmas=1,2,4,8] [--index=computed,offset,nested]
                                   [--out=benchmarks/RESULTS-load-cost.md]

Each invocation of a kernel of many workgroups of 256 runs ``--steps`` steps; each step loads one vec4 and adds
it, times ``--fmas`` independent vec4<f32> accumulators, into them (``a = fma(a, w, c)``): one load per
``fmas`` vec4 multiply-adds, the ratio of a tiled product's inner loop (:mod:`tflfuse.kernels.gemm`: an ``rm x
rn`` block loads ``(rm + rn) / 4`` vec4s per ``rm * rn / 4`` vec4 multiply-adds) or of the resident fused
bottleneck's expansion (one weight vec4 per halo pixel an invocation holds). The load's index is the same for
every invocation (``broadcast``) or differs by invocation (``distinct``); 256 vec4s (4 KiB) are read over and over,
so every read hits its cache. ``--index`` sets how a workgroup load's index is formed (the other sources take
``computed`` only): ``computed``, each load's index worked out on its own, ``(k * 4 + j + lidx) % 256``;
``offset``, one index worked out once a step and each load at a constant offset from it (``wsh[i + 64 j]``, as
the tiled product's inner loop reads its slices); ``nested``, a two-level array with the constant ``j`` as the
outer index and the step's index as the inner one (``wsh2[j][i]``), so that WGSL's bounds check on a dynamic
index (naga clamps it) is the same expression for the step's four loads; ``constant``, each load's index fixed
when the shader is compiled (the loop body unrolled over 64 steps, 64 distinct vec4s read every trip; with each
lane at its own, a per-lane base worked out once before the loop), the form in which a uniform buffer's value can
be an operand of the multiply-add itself, and the one form besides ``computed`` that uniform loads take. Either
way neighbouring lanes read neighbouring vec4s where their addresses differ. TFLOP/s = 8 FLOPs per vec4
multiply-add over the GPU time of one compute pass (timestamp queries, median of --repeats), beside the FMA peak
with no loads (``benchmarks/peaks.py``) measured in the same run. Needs the ``timestamp-query`` feature and no
TensorFlow.

Its kernels and the FMA peak are compiled as the library compiles its own (:class:`tflfuse.Device`'s
``shader_checks`` default: trusted shader modules, no runtime checks, on a GPU; checked on a software adapter);
``--shader_checks`` keeps wgpu's runtime checks (``create_shader_module``, as a browser compiles WGSL), under which
naga clamps every dynamic index into workgroup memory, and ``--noshader_checks`` compiles them trusted. The header
says which ran. The tables before 2026-12-06 13:00 UTC in ``benchmarks/RESULTS-load-cost.md`` had the kernels
checked and the peak trusted.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.runtime.plan import pass_gpu_us  # noqa: E402

from peaks import fma_tflops, require_features, validate_out_flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("fmas", ["1", "2", "4", "8"], "vec4 multiply-adds per load")
flags.DEFINE_list("index", ["computed"], "how a load's index is formed: computed, offset, nested (workgroup loads), "
                  "constant (workgroup and uniform loads)")
flags.DEFINE_integer("steps", 512, "steps per invocation (a multiple of 4)")
flags.DEFINE_integer("workgroups", 132 * 16, "workgroups of 256 invocations")
flags.DEFINE_integer("repeats", 5, "timed passes (median)")
flags.DEFINE_string("out", None, "Markdown table to write")
flags.DEFINE_bool("shader_checks", None, "Compile the kernels and the FMA peak with wgpu's runtime checks "
                  "(naga's clamps on dynamic indices), as a browser does, or (--noshader_checks) trusted; "
                  "default: as the library compiles its kernels (tflfuse.Device's shader_checks default, "
                  "TFLFUSE_SHADER_CHECKS where set)")
flags.register_validator("fmas", lambda v: bool(v) and all(f.isdigit() and 1 <= int(f) <= 32 for f in v),
                         "--fmas takes integers from 1 to 32")
flags.register_validator("index", lambda v: bool(v) and all(i in INDEX for i in v),
                         "--index takes computed, offset, nested and constant")
flags.register_validator("steps", lambda v: 4 <= v <= 1 << 24 and v % 4 == 0,
                         "--steps must be a positive multiple of 4, at most 2**24")
flags.register_validator("workgroups", lambda v: 1 <= v <= 65535, "--workgroups must be in [1, 65535]")
flags.register_validator("repeats", lambda v: v >= 1, "--repeats must be at least 1")
validate_out_flags("out")

WORKGROUP = 256
WHERE = ("workgroup", "uniform", "storage")
INDEX = ("computed", "offset", "nested", "constant")
#: the steps of the ``constant`` form's unrolled loop body (``--steps`` must be a multiple of it)
CONSTANT_STEPS = 64


def source(where: str, fmas: int, distinct: bool, steps: int, index: str = "computed") -> str:
    """WGSL of the kernel (module docstring): ``steps`` steps of one vec4 load from ``where`` (its index formed as
    ``index`` says) and ``fmas`` vec4 multiply-adds; the sums are written so that nothing folds."""
    if index != "computed" and where != "workgroup" and not (index == "constant" and where == "uniform"):
        raise ValueError(f"index {index!r} is not a form of {where} loads")
    decl = {"workgroup": "var<workgroup> wsh: array<vec4<f32>, 256>;",
            "uniform": "@group(0) @binding(2) var<uniform> wu: array<vec4<f32>, 256>;", "storage": ""}[where]
    read = {"workgroup": "wsh", "uniform": "wu", "storage": "src"}[where]
    fill = "  wsh[lidx] = src[lidx];\n  workgroupBarrier();" if where == "workgroup" else ""
    lane = " + lidx" if distinct else ""
    step, unrolled = "", 4
    if index == "constant":   # the same CONSTANT_STEPS vec4s every trip, each at an index fixed at compile time
        fill += "\n  let base = lidx % 192u;" if distinct else ""
        index, unrolled = f"{'base + ' if distinct else ''}{{j}}u", CONSTANT_STEPS
    elif index == "computed":
        index = f"(k * 4u + {{j}}u{lane}) % 256u"
    elif index == "offset":
        step, index = f"    let base = (k{lane}) % 64u;", "base + {j}u * 64u"
    else:
        decl = "var<workgroup> wsh2: array<array<vec4<f32>, 64>, 4>;"
        fill = "  wsh2[lidx / 64u][lidx % 64u] = src[lidx];\n  workgroupBarrier();"
        step, index = f"    let row = (k{lane}) % 64u;", "{j}u][row"
        read = "wsh2"
    accs = "\n".join(f"  var a{q} = src[(lidx + {q}u) % 256u] * (f32(lidx) * 1e-3 + {q}.0);" for q in range(fmas))
    body = [step] if step else []
    for j in range(unrolled):
        body.append(f"    let w{j} = {read}[{index.format(j=j)}];")
        body += [f"    a{q} = fma(a{q}, w{j}, vec4<f32>(0.001));" for q in range(fmas)]
    total = " + ".join(f"a{q}" for q in range(fmas))
    nl = "\n"
    return f"""@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
{decl}
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
{fill}
{accs}
  for (var k = 0u; k < {steps // unrolled}u; k++) {{
{nl.join(body)}
  }}
  y[wid.x * {WORKGROUP}u + lidx] = {total};
}}
"""


def name(where: str, index: str) -> str:
    """A table column's name: the memory, and the index form where it is not ``computed``."""
    return where if index == "computed" else f"{where} ({index})"


def tflops(device, where: str, fmas: int, distinct: bool, index: str = "computed") -> float:
    """TFLOP/s of :func:`source`'s kernel on the tflfuse Device ``device``."""
    wgpu = device._wgpu
    values = np.full(1024, 0.5, np.float32).tobytes()
    src = device.create_buffer(len(values), data=values)
    out = device.create_buffer(FLAGS.workgroups * WORKGROUP * 16)
    code = source(where, fmas, distinct, FLAGS.steps, index)
    module = device.shader_module(code, "load_cost")
    pipeline = device.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    entries = [{"binding": 0, "resource": {"buffer": src, "offset": 0, "size": src.size}},
               {"binding": 1, "resource": {"buffer": out, "offset": 0, "size": out.size}}]
    if where == "uniform":
        uniform = device.device.create_buffer(size=len(values), usage=wgpu.BufferUsage.UNIFORM |
                                              wgpu.BufferUsage.COPY_DST)
        device.device.queue.write_buffer(uniform, 0, values)
        entries.append({"binding": 2, "resource": {"buffer": uniform, "offset": 0, "size": len(values)}})
    group = device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def record(cpass) -> None:
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(FLAGS.workgroups, 1, 1)
    us = pass_gpu_us(device, record, FLAGS.repeats)
    return FLAGS.workgroups * WORKGROUP * FLAGS.steps * fmas * 8 / us / 1e6


def main(argv) -> None:
    del argv
    device = tflfuse.Device(shader_checks=FLAGS.shader_checks)
    require_features(device, "timestamp-query")
    if FLAGS.workgroups * WORKGROUP * 16 > device.max_storage_binding:
        raise SystemExit(f"--workgroups={FLAGS.workgroups}: the output ({FLAGS.workgroups * WORKGROUP * 16} bytes) "
                         f"passes the device's max storage binding of {device.max_storage_binding}")
    if "constant" in FLAGS.index and FLAGS.steps % CONSTANT_STEPS:
        raise SystemExit(f"--steps={FLAGS.steps}: the constant form takes a multiple of {CONSTANT_STEPS}")
    if device.loop_limit is not None and FLAGS.steps // 4 >= device.loop_limit:
        raise SystemExit(f"--steps={FLAGS.steps}: {FLAGS.steps // 4} loop trips, past the {device.loop_limit} "
                         f"after which this adapter stops a loop (its rates would be wrong)")
    peak = fma_tflops(device, "f32", **(dict(workgroups=16, iterations=256, repeats=3) if device.is_software else {}))
    forms = {"workgroup": FLAGS.index, "uniform": [i for i in ("computed", "constant") if i in FLAGS.index or
                                                   i == "computed"], "storage": ["computed"]}
    columns = [(w, i) for w in WHERE for i in forms[w]]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    checks = "trusted (no runtime checks)" if device.trusted_shaders else "with wgpu's runtime checks"
    lines = [f"## load_cost.py, {date}, {device.describe()}, kernels {checks}", "",
             f"TFLOP/s of vec4<f32> multiply-adds with one vec4 load per --fmas of them, {FLAGS.workgroups} "
             f"workgroups of {WORKGROUP}, {FLAGS.steps} steps each; in brackets the share of the f32 FMA peak with no "
             f"loads, {peak:.1f} TFLOP/s in the same run.", "",
             "| multiply-adds per load | " + " | ".join(f"{name(w, i)} {k}" for w, i in columns
                                                        for k in ("broadcast", "distinct"))
             + " |", "|---:|" + "---:|" * (2 * len(columns))]
    for fmas in map(int, FLAGS.fmas):
        cells = []
        for where, index in columns:
            for distinct in (False, True):
                rate = tflops(device, where, fmas, distinct, index)
                cells.append(f"{rate:.3g} ({100 * rate / peak:.0f}%)")
                print(f"{fmas} per load, {name(where, index)} {'distinct' if distinct else 'broadcast'}: "
                      f"{rate:.3g} TFLOP/s", flush=True)
        lines.append(f"| {fmas} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if FLAGS.out:
        Path(FLAGS.out).write_text(text)


if __name__ == "__main__":
    app.run(main)

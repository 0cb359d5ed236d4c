"""A whole inverted-residual block in one dispatch on subgroup matrices (Dawn), against the library's fused_bottleneck
on the same Dawn device in float16, on MobileNetV2's stride-1 blocks of 28x28, 14x14 and 7x7 at batch 32.

    pip install wgpudawn==0.32.0.4
    python benchmarks/matrix_block.py [--tiles=14x2/32/4,7x7/32/8] [--out=benchmarks/RESULTS-matrix-block.md]

The library's float16 plan runs these blocks as three dispatches (the expansion and the projection on subgroup
matrices, the depthwise conv between them on the FMA units, the expanded tensor in memory), because a single
dispatch on the FMA units measured slower there (``benchmarks/sweep_bottleneck_strategies.py``). This prototype
asks whether the matrix units change that: a workgroup owns a ``TH x TW`` tile of output pixels of one image and
stages its ``(TH + 2) x (TW + 2)`` halo of inputs in workgroup memory once; then, for each chunk of ``C`` expanded
channels, its subgroups expand the halo (``[halo, Cin] x [Cin, C]``, f16 operands, f32 sums) into workgroup memory,
every invocation takes the depthwise conv of its share of the tile's pixels and channels from there (the expansion's
bias and RELU6 applied as it is read, zero outside the image: SAME padding), and the subgroups add the chunk's
projection (``[tile, C] x [C, Cout]``) into f32 result fragments held across the chunks. The projection's bias and
the residual are added as the results leave. The halo's border is expanded by every tile that needs it
(recomputation, ``(TH + 2)(TW + 2) / (TH TW)`` times the expansion's work).

Semantics: TFLite's CONV_2D 1x1 (RELU6), DEPTHWISE_CONV_2D 3x3 (SAME, stride 1, RELU6), CONV_2D 1x1 and ADD
(tensorflow/lite/kernels/conv.cc, depthwise_conv.cc, add.cc). Every output is checked against float64 NumPy on the
f16-rounded input and weights, within ``2**-9`` of the output's largest magnitude plus that of
``|relu6(dw)| @ |pw|`` (the depthwise outputs rounded to f16 once before the projection, the expansion summed from
exact f16 products in f32; the library's three-dispatch form holds the expanded tensor in f16 as well). The library's
form is checked the same way. GPU time from timestamp queries around ``--reps`` runs back to back in one compute
pass, median of ``--repeats`` passes, after ``--warm_ms`` of the same work. Needs no TensorFlow.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels import kernel_class  # noqa: E402
from tflfuse.kernels.base import Binding, Program, TensorSpec  # noqa: E402
from tflfuse.runtime.plan import pass_gpu_us  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan  # noqa: E402

from chain import BLOCKS, chain_plan  # noqa: E402
from peaks import recorder, report, require_features, validate_out_flags, validate_timing_flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["32"], "Batch sizes.")
flags.DEFINE_list("tiles", ["14x2/32/4", "14x2/32/4/p", "14x2/16/4", "14x1/32/4", "14x1/32/4/p", "7x2/32/4",
                           "7x2/32/4/p", "7x2/16/4", "7x1/16/4", "7x1/32/4/p", "7x2/16/8", "28x2/32/4/p",
                           "28x1/32/4/p"],
                  "Tiles THxTW/C/S[/p]: output pixels per workgroup, expanded channels per chunk, subgroups (/p: "
                  "each chunk's weights read into registers while the chunk before it is computed).")
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
flags.DEFINE_integer("repeats", 7, "Timed passes per form.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_float("warm_ms", 100.0, "Milliseconds of the same work untimed before each timed form.")
validate_out_flags("out")
validate_timing_flags()
_TILE = re.compile(r"[1-9][0-9]*x[1-9][0-9]*/[1-9][0-9]*/[1-9][0-9]*(/p)?", re.ASCII)
flags.register_validator("tiles", lambda v: bool(v) and all(_TILE.fullmatch(t) for t in v),
                         "--tiles: a list of THxTW/C/S or THxTW/C/S/p (positive integers), e.g. 14x2/32/4")

#: Extra f16 elements per row of the staged operands, so that a fragment's 16 rows fall on distinct banks.
_PAD = 8


def _ceil16(v: int) -> int:
    return -(-v // 16) * 16


def block_source(n: int, h: int, w: int, cin: int, cexp: int, cout: int, residual: bool, th: int, tw: int,
                 chunk: int, subgroups: int, sg: int, prefetch: bool = False) -> tuple[str, int, int, int]:
    """The WGSL of the block on tile ``th x tw``, chunk ``chunk``, ``subgroups`` subgroups of ``sg`` invocations
    (with ``prefetch``, each chunk's weights read into registers while the chunk before it is computed); with its
    workgroup memory in bytes, invocations per workgroup and workgroups. Raises ValueError for sizes it does not
    take."""
    hh, hw = th + 2, tw + 2
    hp, op = hh * hw, th * tw
    hr, orows = _ceil16(hp), _ceil16(op)
    s, threads = subgroups, subgroups * sg
    xa, wa, da, pa = cin + _PAD, chunk + _PAD, chunk + _PAD, cout + _PAD
    ef, pf = (hr // 16) * (chunk // 16), (orows // 16) * (cout // 16)   # expansion and projection fragments
    if cin % 16 or cout % 16 or chunk % 16 or cexp % chunk:
        raise ValueError(f"tile {th}x{tw}/{chunk}/{s} does not map onto Cin {cin}, Cexp {cexp}, Cout {cout}")
    es_size = max(hr * chunk, 256 * s)   # the expansion, then one result fragment per subgroup
    wg_bytes = 2 * (hr * xa + cin * wa + orows * da + chunk * pa) + 4 * es_size
    tiles_y, tiles_x = -(-h // th), -(-w // tw)
    groups = n * tiles_y * tiles_x
    ci4, ce4, co4, q = cin // 4, cexp // 4, cout // 4, chunk // 4

    def shared(items: int, body: str) -> str:
        return f"""  for (var e = lidx; e < {items}u; e += {threads}u) {{
{body}
  }}"""

    # the chunk's weights: expand rows into wsb, projection rows into pws (vec4 m of each, stored as 4 f16)
    parts = [("wsb", "rw", cin * q, q, wa, lambda k, j, c: f"ew[{k} * {ce4}u + {c} * {q}u + {j} / 4u]"),
             ("pws", "rp", chunk * co4, co4, pa, lambda k, j, c: f"pw[({c} * {chunk}u + {k}) * {co4}u + {j} / 4u]")]
    weights, first, ahead = [], [], []
    for arr, reg, items, per, stride, at in parts:
        def put(v: str) -> str:
            return " ".join(f"{arr}[k * {stride}u + j + {i}u] = {v}.{comp};" for i, comp in enumerate("xyzw"))
        if not prefetch:
            weights.append(shared(items, f"    let k = e / {per}u; let j = (e % {per}u) * 4u; "
                                         f"let v = {at('k', 'j', 'c')}; {put('v')}"))
            continue
        for m in range(-(-items // threads)):
            e = f"(lidx + {m * threads}u)"
            cond = "" if (m + 1) * threads <= items else f"if ({e} < {items}u) "
            kj = f"let k = {e} / {per}u; let j = ({e} % {per}u) * 4u;"
            first.append(f"  var {reg}{m} = vec4<f16>(0.0);")
            first.append(f"  {cond}{{ {kj} {reg}{m} = {at('k', 'j', '0u')}; }}")
            weights.append(f"    {cond}{{ {kj} {put(f'{reg}{m}')} }}")
            ahead.append(f"    if (c + 1u < {cexp // chunk}u) {{ {cond}{{ {kj} {reg}{m} = {at('k', 'j', '(c + 1u)')}; }} }}")

    def guard(i: int, count: int) -> str:   # round i of a subgroup's fragments: past count for some subgroups
        return "" if (i + 1) * s <= count else f" if (f < {count}u)"

    expand = []
    for i in range(-(-ef // s)):
        expand += [f"    {{ let f = sg + {i * s}u; let mi = f / {chunk // 16}u; let nj = f % {chunk // 16}u;"
                   f"{guard(i, ef)} {{",
                   "      var acc = subgroup_matrix_result<f32, 16, 16>();"]
        for kk in range(cin // 16):
            expand += [f"      acc = subgroupMatrixMultiplyAccumulate("
                       f"subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&xs, mi * {16 * xa}u + "
                       f"{16 * kk}u, {xa}u), subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>(&wsb, "
                       f"{16 * kk * wa}u + nj * 16u, {wa}u), acc);"]
        expand += [f"      subgroupMatrixStore<row_major>(&es, mi * {16 * chunk}u + nj * 16u, acc, {chunk}u);",
                   "    }}"]
    rounds = -(-pf // s)
    accs = [f"  var p{i} = subgroup_matrix_result<f32, 16, 16>();" for i in range(rounds)]
    project = []
    for i in range(rounds):
        project += [f"    {{ let f = sg + {i * s}u; let mi = f / {cout // 16}u; let nj = f % {cout // 16}u;"
                    f"{guard(i, pf)} {{"]
        for kk in range(chunk // 16):
            project += [f"      p{i} = subgroupMatrixMultiplyAccumulate("
                        f"subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&ds, mi * {16 * da}u + "
                        f"{16 * kk}u, {da}u), subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>(&pws, "
                        f"{16 * kk * pa}u + nj * 16u, {pa}u), p{i});"]
        project += ["    }}"]
    stores = []
    for i in range(rounds):
        res = (f"\n          out += vec4<f32>(x[(pix * {cin}u + col) / 4u]);" if residual else "")
        stores += [f"""  {{ let f = sg + {i * s}u; let mi = f / {cout // 16}u; let nj = f % {cout // 16}u;
    workgroupBarrier();
    subgroupMatrixStore<row_major>(&es, sg * 256u, p{i}, 16u);
    workgroupBarrier();
    for (var t = 0u; t < 2u; t++) {{
      let e4 = lane + t * {sg}u;
      let p = mi * 16u + e4 / 4u;
      let col = nj * 16u + (e4 % 4u) * 4u;
      let oy = ty0 + i32(p / {tw}u);
      let ox = tx0 + i32(p % {tw}u);
      if (f < {pf}u && p < {op}u && oy < {h} && ox < {w}) {{
          let pix = (n * {h}u + u32(oy)) * {w}u + u32(ox);
          let b = sg * 256u + e4 * 4u;
          var out = vec4<f32>(es[b], es[b + 1u], es[b + 2u], es[b + 3u]) + vec4<f32>(pb[col / 4u]);{res}
          y[(pix * {cout}u + col) / 4u] = vec4<f16>(out);
      }}
    }}
  }}"""]
    if sg != 32:   # two vec4s a lane cover a fragment's 256 results
        raise ValueError(f"the store takes subgroups of 32 invocations, the device has {sg}")
    nl = "\n"
    source = f"""enable f16;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
@group(0) @binding(0) var<storage, read> x: array<vec4<f16>>;    // [N, H, W, Cin]
@group(0) @binding(1) var<storage, read> ew: array<vec4<f16>>;   // [Cin, Cexp]
@group(0) @binding(2) var<storage, read> eb: array<vec4<f16>>;   // [Cexp]
@group(0) @binding(3) var<storage, read> dw: array<vec4<f16>>;   // [3, 3, Cexp]
@group(0) @binding(4) var<storage, read> db: array<vec4<f16>>;   // [Cexp]
@group(0) @binding(5) var<storage, read> pw: array<vec4<f16>>;   // [Cexp, Cout]
@group(0) @binding(6) var<storage, read> pb: array<vec4<f16>>;   // [Cout]
@group(0) @binding(7) var<storage, read_write> y: array<vec4<f16>>;   // [N, H, W, Cout]

var<workgroup> xs: array<f16, {hr * xa}>;     // the halo's inputs, [halo pixel][Cin]
var<workgroup> wsb: array<f16, {cin * wa}>;   // the chunk's expand weights, [Cin][C]
var<workgroup> es: array<f32, {es_size}>;  // the halo's expansion of the chunk (f32 sums), then results leaving
var<workgroup> ds: array<f16, {orows * da}>;  // the chunk's depthwise outputs, [tile pixel][C]
var<workgroup> pws: array<f16, {chunk * pa}>; // the chunk's projection weights, [C][Cout]

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let tile = wid.x;
  let tx0 = i32(tile % {tiles_x}u) * {tw};
  let ty0 = i32((tile / {tiles_x}u) % {tiles_y}u) * {th};
  let n = tile / {tiles_x * tiles_y}u;
  let sg = lidx / {sg}u;
  let lane = lidx % {sg}u;
{shared(hp * ci4, f'''    let r = e / {ci4}u;
    let k = (e % {ci4}u) * 4u;
    let iy = ty0 - 1 + i32(r / {hw}u);
    let ix = tx0 - 1 + i32(r % {hw}u);
    var v = vec4<f16>(0.0);
    if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{
      v = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {ci4}u + k / 4u];
    }}
    xs[r * {xa}u + k] = v.x; xs[r * {xa}u + k + 1u] = v.y; xs[r * {xa}u + k + 2u] = v.z;
    xs[r * {xa}u + k + 3u] = v.w;''')}
{nl.join(accs)}
{nl.join(first)}
  for (var c = 0u; c < {cexp // chunk}u; c++) {{
    workgroupBarrier();
{nl.join(weights)}
    workgroupBarrier();
{nl.join(ahead)}
{nl.join(expand)}
    workgroupBarrier();
{shared(op * q, f'''    let p = e / {q}u;
    let j = e % {q}u;
    let oy = i32(p / {tw}u);
    let ox = i32(p % {tw}u);
    let bias = vec4<f32>(eb[c * {q}u + j]);
    var acc = vec4<f32>(db[c * {q}u + j]);
    for (var ky = 0; ky < 3; ky++) {{
      for (var kx = 0; kx < 3; kx++) {{
        let iy = ty0 - 1 + oy + ky;
        let ix = tx0 - 1 + ox + kx;
        if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{
          let r = u32((oy + ky) * {hw} + ox + kx) * {chunk}u + j * 4u;
          let v = clamp(vec4<f32>(es[r], es[r + 1u], es[r + 2u], es[r + 3u]) + bias, vec4<f32>(0.0), vec4<f32>(6.0));
          acc = fma(v, vec4<f32>(dw[u32(ky * 3 + kx) * {ce4}u + c * {q}u + j]), acc);
        }}
      }}
    }}
    let d = vec4<f16>(clamp(acc, vec4<f32>(0.0), vec4<f32>(6.0)));
    ds[p * {da}u + j * 4u] = d.x; ds[p * {da}u + j * 4u + 1u] = d.y; ds[p * {da}u + j * 4u + 2u] = d.z;
    ds[p * {da}u + j * 4u + 3u] = d.w;''')}
    workgroupBarrier();
{nl.join(project)}
  }}
{nl.join(stores)}
}}
"""
    return source, wg_bytes, threads, groups


def reference(x, wts, residual):
    """float64 NumPy of the block on the f16-rounded operands, and the magnitude its rounding error scales with."""
    r = {k: v.astype(np.float16).astype(np.float64) for k, v in wts.items()}
    x64 = x.astype(np.float16).astype(np.float64)
    e = np.clip(x64 @ r["ew"] + r["eb"], 0, 6)
    n, h, w, c = e.shape
    pad = np.pad(e, ((0, 0), (1, 1), (1, 1), (0, 0)))
    d = sum(pad[:, ky:ky + h, kx:kx + w] * r["dw"][ky, kx] for ky in range(3) for kx in range(3)) + r["db"]
    d = np.clip(d, 0, 6)
    y = d @ r["pw"] + r["pb"] + (x64 if residual else 0)
    return y, float((np.abs(d) @ np.abs(r["pw"])).max())


def main(argv):
    del argv
    try:
        dawn = tflfuse.Device(backend="dawn")
    except tflfuse.NoAdapterError as e:
        raise SystemExit(f"no Dawn device: {e}") from None
    require_features(dawn, "timestamp-query", "shader-f16")
    unit = dawn.subgroup_matrix
    if unit is None:
        raise SystemExit(f"{dawn.describe()} has no f16 16x16x16 subgroup matrices with f32 results")
    print(f"adapter: {dawn.describe()}", flush=True)
    rng = np.random.default_rng(0)
    lines = []
    totals = {"library": 0.0, "best": 0.0}
    for n, (h, cin, t, cout, s) in ((int(b), blk) for b in FLAGS.batches for blk in BLOCKS):
        if s != 1 or h not in (28, 14, 7):
            continue
        e, residual = cin * t, cin == cout
        x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
        wts = {"ew": rng.standard_normal((cin, e)).astype(np.float32) / np.sqrt(cin),
               "eb": rng.standard_normal(e).astype(np.float32) / 4,
               "dw": rng.standard_normal((3, 3, e)).astype(np.float32) / 3,
               "db": rng.standard_normal(e).astype(np.float32) / 4,
               "pw": rng.standard_normal((e, cout)).astype(np.float32) / np.sqrt(e),
               "pb": rng.standard_normal(cout).astype(np.float32) / 4}
        want, mag = reference(x, wts, residual)
        tol = 2.0 ** -9 * (float(np.abs(want).max()) + mag)
        label = f"{n}x{h}x{h}x{cin} -> {e} -> {cout}"
        # the library's fused_bottleneck, planned in float16 on the same Dawn device
        inputs = [x] + [wts[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]
        k = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs],
                                             {"expansion": t, "stride": 1, "residual": residual, "target": "gpu"})
        plan = chain_plan(dawn, [("fused_bottleneck", k, list(range(len(inputs))), 99)], dict(enumerate(inputs)), 0,
                          None, "float16")
        plan.run()
        got = np.frombuffer(dawn.device.queue.read_buffer(plan.buffers[99]),
                            np.float16 if plan._is_half(99) else np.float32)[:want.size]
        lib_err = float(np.abs(got.astype(np.float64) - want.ravel()).max())
        lib_us = gpu_time_plan(plan, FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
        print(f"{label}: library ({k.strategy}) {lib_us:.1f} us, max error {lib_err:.3g} (tolerance {tol:.3g})",
              flush=True)
        found = {}
        arrays = [x, wts["ew"], wts["eb"], wts["dw"], wts["db"], wts["pw"], wts["pb"]]
        bufs = [dawn.create_buffer(-(-a.size // 2) * 4, data=np.concatenate(
            [a.astype(np.float16).ravel(), np.zeros(a.size % 2, np.float16)]).tobytes()) for a in arrays]
        out = dawn.create_buffer(want.size * 2)
        for name in FLAGS.tiles:
            shape, chunk, subgroups, *opt = name.split("/")
            th, tw = map(int, shape.split("x"))
            try:
                source, wg_bytes, threads, groups = block_source(n, h, h, cin, e, cout, residual, th, tw, int(chunk),
                                                                 int(subgroups), unit.subgroup_size, opt == ["p"])
            except ValueError as err:
                print(f"  {name}: {err}", flush=True)
                continue
            if wg_bytes > unit.workgroup_bytes:
                print(f"  {name}: {wg_bytes} bytes of workgroup memory, past {unit.workgroup_bytes}", flush=True)
                continue
            binds = tuple(Binding(v, ("input", i), "read", "f32", b.size) for i, (v, b) in
                          enumerate(zip(("x", "ew", "eb", "dw", "db", "pw", "pb"), bufs)))
            prog = Program("matrix_block", source, (threads, 1, 1), (groups, 1, 1),
                           binds + (Binding("y", ("output", 0), "read_write", "f32", out.size),))
            try:
                record = recorder(dawn, prog, bufs + [out])
                us = pass_gpu_us(dawn, record, FLAGS.repeats, reps=FLAGS.reps, warm_ms=FLAGS.warm_ms)
            except Exception as err:  # noqa: BLE001 - a shader the device refuses: report it, go on
                print(f"  {name}: {type(err).__name__}: {str(err)[:1500]}", flush=True)
                continue
            got = np.frombuffer(dawn.device.queue.read_buffer(out), np.float16)[:want.size].astype(np.float64)
            err = float(np.abs(got - want.ravel()).max())
            ok = err <= tol
            print(f"  {name}: {us:.1f} us, max error {err:.3g}{'' if ok else ' WRONG'}, {wg_bytes} bytes, "
                  f"{groups} workgroups of {threads}", flush=True)
            if ok:
                found[name] = (us, err)
        best = min(found, key=lambda v: found[v][0]) if found else None
        totals["library"] += lib_us
        totals["best"] += found[best][0] if best else lib_us
        lines.append(f"| {label} | {k.strategy} | {lib_us:.1f} | {lib_err:.1e} | "
                     + (f"{found[best][0]:.1f} ({best}) | {found[best][1]:.1e} | {lib_us / found[best][0]:.2f}x |"
                        if best else "no checked result | | |")
                     + " " + "; ".join(f"{v} {u:.1f}" for v, (u, _) in found.items()) + " |")
    head = ["# A whole block in one dispatch on subgroup matrices (prototype) against the library's fused_bottleneck",
            "", f"`benchmarks/matrix_block.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"{dawn.describe()}; batch {','.join(FLAGS.batches)}, float16, GPU microseconds per block (median of {FLAGS.repeats} passes of "
            f"{FLAGS.reps} runs). Stride-1 blocks of MobileNetV2 at 28x28, 14x14 and 7x7: library {totals['library']:.1f} "
            f"us in all, one dispatch on matrices {totals['best']:.1f} us (the best tile of each).", "",
            "| block | library's strategy | library us | library max error | one dispatch, best tile, us | its max "
            "error | library / one dispatch | every tile, us |", "|---|---|---:|---:|---:|---:|---:|---|"]
    return report(head + lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)

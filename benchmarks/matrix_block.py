"""The fused bottleneck at stride 1 as ONE dispatch on subgroup matrices (Dawn's), against the library's float16 form of
the same block on the same Dawn device, on MobileNetV2's stride-1 blocks of 28x28, 14x14 and 7x7.

    pip install wgpudawn==0.32.0.4
    python benchmarks/matrix_block.py [--batches=32,1] [--tiles=14x2/32/4,7x2/16/4] \
        [--out=benchmarks/RESULTS-matrix-block.md]

The library's float16 plan runs these blocks in two or three dispatches (the expansion and the projection on
subgroup matrices, the depthwise conv on the FMA units, the expanded tensor in memory), because one dispatch on the
FMA units measured slower there (``benchmarks/sweep_bottleneck_strategies.py``). This form asks whether the matrix
units change that. A workgroup owns a ``TH x TW`` tile of output pixels of one image (``--tiles``: ``THxTW/C/S``,
:class:`MatrixBlockTile`). It stages the tile's halo of inputs (``(TH + K - 1) x (TW + K - 1)`` pixels, ``Cin``
channels, zero outside the image) in workgroup memory once; then for each chunk of ``C`` expanded channels its ``S``
subgroups expand the halo (``[halo, Cin] x [Cin, C]``, f16 operands, f32 sums; :mod:`tflfuse.kernels.matrix`'s
fragments) into workgroup memory, every invocation takes the depthwise conv of its share of the tile's pixels and
the chunk's channels from there (the expansion's bias and activation applied as each value is read, zero outside
the image: the conv's padding), rounded to f16 into workgroup memory, and the subgroups add the chunk's projection
(``[tile, C] x [C, Cout]``) into f32 result fragments held across the chunks. The results leave through workgroup
memory, one fragment per subgroup at a time, with the projection's bias and the residual. Each chunk's weight rows
are read into registers while the chunk before it is computed. A halo's border is expanded by every tile that needs
it: ``(TH + K - 1)(TW + K - 1) / (TH TW)`` times the expansion's work, which the matrix units make cheap.

Semantics: TFLite's CONV_2D 1x1 (RELU6), DEPTHWISE_CONV_2D 3x3 (SAME, stride 1, RELU6), CONV_2D 1x1 and ADD
(tensorflow/lite/kernels/conv.cc, depthwise_conv.cc, add.cc). Every output is checked against float64 NumPy on the
f16-rounded input and weights, within ``2**-9`` of the output's largest magnitude plus that of
``|relu6(dw)| @ |pw|`` (the depthwise outputs rounded to f16 once before the projection, the output once at its
store; the library's form holds the expanded tensor in f16 as well). GPU time from timestamp queries around
``--reps`` runs back to back in one compute pass, median of ``--repeats`` passes, after ``--warm_ms`` of the same
work; the library's form is timed as its plan runs (with the plan's first dispatch, the input's rounding to f16).
Needs no TensorFlow.
"""

from __future__ import annotations

import dataclasses
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
from tflfuse.kernels.base import Binding, KernelError, Program, TensorSpec, linear_dispatch  # noqa: E402
from tflfuse.kernels.fused.expand_depthwise import _activations, tiled_main  # noqa: E402
from tflfuse.kernels.half import half_storage  # noqa: E402
from tflfuse.kernels.wgsl import prelude  # noqa: E402
from tflfuse.runtime.profile import gpu_time_plan, pass_gpu_us  # noqa: E402

from chain import BLOCKS, block_arrays, chain_plan  # noqa: E402
from peaks import recorder, report, require_features, validate_out_flags, validate_timing_flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["32"], "Batch sizes.")
flags.DEFINE_list("tiles", ["14x2/32/4", "14x2/32/4/v", "14x2/32/8/v", "14x1/32/4/v", "7x2/32/4/v", "7x2/16/4",
                            "7x2/16/4/v", "7x2/16/8/v"],
                  "One-dispatch tiles THxTW/C/S[/v]: output pixels per workgroup, expanded channels per chunk, "
                  "subgroups (/v: the depthwise conv reads the activated expansion as vec4<f16>).")
flags.DEFINE_string("out", None, "Markdown file to write (printed in any case).")
flags.DEFINE_integer("repeats", 7, "Timed passes per form.")
flags.DEFINE_integer("reps", 30, "Runs back to back per timed pass.")
flags.DEFINE_float("warm_ms", 100.0, "Milliseconds of the same work untimed before each timed form.")
validate_out_flags("out")
validate_timing_flags()


def _tiles_ok(names) -> bool:
    try:
        for name in names:
            MatrixBlockTile.parse(name)
    except KernelError as e:
        raise flags.ValidationError(f"--tiles: {e}") from None
    return bool(names)


flags.register_validator("tiles", _tiles_ok, "--tiles: a non-empty list of THxTW/C/S[/v]")


#: Extra f16 elements per row of the staged operands, so that a fragment's 16 rows fall on distinct banks.
_PAD = 8
_TILE_FORM = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)/([1-9][0-9]*)/([1-9][0-9]*)(/v)?", re.ASCII)


def _up16(v: int) -> int:
    return -(-v // 16) * 16


@dataclasses.dataclass(frozen=True)
class MatrixBlockTile:
    """``th x tw`` output pixels per workgroup, ``chunk`` expanded channels per step (a multiple of 16), in
    ``subgroups`` subgroups; with ``vec4``, the halo's expansion passes once through its bias, activation and
    padding into a ``vec4<f16>`` array that the depthwise conv reads (a vec4 load a tap), rather than the depthwise
    conv reading the f32 sums four at a time and applying them at every tap."""

    th: int
    tw: int
    chunk: int
    subgroups: int
    vec4: bool = False

    def __post_init__(self):
        sizes = (self.th, self.tw, self.chunk, self.subgroups)
        if not all(type(v) is int and v > 0 for v in sizes) or not isinstance(self.vec4, bool):
            raise KernelError(f"matrix block tile {sizes!r}: its sizes must be positive Python ints, vec4 a bool")

    @classmethod
    def parse(cls, text: str) -> "MatrixBlockTile":
        """``"THxTW/C/S"`` or ``"THxTW/C/S/v"`` (:attr:`name`), e.g. ``"14x2/32/4"``. Raises :class:`KernelError`
        for anything else."""
        found = _TILE_FORM.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise KernelError(f"matrix block tile {text!r} is not 'THxTW/C/S' or 'THxTW/C/S/v' of positive integers, "
                              f"e.g. '14x2/32/4'")
        return cls(*(int(v) for v in found.groups()[:4]), vec4=bool(found.group(5)))

    @property
    def name(self) -> str:
        return f"{self.th}x{self.tw}/{self.chunk}/{self.subgroups}" + ("/v" if self.vec4 else "")

    def sizes(self, k: int, cin: int, cout: int) -> dict:
        """Rows of the staged halo and tile (multiples of 16), fragments of the expansion and projection, and the
        workgroup memory in bytes, for a ``k x k`` depthwise conv between ``cin`` and ``cout`` channels."""
        hr, tr = _up16((self.th + k - 1) * (self.tw + k - 1)), _up16(self.th * self.tw)
        es = max(hr * self.chunk, 256 * self.subgroups)   # the expansion, then one result fragment per subgroup
        wg = 2 * (hr * (cin + _PAD) + cin * (self.chunk + _PAD) + tr * (self.chunk + _PAD) +
                  self.chunk * (cout + _PAD) + (hr * self.chunk if self.vec4 else 0)) + 4 * es
        return {"hr": hr, "tr": tr, "es": es, "bytes": wg, "ef": (hr // 16) * (self.chunk // 16),
                "pf": (tr // 16) * (cout // 16)}




def matrix_block_refusal(g: dict, cin: int, cexp: int, cout: int, tile: MatrixBlockTile, unit) -> str:
    """Why :func:`matrix_block_program` does not take this block and tile on ``unit`` (a
    :class:`~tflfuse.kernels.matrix.SubgroupMatrix`), or ``""``: it needs positive sizes, a square depthwise conv
    without dilation and with stride 1, channels (in, expanded, out) that are multiples of 16, a chunk (a multiple
    of 16) dividing the expanded channels, subgroups of at most 64 invocations, at most 256 invocations, and the
    tile's arrays within the device's workgroup memory."""
    if not isinstance(tile, MatrixBlockTile):
        return f"the tile must be a MatrixBlockTile, got {tile!r}"
    if not all(type(v) is int and v > 0 for v in (cin, cexp, cout)):
        return f"channels {cin!r} -> {cexp!r} -> {cout!r}: each must be a positive int"
    if not all(type(g.get(k)) is int and g[k] > 0 for k in ("N", "H", "W", "OH", "OW", "KH", "KW")) or \
            g["KH"] != g["KW"] or g.get("DH", 1) != 1 or g.get("DW", 1) != 1 or \
            not all(type(g.get(k)) is int and 0 <= g[k] < g["KH"] for k in ("PT", "PL")):
        return (f"geometry {g!r}: N, H, W, OH, OW positive, a square K x K depthwise conv without dilation, "
                f"padding before (PT, PL) below K")
    if g["SH"] != 1 or g["SW"] != 1:
        return f"stride {g['SH']}x{g['SW']}: the form takes stride 1"
    if cin % 16 or cexp % 16 or cout % 16:
        return f"channels {cin} -> {cexp} -> {cout}: each must be a multiple of 16"
    if tile.chunk % 16 or cexp % tile.chunk:
        return f"chunk {tile.chunk}: a multiple of 16 dividing the {cexp} expanded channels"
    if unit.subgroup_size > 64:
        return f"subgroups of {unit.subgroup_size} invocations: the form takes at most 64"
    if tile.subgroups * unit.subgroup_size > 256:
        return f"{tile.subgroups} subgroups of {unit.subgroup_size}: past 256 invocations"
    used = tile.sizes(g["KH"], cin, cout)["bytes"]
    if used > unit.workgroup_bytes:
        return f"{used} bytes of workgroup memory, past the device's {unit.workgroup_bytes}"
    return ""


def matrix_block_program(name: str, bindings: tuple[Binding, ...], g: dict, cin: int, cexp: int, cout: int,
                         expand_activation: str, dw_activation: str, store: str, helpers: str, unit,
                         tile: MatrixBlockTile) -> Program:
    """The block in one dispatch on subgroup matrices (see the module doc): its float32-typed source, which
    :func:`~tflfuse.kernels.half.half_storage` turns into the float16 program.

    Args:
      name: the program's name.
      bindings: ``x [N, H, W, Cin]``, ``ew [Cin, Cexp]``, ``eb [Cexp]``, ``dw [K, K, Cexp]``, ``db [Cexp]``,
        ``pw [Cexp, Cout]``, ``pb [Cout]``, then the output and whatever ``store`` reads; float bindings, read as
        vec4s (a float16 plan's :func:`~tflfuse.kernels.half.half_storage` makes them f16).
      g: the depthwise conv's geometry: ``N``, ``H``, ``W``, ``OH``, ``OW``, ``KH`` (= ``KW``), ``SH`` and ``SW``
        (1), ``PT``, ``PL``.
      cin, cexp, cout: channels.
      expand_activation, dw_activation: the two convs' activations (:func:`~tflfuse.kernels.wgsl.activation_fn`'s
        names).
      store: statements per output vec4, with ``pix`` (``(n * OH + oy) * OW + ox``), ``co4`` (its vec4 of output
        channels) and the vec4<f32> ``acc`` (the projection without its bias).
      helpers: WGSL functions ``store`` calls.
      unit: the device's :class:`~tflfuse.kernels.matrix.SubgroupMatrix`.
      tile: a :class:`MatrixBlockTile`.
    Raises:
      KernelError: the block or tile is one :func:`matrix_block_refusal` refuses.
    """
    why = matrix_block_refusal(g, cin, cexp, cout, tile, unit)
    if why:
        raise KernelError(f"{name}: one dispatch on subgroup matrices does not take this block: {why}")
    k, th, tw, chunk, s = g["KH"], tile.th, tile.tw, tile.chunk, tile.subgroups
    z = tile.sizes(k, cin, cout)
    hh, hw = th + k - 1, tw + k - 1
    sg = unit.subgroup_size
    hp, op, threads = hh * hw, th * tw, sg * s
    xa, wa, da, pa = cin + _PAD, chunk + _PAD, chunk + _PAD, cout + _PAD
    tiles_y, tiles_x = -(-g["OH"] // th), -(-g["OW"] // tw)
    groups = g["N"] * tiles_y * tiles_x
    ci4, ce4, co4, q, chunks = cin // 4, cexp // 4, cout // 4, chunk // 4, cexp // chunk
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") if b.elem_type == "f32" else b for b in bindings)
    nl = "\n"

    def shared(items: int, body: str) -> str:
        return f"  for (var e = lidx; e < {items}u; e += {threads}u) {{\n{body}\n  }}"

    def put(arr: str, at: str, v: str) -> str:   # a vec4<f16> into 4 consecutive f16 of a workgroup array
        return " ".join(f"{arr}[{at} + {i}u] = {v}.{c};" for i, c in enumerate("xyzw"))

    def guard(i: int, count: int) -> str:   # round i of the subgroups' fragments passes count for some subgroups
        return "" if (i + 1) * s <= count else f" if (f < {count}u)"

    def mma(left: str, left_at: str, lstride: int, right: str, right_at: str, rstride: int, acc: str) -> str:
        return (f"{acc} = subgroupMatrixMultiplyAccumulate(subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, "
                f"row_major>(&{left}, {left_at}, {lstride}u), subgroupMatrixLoad<subgroup_matrix_right<f16, 16, "
                f"16>, row_major>(&{right}, {right_at}, {rstride}u), {acc});")

    # the chunk's weights: expand rows into wsb, projection rows into pws, read into registers a chunk ahead
    parts = [("wsb", "rw", cin * q, q, wa, lambda kk, j, c: f"ew[{kk} * {ce4}u + {c} * {q}u + {j} / 4u]"),
             ("pws", "rp", chunk * co4, co4, pa, lambda kk, j, c: f"pw[({c} * {chunk}u + {kk}) * {co4}u + {j} / 4u]")]
    first, stage, ahead = [], [], []
    for arr, reg, items, per, stride, at in parts:
        for m in range(-(-items // threads)):
            e = f"(lidx + {m * threads}u)"
            cond = "" if (m + 1) * threads <= items else f"if ({e} < {items}u) "
            kj = f"let kk = {e} / {per}u; let j = ({e} % {per}u) * 4u;"
            first += [f"  var {reg}{m} = vec4<f16>(0.0);",
                      f"  {cond}{{ {kj} {reg}{m} = vec4<f16>({at('kk', 'j', '0u')}); }}"]
            stage.append(f"    {cond}{{ {kj} {put(arr, f'kk * {stride}u + j', f'{reg}{m}')} }}")
            ahead.append(f"      {cond}{{ {kj} {reg}{m} = vec4<f16>({at('kk', 'j', '(c + 1u)')}); }}")
    expand = []
    for i in range(-(-z["ef"] // s)):
        expand += [f"    {{ let f = sg + {i * s}u; let mi = f / {chunk // 16}u; let nj = f % {chunk // 16}u;"
                   f"{guard(i, z['ef'])} {{", "      var acc = subgroup_matrix_result<f32, 16, 16>();"]
        expand += ["      " + mma("xs", f"mi * {16 * xa}u + {16 * kk}u", xa, "wsb", f"{16 * kk * wa}u + nj * 16u", wa,
                                  "acc") for kk in range(cin // 16)]
        expand += [f"      subgroupMatrixStore<row_major>(&es, mi * {16 * chunk}u + nj * 16u, acc, {chunk}u);",
                   "    }}"]
    rounds = -(-z["pf"] // s)
    project = []
    for i in range(rounds):
        project += [f"    {{ let f = sg + {i * s}u; let mi = f / {cout // 16}u; let nj = f % {cout // 16}u;"
                    f"{guard(i, z['pf'])} {{"]
        project += ["      " + mma("ds", f"mi * {16 * da}u + {16 * kk}u", da, "pws", f"{16 * kk * pa}u + nj * 16u", pa,
                                   f"p{i}") for kk in range(chunk // 16)]
        project.append("    }}")
    stores = [f"""  {{ let f = sg + {i * s}u; let mi = f / {cout // 16}u; let nj = f % {cout // 16}u;
    workgroupBarrier();
    subgroupMatrixStore<row_major>(&es, sg * 256u, p{i}, 16u);
    workgroupBarrier();
    for (var t = 0u; t < {64 // sg}u; t++) {{   // a fragment's 64 vec4s
      let e4 = lane + t * {sg}u;
      let p = mi * 16u + e4 / 4u;
      let oy = ty0 + i32(p / {tw}u);
      let ox = tx0 + i32(p % {tw}u);
      if (f < {z['pf']}u && p < {op}u && oy < {g['OH']} && ox < {g['OW']}) {{
        let pix = (n * {g['OH']}u + u32(oy)) * {g['OW']}u + u32(ox);
        let co4 = nj * 4u + e4 % 4u;
        let b = sg * 256u + e4 * 4u;
        let acc = vec4<f32>(es[b], es[b + 1u], es[b + 2u], es[b + 3u]);
        {store}
      }}
    }}
  }}""" for i in range(rounds)]
    if tile.vec4:   # the halo's values once through bias, activation and padding, then a vec4 load a tap
        activated = shared(hp * q, f"""    let r = e / {q}u;
    let j = e % {q}u;
    let iy = ty0 - {g['PT']} + i32(r / {hw}u);
    let ix = tx0 - {g['PL']} + i32(r % {hw}u);
    let b = r * {chunk}u + j * 4u;
    let v = eact4(vec4<f32>(es[b], es[b + 1u], es[b + 2u], es[b + 3u]) + eb[c * {q}u + j]);
    ev[e] = vec4<f16>(select(vec4<f32>(0.0), v, iy >= 0 && iy < {g['H']} && ix >= 0 && ix < {g['W']}));""") + \
            "\n    workgroupBarrier();\n"
        bias, tap = "", f"""        let v = vec4<f32>(ev[u32((oy + ky) * {hw} + ox + kx) * {q}u + j]);
        acc = fma(v, dw[u32(ky * {k} + kx) * {ce4}u + c * {q}u + j], acc);"""
    else:   # the f32 sums read four at a time, with the bias, activation and padding at every tap
        activated, bias = "", f"\n    let bias = eb[c * {q}u + j];"
        tap = f"""        let iy = ty0 + oy + ky - {g['PT']};
        let ix = tx0 + ox + kx - {g['PL']};
        if (iy >= 0 && iy < {g['H']} && ix >= 0 && ix < {g['W']}) {{
          let r = u32((oy + ky) * {hw} + ox + kx) * {chunk}u + j * 4u;
          let v = eact4(vec4<f32>(es[r], es[r + 1u], es[r + 2u], es[r + 3u]) + bias);
          acc = fma(v, dw[u32(ky * {k} + kx) * {ce4}u + c * {q}u + j], acc);
        }}"""
    depthwise = activated + shared(op * q, f"""    let p = e / {q}u;
    let j = e % {q}u;
    let oy = i32(p / {tw}u);
    let ox = i32(p % {tw}u);{bias}
    var acc = db[c * {q}u + j];
    for (var ky = 0; ky < {k}; ky++) {{
      for (var kx = 0; kx < {k}; kx++) {{
{tap}
      }}
    }}
    let d = vec4<f16>(dact4(acc));
    {put('ds', f'p * {da}u + j * 4u', 'd')}""")
    ev = f"var<workgroup> ev: array<vec4<f16>, {z['hr'] * q}>;   // the halo's expansion, activated\n" if tile.vec4 \
        else ""
    source = f"""enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
{prelude(binds)}{_activations(expand_activation, dw_activation)}{helpers}
var<workgroup> xs: array<f16, {z['hr'] * xa}>;      // the halo's inputs, [halo pixel][Cin]
var<workgroup> wsb: array<f16, {cin * wa}>;          // the chunk's expand weights, [Cin][chunk]
var<workgroup> es: array<f32, {z['es']}>;            // the halo's expansion of the chunk, then results leaving
var<workgroup> ds: array<f16, {z['tr'] * da}>;       // the chunk's depthwise outputs, [tile pixel][chunk]
var<workgroup> pws: array<f16, {chunk * pa}>;        // the chunk's projection weights, [chunk][Cout]
{ev}
{tiled_main(threads, groups, th, tw, tiles_y, tiles_x)}
  let sg = lidx / {sg}u;
  let lane = lidx % {sg}u;
{shared(hp * ci4, f'''    let r = e / {ci4}u;
    let kk = (e % {ci4}u) * 4u;
    let iy = ty0 - {g['PT']} + i32(r / {hw}u);
    let ix = tx0 - {g['PL']} + i32(r % {hw}u);
    var v = vec4<f16>(0.0);
    if (iy >= 0 && iy < {g['H']} && ix >= 0 && ix < {g['W']}) {{
      v = vec4<f16>(x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {ci4}u + kk / 4u]);
    }}
    {put('xs', f'r * {xa}u + kk', 'v')}''')}
{nl.join(f"  var p{i} = subgroup_matrix_result<f32, 16, 16>();" for i in range(rounds))}
{nl.join(first)}
  for (var c = 0u; c < {chunks}u; c++) {{
    workgroupBarrier();   // the last chunk's projection has read ds and pws, its depthwise conv es
{nl.join(stage)}
    workgroupBarrier();
    if (c + 1u < {chunks}u) {{   // the next chunk's weights, while this one is computed
{nl.join(ahead)}
    }}
{nl.join(expand)}
    workgroupBarrier();
{depthwise}
    workgroupBarrier();
{nl.join(project)}
  }}
{nl.join(stores)}
}}
"""
    trips = chunks * (-(-cin * q // threads) + -(-op * q // threads) * k * k + 3) + -(-hp * ci4 // threads) + 2 * rounds
    return Program(name, source, (threads, 1, 1), linear_dispatch(groups * threads, threads), binds, loop_trips=trips)


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
        x, wts = block_arrays(rng, n, h, cin, e, cout)
        want, mag = reference(x, wts, residual)
        tol = 2.0 ** -9 * (float(np.abs(want).max()) + mag)
        label = f"{n}x{h}x{h}x{cin} -> {e} -> {cout}"
        inputs = [x] + [wts[k] for k in ("ew", "eb", "dw", "db", "pw", "pb")]

        # the library's form of the op, planned in float16 on the Dawn device
        k = kernel_class("fused_bottleneck")([TensorSpec(a.shape) for a in inputs], {
            "expansion": t, "stride": 1, "residual": residual, "target": "gpu"})
        plan = chain_plan(dawn, [("fused_bottleneck", k, list(range(len(inputs))), 99)], dict(enumerate(inputs)), 0,
                          None, "float16")
        plan.run()
        got = np.frombuffer(dawn.device.queue.read_buffer(plan.buffers[99]),
                            np.float16 if plan._is_half(99) else np.float32)[:want.size].astype(np.float64)
        lib_err = float(np.abs(got - want.ravel()).max())
        lib_us = gpu_time_plan(plan, FLAGS.repeats, FLAGS.reps, FLAGS.warm_ms)
        lib_progs = [p.name for p, *_ in plan.steps]
        strategy = ", ".join(p.removeprefix("fused_bottleneck_") for p in lib_progs)
        print(f"{label}: library {lib_us:.1f} us ({' + '.join(lib_progs)}), max error {lib_err:.3g} (tolerance "
              f"{tol:.3g})", flush=True)
        # the one-dispatch form over the same f16 values
        g = dict(N=n, H=h, W=h, OH=h, OW=h, SH=1, SW=1, PT=1, PL=1, KH=3, KW=3)
        names = ("x", "ew", "eb", "dw", "db", "pw", "pb")
        binds = tuple(Binding(v, ("input", i), "read", "f32", 4 * a.size) for i, (v, a) in
                      enumerate(zip(names, inputs))) + (Binding("y", ("output", 0), "read_write", "f32",
                                                                4 * want.size),)
        store = f"y[pix * {cout // 4}u + co4] = acc + pb[co4]" + (f" + x[pix * {cout // 4}u + co4];" if residual
                                                                  else ";")
        bufs = [dawn.create_buffer(-(-a.size // 2) * 4, data=np.concatenate(
            [a.astype(np.float16).ravel(), np.zeros(a.size % 2, np.float16)]).tobytes()) for a in inputs]
        out = dawn.create_buffer(-(-want.size // 2) * 4)
        found = {}
        for name in FLAGS.tiles:
            try:
                prog = half_storage(matrix_block_program("matrix_block", binds, g, cin, e, cout, "relu6", "relu6",
                                                         store, "", unit, MatrixBlockTile.parse(name)))
            except KernelError as why:   # a tile the block or the device does not take
                print(f"  {name}: {why}", flush=True)
                continue
            us = pass_gpu_us(dawn, recorder(dawn, prog, bufs + [out]), FLAGS.repeats, reps=FLAGS.reps,
                             warm_ms=FLAGS.warm_ms)
            got = np.frombuffer(dawn.device.queue.read_buffer(out), np.float16)[:want.size].astype(np.float64)
            err = float(np.abs(got - want.ravel()).max())
            ok = err <= tol
            print(f"  {name}: {us:.1f} us, max error {err:.3g}{'' if ok else ' WRONG'}", flush=True)
            if ok:
                found[name] = (us, err)
        best = min(found, key=lambda v: found[v][0]) if found else None
        totals["library"] += lib_us
        totals["best"] += found[best][0] if best else lib_us
        lines.append(f"| {label} | {strategy} | {lib_us:.1f} | {lib_err:.1e} | "
                     + (f"{found[best][0]:.1f} ({best}) | {found[best][1]:.1e} | {lib_us / found[best][0]:.2f}x |"
                        if best else "no checked result | | |")
                     + " " + "; ".join(f"{v} {u:.1f}" for v, (u, _) in found.items()) + " |")
    head = ["# The fused bottleneck in one dispatch on subgroup matrices against its default form (Dawn, float16)",
            "", f"`benchmarks/matrix_block.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"{dawn.describe()}; batch {','.join(FLAGS.batches)}, float16, GPU microseconds per block (median of "
            f"{FLAGS.repeats} passes of {FLAGS.reps} runs). MobileNetV2's stride-1 blocks at 28x28, 14x14 and 7x7: "
            f"{totals['library']:.1f} us in all in the default form, {totals['best']:.1f} us in one dispatch (the best "
            "tile of each).", "",
            "| block | default form's dispatches | default us | its max error | one dispatch, best tile, us | its max "
            "error | default / one dispatch | every tile, us |", "|---|---|---:|---:|---:|---:|---:|---|"]
    return report(head + lines, FLAGS.out)


if __name__ == "__main__":
    app.run(main)

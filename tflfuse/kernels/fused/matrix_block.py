"""The fused bottleneck at stride 1 as ONE dispatch on subgroup matrices (Dawn's): the float16 plan's form of a
block whose expanded tensor the other forms keep in memory.

A workgroup owns a ``TH x TW`` tile of output pixels of one image. It stages the tile's halo of inputs
(``(TH + K - 1) x (TW + K - 1)`` pixels, ``Cin`` channels, zero outside the image) in workgroup memory once; then for
each chunk of ``C`` expanded channels its subgroups expand the halo (``[halo, Cin] x [Cin, C]``, f16 operands, f32
sums; :mod:`tflfuse.kernels.matrix`'s fragments) into workgroup memory, every invocation takes the depthwise conv of
its share of the tile's pixels and the chunk's channels from there (the expansion's bias and activation applied as
each value is read, zero outside the image: the conv's padding), rounded to f16 into workgroup memory, and the
subgroups add the chunk's projection (``[tile, C] x [C, Cout]``) into f32 result fragments held across the chunks.
The results leave through workgroup memory, one fragment per subgroup at a time, through the kernel's store (the
projection's bias, the residual, the output activation). Each chunk's weight rows are read into registers while the
chunk before it is computed. A halo's border is expanded by every tile that needs it: ``(TH + K - 1)(TW + K - 1) /
(TH TW)`` times the expansion's work, which the matrix units make cheap.

Semantics: TFLite's CONV_2D 1x1, DEPTHWISE_CONV_2D (stride 1, depth multiplier 1) and CONV_2D 1x1 with their fused
activations (tensorflow/lite/kernels/conv.cc, depthwise_conv.cc). Precision: the expansion sums exact products of
f16 values in f32 over ``Cin``; the depthwise conv runs in f32 on those sums (after the bias and activation), its
outputs rounded to f16 once; the projection sums exact products of f16 values in f32 over ``Cexp``.

Measured: ``benchmarks/matrix_block.py`` (a prototype of this form against the library's three-dispatch form on
MobileNetV2's stride-1 blocks, one Dawn device) and ``benchmarks/switch_ab.py`` with :data:`MATRIX_BLOCK`.
"""

from __future__ import annotations

import dataclasses
import re

from ..base import Binding, KernelError, Program, linear_dispatch
from ..wgsl import prelude
from .expand_depthwise import _activations

__all__ = ["MATRIX_BLOCK", "MatrixBlockTile", "matrix_block_program", "matrix_block_refusal", "matrix_block_tile"]

#: Whether a float16 plan on a device with subgroup matrices runs eligible fused bottlenecks (stride 1, an expand
#: conv, no squeeze-excite or PReLU; :meth:`tflfuse.kernels.fused.bottleneck.FusedBottleneck.matrix_programs`) as
#: one dispatch of :func:`matrix_block_program` rather than their default strategy's dispatches.
MATRIX_BLOCK = False
#: Extra f16 elements per row of the staged operands, so that a fragment's 16 rows fall on distinct banks.
_PAD = 8
_TILE_FORM = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)/([1-9][0-9]*)/([1-9][0-9]*)", re.ASCII)


def _up16(v: int) -> int:
    return -(-v // 16) * 16


@dataclasses.dataclass(frozen=True)
class MatrixBlockTile:
    """``th x tw`` output pixels per workgroup, ``chunk`` expanded channels per step (a multiple of 16), in
    ``subgroups`` subgroups."""

    th: int
    tw: int
    chunk: int
    subgroups: int

    @classmethod
    def parse(cls, text: str) -> "MatrixBlockTile":
        """``"THxTW/C/S"`` (:attr:`name`), e.g. ``"14x2/32/4"``. Raises :class:`KernelError` for anything else."""
        found = _TILE_FORM.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise KernelError(f"matrix block tile {text!r} is not 'THxTW/C/S' of positive integers, e.g. '14x2/32/4'")
        return cls(*(int(v) for v in found.groups()))

    @property
    def name(self) -> str:
        return f"{self.th}x{self.tw}/{self.chunk}/{self.subgroups}"

    def sizes(self, k: int, cin: int, cout: int) -> dict:
        """Rows of the staged halo and tile (multiples of 16), fragments of the expansion and projection, and the
        workgroup memory in bytes, for a ``k x k`` depthwise conv between ``cin`` and ``cout`` channels."""
        hr, tr = _up16((self.th + k - 1) * (self.tw + k - 1)), _up16(self.th * self.tw)
        es = max(hr * self.chunk, 256 * self.subgroups)   # the expansion, then one result fragment per subgroup
        wg = 2 * (hr * (cin + _PAD) + cin * (self.chunk + _PAD) + tr * (self.chunk + _PAD) +
                  self.chunk * (cout + _PAD)) + 4 * es
        return {"hr": hr, "tr": tr, "es": es, "bytes": wg, "ef": (hr // 16) * (self.chunk // 16),
                "pf": (tr // 16) * (cout // 16)}


#: Tiles tried in order by :func:`matrix_block_tile`: the first that maps onto the block and fits the device.
_TILES = ("14x2/32/4", "7x2/32/4", "7x2/16/4")


def matrix_block_refusal(g: dict, cin: int, cexp: int, cout: int, tile: MatrixBlockTile, unit) -> str:
    """Why :func:`matrix_block_program` does not take this block and tile on ``unit`` (a
    :class:`~tflfuse.kernels.matrix.SubgroupMatrix`), or ``""``: it needs stride 1, channels (in, expanded, out)
    that are multiples of 16, a chunk (a multiple of 16) dividing the expanded channels, subgroups of at most 64
    invocations, at most 256 invocations, and the tile's arrays within the device's workgroup memory."""
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


def matrix_block_tile(g: dict, cin: int, cexp: int, cout: int, unit) -> MatrixBlockTile | None:
    """The first of :data:`_TILES` that :func:`matrix_block_refusal` takes and that is no taller than the output,
    else the first it takes, or None."""
    taken = [t for t in map(MatrixBlockTile.parse, _TILES) if not matrix_block_refusal(g, cin, cexp, cout, t, unit)]
    return next((t for t in taken if t.th <= g["OH"]), taken[0] if taken else None)


def matrix_block_program(name: str, bindings: tuple[Binding, ...], g: dict, cin: int, cexp: int, cout: int,
                         expand_activation: str, dw_activation: str, store: str, helpers: str, unit,
                         tile: MatrixBlockTile | None = None) -> Program:
    """The block in one dispatch on subgroup matrices (see the module doc).

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
      tile: a :class:`MatrixBlockTile`, or None for :func:`matrix_block_tile`'s.
    Raises:
      KernelError: the block or tile is one :func:`matrix_block_refusal` refuses.
    """
    tile = tile or matrix_block_tile(g, cin, cexp, cout, unit)
    why = "no tile of the library's fits" if tile is None else matrix_block_refusal(g, cin, cexp, cout, tile, unit)
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
    source = f"""enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
{prelude(binds)}{_activations(expand_activation, dw_activation)}{helpers}
var<workgroup> xs: array<f16, {z['hr'] * xa}>;      // the halo's inputs, [halo pixel][Cin]
var<workgroup> wsb: array<f16, {cin * wa}>;          // the chunk's expand weights, [Cin][chunk]
var<workgroup> es: array<f32, {z['es']}>;            // the halo's expansion of the chunk, then results leaving
var<workgroup> ds: array<f16, {z['tr'] * da}>;       // the chunk's depthwise outputs, [tile pixel][chunk]
var<workgroup> pws: array<f16, {chunk * pa}>;        // the chunk's projection weights, [chunk][Cout]

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let tx0 = i32(tile % {tiles_x}u) * {tw};
  let ty0 = i32((tile / {tiles_x}u) % {tiles_y}u) * {th};
  let n = tile / {tiles_x * tiles_y}u;
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
{shared(op * q, f'''    let p = e / {q}u;
    let j = e % {q}u;
    let oy = i32(p / {tw}u);
    let ox = i32(p % {tw}u);
    let bias = eb[c * {q}u + j];
    var acc = db[c * {q}u + j];
    for (var ky = 0; ky < {k}; ky++) {{
      for (var kx = 0; kx < {k}; kx++) {{
        let iy = ty0 + oy + ky - {g['PT']};
        let ix = tx0 + ox + kx - {g['PL']};
        if (iy >= 0 && iy < {g['H']} && ix >= 0 && ix < {g['W']}) {{
          let r = u32((oy + ky) * {hw} + ox + kx) * {chunk}u + j * 4u;
          let v = eact4(vec4<f32>(es[r], es[r + 1u], es[r + 2u], es[r + 3u]) + bias);
          acc = fma(v, dw[u32(ky * {k} + kx) * {ce4}u + c * {q}u + j], acc);
        }}
      }}
    }}
    let d = vec4<f16>(dact4(acc));
    {put('ds', f'p * {da}u + j * 4u', 'd')}''')}
    workgroupBarrier();
{nl.join(project)}
  }}
{nl.join(stores)}
}}
"""
    trips = chunks * (-(-cin * q // threads) + -(-op * q // threads) * k * k + 3) + -(-hp * ci4 // threads) + 2 * rounds
    return Program(name, source, (threads, 1, 1), linear_dispatch(groups * threads, threads), binds, loop_trips=trips)

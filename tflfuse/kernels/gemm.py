"""Matrix products tiled for a GPU: register-blocked tiles staged through workgroup memory.

``C [rows, cols] = A [rows, depth] @ B [depth, cols]``, the form of every 1x1 convolution (NHWC pixels x
input channels times HWIO/IO weights) and FULLY_CONNECTED. A workgroup of 256 invocations owns a ``tm x tn``
tile of ``C``; each invocation accumulates an ``rm x rn`` block of it in registers (``rm * rn / 4`` vec4
accumulators). The depth is walked ``tk`` at a time: the slices of ``A`` (``tm x tk``) and ``B`` (``tk x
tn``) are read from memory once per tile into workgroup memory, while the next slices are already loaded
into registers (the loads of step ``k + 1`` overlap the arithmetic of step ``k``). The inner loop reads only
workgroup memory, ``rm / 4 + rn / 4`` vec4 loads per ``rm * rn`` multiply-adds, with no bounds checks: the
staging loads write zeros past the matrix's edges.

The tile (:data:`TILES`) is chosen per shape by :func:`matmul_tile`. Sums run in another order than a
serial loop's: results differ from it by rounding only.
"""

from __future__ import annotations

import dataclasses

from .base import Binding, KernelError, Program, Uniform, linear_dispatch
from .wgsl import prelude

__all__ = ["MatmulTile", "TILES", "matmul_tile", "tiled_matmul_program", "use_tiled_matmul"]

_THREADS = 256


@dataclasses.dataclass(frozen=True)
class MatmulTile:
    """``tm x tn`` outputs per workgroup, ``rm x rn`` per invocation, ``tk`` depth per staged slice."""

    tm: int
    tn: int
    rm: int
    rn: int
    tk: int

    def __post_init__(self):
        if (self.tm // self.rm) * (self.tn // self.rn) != _THREADS or self.rm % 4 or self.rn % 4 or \
                self.tm % self.rm or self.tn % self.rn or self.tk % 4 or self.workgroup_bytes > 16384:
            raise KernelError(f"matmul tile {self} does not map onto {_THREADS} invocations in vec4 groups: it "
                              f"needs (tm / rm) * (tn / rn) == {_THREADS}, rm, rn and tk multiples of 4, and "
                              f"4 * tk * (tm + tn) <= 16384 bytes of workgroup memory")

    @classmethod
    def parse(cls, text: str) -> "MatmulTile":
        """``"TMxTN/RMxRN/TK"``, e.g. ``"128x128/8x8/16"`` (the form of :data:`TILES`' names). Raises
        :class:`KernelError` for anything else."""
        try:
            (tm, tn), (rm, rn), (tk,) = (tuple(int(v) for v in part.split("x")) for part in text.split("/"))
        except ValueError:
            raise KernelError(f"matmul tile {text!r} is not 'TMxTN/RMxRN/TK', e.g. {next(iter(TILES), '')!r}") \
                from None
        return cls(tm, tn, rm, rn, tk)

    @property
    def workgroup_bytes(self) -> int:
        return 4 * self.tk * (self.tm + self.tn)


#: The tiles :func:`matmul_tile` chooses between, named as :meth:`MatmulTile.parse` reads them: each was the
#: fastest of the sweep on some 1x1 product of MobileNetV2 (``benchmarks/sweep_matmul.py``, H200).
TILES: dict[str, MatmulTile] = {}
_TILE_NAMES = ("128x128/8x8/16", "128x128/8x8/8", "64x128/4x8/16", "256x32/8x4/8", "128x32/4x4/8",
               "64x64/4x4/16")
TILES.update({name: MatmulTile.parse(name) for name in _TILE_NAMES})

#: Outputs from which a GPU's matrix products (1x1 convolutions, FULLY_CONNECTED) run tiled: below, the GPU
#: holds every output's invocation at once and the per-output form (with ``split_lanes``) is quicker.
_TILED_MIN_OUTPUTS = 1 << 17
#: Workgroups of 256 invocations a GPU runs at once in :func:`matmul_tile`'s model (an H200: 132 SMs, two each).
_RESIDENT_WORKGROUPS = 264


def use_tiled_matmul(rows: int, depth: int, cols: int, target: str) -> bool:
    """Whether a product ``[rows, depth] x [depth, cols]`` runs as a :func:`tiled_matmul_program`: on a GPU
    (``target="gpu"``), with at least :data:`_TILED_MIN_OUTPUTS` outputs and a depth of at least 16."""
    return target == "gpu" and rows * cols >= _TILED_MIN_OUTPUTS and depth >= 16


def matmul_tile(rows: int, depth: int, cols: int) -> MatmulTile:
    """The tile of :data:`TILES` with the least modelled time for ``[rows, depth] x [depth, cols]``: waves
    of :data:`_RESIDENT_WORKGROUPS` workgroups, each wave as long as one tile's multiply-adds (``tm * tn *
    depth``, padding included) divided by the tile's multiply-adds per value read from workgroup memory
    (``rm * rn / (rm + rn)``).

    Fitted to the sweep of MobileNetV2's 38 products at batch 1 and 32 on an H200 (2026-12-01, GPU time of
    50 back-to-back runs per pass): the tiles this picks took 1560 us in all, against 1382 us for the best
    tile of each product and 1760 us for 64 x 64 tiles everywhere. Tuning only: every tile computes the
    same values in the same order.
    """
    def cost(t: MatmulTile) -> tuple[float, int]:
        groups = -(-rows // t.tm) * -(-cols // t.tn)
        waves = -(-groups // _RESIDENT_WORKGROUPS)
        return waves * t.tm * t.tn * depth * (t.rm + t.rn) / (t.rm * t.rn), -groups   # ties: more in flight
    return min(TILES.values(), key=cost)


def tiled_matmul_program(name: str, bindings: tuple[Binding, ...], rows: int, depth: int, cols: int, a: str,
                         b: str, store: str, helpers: str = "", uniforms: tuple[Uniform, ...] = (),
                         tile: MatmulTile | str | None = None) -> Program:
    """``C = A @ B`` with ``A [rows, depth]`` and ``B [depth, cols]``, float32, tiled for a GPU.

    Args:
      name: the program's name.
      bindings: the storage buffers ``a``, ``b`` and ``store`` read and write.
      rows, depth, cols: the product's sizes.
      a: WGSL expression of ``A[r, k]`` over the u32 names ``r`` and ``k`` (evaluated only in range).
      b: WGSL expression of ``B[k, c]`` over ``k`` and ``c`` (evaluated only in range).
      store: statements run once per output with ``row``, ``col``, ``idx = row * cols + col`` and ``acc``
        (the sum), e.g. ``"y[idx] = act(acc + bias[col]);"``.
      helpers, uniforms: WGSL functions and uniforms ``store`` uses.
      tile: a :class:`MatmulTile`, its name (:meth:`MatmulTile.parse`), or None for :func:`matmul_tile`'s
        choice.
    Returns:
      the :class:`~tflfuse.kernels.base.Program`, one workgroup per tile of ``C``.
    Raises:
      KernelError: for a tile that is unknown or does not map onto 256 invocations.
    """
    if tile is None:
        tile = matmul_tile(rows, depth, cols)
    elif isinstance(tile, str):
        tile = MatmulTile.parse(tile)
    tm, tn, rm, rn, tk = tile.tm, tile.tn, tile.rm, tile.rn, tile.tk
    col_tiles = -(-cols // tn)
    tiles = -(-rows // tm) * col_tiles
    gy, gx = tm // rm, tn // rn          # invocations along the tile's rows and columns
    a_groups, b_groups = tm * tk // 4, tn * tk // 4   # vec4 groups: 4 consecutive k of a row of A, 4 columns of B
    a_loads, b_loads = -(-a_groups // _THREADS), -(-b_groups // _THREADS)   # per invocation
    ra, rb = rm // 4, rn // 4
    lines = []
    # registers: the next slices' values, loaded before the current slice is multiplied
    for j in range(a_loads):
        lines.append(f"  var pa{j}: vec4<f32>;")
    for j in range(b_loads):
        lines.append(f"  var pb{j}: vec4<f32>;")
    for g in range(ra):
        for r in range(4):
            for h in range(rb):
                lines.append(f"  var c{g}_{r}_{h} = vec4<f32>(0.0);")
    decl = "\n".join(lines)

    def load(k0: str) -> str:
        out = []
        for j in range(a_loads):
            e = f"(lidx + {j * _THREADS}u)"
            out.append(f"    pa{j} = a4(r0 + {e} / {tk // 4}u, {k0} + ({e} % {tk // 4}u) * 4u);"
                       if (j + 1) * _THREADS <= a_groups else f"    if ({e} < {a_groups}u) {{ pa{j} = "
                       f"a4(r0 + {e} / {tk // 4}u, {k0} + ({e} % {tk // 4}u) * 4u); }}")
        for j in range(b_loads):
            e = f"(lidx + {j * _THREADS}u)"
            out.append(f"    pb{j} = b4({k0} + {e} / {tn // 4}u, c0 + ({e} % {tn // 4}u) * 4u);"
                       if (j + 1) * _THREADS <= b_groups else f"    if ({e} < {b_groups}u) {{ pb{j} = "
                       f"b4({k0} + {e} / {tn // 4}u, c0 + ({e} % {tn // 4}u) * 4u); }}")
        return "\n".join(out)

    stage = []
    for j in range(a_loads):
        e = f"(lidx + {j * _THREADS}u)"
        guard = "" if (j + 1) * _THREADS <= a_groups else f"if ({e} < {a_groups}u) "
        stage.append(f"    {guard}{{ let r = {e} / {tk // 4}u; let k = ({e} % {tk // 4}u) * 4u;")
        for i, comp in enumerate("xyzw"):
            stage.append(f"      ta[(k + {i}u) * {tm // 4}u + r / 4u][r % 4u] = pa{j}.{comp};")
        stage.append("    }")
    for j in range(b_loads):
        guard = "" if (j + 1) * _THREADS <= b_groups else f"if (lidx + {j * _THREADS}u < {b_groups}u) "
        stage.append(f"    {guard}{{ tb[lidx + {j * _THREADS}u] = pb{j}; }}")
    def step(k: str) -> list[str]:
        out = [f"      let a{g} = ta[{k} * {tm // 4}u + {g * gy}u + ty];" for g in range(ra)]
        out += [f"      let b{h} = tb[{k} * {tn // 4}u + {h * gx}u + tx];" for h in range(rb)]
        out += [f"      c{g}_{r}_{h} += a{g}.{comp} * b{h};" for g in range(ra) for r, comp in enumerate("xyzw")
                for h in range(rb)]
        return out
    # the slice's steps written out one after another
    inner = [line for k in range(tk) for line in ["    {"] + step(f"{k}u") + ["    }"]]
    # Every accumulator is read by a constant component (.x, .y, .z, .w), never indexed at run time, so that it
    # can stay in registers.
    stores = []
    for g in range(ra):
        for r in range(4):
            for h in range(rb):
                cells = "".join(f"""
      {{
        let col = col4 + {j}u;
        if (col < {cols}u) {{
          let acc = c{g}_{r}_{h}.{comp};
          let idx = row * {cols}u + col;
          {store}
        }}
      }}""" for j, comp in enumerate("xyzw"))
                stores.append(f"""  {{
    let row = r0 + ({g * gy}u + ty) * 4u + {r}u;
    let col4 = c0 + ({h * gx}u + tx) * 4u;
    if (row < {rows}u) {{{cells}
    }}
  }}""")
    nl = "\n"
    source = prelude(bindings, uniforms) + helpers + f"""
// Staging loads without branches: the address is clamped into the matrix and the value zeroed past its edges.
fn a_at(r0: u32, k0: u32) -> f32 {{
  let r = min(r0, {max(rows, 1) - 1}u);
  let k = min(k0, {max(depth, 1) - 1}u);
  return select(0.0, {a}, r0 < {rows}u && k0 < {depth}u);
}}

fn b_at(k0: u32, c0: u32) -> f32 {{
  let k = min(k0, {max(depth, 1) - 1}u);
  let c = min(c0, {max(cols, 1) - 1}u);
  return select(0.0, {b}, k0 < {depth}u && c0 < {cols}u);
}}

fn a4(r: u32, k: u32) -> vec4<f32> {{
  return vec4<f32>(a_at(r, k), a_at(r, k + 1u), a_at(r, k + 2u), a_at(r, k + 3u));
}}

fn b4(k: u32, c: u32) -> vec4<f32> {{
  return vec4<f32>(b_at(k, c), b_at(k, c + 1u), b_at(k, c + 2u), b_at(k, c + 3u));
}}

var<workgroup> ta: array<vec4<f32>, {tk * tm // 4}>;   // the A slice, [k][row / 4]
var<workgroup> tb: array<vec4<f32>, {tk * tn // 4}>;   // the B slice, [k][col / 4]

@compute @workgroup_size({_THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {tiles}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let tx = lidx % {gx}u;
  let ty = lidx / {gx}u;
  let r0 = (tile / {col_tiles}u) * {tm}u;
  let c0 = (tile % {col_tiles}u) * {tn}u;
{decl}
{load("0u")}
  for (var k0 = 0u; k0 < {depth}u; k0 += {tk}u) {{
    workgroupBarrier();
{nl.join(stage)}
    workgroupBarrier();
    if (k0 + {tk}u < {depth}u) {{
{load(f"k0 + {tk}u")}
    }}
{nl.join(inner)}
  }}
{nl.join(stores)}
}}
"""
    steps = -(-depth // tk)
    return Program(name, source, (_THREADS, 1, 1), linear_dispatch(tiles * _THREADS, _THREADS), bindings, uniforms,
                   loop_trips=2 * steps)

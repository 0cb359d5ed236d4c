"""The float16 plan's matrix products on the GPU's matrix units: Dawn's subgroup matrices.

``C [rows, cols] = A [rows, depth] @ B [depth, cols]`` (:func:`tflfuse.kernels.gemm.tiled_matmul_program`'s
products: 1x1 CONV_2D, FULLY_CONNECTED, BATCH_MATMUL and the fused bottleneck's products) as ``16 x 16 x 16``
multiply-accumulates of f16 fragments into f32 ones, the subgroup-wide operations of Dawn's
``chromium-experimental-subgroup-matrix`` feature (WGSL ``enable chromium_experimental_subgroup_matrix;``:
``subgroup_matrix_left/right/result``, ``subgroupMatrixLoad``, ``subgroupMatrixMultiplyAccumulate``,
``subgroupMatrixStore``; Dawn's ``docs/dawn/features/subgroup_matrix.md``), which Dawn lowers to Vulkan's
``VK_KHR_cooperative_matrix`` (NVIDIA's tensor cores). A workgroup of ``wm x wn`` subgroups owns a ``tm x tn`` tile
of ``C`` (:class:`MatrixTile`); each subgroup holds ``fm x fn`` f32 result fragments. The depth is walked ``tk`` at a
time: every invocation stages its share of the ``A`` slice (``tm x tk``) and the ``B`` slice (``tk x tn``) into
workgroup memory as f16, through the same staging loads as the FMA form (the operand expressions, zero past the
matrix's edges), and each subgroup loads its fragments from there. The results leave through workgroup memory, one
fragment at a time (or the whole tile at once: :attr:`MatrixTile.whole`), so that the kernel's own store
statements (bias, activation, residual) run per output as in the FMA form. The tile and the choice of this form
over the FMA one are measured per product (:data:`MEASURED_MATRIX_TILES`, :func:`use_matrices`).

Precision: the operands are rounded to f16 as they are staged (a float16 plan holds them as f16 already), and
every product of two f16 values is exact in f32; the sums are f32 across the whole depth, with no f16 partial sum
(unlike the FMA form's ``HALF_STEPS``). Each output is within ``gamma(depth + 1, 2**-24) (|A| @ |B|)`` of the exact
product of the f16-rounded operands, before the store's own rounding to f16.

Two changes measured on an H100 (Vulkan, driver 580.159.04, 2026-12-07) were not kept. The next staged slice read
into registers while the subgroups multiply the one in workgroup memory (bit for bit the same sums): MobileNetV2 on
Dawn in float16 took 1.001x the time at batch 32 fused and 1.004x unfused, 1.010x and 1.005x at batch 1
(``benchmarks/switch_ab.py``, 3 alternating rounds), its products 0.94-1.18x each; over 8 tiles each
(``benchmarks/sweep_matrix.py``) the best tile of each product took 437.9 us over the 34 with the read-ahead
allowed, 444.9 without it (1.6%), 450 with the library's tiles. And a whole stride-1 inverted-residual block in one
dispatch, the expansion and projection on these fragments with the depthwise conv between them in workgroup memory
(``benchmarks/matrix_block.py``, ``benchmarks/RESULTS-matrix-block.md``): 2.1-5.5x the time of the float16 plan's
two or three dispatches on MobileNetV2's blocks at batch 32, 1.6-12x at batch 1, every block and tile; 1.3-3.1x at
batch 32 with the depthwise conv reading the activated expansion as vec4s (a pass through the bias and activation
per chunk) and 4 or 8 subgroups a workgroup: a workgroup walks all the expanded channels' chunks in turn.

Offsets of subgroup-matrix loads and stores must be uniform in WGSL's analysis, which treats the subgroup's
index in the workgroup as non-uniform: the diagnostic ``chromium.subgroup_matrix_uniformity`` is turned off, and
the subgroup index is ``local_invocation_index / subgroup_size``, invocations of a subgroup being consecutive in a
one-dimensional workgroup (as on NVIDIA's Vulkan driver, the adapter this form is measured on). Dawn asks a
workgroup's x size to be a multiple of the adapter's largest subgroup size: the source is made per
:class:`SubgroupMatrix`.
"""

from __future__ import annotations

import dataclasses
import re

from .base import KernelError, linear_dispatch

__all__ = ["FRAGMENT", "MAX_SUBGROUPS", "MEASURED_MATRIX_TILES", "SUBGROUP_SIZES", "MatrixTile", "SubgroupMatrix",
           "matrix_source", "matrix_tile", "use_matrices"]

#: The subgroup sizes WebGPU allows (powers of two from 4 to 128).
SUBGROUP_SIZES = (4, 8, 16, 32, 64, 128)
#: The most subgroups a tile of the library's holds (:func:`matrix_tile`'s and :data:`MEASURED_MATRIX_TILES`'):
#: a device offers subgroup matrices only where a workgroup holds that many.
MAX_SUBGROUPS = 4
#: The most subgroups any :class:`MatrixTile` may hold (a sweep's).
_MOST_SUBGROUPS = 8
#: WebGPU's default workgroup memory, bytes.
DEFAULT_WORKGROUP_BYTES = 16384
#: The fragments' size: ``16 x 16`` results from ``16 x 16`` left and right operands.
FRAGMENT = 16
#: Extra f16 elements per row of the staged slices, so that a fragment's 16 rows fall on distinct banks.
_PAD = 8


@dataclasses.dataclass(frozen=True)
class SubgroupMatrix:
    """A device's subgroup matrices as the kernels use them: f16 ``16 x 16 x 16`` products with f32 results, in
    subgroups of ``subgroup_size`` invocations (the adapter's only size for that configuration, and its largest),
    with ``workgroup_bytes`` of workgroup memory a workgroup may use (the device's limit)."""

    subgroup_size: int
    workgroup_bytes: int = DEFAULT_WORKGROUP_BYTES

    def __post_init__(self):
        size, wg = self.subgroup_size, self.workgroup_bytes
        if not isinstance(size, int) or isinstance(size, bool) or size not in SUBGROUP_SIZES:
            raise ValueError(f"a subgroup size is one of {SUBGROUP_SIZES} (WebGPU's), got {size!r}")
        if not isinstance(wg, int) or isinstance(wg, bool) or wg < DEFAULT_WORKGROUP_BYTES:
            raise ValueError(f"a device's workgroup memory is an int of at least {DEFAULT_WORKGROUP_BYTES} bytes "
                             f"(WebGPU's least), got {wg!r}")


#: :meth:`MatrixTile.parse`'s form.
_TILE_FORM = re.compile(r"([1-9][0-9]?)x([1-9][0-9]?)/([1-9][0-9]?)x([1-9][0-9]?)/([1-9][0-9]{0,3})(/w)?", re.ASCII)


@dataclasses.dataclass(frozen=True)
class MatrixTile:
    """``wm x wn`` subgroups per workgroup, ``fm x fn`` fragments of 16 x 16 results each, ``tk`` depths per staged
    slice (a multiple of 16): a ``tm x tn = (16 wm fm) x (16 wn fn)`` tile of ``C``. With ``whole``, the results
    leave through workgroup memory as one ``tm x tn`` tile (one barrier); without, one fragment per subgroup at a
    time (two barriers a fragment, 1 KiB a subgroup)."""

    wm: int
    wn: int
    fm: int
    fn: int
    tk: int = 32
    whole: bool = False

    def __post_init__(self):
        sizes = (self.wm, self.wn, self.fm, self.fn, self.tk)
        if not all(type(v) is int and v > 0 for v in sizes) or self.tk % FRAGMENT or self.tk > 256 or \
                self.wm * self.wn > _MOST_SUBGROUPS or self.fm * self.fn > 16 or not isinstance(self.whole, bool):
            raise KernelError(f"matrix tile {self.wm!r}x{self.wn!r}/{self.fm!r}x{self.fn!r}/{self.tk!r}: its sizes "
                              f"must be Python ints, at most {_MOST_SUBGROUPS} subgroups (wm * wn), at most 16 "
                              f"fragments each (fm * fn), tk a multiple of {FRAGMENT} up to 256, whole a bool")

    @classmethod
    def parse(cls, text: str) -> "MatrixTile":
        """``"WMxWN/FMxFN/TK"``, with ``"/w"`` after it for ``whole`` (:attr:`name`'s form), e.g. ``"2x2/2x2/32/w"``.
        Raises :class:`KernelError` for anything else."""
        found = _TILE_FORM.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise KernelError(f"matrix tile {text!r} is not 'WMxWN/FMxFN/TK' or 'WMxWN/FMxFN/TK/w' of positive "
                              f"integers, e.g. '2x2/2x2/32/w'")
        return cls(*(int(v) for v in found.groups()[:5]), whole=bool(found.group(6)))

    @property
    def tm(self) -> int:
        return FRAGMENT * self.wm * self.fm

    @property
    def tn(self) -> int:
        return FRAGMENT * self.wn * self.fn

    @property
    def subgroups(self) -> int:
        return self.wm * self.wn

    @property
    def name(self) -> str:
        """The form :meth:`parse` reads."""
        return f"{self.wm}x{self.wn}/{self.fm}x{self.fn}/{self.tk}" + ("/w" if self.whole else "")

    def workgroup_bytes(self) -> int:
        """The staged f16 slices (rows padded by :data:`_PAD`) and the results on their way out: the whole tile, or
        one f32 fragment per subgroup."""
        staged = 2 * (self.tm * (self.tk + _PAD) + self.tk * (self.tn + _PAD))
        return staged + 4 * (self.tm * self.tn if self.whole else FRAGMENT * FRAGMENT * self.subgroups)


#: Tiles measured faster than :func:`matrix_tile`'s rule by at least 5% on these exact products ``(rows, depth,
#: cols)``: ``benchmarks/sweep_matrix.py`` with 14 tiles over MobileNetV2's products at batch 32 (an H100, Vulkan,
#: driver 580.159.04, 2026-12-07 16:58 UTC, one run; ``benchmarks/RESULTS-sweep-matrix.md``): the 34 products took 456
#: against 492 us. Whole-tile stores (``/w``) lost on 12 of the 19, most by 1.5-3x: their 16-48 KiB of workgroup
#: memory hold fewer workgroups on each SM.
MEASURED_MATRIX_TILES: dict[tuple[int, int, int], str] = {
    (6272, 192, 64): "2x2/2x2/64/w",     # 6.0 -> 5.4 us
    (6272, 384, 96): "2x2/2x2/64",       # 20.8 -> 9.3
    (6272, 576, 96): "2x2/2x2/64",       # 13.7 -> 12.2
    (1568, 576, 160): "2x2/1x1/32/w",    # 11.2 -> 8.5
    (1568, 960, 160): "2x2/1x1/32/w",    # 15.7 -> 11.6
    (1568, 960, 320): "2x2/2x2/64",      # 21.8 -> 15.4
    (1568, 320, 1280): "2x2/2x2/64",     # 18.2 -> 14.9
}


def use_matrices(rows: int, depth: int, cols: int) -> bool:
    """Whether a float16 plan runs ``[rows, depth] x [depth, cols]`` on subgroup matrices where the device has
    them, rather than on the FMA units: from a depth of 32 and more than 16 columns. Measured over MobileNetV2's
    products at batch 32 (the same run as :data:`MEASURED_MATRIX_TILES`): the matrices (the best of 14 tiles) took
    0.15-0.93x of the FMA form's time on the 16 products that hold to it (0.15x and 0.21x where the FMA form took
    62.7 and 73.2 us, 6272 x 384 x 96 and 1568 x 960 x 320, more than on larger products of the same run: 30.3 us
    for 6272 x 576 x 96, 38.4 for 1568 x 320 x 1280), but 1.17x on
    401408 x 32 x 16 (21.4 against 18.3 us) and on 401408 x 16 x 96 (59.7 against 51.0), and 1.00x on 100352 x 24
    x 144 (31.9 against 31.8): a shallow product spends its time staging and storing, which the matrices do not
    shorten."""
    return depth >= 32 and cols > 16


def matrix_tile(rows: int, depth: int, cols: int, unit: SubgroupMatrix | None = None) -> MatrixTile:
    """The tile for ``[rows, depth] x [depth, cols]``: :data:`MEASURED_MATRIX_TILES`'s where listed (and it fits
    ``unit``'s workgroup memory), else 2 x 2 subgroups of 2 x 2 fragments (64 x 64), narrower where ``cols`` is
    (64 x 32, 64 x 16), one staged slice of 32 depths (16 where the depth is), the results leaving one fragment at
    a time."""
    measured = MEASURED_MATRIX_TILES.get((rows, depth, cols))
    if measured:
        t = MatrixTile.parse(measured)
        if unit is None or t.workgroup_bytes() <= unit.workgroup_bytes:
            return t
    tk = 16 if depth <= 16 else 32
    if cols <= 16:
        return MatrixTile(4, 1, 1, 1, tk)
    if cols <= 32:
        return MatrixTile(2, 2, 2, 1, tk)
    return MatrixTile(2, 2, 2, 2, tk)


def _shared(items: int, threads: int, body) -> list[str]:
    """WGSL statements sharing ``items`` pieces of work between a workgroup's ``threads`` invocations: piece ``e =
    lidx + s * threads`` for each round ``s``, the last round guarded where it passes ``items``; ``body(e)`` gives the
    statements of piece ``e`` (a WGSL term)."""
    out = []
    for s in range(-(-items // threads)):
        e = f"(lidx + {s * threads}u)"
        guard = "" if (s + 1) * threads <= items else f"if ({e} < {items}u) "
        out.append(f"    {guard}{{ {body(e)} }}")
    return out


def _results_out(t: MatrixTile, rows: int, cols: int, sg: int, store: str, store_vec: str | None) -> str:
    """WGSL moving the subgroups' result fragments through ``tc`` and the kernel's store statements."""
    threads = t.subgroups * sg
    if t.whole:   # every fragment into the tile at once, one barrier, every invocation storing its share
        outs = [f"  subgroupMatrixStore<row_major>(&tc, (sm + {16 * i}u) * {t.tn}u + sn + {16 * j}u, c{i}_{j}, "
                f"{t.tn}u);" for i in range(t.fm) for j in range(t.fn)]
        outs.append("  workgroupBarrier();")
        outs.append(_stores("0u", t.tn, "lidx", t.tm * t.tn, threads, ("r0", "c0"), rows, cols, store, store_vec))
        return "\n".join(outs)
    out = []
    for i in range(t.fm):
        for j in range(t.fn):
            cells = _stores("sg * 256u", 16, "lane", 256, sg, (f"r0 + sm + {16 * i}u", f"c0 + sn + {16 * j}u"),
                            rows, cols, store, store_vec)
            out.append(f"""  {{
    subgroupMatrixStore<row_major>(&tc, sg * 256u, c{i}_{j}, 16u);
    workgroupBarrier();
{cells}
    workgroupBarrier();
  }}""")
    return "\n".join(out)


def _stores(base: str, span: int, first: str, width: int, step: int, offset: tuple[str, str], rows: int, cols: int,
            store: str, store_vec: str | None) -> str:
    """A loop over ``width`` results held in ``tc`` from ``base`` on, rows ``span`` apart (a ``width / span`` x
    ``span`` block whose first output is at ``offset``), invocation ``first`` taking every ``step``-th vec4 (or
    output) and running the kernel's store statements on it."""
    r0, c0 = offset
    if store_vec:
        return f"""  for (var e = {first}; e < {width // 4}u; e += {step}u) {{
    let row = {r0} + e / {span // 4}u;
    let col4 = {c0} + (e % {span // 4}u) * 4u;
    if (row < {rows}u && col4 < {cols}u) {{
      let f = {base} + e * 4u;
      let acc = vec4<f32>(tc[f], tc[f + 1u], tc[f + 2u], tc[f + 3u]);
      let idx4 = (row * {cols}u + col4) / 4u;
      {store_vec}
    }}
  }}"""
    return f"""  for (var e = {first}; e < {width}u; e += {step}u) {{
    let row = {r0} + e / {span}u;
    let col = {c0} + e % {span}u;
    if (row < {rows}u && col < {cols}u) {{
      let acc = tc[{base} + e];
      let idx = row * {cols}u + col;
      {store}
    }}
  }}"""


def matrix_source(prelude: str, helpers: str, a_load: str, b_load: str, rows: int, depth: int, cols: int,
                  store: str, store_vec: str | None, a_strip: str | None, unit: SubgroupMatrix,
                  tile: MatrixTile | None = None) -> tuple[str, tuple, tuple, int]:
    """The WGSL of a product on subgroup matrices, and its ``(workgroup_size, dispatch, loop_trips)``.

    Args:
      prelude, helpers: the bindings' declarations and the WGSL functions the operands and stores use.
      a_load, b_load: WGSL ``fn a4(r, k) -> vec4<f32>`` and ``fn b4(k, c) -> vec4<f32>``
        (:func:`tflfuse.kernels.gemm._staging_load`): 4 consecutive depths of a row of ``A``, 4 consecutive
        columns of a row of ``B``, zero past the matrix's edges.
      rows, depth, cols: the product's sizes.
      store: statements per output, with ``row``, ``col``, ``idx = row * cols + col`` and the f32 ``acc``.
      store_vec: where not None (``cols % 4 == 0``), statements per 4 outputs with ``row``, ``col4``, ``idx4`` and a
        vec4 ``acc``, used instead of ``store``.
      a_strip: the name of a function ``fn(r0, k) -> mat4x4<f32>`` giving ``A[r0 : r0 + 4, k : k + 4]`` (column
        ``i`` the rows at depth ``k + i``), used instead of ``a4``; or None.
      unit: the device's :class:`SubgroupMatrix`.
      tile: a :class:`MatrixTile`, or None for :func:`matrix_tile`'s.
    Raises:
      KernelError: the tile's workgroup memory passes ``unit``'s.
    """
    t = tile or matrix_tile(rows, depth, cols, unit)
    if t.workgroup_bytes() > unit.workgroup_bytes:
        raise KernelError(f"matrix tile {t.name}: {t.workgroup_bytes()} bytes of workgroup memory, over the "
                          f"device's {unit.workgroup_bytes}")
    sg, tm, tn, tk = unit.subgroup_size, t.tm, t.tn, t.tk
    threads = t.subgroups * sg
    sa, sb = tk + _PAD, tn + _PAD            # the staged slices' row strides
    col_tiles = -(-cols // tn)
    tiles = -(-rows // tm) * col_tiles
    kq = tk // 4
    stage = []
    if a_strip:   # 4 x 4 blocks: rows r .. r + 3, depths k .. k + 3
        groups = tm * tk // 16
        cells = " ".join(f"ta[(r + {j}u) * {sa}u + k + {i}u] = f16(m[{i}][{j}]);" for i in range(4) for j in range(4))
        stage += _shared(groups, threads, lambda e: f"let r = ({e} / {kq}u) * 4u; let k = ({e} % {kq}u) * 4u; "
                                                    f"let m = {a_strip}(r0 + r, k0 + k); {cells}")
    else:
        groups = tm * tk // 4
        cells = " ".join(f"ta[r * {sa}u + k + {i}u] = f16(v.{c});" for i, c in enumerate("xyzw"))
        stage += _shared(groups, threads, lambda e: f"let r = {e} / {kq}u; let k = ({e} % {kq}u) * 4u; "
                                                    f"let v = a4(r0 + r, k0 + k); {cells}")
    groups = tk * tn // 4
    cells = " ".join(f"tb[k * {sb}u + c + {i}u] = f16(v.{c});" for i, c in enumerate("xyzw"))
    stage += _shared(groups, threads, lambda e: f"let k = {e} / {tn // 4}u; let c = ({e} % {tn // 4}u) * 4u; "
                                                f"let v = b4(k0 + k, c0 + c); {cells}")
    steps = []
    for kk in range(0, tk, FRAGMENT):
        steps.append("    {")
        steps += [f"      let a{i} = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&ta, "
                  f"(sm + {16 * i}u) * {sa}u + {kk}u, {sa}u);" for i in range(t.fm)]
        steps += [f"      let b{j} = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>(&tb, "
                  f"{kk * sb}u + sn + {16 * j}u, {sb}u);" for j in range(t.fn)]
        steps += [f"      c{i}_{j} = subgroupMatrixMultiplyAccumulate(a{i}, b{j}, c{i}_{j});"
                  for i in range(t.fm) for j in range(t.fn)]
        steps.append("    }")
    accs = "\n".join(f"  var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();"
                     for i in range(t.fm) for j in range(t.fn))
    nl = "\n"
    source = f"""enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
{prelude}{helpers}
{a_load}

{b_load}

var<workgroup> ta: array<f16, {tm * sa}>;   // the A slice, [row][k], rows {sa} apart
var<workgroup> tb: array<f16, {tk * sb}>;   // the B slice, [k][col], rows {sb} apart
var<workgroup> tc: array<f32, {tm * tn if t.whole else 256 * t.subgroups}>;   // results on their way out

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {tiles}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let r0 = (tile / {col_tiles}u) * {tm}u;
  let c0 = (tile % {col_tiles}u) * {tn}u;
  let sg = lidx / {sg}u;   // the subgroup
  let lane = lidx % {sg}u;
  let sm = (sg / {t.wn}u) * {16 * t.fm}u;   // the subgroup's first row and column in the tile
  let sn = (sg % {t.wn}u) * {16 * t.fn}u;
{accs}
  for (var k0 = 0u; k0 < {depth}u; k0 += {tk}u) {{
    workgroupBarrier();
{nl.join(stage)}
    workgroupBarrier();
{nl.join(steps)}
  }}
{_results_out(t, rows, cols, sg, store, store_vec)}
}}
"""
    return source, (threads, 1, 1), linear_dispatch(tiles * threads, threads), 2 * -(-depth // tk)

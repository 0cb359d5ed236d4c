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
matrix's edges), and each subgroup loads its fragments from there. The results leave through workgroup memory one
fragment at a time, so that the kernel's own store statements (bias, activation, residual) run per output as in
the FMA form.

Precision: the operands are rounded to f16 as they are staged (a float16 plan holds them as f16 already), and
every product of two f16 values is exact in f32; the sums are f32 across the whole depth, with no f16 partial sum
(unlike the FMA form's ``HALF_STEPS``). Each output is within ``gamma(depth + 1, 2**-24) (|A| @ |B|)`` of the exact
product of the f16-rounded operands, before the store's own rounding to f16.

Offsets of subgroup-matrix loads and stores must be uniform in WGSL's analysis, which treats the subgroup's
index in the workgroup as non-uniform: the diagnostic ``chromium.subgroup_matrix_uniformity`` is turned off, and
the subgroup index is ``local_invocation_index / subgroup_size``, invocations of a subgroup being consecutive in a
one-dimensional workgroup (as on NVIDIA's Vulkan driver, the adapter this form is measured on). Dawn asks a
workgroup's x size to be a multiple of the adapter's largest subgroup size: the source is made per
:class:`SubgroupMatrix`.
"""

from __future__ import annotations

import dataclasses

from .base import KernelError, linear_dispatch

__all__ = ["FRAGMENT", "MatrixTile", "SubgroupMatrix", "matrix_source", "matrix_tile"]

#: The fragments' size: ``16 x 16`` results from ``16 x 16`` left and right operands.
FRAGMENT = 16
#: Extra f16 elements per row of the staged slices, so that a fragment's 16 rows fall on distinct banks.
_PAD = 8


@dataclasses.dataclass(frozen=True)
class SubgroupMatrix:
    """A device's subgroup matrices as the kernels use them: f16 ``16 x 16 x 16`` products with f32 results, in
    subgroups of ``subgroup_size`` invocations (the adapter's only size for that configuration, and its largest)."""

    subgroup_size: int


@dataclasses.dataclass(frozen=True)
class MatrixTile:
    """``wm x wn`` subgroups per workgroup, ``fm x fn`` fragments of 16 x 16 results each, ``tk`` depths per staged
    slice (a multiple of 16): a ``tm x tn = (16 wm fm) x (16 wn fn)`` tile of ``C``."""

    wm: int
    wn: int
    fm: int
    fn: int
    tk: int = 32

    def __post_init__(self):
        sizes = (self.wm, self.wn, self.fm, self.fn, self.tk)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes) or self.tk % FRAGMENT:
            raise KernelError(f"matrix tile {self}: positive int sizes, tk a multiple of {FRAGMENT}")

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
        return f"{self.tm}x{self.tn}/{self.wm}x{self.wn}/{self.tk}"

    def workgroup_bytes(self) -> int:
        """The staged f16 slices (rows padded by :data:`_PAD`) and one f32 fragment per subgroup."""
        return 2 * (self.tm * (self.tk + _PAD) + self.tk * (self.tn + _PAD)) + 4 * FRAGMENT * FRAGMENT * self.subgroups


def matrix_tile(rows: int, depth: int, cols: int) -> MatrixTile:
    """The tile for ``[rows, depth] x [depth, cols]``: 2 x 2 subgroups of 2 x 2 fragments (64 x 64), narrower
    where ``cols`` is (64 x 32, 64 x 16), and one staged slice of 32 depths (16 where the depth is)."""
    tk = 16 if depth <= 16 else 32
    if cols <= 16:
        return MatrixTile(4, 1, 1, 1, tk)
    if cols <= 32:
        return MatrixTile(2, 2, 2, 1, tk)
    return MatrixTile(2, 2, 2, 2, tk)


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
      KernelError: the tile's workgroup memory passes WebGPU's default 16 KiB.
    """
    t = tile or matrix_tile(rows, depth, cols)
    if t.workgroup_bytes() > 16384:
        raise KernelError(f"matrix tile {t.name}: {t.workgroup_bytes()} bytes of workgroup memory, over 16384")
    sg, tm, tn, tk = unit.subgroup_size, t.tm, t.tn, t.tk
    threads = t.subgroups * sg
    sa, sb = tk + _PAD, tn + _PAD            # the staged slices' row strides
    col_tiles = -(-cols // tn)
    tiles = -(-rows // tm) * col_tiles
    kq = tk // 4
    stage = []
    if a_strip:   # 4 x 4 blocks: rows r .. r + 3, depths k .. k + 3
        groups = tm * tk // 16
        for s in range(-(-groups // threads)):
            e = f"(lidx + {s * threads}u)"
            guard = "" if (s + 1) * threads <= groups else f"if ({e} < {groups}u) "
            cells = " ".join(f"ta[(r + {j}u) * {sa}u + k + {i}u] = f16(m[{i}][{j}]);"
                             for i in range(4) for j in range(4))
            stage.append(f"    {guard}{{ let r = ({e} / {kq}u) * 4u; let k = ({e} % {kq}u) * 4u; "
                         f"let m = {a_strip}(r0 + r, k0 + k); {cells} }}")
    else:
        groups = tm * tk // 4
        for s in range(-(-groups // threads)):
            e = f"(lidx + {s * threads}u)"
            guard = "" if (s + 1) * threads <= groups else f"if ({e} < {groups}u) "
            cells = " ".join(f"ta[r * {sa}u + k + {i}u] = f16(v.{c});" for i, c in enumerate("xyzw"))
            stage.append(f"    {guard}{{ let r = {e} / {kq}u; let k = ({e} % {kq}u) * 4u; "
                         f"let v = a4(r0 + r, k0 + k); {cells} }}")
    groups = tk * tn // 4
    for s in range(-(-groups // threads)):
        e = f"(lidx + {s * threads}u)"
        guard = "" if (s + 1) * threads <= groups else f"if ({e} < {groups}u) "
        cells = " ".join(f"tb[k * {sb}u + c + {i}u] = f16(v.{c_});" for i, c_ in enumerate("xyzw"))
        stage.append(f"    {guard}{{ let k = {e} / {tn // 4}u; let c = ({e} % {tn // 4}u) * 4u; "
                     f"let v = b4(k0 + k, c0 + c); {cells} }}")
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
    out = []
    for i in range(t.fm):
        for j in range(t.fn):
            if store_vec:
                cell = f"""
    for (var e = lane; e < 64u; e += {sg}u) {{
      let row = r0 + sm + {16 * i}u + e / 4u;
      let col4 = c0 + sn + {16 * j}u + (e % 4u) * 4u;
      if (row < {rows}u && col4 < {cols}u) {{
        let f = sg * 256u + e * 4u;
        let acc = vec4<f32>(tc[f], tc[f + 1u], tc[f + 2u], tc[f + 3u]);
        let idx4 = (row * {cols}u + col4) / 4u;
        {store_vec}
      }}
    }}"""
            else:
                cell = f"""
    for (var e = lane; e < 256u; e += {sg}u) {{
      let row = r0 + sm + {16 * i}u + e / 16u;
      let col = c0 + sn + {16 * j}u + e % 16u;
      if (row < {rows}u && col < {cols}u) {{
        let acc = tc[sg * 256u + e];
        let idx = row * {cols}u + col;
        {store}
      }}
    }}"""
            out.append(f"""  {{
    subgroupMatrixStore<row_major>(&tc, sg * 256u, c{i}_{j}, 16u);
    workgroupBarrier();{cell}
    workgroupBarrier();
  }}""")
    nl = "\n"
    source = f"""enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
{prelude}{helpers}
{a_load}

{b_load}

var<workgroup> ta: array<f16, {tm * sa}>;   // the A slice, [row][k], rows {sa} apart
var<workgroup> tb: array<f16, {tk * sb}>;   // the B slice, [k][col], rows {sb} apart
var<workgroup> tc: array<f32, {256 * t.subgroups}>;   // each subgroup's result fragment on its way out

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
{nl.join(out)}
}}
"""
    return source, (threads, 1, 1), linear_dispatch(tiles * threads, threads), 2 * -(-depth // tk)

"""Matrix products tiled for a GPU: register-blocked tiles staged through workgroup memory.

``C [rows, cols] = A [rows, depth] @ B [depth, cols]``, the form of every 1x1 convolution (NHWC pixels x
input channels times HWIO/IO weights) and FULLY_CONNECTED. A workgroup of 64, 128 or 256 invocations owns a
``tm x tn`` tile of ``C``; each invocation accumulates an ``rm x rn`` block of it in registers (``rm * rn / 4`` vec4
accumulators). The depth is walked ``tk`` at a time: the slices of ``A`` (``tm x tk``) and ``B`` (``tk x
tn``) are read from memory once per tile into workgroup memory, while the next slices are already loaded
into registers (the loads of step ``k + 1`` overlap the arithmetic of step ``k``). The inner loop reads only
workgroup memory, ``rm / 4 + rn / 4`` vec4 loads per ``rm * rn`` multiply-adds, with no bounds checks: the
staging loads write zeros past the matrix's edges. Where the sizes are multiples of 4 (:func:`use_vec4`),
``A`` and ``B`` are read and ``C`` stored as vec4s. A sliced tile (``sk > 1``, :class:`MatmulTile`) holds
``sk`` groups of invocations for the same outputs, each multiplying its share of every staged slice's depths; the
groups' sums meet in workgroup memory before the store, so a product with few output tiles and a deep
reduction keeps more invocations on each SM.

The tile (:data:`TILES`) is chosen per shape by :func:`matmul_tile`. Sums run in another order than a
serial loop's: results differ from it by rounding only.

float16 plans (``precision="float16"``): every product is a :class:`~tflfuse.kernels.half.HalfMathProgram`
carrying a second source in which the A and B slices are staged in workgroup memory as ``vec4<f16>`` (half the
workgroup memory and half its traffic) and each invocation's ``slice_depth`` multiply-adds of a slice are
``vec4<f16>`` fmas into f16 partial sums, added into the f32 accumulators once per slice: f16 math with f32
accumulation across the depth, as LiteRT's GPU delegate in FP16 mode. The stores are the float32 form's.
:func:`tflfuse.kernels.half.half_storage` (applied by the plan after the kernels made their programs) takes that
source; the float32 plan runs the first source, the same text as before f16 math existed. The second source
rather than a ``precision`` argument: the kernels (CONV_2D, FULLY_CONNECTED, BATCH_MATMUL, the fused bottleneck)
never learn the plan's precision, so none of them changes. Error: each output within ``(gamma(2 t, 2**-11) +
gamma(depth + 2, 2**-24)) (|A| @ |B|)`` (``t`` the ``slice_depth``) plus one f16 ulp of the f16-rounded operands'
exact product (tests/half_math.py derives it; about 1.6% of
``|A| @ |B|`` at 16 steps, a tile's ``slice_depth``); a slice's partial sum must stay below f16's 65504.

Measured on an H200 (2026-12-05, ``benchmarks/sweep_gemm_f16.py`` over MobileNetV2's 19 distinct products at
batch 32, the best of 6 tiles each): the f16 form took 413 us in all against 534 us in float32 (0.77x), far
from the 0.5x of the f16 FMA peak (128 against 64.8 TFLOP/s), and on 6272 x 96 x 576 with the float32 tile
25.1 against 24.9 us. Two changes aimed at that gap lost and were not kept: slices staged twice as deep in the
same workgroup memory (half the slices and barriers, f16 staging registers, the same partial sums) took 472
us; a tile chosen per precision would take 671.5 against 691.5 us over MobileNetV2's 34 products (3%), not
worth a second dispatch shape per program. Two more lost on an H100 (the H200's GH100 chip with less, slower memory;
2026-12-05, the same sweep, the best of 4 tiles each): f16 partial sums carried across 2 or 4 staged slices (a half
or a quarter of the conversions to f32) took 421 and 419 against 408 us; the A slice staged as ``vec2<f16>(a, a)``
per row and depth, so that no multiply-add takes a vec4 splat of one f16 value, took 407.6 against 405.2 us. So
neither the conversions nor the splats bound the f16 form on those products. Nor does the products' size: on large
square products (an H100, 2026-12-06, ``sweep_gemm_f16.py --extra=2048x2048x2048,4096x4096x4096``, the best of 4
tiles) the f16 form ran at 40.6 and 41.0 TFLOP/s, float32 at 39.6 and 40.2 (61% and 62% of the f32 FMA peak, 32%
of the f16 one): the f16 form takes half the multiply-add instructions and runs no faster. What bounds both
(an H100, 2026-12-06, ``benchmarks/f16_bound.py``, ``benchmarks/RESULTS-f16-bound.md``): not the f16 form's
conversions (its partial sums carried across 2 or 4 slices, or the whole depth summed in f16 as a diagnostic with
no conversion in the loop and the f32 accumulators' registers free, took 0.92-1.00x of its time on 2048 x 2048
x 2048 and on MobileNetV2's products), and in float32 not the multiply-adds: with each step's multiply-adds cut to
a quarter (every load, staging store and barrier kept) the float32 form took 0.72-0.98x of its time (0.74x on
2048^3 with 128 x 128 / 8 x 8 tiles, 0.72-0.94x on MobileNetV2's products). Its loads from workgroup memory bound
it: an ``rm x rn`` block takes ``(rm + rn) / 4`` vec4 loads per ``rm * rn / 4`` vec4 multiply-adds a step, and a
vec4 load costs one to three vec4 multiply-adds (``benchmarks/load_cost.py``, ``benchmarks/RESULTS-load-cost.md``;
compiled trusted, as the library's kernels run on a GPU: one load per 1, 2, 4 and 8 multiply-adds ran at 45, 63, 69
and 80% of the FMA peak with every lane at one address, 24, 47, 69 and 81% with each at its own).
A float16 form without the splat of one A value (each multiply-add a vec4<f16> of one row's two depths, twice,
times two columns' pairs of depths, the slices staged as ``mat2x4<f16>``) took 0.89-0.95x of this form's time on
8 x 8 blocks but 0.96-1.26x on 4 x 8 and 4 x 4 ones (an H100, 2026-12-06 07:50 UTC, in one run; 6272 x 64 x 384
15.4 against 12.2 us), and MobileNetV2's products mostly take those: not kept.

On the same H100 (``benchmarks/sweep_gemm_forms.py --batches=32 --library_form``), MobileNetV2's 19 distinct
products at batch 32 took 537 us in all with the library's tiles, and 710 us through cuBLAS (PyTorch's float32
addmm, TF32 off) in the same run; sliced tiles with 8 x 4 and 8 x 8 blocks per invocation (eight of them, e.g.
``32x32/8x4/32/4``) would take 532 us (1568 x 960 x 320 37.9 against 40.3 us, the rest within 1 us), not taken.
On the H200 (2026-12-05, the same sweep) the 19 products took 523 us with the library's tiles and 586 us
through cuBLAS. The depth split between workgroups (each walking its run of the depth and storing partial sums,
a second dispatch in the same pass adding them and the bias; 2, 3 or 4 runs, over 7 tiles) would take 510
against 520 us for the best tile of each without it: 1568 x 960 x 320 34.3 against 40.5, 6272 x 576 x 96 30.6
against 32.8, 1568 x 960 x 160 24.3 against 26.2, no gain on the rest. Not taken: 2% for a second dispatch and
a scratch buffer per product. Deeper slices in more workgroup memory than WebGPU's default 16 KiB (tiles
staging 32 depths, e.g. ``128x128/8x8/32`` in 32 KiB, or 64 with slice groups; an H100, 2026-12-05,
``sweep_gemm_forms.py --workgroup_bytes=49152`` over the same 19 products with 17 tiles) would take 527 against
533 us for the best of the 16 KiB tiles (538 with the library's; cuBLAS 675): 1568 x 320 x 1280 37.8 against
40.4, 1568 x 160 x 960 17.6 against 19.4, slower on 15 of the 19. Not worth tiles that depend on the adapter's
limits. Nor does the latency of the staging loads bound it: with two sets of staging registers and the walk over
the depth unrolled by two, each slice's loads issued two slices ahead (an H100, 2026-12-06 11:31 UTC,
``benchmarks/switch_ab.py``), MobileNetV2 at batch 32 took 1329.2 against 1222.5 us fused (1.087x; float16 1.032x),
1568.1 against 1463.5 unfused; only 401408 x 32 x 16 gained (30.7 against 34.4 us), the 4 x 8 and 8 x 8 blocks'
products took 1.10-1.30x. Nor the index arithmetic of the inner loop's loads (``benchmarks/RESULTS-load-cost.md``).
Nor, in the float16 form, the number of loads from workgroup memory: with the slices staged as ``mat2x4<f16>``
entries of two depths (each 16-byte load serving two steps, half the loads of ``vec4<f16>`` entries; the same sums,
bit for bit), MobileNetV2 in float16 took 1031.5 against 1023.4 us at batch 32 fused, 1183.2 against 1178.3 unfused
(its products 1.00-1.05x), and 1.000x at batch 1 (an H100, 2026-12-06 13:41 UTC, ``benchmarks/switch_ab.py``); not
kept. Larger register blocks (8 x 16 and 16 x 8 outputs per invocation, ``(8 + 16) / 4`` loads per 32 vec4
multiply-adds; 12 tiles of them, e.g. ``128x128/8x16/16``, the same run, ``sweep_gemm_forms.py --batches=32``) were
the fastest on 2048 x 2048 x 2048 (414.2 us, 41.5 TFLOP/s, against 430.4 for ``128x128/8x8/16``; cuBLAS 342.6)
but on MobileNetV2's 19 products at batch 32 only on 401408 x 16 x 96 (73.2 against 76.0 us) and 100352 x 144 x
24 (42.7 against 43.6): 533 us for the best tile of each against 537 with the library's (cuBLAS 589). Not taken.
"""

from __future__ import annotations

import dataclasses
import re

from .base import MAX_WORKGROUP_STORAGE, Binding, KernelError, Program, Uniform, linear_dispatch
from .half import with_half_math
from .matrix import SubgroupMatrix, matrix_source, use_matrices
from .wgsl import lane_tree, prelude

__all__ = ["MEASURED_HALF_TILES", "MEASURED_TILES", "MatmulTile", "TILES", "few_rows_block", "few_rows_lanes",
           "few_rows_program", "half_matmul_tile", "matmul_tile", "product_program", "resident_workgroups", "tile_attr",
           "tiled_matmul_program", "use_few_rows", "use_tiled_matmul", "use_vec4"]

_THREAD_COUNTS = (64, 128, 256)
#: The element types of a tiled product (:func:`tiled_matmul_program`'s ``elem``) and their zero literals.
_ZERO = {"f32": "0.0", "i32": "0"}
#: :meth:`MatmulTile.parse`'s form: positive ASCII-digit integers (no sign, underscore or other digits).
_TILE_FORM = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)/([1-9][0-9]*)x([1-9][0-9]*)/([1-9][0-9]*)(?:/([1-9][0-9]*))?",
                        re.ASCII)
_WG_BYTES = MAX_WORKGROUP_STORAGE


@dataclasses.dataclass(frozen=True)
class MatmulTile:
    """``tm x tn`` outputs per workgroup, ``rm x rn`` per invocation, ``tk`` depth per staged slice, and ``sk``
    slices of the depth: with ``sk > 1`` the workgroup holds ``sk`` groups of invocations for the same
    ``tm x tn`` outputs, group ``s`` multiplying depths ``[s tk / sk, (s + 1) tk / sk)`` of each staged slice,
    and the groups' sums are added in workgroup memory before the store (CUTLASS's "sliced-K"): ``sk`` times the
    invocations on a product with few output tiles and a deep reduction."""

    tm: int
    tn: int
    rm: int
    rn: int
    tk: int
    sk: int = 1

    def __post_init__(self):
        sizes = (self.tm, self.tn, self.rm, self.rn, self.tk, self.sk)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
            raise KernelError(f"matmul tile {self}: its sizes must be ints")
        if min(sizes) <= 0 or self.threads not in _THREAD_COUNTS or \
                self.rm % 4 or self.rn % 4 or self.tm % self.rm or self.tn % self.rn or self.tk % 4 or \
                self.tk % self.sk or self.workgroup_bytes > _WG_BYTES:
            raise KernelError(f"matmul tile {self} does not map onto invocations in vec4 groups: it needs "
                              f"positive sizes, (tm / rm) * (tn / rn) * sk in {_THREAD_COUNTS}, rm, rn and tk "
                              f"multiples of 4, sk dividing tk, and 4 * tk * (tm + tn) (plus 4 * tm * tn where "
                              f"sk > 1) <= {_WG_BYTES} bytes of workgroup memory")

    @classmethod
    def parse(cls, text: str) -> "MatmulTile":
        """``"TMxTN/RMxRN/TK"`` or ``"TMxTN/RMxRN/TK/SK"``, e.g. ``"128x128/8x8/16"`` or ``"32x64/4x8/16/4"``
        (the forms of :data:`TILES`' names, :attr:`name`). Raises :class:`KernelError` for anything else."""
        found = _TILE_FORM.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise KernelError(f"matmul tile {text!r} is not 'TMxTN/RMxRN/TK' or 'TMxTN/RMxRN/TK/SK' of positive "
                              f"integers (ASCII digits), e.g. {next(iter(TILES), '128x128/8x8/16')!r}")
        if any(len(v) > 6 for v in found.groups() if v is not None):   # past any workgroup (and int()'s digit cap)
            raise KernelError(f"matmul tile {text[:80]!r}: its sizes must be at most 6 digits")
        return cls(*(int(v) for v in found.groups() if v is not None))

    @property
    def name(self) -> str:
        """The form :meth:`parse` reads."""
        return f"{self.tm}x{self.tn}/{self.rm}x{self.rn}/{self.tk}" + (f"/{self.sk}" if self.sk > 1 else "")

    @property
    def slice_depth(self) -> int:
        """The depths of a staged slice one invocation multiplies, ``tk / sk``: in the float16 form, the f16
        multiply-adds into each partial sum before it is added into its f32 accumulator."""
        return self.tk // self.sk

    @property
    def threads(self) -> int:
        """Invocations per workgroup, one per ``rm x rn`` block and slice of the depth."""
        return (self.tm // max(self.rm, 1)) * (self.tn // max(self.rn, 1)) * self.sk

    @property
    def workgroup_bytes(self) -> int:
        """The staged slices of A and B, and with ``sk > 1`` one slice group's ``tm x tn`` sums."""
        return 4 * self.tk * (self.tm + self.tn) + (4 * self.tm * self.tn if self.sk > 1 else 0)

    @property
    def double_buffered_bytes(self) -> int:
        """:attr:`workgroup_bytes` with a second A and B slice (:func:`tiled_matmul_program`'s ``double_buffer``)."""
        return self.workgroup_bytes + 4 * self.tk * (self.tm + self.tn)


#: The tiles :func:`matmul_tile` chooses between, named as :meth:`MatmulTile.parse` reads them: each was the
#: fastest of the sweep on some 1x1 product of MobileNetV2 (``benchmarks/sweep_gemm_forms.py``, H200); the
#: sliced ones are :data:`_SLICED`, the 16-column one :data:`_NARROW`.
TILES: dict[str, MatmulTile] = {}
_TILE_NAMES = ("128x128/8x8/16", "128x64/8x4/16", "256x32/8x4/8", "128x32/4x4/8", "64x64/8x8/16",
               "64x64/4x8/16", "64x64/4x4/16", "64x32/4x4/16", "32x64/4x8/16", "32x32/4x4/32/2", "32x32/4x4/32/4",
               "128x16/4x4/16")
TILES.update({name: MatmulTile.parse(name) for name in _TILE_NAMES})
#: :func:`matmul_tile`'s sliced tiles: 32 x 32 outputs, two slice groups of the depth below
#: :data:`_SLICED_DEEP`, four from it.
_SLICED, _SLICED_DEEP = TILES["32x32/4x4/32/2"], TILES["32x32/4x4/32/4"]
_SLICED_MIN_DEPTH, _SLICED_DEEP_MIN_DEPTH = 32, 512
#: :func:`matmul_tile`'s tile for products of at most 16 columns (a 16-column tile: none of it padding).
_NARROW, _NARROW_MAX_COLS = TILES["128x16/4x4/16"], 16

#: Tiles measured faster than :func:`matmul_tile`'s model by at least 5% on these exact products ``(rows, depth,
#: cols)``: ``benchmarks/sweep_gemm_forms.py --batches=32,8,1 --library_form`` on an H200 (Vulkan, driver 580.159.04,
#: 2026-12-04 13:45 UTC), each tile's timing after 50 ms of its own runs untimed (the clocks those of sustained work;
#: :data:`tflfuse.runtime.profile.WARM_MS`), over MobileNetV2's products at batch 1, 8 and 32 and the MediaPipe models'
#: tiled products. Only tiles whose ``slice_depth`` is at least the model's tile's were taken (until the swizzle,
#: below), so that a float16 plan (which runs the same tile) keeps f16 partial sums at least as deep: a shallower one
#: lost there before (:func:`matmul_tile`). ``benchmarks/sweep_gemm_f16.py`` (the same machine, 14:12 UTC) then timed
#: the float16 plan's form of each: at batch 32, each product counted as often as MobileNetV2 has it, these tiles took
#: 305 against 314 us there (float32: 357 against 416 us); 6272 x 96 x 576 took 2.0 us more, 401408 x 16 x 96 6.9 us
#: less. 100352 x 24 x 144's best, 256 x 32 / 8 x 4 / 8 (45.0 -> 42.7 us in float32), took 36.1 against 32.9 us in
#: float16 and is left out. MobileNetV2's 37 distinct products at batch 1, 8 and 32 in all (float32): 755 against 797 us
#: (the MediaPipe models' seven unchanged, 30.5 us). With the A slices swizzled (:func:`_swizzle`), the sliced tiles
#: gained most, and a sweep of 15 tiles over MobileNetV2's products at batch 32 and 8 (the same machine, 2026-12-04
#: 17:23 UTC, the best of two rounds each) moved four: 6272 x 576 x 96 33.5 against 38.7 us, 6272 x 384 x 96 23.5
#: against 26.8, 1568 x 960 x 320 40.3 against 47.3, 392 x 320 x 1280 15.9 against 18.1. Two of them slice 8 deep
#: (``32x32/4x4/16/2``), shallower than the model's tile: their float16 timing is the benchmark's float16 rows.
MEASURED_TILES: dict[tuple[int, int, int], str] = {
    (401408, 16, 96): "64x64/4x4/16",      # 80.3 -> 73.1 us
    (25088, 32, 192): "64x64/4x4/16",      # 18.6 -> 15.4
    (6272, 96, 576): "128x64/8x8/16",      # 31.6 -> 25.3
    (6272, 576, 96): "32x32/4x4/16/2",     # swizzled 38.7 -> 33.5
    (6272, 384, 96): "32x32/4x4/16/2",     # swizzled 26.8 -> 23.5
    (1568, 160, 960): "64x64/4x8/16",      # 23.4 -> 19.7
    (1568, 960, 320): "32x32/4x4/32/2",    # 55.3 -> 48.7 (32x64/4x8/16); swizzled 47.3 -> 40.3
    (1568, 320, 1280): "64x64/8x8/16",     # 46.8 -> 41.4
    (100352, 16, 96): "64x64/4x4/16",      # 24.2 -> 20.9
    (392, 320, 1280): "32x32/4x4/32/2",    # 23.5 -> 18.5 (32x64/4x8/16); swizzled 18.1 -> 15.9
    (12544, 16, 96): "64x64/4x4/16",       # 5.6 -> 5.0
    (3136, 24, 144): "64x32/4x4/16",       # 4.7 -> 4.4
}

#: :func:`matmul_tile`'s tile for products of at least :data:`_LARGE_MIN_MACS` multiply-adds, where the model's
#: choice (fitted to MobileNetV2's smaller products) took smaller blocks. Measured on an H100 (Vulkan, 2026-12-06
#: 14:00 UTC, ``benchmarks/sweep_gemm_forms.py --extra=...`` and ``sweep_gemm_f16.py --extra=...``, GPU time of 10
#: runs back to back, median of 5 passes), float32 against the model's tile: 2048 x 2048 x 2048 437.7 against 521.6 us,
#: 4096 x 1024 x 1024 221.3 against 263.4, 8192 x 1024 x 1024 433.7 against 520.2, 1024 x 1024 x 4096 220.5 against
#: 257.4, 4096 x 4096 x 4096 3416 against 4589, 25216 x 768 x 3072 2762 against 3837, 25216 x 3072 x 768 2792 against
#: 3400 (cuBLAS's float32, TF32 off, 0.79-0.90x of this tile's time); float16 plans 0.96-1.03x of the model's tile's
#: time on the same seven. Below the bound it lost: 3136 x 1152 x 512 (1.85e9 multiply-adds) 136.5 against 129.6 us.
#: No MobileNetV2 product takes it below batch 256 (12544 x 320 x 1280 there).
_LARGE, _LARGE_MIN_MACS = MatmulTile.parse("128x64/8x8/16"), 1 << 32
#: :data:`_LARGE` (and :data:`_HALF_LARGE`) only where the product is also wide and tall, as every product of the
#: measurement was: at least this many columns (so that 64-column tiles pad less than a quarter of them) and at
#: least two of :data:`_LARGE`'s tiles per SM (so that the sliced tiles' case, few output tiles, is not taken).
_LARGE_MIN_COLS = 256


def _large(rows: int, depth: int, cols: int) -> bool:
    """Whether a product takes :data:`_LARGE` (float32) and :data:`_HALF_LARGE` (float16): at least
    :data:`_LARGE_MIN_MACS` multiply-adds, :data:`_LARGE_MIN_COLS` columns and ``2 * _SMS`` tiles of 128 x 64."""
    return (rows * depth * cols >= _LARGE_MIN_MACS and cols >= _LARGE_MIN_COLS
            and -(-rows // _LARGE.tm) * -(-cols // _LARGE.tn) >= 2 * _SMS)


#: Outputs from which a GPU's matrix products (1x1 convolutions, FULLY_CONNECTED) run tiled: below, the GPU
#: holds every output's invocation at once and the per-output form (with ``split_lanes``) is quicker.
_TILED_MIN_OUTPUTS = 1 << 17
#: The streaming multiprocessors of :func:`matmul_tile`'s model (an H200: 132) and what each holds at once:
#: invocations, 32-bit registers and bytes of workgroup memory (NVIDIA's compute capability 9.0).
_SMS, _SM_THREADS, _SM_REGISTERS, _SM_WORKGROUP_BYTES = 132, 2048, 65536, 229376


def tile_attr(kernel) -> str | None:
    """A kernel's ``matmul_tile`` attribute (tuning only), checked: None where absent or empty, else its name
    (:meth:`MatmulTile.parse`). Raises the kernel's :class:`KernelError` (naming the op) for anything else."""
    tile = kernel.attrs.get("matmul_tile")
    if tile is None or tile == "":
        return None
    if not isinstance(tile, str):
        raise kernel.fail(f"matmul_tile must be a string such as '128x128/8x8/16', got {tile!r}")
    try:
        MatmulTile.parse(tile)
    except KernelError as e:
        raise kernel.fail(str(e)) from None
    return tile


def use_tiled_matmul(rows: int, depth: int, cols: int, target: str) -> bool:
    """Whether a product ``[rows, depth] x [depth, cols]`` runs as a :func:`tiled_matmul_program`: on a GPU
    (``target="gpu"``), with at least :data:`_TILED_MIN_OUTPUTS` outputs and a depth of at least 16."""
    return target == "gpu" and rows * cols >= _TILED_MIN_OUTPUTS and depth >= 16


def use_vec4(depth: int, cols: int) -> bool:
    """Whether a tiled product reads ``A`` and ``B`` and stores ``C`` four floats at a time (the ``a_vec``,
    ``b_vec`` and ``store_vec`` forms of :func:`tiled_matmul_program`): where ``depth`` and ``cols`` are
    multiples of 4 and ``cols`` is at least 16. Measured on the H200 over MobileNetV2's products at batch 32
    (``benchmarks/sweep_gemm_forms.py``, 2026-12-01): 765 us in all with the best tile of each, against 871 us
    for scalar loads and stores; with 16 columns (2026-12-02, the best of 7 tiles in each form) 401408 x 32 x 16
    took 44 us against 70 us, 100352 x 32 x 16 13 against 21 us, and the MediaPipe models' 9216 x 16 x 16 and
    16384 x 24 x 16 3.4 and 4.5 us against 4.1 and 5.6 us."""
    return depth % 4 == 0 and cols % 4 == 0 and cols >= 16


def resident_workgroups(t: MatmulTile) -> int:
    """Workgroups of tile ``t`` one SM holds at once in :func:`matmul_tile`'s model: limited by invocations,
    registers (an estimate: the accumulators, one A and one B vec4 group per row and column of the block, the
    staged loads in flight and 24 for addresses) and workgroup memory (plus 1 KiB reserved per workgroup)."""
    loads = -(-t.tm * t.tk // 4 // t.threads) + -(-t.tn * t.tk // 4 // t.threads)
    registers = t.rm * t.rn + t.rm + t.rn + 8 * loads + 24
    return max(1, min(_SM_THREADS // t.threads, _SM_REGISTERS // (t.threads * registers),
                      _SM_WORKGROUP_BYTES // (t.workgroup_bytes + 1024)))


def matmul_tile(rows: int, depth: int, cols: int) -> MatmulTile:
    """The tile for ``[rows, depth] x [depth, cols]``: of :data:`TILES`' unsliced tiles the one with the least
    modelled time (waves of :func:`resident_workgroups` per SM over :data:`_SMS` SMs, each wave as long as one
    SM's multiply-adds in it, ``resident x tm x tn x depth`` with padding; ties go to more workgroups); but
    where that tile leaves fewer than two workgroups per SM and the depth is at least 32, a sliced tile
    (:data:`_SLICED`, :data:`_SLICED_DEEP` from a depth of 512), whose slice groups put more invocations on
    each SM.

    The model was fitted to the sweep of MobileNetV2's 23 tiled products at batch 1 and 32 on an H200
    (2026-12-01, ``benchmarks/sweep_gemm_forms.py``, vec4 forms, GPU time of 30 back-to-back runs per pass),
    the sliced rule to the sweep of 2026-12-02 (MobileNetV2's products at batch 8 and 32 and the MediaPipe
    models' at batch 1, 55 products, the library's form of each): 950 us in all with the rule, against 978 us
    without it and 885 us for the best of 26 tiles on each product; MobileNetV2's 1568 x 960 x 160 at batch
    32 took 31 us against 39 us, 6272 x 384 x 64 18 us against 22 us. Products of at most 16 columns take
    :data:`_NARROW` (16 columns wide, where every other tile pads to at least 32): 401408 x 32 x 16 (MobileNetV2's
    first projection at batch 32) 35.4 us against 47.1 us for the model's 128 x 32 / 4 x 4 / 8 (the sweep of
    2026-12-04); with more columns the 16-column tiles were slower on every MobileNetV2 product (e.g. 100352 x
    96 x 24 39.1 against 31.1 us). The same sweep found 256 x 32 / 8 x 4 / 8 faster on the products of 100,352
    rows and more (100352 x 96 x 24 26.9 against 31.1 us), but in MobileNetV2 at batch 32 it took only 10 us
    off the float32 model, and the float16 plan, which runs the same tile, lost more: the 112x112 block's
    expansion 74.9 against 61.6 us, its projection 27.0 against 21.4 (f16 partial sums 8 deep instead of 16):
    not taken. Products measured on their own (:data:`MEASURED_TILES`) take the measured tile instead: the
    sweeps behind the model ran many tiles in one process without keeping the GPU busy between them, and an
    H200 idle for seconds clocks down (:data:`tflfuse.runtime.profile.WARM_MS`), so some of their figures were
    taken at lower clocks than others. Products of at least :data:`_LARGE_MIN_MACS` multiply-adds that are wide and
    tall (:func:`_large`) take :data:`_LARGE`, measured faster than the model's choice on every such product timed.
    Tuning only: the tiles differ in the order of the sums, so in rounding only.
    """
    measured = MEASURED_TILES.get((rows, depth, cols))
    if measured:
        return MatmulTile.parse(measured)
    if _large(rows, depth, cols):
        return _LARGE
    if cols <= _NARROW_MAX_COLS:
        return _NARROW
    def cost(t: MatmulTile) -> tuple[float, int]:
        resident = resident_workgroups(t)
        groups = -(-rows // t.tm) * -(-cols // t.tn)
        waves = -(-groups // (_SMS * resident))
        return waves * resident * t.tm * t.tn * -(-depth // t.tk) * t.tk, -groups
    best = min((t for t in TILES.values() if t.sk == 1 and t is not _NARROW), key=cost)
    if depth >= _SLICED_MIN_DEPTH and -(-rows // best.tm) * -(-cols // best.tn) < 2 * _SMS:
        return _SLICED_DEEP if depth >= _SLICED_DEEP_MIN_DEPTH else _SLICED
    return best


#: Whether a product whose tile is :func:`matmul_tile`'s choice runs its float16 form on
#: :func:`half_matmul_tile`'s tile where that differs (its own workgroup and dispatch,
#: :attr:`~tflfuse.kernels.half.HalfMathProgram.half_shape`).
HALF_OWN_TILES = True
#: The float16 form's tiles measured faster than the float32 form's on these exact products ``(rows, depth, cols)``
#: (an H100, 2026-12-06 14:00 UTC, ``benchmarks/sweep_gemm_f16.py``, GPU time of 10 runs back to back, median of 5
#: passes): 6272 x 96 x 576 (MobileNetV2's 14x14 expansions at batch 32) 21 us against 25 on 128 x 64 / 8 x 8 / 16.
#: In the model (the same H100, 14:13 UTC, ``benchmarks/switch_ab.py``, ``benchmarks/RESULTS-switch-ab.md``): those
#: three dispatches 22.0-22.2 us against 26.7-27.0, the float16 plan's GPU time at batch 32 1005.3 against 1021.9 us
#: fused (0.984x), 1154.9 against 1170.3 unfused; bit for bit the same outputs (both tiles stage 16 depths a slice).
MEASURED_HALF_TILES: dict[tuple[int, int, int], str] = {(6272, 96, 576): "64x64/4x8/16"}
#: The float16 form's tile for products of at least :data:`_LARGE_MIN_MACS` multiply-adds: on the seven products
#: of :data:`_LARGE`'s measurement it took 0.91-0.97x the time of :data:`_LARGE` (2048 x 2048 x 2048 413 against
#: 431 us, 25216 x 3072 x 768 2651 against 2904), where the float32 form took 1.09-1.23x.
_HALF_LARGE = MatmulTile.parse("64x64/4x8/16")


def half_matmul_tile(rows: int, depth: int, cols: int) -> MatmulTile | None:
    """The float16 form's own tile for ``[rows, depth] x [depth, cols]`` where it differs from
    :func:`matmul_tile`'s (:data:`MEASURED_HALF_TILES`, then :data:`_HALF_LARGE` where :func:`_large` holds), or
    None: the float32 form's tile. None where :data:`HALF_OWN_TILES` is off."""
    if not HALF_OWN_TILES:
        return None
    measured = MEASURED_HALF_TILES.get((rows, depth, cols))
    if measured:
        return MatmulTile.parse(measured)
    if _large(rows, depth, cols) and (rows, depth, cols) not in MEASURED_TILES:
        return _HALF_LARGE
    return None


def _swizzle(kk: str, r4: str, kq: int) -> str:
    """WGSL of the vec4 slot holding row group ``r4`` in the row of an A slice at depth ``kk`` (``kq = tk / 4``
    2, 4 or 8): ``r4 XOR ((kk / 4) % kq) * (8 / kq)``. The staging stores write, per warp of 32 invocations,
    ``32 / kq`` rows at ``kq`` depths that are 4 apart; unswizzled, a row group's slot at those depths falls in
    the same bank of workgroup memory whenever ``tm`` is a multiple of 32 (a ``kq``-way conflict on every
    store). The XOR moves the depths' slots onto distinct banks; the inner loop reads each slot with the same
    XOR (a constant per step). Measured on an H200 (2026-12-04, GPU time of 20 back-to-back runs, median of
    5 passes; the inner loop's multiply-adds written as ``fma()`` on both sides, which times as the ``+=`` form
    does) over MobileNetV2's products at batch 32, the same tiles with and without it: 6272 x 384 x 64
    18.3 -> 14.7 us, 1568 x 960 x 160 30.4 -> 26.3, 6272 x 192 x 64 10.6 -> 8.9, 1568 x 576 x 160 19.5 -> 17.1
    (the sliced tiles), 0.3 to 1.7 us less on the others; the whole model's GPU time 1.308 -> 1.289 ms fused,
    1.466 -> 1.419 ms unfused. With the tiles it then moved (:data:`MEASURED_TILES`), ``benchmarks/run.py``'s
    products took 858 against 932 us in all (17:30 against 16:15 UTC). Tuning only: the same values in the
    same order."""
    return f"(({r4}) ^ ((({kk}) / 4u) % {kq}u * {8 // kq}u))"


def _staging_load(m: str, i: str, j: str, n_i: int, n_j: int, scalar: str, vec: str | None,
                  elem: str = "f32") -> str:
    """WGSL ``fn {m}4(i0, j0) -> vec4<elem>``: the 4 elements ``[i, j : j + 4]`` of an ``n_i x n_j`` matrix
    whose elements the expressions over the u32 names ``i`` and ``j`` give (``vec``: one vec4 load, ``j0`` a
    multiple of 4 and ``n_j`` of 4; else ``scalar`` four times), the address clamped into the matrix and the
    values zeroed past its edges, so the staging loads need no branch."""
    zero = _ZERO[elem]
    if vec:
        return f"""fn {m}4({i}0: u32, {j}0: u32) -> vec4<{elem}> {{
  let {i} = min({i}0, {max(n_i, 1) - 1}u);
  let {j} = min({j}0, {max(n_j, 4) - 4}u);
  return select(vec4<{elem}>({zero}), {vec}, {i}0 < {n_i}u && {j}0 < {n_j}u);
}}"""
    return f"""fn {m}_at({i}0: u32, {j}0: u32) -> {elem} {{
  let {i} = min({i}0, {max(n_i, 1) - 1}u);
  let {j} = min({j}0, {max(n_j, 1) - 1}u);
  return select({zero}, {scalar}, {i}0 < {n_i}u && {j}0 < {n_j}u);
}}

fn {m}4({i}: u32, {j}: u32) -> vec4<{elem}> {{
  return vec4<{elem}>({m}_at({i}, {j}), {m}_at({i}, {j} + 1u), {m}_at({i}, {j} + 2u), {m}_at({i}, {j} + 3u));
}}"""


def tiled_matmul_program(name: str, bindings: tuple[Binding, ...], rows: int, depth: int, cols: int, a: str,
                         b: str, store: str, helpers: str = "", uniforms: tuple[Uniform, ...] = (),
                         tile: MatmulTile | str | None = None, *, a_vec: str | None = None,
                         b_vec: str | None = None, store_vec: str | None = None,
                         a_strip: str | None = None, elem: str = "f32", double_buffer: bool = False,
                         half_helpers: str | None = None) -> Program:
    """``C = A @ B`` with ``A [rows, depth]`` and ``B [depth, cols]``, float32, tiled for a GPU; with the float16
    plan's form (f16 slices and multiply-adds, f32 accumulation; the module docstring) kept on the program.
    With ``elem="i32"``, the operands, the workgroup memory and the sums are i32 (exact integer products, as
    TFLite's int8 kernels accumulate in int32, wrapping modulo 2**32 where those would overflow), and there
    is no float16 form.

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
      a_vec: where ``depth % 4 == 0``, a WGSL expression of the vec4 ``A[r, k : k + 4]`` (``k`` a multiple of
        4) read in one load, used instead of ``a``; None: four loads of ``a``.
      b_vec: where ``cols % 4 == 0``, the vec4 ``B[k, c : c + 4]`` likewise.
      store_vec: where ``cols % 4 == 0``, statements storing four outputs at once, with ``row``, ``col4`` (the
        first column), ``idx4 = (row * cols + col4) / 4`` and the vec4 ``acc``; None: ``store`` per output.
      a_strip: where ``depth % 4 == 0``, the name of a WGSL function (in ``helpers``) ``fn(r0: u32, k: u32) ->
        mat4x4<f32>`` giving the 4 x 4 block ``A[r0 : r0 + 4, k : k + 4]`` (``r0`` and ``k`` multiples of 4),
        column ``i`` the vec4 of ``A[r0 .. r0 + 3, k + i]``; used instead of ``a`` and ``a_vec``, once per block,
        so that the function can share work between the four rows. It is called for blocks past the matrix's
        rows or depth too and must then return finite values (zero past the depth). It returns f32; in the
        float16 form its block is rounded to f16 as it is staged.
      elem: ``"f32"`` or ``"i32"``, the type of the operands and sums (``a``, ``b`` and ``acc``).
      double_buffer: two buffers of workgroup memory for the slices: the next slice is staged into the other
        buffer after this one is multiplied, one barrier a slice instead of two (tuning only, the same sums in
        the same order; timed by ``benchmarks/sweep_gemm_forms.py --double_buffer=off,on``: on an H200, 2026-12-05,
        MobileNetV2's 19 distinct products at batch 32 took 591 us in all double-buffered against 524 us with the
        library's tiles, 572 against 518 with the best tile of each form, so it is off by default).
      half_helpers: the float16 form's ``helpers`` (the same functions, e.g. an ``a_strip`` whose arithmetic is
        partly f16); None: ``helpers``.
    Returns:
      the :class:`~tflfuse.kernels.half.HalfMathProgram` (a :class:`Program` for ``"i32"``), one workgroup per
      tile of ``C``.
    Raises:
      KernelError: for a tile that is unknown or does not map onto the invocations, a vector form where the
        sizes are not multiples of 4, an unknown ``elem``, ``a_strip`` with ``"i32"``, or ``double_buffer``
        where the tile's two slices (and its slice groups' sums) pass 16 KiB of workgroup memory.
    """
    if elem not in _ZERO or (a_strip and elem != "f32"):
        raise KernelError(f"{name}: a tiled product's elements are f32 or i32 (a_strip f32 only), got {elem!r}")
    half_tile = half_matmul_tile(rows, depth, cols) if tile is None and elem == "f32" else None
    if tile is None:
        tile = matmul_tile(rows, depth, cols)
    elif isinstance(tile, str):
        tile = MatmulTile.parse(tile)
    if ((a_vec or a_strip) and depth % 4) or ((b_vec or store_vec) and cols % 4):
        raise KernelError(f"{name}: vec4 operands need depth ({depth}) and cols ({cols}) multiples of 4")
    tm, tn, rm, rn, tk, sk = tile.tm, tile.tn, tile.rm, tile.rn, tile.tk, tile.sk
    if double_buffer and tile.double_buffered_bytes > _WG_BYTES:
        raise KernelError(f"{name}: tile {tile.name} double-buffered needs {tile.double_buffered_bytes} bytes of "
                          f"workgroup memory, over {_WG_BYTES}")
    threads = tile.threads
    tks = tk // sk                       # the depths of a staged slice each slice group multiplies
    col_tiles = -(-cols // tn)
    tiles = -(-rows // tm) * col_tiles
    gy, gx = tm // rm, tn // rn          # invocations along the tile's rows and columns
    a_groups, b_groups = tm * tk // 4, tn * tk // 4   # vec4 groups: 4 consecutive k of a row of A, 4 columns of B
    if a_strip:
        a_groups = tm * tk // 16   # 4 x 4 blocks of A: 4 rows, 4 consecutive k
    a_loads, b_loads = -(-a_groups // threads), -(-b_groups // threads)   # per invocation
    ra, rb = rm // 4, rn // 4
    kq = tk // 4
    # The A slice's row groups are XOR-swizzled by depth (:func:`_swizzle`): where the tile allows it.
    swizzled = tm % 32 == 0 and kq in (2, 4, 8)

    def slot(kk: str, r4: str) -> str:
        """WGSL of the vec4 slot in ``ta``'s row at depth ``kk`` holding row group ``r4`` (rows 4 r4 .. 4 r4 + 3)."""
        return _swizzle(kk, r4, kq) if swizzled else r4
    lines = []
    # registers: the next slices' values, loaded before the current slice is multiplied
    for j in range(a_loads):
        lines.append(f"  var pa{j}: {'mat4x4<f32>' if a_strip else f'vec4<{elem}>'};")
    for j in range(b_loads):
        lines.append(f"  var pb{j}: vec4<{elem}>;")
    for g in range(ra):
        for r in range(4):
            for h in range(rb):
                lines.append(f"  var c{g}_{r}_{h} = vec4<{elem}>({_ZERO[elem]});")
    decl = "\n".join(lines)

    def load(k0: str) -> str:
        out = []
        for j in range(a_loads):
            e = f"(lidx + {j * threads}u)"
            if a_strip:
                call = f"pa{j} = {a_strip}(r0 + ({e} / {kq}u) * 4u, {k0} + ({e} % {kq}u) * 4u);"
                guard = "" if (j + 1) * threads <= a_groups else f"if ({e} < {a_groups}u) "
                out.append(f"    {guard}{{ {call} }}")
                continue
            out.append(f"    pa{j} = a4(r0 + {e} / {kq}u, {k0} + ({e} % {kq}u) * 4u);"
                       if (j + 1) * threads <= a_groups else f"    if ({e} < {a_groups}u) {{ pa{j} = "
                       f"a4(r0 + {e} / {kq}u, {k0} + ({e} % {kq}u) * 4u); }}")
        for j in range(b_loads):
            e = f"(lidx + {j * threads}u)"
            out.append(f"    pb{j} = b4({k0} + {e} / {tn // 4}u, c0 + ({e} % {tn // 4}u) * 4u);"
                       if (j + 1) * threads <= b_groups else f"    if ({e} < {b_groups}u) {{ pb{j} = "
                       f"b4({k0} + {e} / {tn // 4}u, c0 + ({e} % {tn // 4}u) * 4u); }}")
        return "\n".join(out)

    def staged(half: bool, oa: str = "", ob: str = "") -> str:
        """The statements moving the registers' next slices into workgroup memory (as f16 where ``half``), at
        the offsets ``oa`` and ``ob`` (WGSL terms ending in ``+``) of the double-buffered form."""
        vec, one = ("vec4<f16>", "f16") if half else ("", "")
        stage = []
        for j in range(a_loads):
            e = f"(lidx + {j * threads}u)"
            guard = "" if (j + 1) * threads <= a_groups else f"if ({e} < {a_groups}u) "
            if a_strip:   # column i of the block is the vec4 of rows r0 .. r0 + 3 at depth k + i: one ta entry
                stage.append(f"    {guard}{{ let r4 = {e} / {kq}u; let k = ({e} % {kq}u) * 4u;")
                for i in range(4):
                    value = f"{vec}(pa{j}[{i}])" if half else f"pa{j}[{i}]"
                    stage.append(f"      ta[{oa}(k + {i}u) * {tm // 4}u + {slot('k', 'r4')}] = {value};")
                stage.append("    }")
                continue
            stage.append(f"    {guard}{{ let r = {e} / {kq}u; let k = ({e} % {kq}u) * 4u;")
            for i, comp in enumerate("xyzw"):
                value = f"{one}(pa{j}.{comp})" if half else f"pa{j}.{comp}"
                stage.append(f"      ta[{oa}(k + {i}u) * {tm // 4}u + {slot('k', 'r / 4u')}][r % 4u] = {value};")
            stage.append("    }")
        for j in range(b_loads):
            guard = "" if (j + 1) * threads <= b_groups else f"if (lidx + {j * threads}u < {b_groups}u) "
            value = f"{vec}(pb{j})" if half else f"pb{j}"
            stage.append(f"    {guard}{{ tb[{ob}lidx + {j * threads}u] = {value}; }}")
        return "\n".join(stage)

    def b_row(k: int, ob: str) -> list[str]:
        return [f"      let b{h} = tb[{ob}{'kb + ' if sk > 1 else ''}{k * tn // 4 + h * gx}u + tx];"
                for h in range(rb)]

    lanes = [(g, r, comp, h) for g in range(ra) for r, comp in enumerate("xyzw") for h in range(rb)]

    def multiplied(half: bool, oa: str = "", ob: str = "") -> str:
        """The slice's ``tk`` steps written out one after another, reading the slices at offsets ``oa`` and
        ``ob``. Where ``half``, each step is a vec4<f16> fma into the slice's f16 partial sums ``p``, added into
        the f32 accumulators ``c`` once per slice."""
        inner = [f"    var p{g}_{r}_{h} = vec4<f16>(0.0);" for g, r, _, h in lanes] if half else []
        if sk > 1:   # this slice group's depths of the staged slice
            inner += [f"    let ka = ks * {tks * tm // 4}u;", f"    let kb = ks * {tks * tn // 4}u;"]
        for k in range(tks):
            inner.append("    {")
            depth_k = f"ks * {tks}u + {k}u" if sk > 1 else f"{k}u"   # the step's depth in the staged slice
            inner += [f"      let a{g} = ta[{oa}{'ka + ' if sk > 1 else ''}{k * tm // 4}u + "
                      f"{slot(depth_k, f'{g * gy}u + ty')}];" for g in range(ra)]
            inner += b_row(k, ob)
            inner += [f"      p{g}_{r}_{h} = fma(vec4<f16>(a{g}.{comp}), b{h}, p{g}_{r}_{h});" if half else
                      f"      c{g}_{r}_{h} += a{g}.{comp} * b{h};" for g, r, comp, h in lanes]
            inner.append("    }")
        if half:
            inner += [f"    c{g}_{r}_{h} += vec4<f32>(p{g}_{r}_{h});" for g, r, _, h in lanes]
        return "\n".join(inner)

    # Every accumulator is read by a constant component (.x, .y, .z, .w), never indexed at run time, so that it
    # can stay in registers.
    stores = []
    for g in range(ra):
        for r in range(4):
            for h in range(rb):
                if store_vec:
                    cells = f"""
      if (col4 < {cols}u) {{
        let acc = c{g}_{r}_{h};
        let idx4 = (row * {cols}u + col4) / 4u;
        {store_vec}
      }}"""
                else:
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
    # Slice groups 1 .. sk - 1 hand their sums to group 0 through workgroup memory, one group at a time (red
    # holds one group's sums, [accumulator][invocation of the group]); group 0 stores.
    base = gy * gx
    slice_id, reduced, stored = "", "", nl.join(stores)
    if sk > 1:
        slice_id = f"\n  let ks = lidx / {base}u;   // the slice group\n  let lane = lidx % {base}u;"
        cells = [f"c{g}_{r}_{h}" for g in range(ra) for r in range(4) for h in range(rb)]
        rounds = []
        for grp in range(1, sk):
            if grp > 1:
                rounds.append("  workgroupBarrier();")
            rounds.append(f"  if (ks == {grp}u) {{")
            rounds += [f"    red[{i * base}u + lane] = {c};" for i, c in enumerate(cells)]
            rounds += ["  }", "  workgroupBarrier();", "  if (ks == 0u) {"]
            rounds += [f"    {c} += red[{i * base}u + lane];" for i, c in enumerate(cells)]
            rounds.append("  }")
        reduced = nl.join(rounds) + nl
        stored = "  if (ks == 0u) {\n" + stored + "\n  }"
    a_load = _staging_load("a", "r", "k", rows, depth, a, a_vec, elem)
    b_load = _staging_load("b", "k", "c", depth, cols, b, b_vec, elem)

    buffers = 2 if double_buffer else 1
    plural = "s" if double_buffer else ""
    red_decl = (f"\nvar<workgroup> red: array<vec4<{elem}>, {tm * tn // 4}>;   // a slice group's sums"
                if sk > 1 else "")

    def source_for(half: bool) -> str:
        t = "f16" if half else elem
        return prelude(bindings, uniforms) + (half_helpers if half and half_helpers is not None else helpers) + f"""
// Staging loads without branches: the address is clamped into the matrix and the value zeroed past its edges.
{a_load}

{b_load}

var<workgroup> ta: array<vec4<{t}>, {tk * tm // 4 * buffers}>;   // the A slice{plural}, [k][row / 4]
var<workgroup> tb: array<vec4<{t}>, {tk * tn // 4 * buffers}>;   // the B slice{plural}, [k][col / 4]{red_decl}

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let tile = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (tile >= {tiles}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let tx = lidx % {gx}u;
  let ty = {f"(lidx / {gx}u) % {gy}u" if sk > 1 else f"lidx / {gx}u"};{slice_id}
  let r0 = (tile / {col_tiles}u) * {tm}u;
  let c0 = (tile % {col_tiles}u) * {tn}u;
{decl}
{load("0u")}
{loop(half)}
{reduced}{stored}
}}
"""

    def loop(half: bool) -> str:
        """The walk over the depth: single-buffered, two barriers a slice (the registers' slice is staged once
        every invocation is done with the last); double-buffered, the next slice is staged into the other
        buffer after this one is multiplied, one barrier a slice."""
        if not double_buffer:
            return f"""  for (var k0 = 0u; k0 < {depth}u; k0 += {tk}u) {{
    workgroupBarrier();
{staged(half)}
    workgroupBarrier();
    if (k0 + {tk}u < {depth}u) {{
{load(f"k0 + {tk}u")}
    }}
{multiplied(half)}
  }}"""
        return f"""{staged(half)}
  workgroupBarrier();
  var odd = 0u;   // the buffer holding this slice
  for (var k0 = 0u; k0 < {depth}u; k0 += {tk}u) {{
    let more = k0 + {tk}u < {depth}u;
    if (more) {{
{load(f"k0 + {tk}u")}
    }}
    let oa = odd * {tk * tm // 4}u;
    let ob = odd * {tk * tn // 4}u;
{multiplied(half, "oa + ", "ob + ")}
    if (more) {{
      let oa = (1u - odd) * {tk * tm // 4}u;
      let ob = (1u - odd) * {tk * tn // 4}u;
{staged(half, "oa + ", "ob + ")}
    }}
    workgroupBarrier();
    odd = 1u - odd;
  }}"""
    source = source_for(False)
    steps = -(-depth // tk)
    program = Program(name, source, (threads, 1, 1), linear_dispatch(tiles * threads, threads), bindings, uniforms,
                      loop_trips=2 * steps)
    if elem != "f32":
        return program
    pre, half_fns = prelude(bindings, uniforms), half_helpers if half_helpers is not None else helpers

    def on_matrices(unit: SubgroupMatrix) -> tuple[str, tuple]:
        """The float16 form on subgroup matrices (:mod:`tflfuse.kernels.matrix`): source and shape."""
        source, *shape = matrix_source(pre, half_fns, a_load, b_load, rows, depth, cols, store, store_vec,
                                       a_strip, unit)
        return source, tuple(shape)
    on_matrices = on_matrices if use_matrices(rows, depth, cols) else None
    if half_tile not in (None, tile) and not (double_buffer and half_tile.double_buffered_bytes > _WG_BYTES):
        half = tiled_matmul_program(name, bindings, rows, depth, cols, a, b, store, helpers, uniforms, half_tile,
                                    a_vec=a_vec, b_vec=b_vec, store_vec=store_vec, a_strip=a_strip,
                                    double_buffer=double_buffer, half_helpers=half_helpers)
        return with_half_math(program, half.half_math, (half.workgroup_size, half.dispatch, half.loop_trips),
                              matrix_math=on_matrices)
    return with_half_math(program, source_for(True), matrix_math=on_matrices)


def product_program(name: str, bindings: tuple[Binding, ...], rows: int, depth: int, cols: int, a: str, b: str,
                    out: str, store: str, helpers: str = "", uniforms: tuple[Uniform, ...] = (),
                    tile: MatmulTile | str | None = None, elem: str = "f32") -> Program:
    """:func:`tiled_matmul_program` for row-major operands: the binding named ``a`` holds ``A [rows, depth]``,
    ``b`` holds ``B [depth, cols]`` and ``store`` writes the output binding ``out`` once, as
    ``out[idx] = ...;``. Where :func:`use_vec4` holds and ``store`` and ``helpers`` read none of the three
    otherwise, the three are bound as ``array<vec4<f32>>`` (``vec4<i32>`` for ``elem="i32"``) and read and
    written four elements at a time: ``store`` runs once per component (with its own ``acc``, ``col`` and
    ``idx``) into a vec4 stored at once.

    Raises:
      KernelError: ``store`` does not write ``out[idx] =`` exactly once; or as :func:`tiled_matmul_program`.
    """
    target = f"{out}[idx] ="
    if store.count(target) != 1:
        raise KernelError(f"{name}: the product's store must write {target!r} once, got {store!r}")
    scalar = (f"{a}[r * {depth}u + k]", f"{b}[k * {cols}u + c]")
    others = store.replace(target, "") + helpers
    if not use_vec4(depth, cols) or re.search(rf"\b({a}|{b}|{out})\[", others):
        return tiled_matmul_program(name, bindings, rows, depth, cols, *scalar, store, helpers, uniforms, tile,
                                    elem=elem)
    vec = {a, b, out}
    bindings = tuple(dataclasses.replace(x, elem_type=f"vec4<{elem}>") if x.name in vec else x for x in bindings)
    parts = "".join(f"""
        {{
          let acc = acc4.{comp};
          let col = col4 + {j}u;
          let idx = row * {cols}u + col;
          {store.replace(target, f"v.{comp} =")}
        }}""" for j, comp in enumerate("xyzw"))
    store_vec = f"""let acc4 = acc;
        var v: vec4<{elem}>;{parts}
        {out}[idx4] = v;"""
    return tiled_matmul_program(name, bindings, rows, depth, cols, *scalar, store, helpers, uniforms, tile,
                                a_vec=f"{a}[(r * {depth}u + k) / 4u]", b_vec=f"{b}[(k * {cols}u + c) / 4u]",
                                store_vec=store_vec, elem=elem)


#: Whether :func:`few_rows_program`, where at least :data:`_FEW_ROWS_EARLY_MIN_LANES` lanes share a block's depth,
#: loads each trip's weight and input vec4s during the trip before (the first trip's before the loop), so that
#: their latency passes under the multiply-adds. The same sums in the same order. Measured on an H100 (Vulkan,
#: 2026-12-06, ``benchmarks/switch_ab.py``, alternating rounds; ``benchmarks/RESULTS-switch-ab.md``) at batch 1:
#: MobileNetV2's projections of 7x7 and 14x14 maps (32 or 64 lanes) took 0.68-0.85x of their time (7x7x960 -> 320
#: 9.89 against 6.82 us), its 7x7x160 -> 960 expansions (16 lanes) 0.85x, but its 14x14 expansions (8 lanes, 2-3
#: trips) 1.02-1.06x; with it at every lane count, the whole model's GPU time 227.1 against 234.6 us fused, 289.0
#: against 313.8 unfused (float16 224.9 against 233.4, 272.7 against 298.0); hand, pose and palm landmark models
#: 0.95-0.99x unfused, 0.98-1.00x fused; nothing changed at batch 32 (0.999-1.001x). The same change elsewhere
#: did not pay (the same machine and day): in the per-output split sums (:func:`~tflfuse.kernels.wgsl.dot` with
#: lanes) the six models took 1.00-1.08x at batch 1, and in the per-chunk expand_dw form (its input loads, a trip
#: early and the first trip's before the weights' barrier) MobileNetV2's 15 such dispatches took 0.99-1.06x.
FEW_ROWS_EARLY_LOADS = True
#: Lanes per block from which :data:`FEW_ROWS_EARLY_LOADS` applies (above: it cost where 8 lanes walk 2-3 trips).
_FEW_ROWS_EARLY_MIN_LANES = 16
#: Rows of :func:`few_rows_program`'s block whose lanes' sums meet in one tree, their shares side by side in
#: workgroup memory (4 KiB a row, so 4 rows fill WebGPU's default 16 KiB): one barrier per halving step for all of
#: them rather than one per row (blocks of 4 rows and 32 lanes: 6 barriers instead of 24). The same sums in the same
#: order. Measured on an H100 (Vulkan, 2026-12-07 08:29 UTC, ``benchmarks/switch_ab.py``, 5 alternating rounds;
#: ``benchmarks/RESULTS-switch-ab.md``) against a tree per row: MobileNetV2's few-rows projections and last 1x1 conv
#: at batch 1 took 0.86-0.97x their time (7x7x960 -> 160 6.22 against 5.50 us), the model's GPU time 211.9 against
#: 214.8 us fused (0.986x), 274.8 against 279.9 unfused (float16 0.957x and 0.930x); two rows a tree, 0.995x and
#: 0.989x; batch 32 unchanged (1.003x, 1.002x).
_FEW_ROWS_TREE_ROWS = 4
#: :func:`few_rows_lanes` splits the depth until about this many invocations are in flight.
_FEW_ROWS_INVOCATIONS = 1 << 16
#: Multiply-adds from which :func:`use_few_rows` holds, and rows up to which it does (measured up to 196).
_FEW_ROWS_MIN_MACS, _FEW_ROWS_MAX_ROWS = 1 << 20, 256


def use_few_rows(rows: int, depth: int, cols: int, target: str) -> bool:
    """Whether a product ``[rows, depth] x [depth, cols]`` runs as :func:`few_rows_program`: on a GPU, where
    :func:`use_tiled_matmul` does not hold (too few outputs to fill the GPU with tiles), ``depth`` and ``cols``
    are multiples of 4, the depth is long enough to split between lanes (:func:`few_rows_lanes` > 1), the
    product has at least :data:`_FEW_ROWS_MIN_MACS` multiply-adds and at most :data:`_FEW_ROWS_MAX_ROWS` rows
    (tall, narrow products were not measured).

    Measured on an H200 (2026-12-04, GPU time of 20 back-to-back runs, 7 repeats), against the per-output form
    (:func:`~tflfuse.kernels.wgsl.split_lanes`): FULLY_CONNECTED 1280 -> 1000 at batch 1 4.4 against 7.2 us,
    at batch 8 8.2 against 13.0, at batch 32 11.2 against 23.1; 1024 -> 1024 at batch 1 4.1 against 6.5; 1x1
    CONV_2D 7x7x320 -> 1280 at batch 1 7.2 against 12.4, 14x14x96 -> 576 5.0 against 7.5, 7x7x160 -> 960 6.2
    against 6.8. Below the multiply-adds bound it did not pay: 2x2x288 -> 288 5.3 against 3.8 us, 512 -> 64
    at batch 1 3.1 against 3.1. With the row bound raised to 4096 (and every bottleneck projection of at most that
    many rows taking it), measured on an H100 (2026-12-06 12:07 UTC, ``benchmarks/switch_ab.py``, 5 alternating
    rounds, batch 1), it was faster on some taller products and slower on others, with no bound between them: the
    1x1 convs 3136 x 144 x 24 and 3136 x 96 x 24 (MobileNetV2's 56x56 projections) 5.75 against 7.37 us and 5.17
    against 5.91, pose_landmark_full's and hand_landmark_full's larger projections 0.68-0.84x, but 784 x 144 x 32 and
    784 x 192 x 32 (MobileNetV2's 28x28 projections) 1.05-1.09x, and one of pose_landmark_full's 1x1 convs 5.39
    against 4.04; the models 0.97-1.05x. Not taken: the bound stays."""
    return (target == "gpu" and 0 < rows <= _FEW_ROWS_MAX_ROWS and depth % 4 == 0 and cols % 4 == 0 and cols > 0
            and rows * depth * cols >= _FEW_ROWS_MIN_MACS
            and not use_tiled_matmul(rows, depth, cols, target) and few_rows_lanes(rows, depth, cols) > 1)


def few_rows_block(rows: int) -> int:
    """Rows of ``C`` one invocation of :func:`few_rows_program` accumulates (each weight vec4 it loads serves
    them): 8 for up to 32 rows (FULLY_CONNECTED 1280 -> 1000 at batch 32: 11.2 us against 12.6 with 4 and 22.1
    with 16), else 4 (1x1 CONV_2D 7x7x320 -> 1280: 7.2 against 8.4 us with 8; 14x14x96 -> 576 5.0 against
    6.2), never more than ``rows``. Raises ``ValueError`` for ``rows`` below 1."""
    if rows < 1:
        raise ValueError(f"few_rows_block needs at least one row, got {rows}")
    return min(rows, 8 if rows <= 32 else 4)


def few_rows_lanes(rows: int, depth: int, cols: int) -> int:
    """Invocations sharing each output block's depth in :func:`few_rows_program`: the largest power of two up
    to 256 that keeps about :data:`_FEW_ROWS_INVOCATIONS` invocations in flight (the best or within 0.2 us of
    the best of 2**14, 2**16 and 2**18 on the shapes of :func:`use_few_rows`) and gives each lane at least
    two vec4 steps of the depth. Raises ``ValueError`` for ``rows`` or ``cols`` below 1 (or ``cols`` below 4)."""
    if cols < 4:
        raise ValueError(f"few_rows_lanes needs at least 4 columns, got {cols}")
    outputs = -(-rows // few_rows_block(rows)) * (cols // 4)
    lanes = 1
    while lanes < 256 and outputs * lanes * 2 <= _FEW_ROWS_INVOCATIONS and depth // 4 >= 4 * lanes:
        lanes *= 2
    return lanes


def few_rows_program(name: str, bindings: tuple[Binding, ...], rows: int, depth: int, cols: int,
                     act: str = "", has_bias: bool = False, residual: bool = False) -> Program:
    """``y [rows, cols] = act(x [rows, depth] @ w [depth, cols] (+ b [cols]) (+ res [rows, cols]))`` for products
    with few outputs and long dot products (FULLY_CONNECTED at small batch sizes, 1x1 convolutions of small feature
    maps, the projections of inverted-residual blocks on them), float32.

    An invocation owns a block of :func:`few_rows_block` rows and four neighbouring columns: per vec4
    step of the depth it loads four vec4s of ``w`` (4 depths x 4 columns) once for all its rows, and one vec4 of
    ``x`` per row, so that each weight read from memory serves every row of the block (the per-output form
    reads each weight once per row); with :data:`FEW_ROWS_EARLY_LOADS` (16 or more lanes) those loads run a trip
    ahead of the multiply-adds. :func:`few_rows_lanes` invocations share a block's depth (interleaved vec4
    steps) and add their sums in workgroup memory, up to :data:`_FEW_ROWS_TREE_ROWS` rows at a time. Semantics:
    TFLite's FULLY_CONNECTED and 1x1 CONV_2D (tensorflow/lite/kernels/fully_connected.cc, conv.cc) with ``act``
    their fused activation; the sums run in another order than a serial loop's, so results differ from it by
    rounding only.

    Args:
      bindings: storage buffers named ``x``, ``w``, ``b`` (only with ``has_bias``), ``res`` (only with
        ``residual``) and ``y``; all are bound as ``array<vec4<f32>>``.
      act: WGSL declaring ``fn act(v: f32) -> f32`` (:func:`~tflfuse.kernels.wgsl.activation_fn`), or empty for
        none.
      residual: add ``res [rows, cols]`` (an inverted-residual block's input) to the sums before ``act``.
    Raises:
      KernelError: where :func:`use_few_rows`'s shape conditions (multiples of 4, rows > 0) do not hold.
    """
    if rows <= 0 or depth % 4 or cols % 4 or depth <= 0 or cols <= 0:
        raise KernelError(f"{name}: the few-rows product needs rows > 0 and depth ({depth}) and columns ({cols}) "
                          f"that are positive multiples of 4")
    binds = tuple(dataclasses.replace(b, elem_type="vec4<f32>") for b in bindings)
    block = few_rows_block(rows)
    c4, d4 = cols // 4, depth // 4
    outputs = -(-rows // block) * c4
    lanes = few_rows_lanes(rows, depth, cols)
    per = 256 // lanes
    rs = range(block)

    def w_at(k: str, i: int) -> str:
        return f"w[({k} * 4u + {i}u) * {c4}u + cq]"

    def x_at(k: str, r: int) -> str:
        return f"x[min(r0 + {r}u, {rows - 1}u) * {d4}u + {k}]"
    early = FEW_ROWS_EARLY_LOADS and lanes >= _FEW_ROWS_EARLY_MIN_LANES
    first = ""
    if early:   # this trip's values were loaded during the last trip (the first before the loop); the next
        # trip's index is clamped into the depth, so that the last trip's loads read an address that exists
        first = "".join(f"\n  var wn{i} = {w_at(f'min(lane, {d4 - 1}u)', i)};" for i in range(4)) + "".join(
            f"\n  var xn{r} = {x_at(f'min(lane, {d4 - 1}u)', r)};" for r in rs)
        step = [f"    let w{i} = wn{i};" for i in range(4)] + [f"    let x{r} = xn{r};" for r in rs]
        step += [f"    let kn = min(k + {lanes}u, {d4 - 1}u);", *(f"    wn{i} = {w_at('kn', i)};" for i in range(4)),
                 *(f"    xn{r} = {x_at('kn', r)};" for r in rs)]
    else:
        step = [f"    let w{i} = {w_at('k', i)};" for i in range(4)]
    for r in rs:
        step += ([] if early else [f"    let x{r} = {x_at('k', r)};"]) + [
                 f"    acc{r} = fma(vec4<f32>(x{r}.x), w0, fma(vec4<f32>(x{r}.y), w1, fma(vec4<f32>(x{r}.z), w2, "
                 f"fma(vec4<f32>(x{r}.w), w3, acc{r}))));"]
    bias = " + b[cq]" if has_bias else ""

    def res(r: int) -> str:   # row r's residual term
        return f" + res[(r0 + {r}u) * {c4}u + cq]" if residual else ""

    value = "vec4<f32>(act(v.x), act(v.y), act(v.z), act(v.w))" if act else "v"
    # the rows' sums meet in groups of `group` rows, each group's shares side by side ([row][256]) so that one tree
    # adds them all; lane 0 reads only its own shares after the tree's last barrier, so the next group may overwrite
    # the others
    group = min(block, _FEW_ROWS_TREE_ROWS) if lanes > 1 else 1

    def share(r: int) -> str:   # row r's share of this invocation: rows of a group side by side
        return f"shares[{(r % group) * 256}u + lidx]" if r % group else "shares[lidx]"
    stores = []
    for g0 in range(0, block, group):
        rg = range(g0, min(block, g0 + group))
        tree = lane_tree(lanes, per, [(r - g0) * 256 for r in rg])
        stored = "".join(f"  {share(r)} = acc{r};\n" for r in rg)
        stores.append(stored + "  workgroupBarrier();\n" + tree + "\n" + "\n".join(
            f"""  if (lane == 0u && o < {outputs}u && r0 + {r}u < {rows}u) {{
    let v = {share(r)}{bias}{res(r)};
    y[(r0 + {r}u) * {c4}u + cq] = {value};
  }}""" for r in rg))
    stores = "\n".join(stores)
    source = prelude(binds) + act + f"""
var<workgroup> shares: array<vec4<f32>, {256 * group}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let lane = lidx / {per}u;
  let o = ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * {per}u + lidx % {per}u;
  let oc = min(o, {outputs - 1}u);   // every invocation reaches the barriers
  let cq = oc % {c4}u;
  let r0 = (oc / {c4}u) * {block}u;
{chr(10).join(f"  var acc{r} = vec4<f32>(0.0);" for r in rs)}{first}
  for (var k = lane; k < {d4}u; k += {lanes}u) {{
{chr(10).join(step)}
  }}
{stores}
}}
"""
    return Program(name, source, (256, 1, 1), linear_dispatch(-(-outputs // per) * 256, 256), binds,
                   loop_trips=-(-d4 // lanes) + 1)   # + the loop's last exit test, which the software adapter counts

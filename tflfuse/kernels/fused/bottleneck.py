"""fused_bottleneck: the inverted-residual block of MobileNetV2 and MobileNetV3 as one op.

Semantics (``composites.bottleneck.fused_bottleneck``, BatchNorm folded): for input ``x [N, H, W, Cin]``

    e = act(x @ expand_w + expand_b)                      # 1x1 expand, [N, H, W, Cexp]   (expansion > 1)
    d = act(depthwiseKxK(e, dw_w, stride, padding) + dw_b)   # [N, OH, OW, Cexp], K = kernel_size (3 or 5)
    g = hard_sigmoid(relu(mean_hw(d) @ se_w1 + se_b1) @ se_w2 + se_b2)   # [N, Cexp] (squeeze_excite)
    d = d * g                                             # (squeeze_excite)
    y = d @ project_w + project_b (+ x when residual)     # 1x1 projection, linear, [N, OH, OW, Cout]
    y = output_act(y)                                     # (output_activation; default linear)

with ``act`` one of relu6 (default), relu, hard_swish (``v * relu6(v + 3) / 6``) and ``hard_sigmoid(v) =
relu6(v + 3) / 6``. PReLU blocks (MediaPipe's iris landmark model): ``activation="prelu"`` is TFLite's PRELU
(``v >= 0 ? v : alpha[c] * v``) after the expand conv, with ``dw_activation`` (any of the others, or
``"linear"``; absent: ``activation``) after the depthwise conv, and ``output_activation="prelu"`` a PRELU after
the residual. Op inputs, in order: ``x``; ``expand_w [Cin, Cexp]`` and ``expand_b [Cexp]`` when
expansion > 1; ``dw_w [K, K, Cexp]``, ``dw_b [Cexp]``, ``project_w [Cexp, Cout]``, ``project_b [Cout]``; with
squeeze_excite ``se_w1 [Cexp, Csq]``, ``se_b1 [Csq]``, ``se_w2 [Csq, Cexp]``, ``se_b2 [Cexp]``; with
``activation="prelu"`` ``expand_alpha [Cexp]``, then with ``output_activation="prelu"`` ``output_alpha [Cout]``
(only the tiled, staged and blocked strategies take them; no squeeze-excite with them). With ``expand_stride`` 2
the expand conv is a 2x2 conv of stride 2, VALID (``e [N, H // 2, W // 2, Cexp]``, ``expand_w [4 Cin, Cexp]``:
TensorFlow's HWIO filter flattened, tap ``(dy, dx)`` at rows ``(2 dy + dx) Cin``; the tiled and staged strategies
take it): iris landmark's downsampling blocks, whose residual is x's 2x2 max pool (``residual_pool`` 2, its
channels zero-extended to Cout where Cin < Cout, as TFLite's PAD of the last axis). With ``expand_kernel`` 3 (and
``expand_stride`` 2) the expand conv is a 3x3 conv of stride 2, SAME, as TFLite's CONV_2D pads it (``e [N,
ceil(H / 2), ceil(W / 2), Cexp]``, ``expand_w [9 Cin, Cexp]``, HWIO flattened): a network's stem folded into its
first block (:func:`tflfuse.fuse`'s ``bottleneck`` and ``stem_block`` patterns, ``tflfuse.convert``), without a
residual, squeeze-excite or PReLU slopes; the staged, dw_projection and dw_pointwise strategies take it (the conv
as CONV_2D's own program, into a scratch buffer), and expand_dw's resident form, whose halo pixels hold the conv's
window in registers (:meth:`FusedBottleneck._stem_resident_tiles`: the default on the software adapter, and on a
GPU from 112x112 outputs). Attributes:
``expansion`` (int), ``stride`` (1 or 2), ``residual`` (bool), ``activation`` (str), ``kernel_size`` (int,
default 3), ``squeeze_excite`` (bool, default False), ``dw_activation`` (str, default None: ``activation``) and
``output_activation`` (``"linear"``, the default, ``"relu"``, ``"relu6"`` or ``"prelu"``: applied after the
residual, as TFLite's ADD with a fused RELU6 after a block, or a projection CONV_2D with a fused activation;
:func:`tflfuse.fuse` folds both), ``padding`` (``"SAME"``, the
default, ``"VALID"`` or ``"EXPLICIT"`` with ``explicit_paddings``: eight ints, TensorFlow's NHWC
``[0, 0, top, bottom, left, right, 0, 0]``, each of the four below ``kernel_size``; a PAD of zeros before a
VALID depthwise conv, as in MediaPipe's pose landmark model, is this): files written before the last
five existed read as MobileNetV2's block.

Without squeeze-excite, six strategies, chosen from the ``target`` attribute and the shapes (all compute
the same values; see :meth:`FusedBottleneck._schedule`; the ``strategy`` attribute picks one on any target):

* ``tiled`` (a GPU at batch 1, blocks without expansion or with up to 64 expanded channels): ONE dispatch
  that never writes the expanded tensor to memory. A workgroup owns a tile of output pixels and a block of
  output channels; it walks the expanded channels in chunks: the chunk's expand weights and the 1x1
  expansion of the tile's input halo go into workgroup memory, each invocation applies the KxK depthwise
  filter and accumulates the projection in registers. Where the feature map is too small to fill the GPU,
  the expanded channels are split between workgroups and a second dispatch sums the shares.
* ``blocked`` (the software adapter, blocks of at least 2**20 multiply-adds): ONE dispatch without workgroup
  memory; an invocation owns a row of output pixels and keeps its halo's expansion, the depthwise results
  and the projection sums in registers, so that each weight it loads serves the whole row
  (:mod:`.bottleneck_cpu`, where the reasons and measurements are).
* ``dw_projection`` (a GPU, at stride 1 on wide feature maps: :meth:`FusedBottleneck._takes_dw_projection`,
  where the resident ``expand_dw`` form below is not the default):
  TWO dispatches, the expand conv (into a scratch buffer), then the projection, whose product computes the
  depthwise conv (bias, activation) as it stages its input (:mod:`.depthwise_product`), so the depthwise
  output never goes to memory.
* ``expand_dw`` (a GPU, small feature maps: :meth:`FusedBottleneck._takes_expand_dw`; and large ones with
  few input channels, such as MobileNetV2's first blocks at batch 32: :meth:`FusedBottleneck._resident_tile`):
  TWO dispatches, the expansion of each output tile's input halo and the depthwise conv in workgroup memory
  (:mod:`.expand_depthwise`; the expanded tensor never goes to memory), then the projection. On large maps a
  workgroup keeps its halo's inputs in registers and walks all the expanded channels (the resident form), and
  by default also runs the projection (``expand_tile`` ``"THxTW/C/rPp"``): ONE dispatch, in which neither the
  expanded tensor nor the depthwise output goes to memory.
* ``dw_pointwise`` (a GPU at batch 1, blocks without expansion that dw_projection does not take:
  :meth:`FusedBottleneck._takes_dw_pointwise`; a GPU at any batch, blocks with PReLU slopes or a 2x2 expand
  conv): the expansion where there is one (into a scratch buffer), then ONE dispatch, the one-dispatch schedule
  of ``fused_separable_conv2d`` (:func:`~tflfuse.kernels.fused.conv.depthwise_pointwise_program`) with the
  depthwise bias and activation applied to the values its 1x1 conv reads and the residual (pooled and
  zero-extended with ``residual_pool`` 2) and output activation in its store.
* ``staged`` (the GPU cases the other strategies do not take; on the software adapter, small blocks and
  those with squeeze-excite or past its loop cap): three dispatches through scratch buffers (expand,
  depthwise, projection with bias and residual), whose 1x1 convs read the weights as ``[Cin, Cout]``,
  neighbouring invocations neighbouring weights.

With squeeze-excite the pool needs the whole depthwise output before any projection, so every target runs
the staged strategy with one more dispatch between the depthwise conv and the projection: one workgroup per
image averages ``d`` over the pixels, applies both 1x1 convs of the squeeze-excite in workgroup memory and
writes the gate ``g``; the projection multiplies ``d`` by ``g`` as it reads it.

In a float16 plan (``precision="float16"``) the tensors the staged, dw_projection and expand_dw strategies keep
in scratch buffers (``e`` and ``d``) are stored as float16, as the unfused graph's tensors would be
(:attr:`~tflfuse.kernels.base.Program.half_scratch`); the gate, the tiled strategy's split sums, the
dw_pointwise strategy's expanded tensor and all arithmetic stay float32.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from absl import logging

from ..base import (DEFAULT_MAX_STORAGE_BINDING, MAX_WORKGROUP_STORAGE, MAX_WORKGROUPS_PER_DIM, CompositeKernel,
                    KernelError, Program, TensorSpec, is_integral)
from ..conv import Conv2D, conv_output_size, depthwise_program
from ..registry import register
from .bottleneck_cpu import blocked_loop_trips, blocked_program, blocked_schedule, blocked_sums_bytes
from .conv import SEPARABLE_MAX_CHANNELS, depthwise_pointwise_program, max_pool_2x2, pixel_block, pointwise_split
from .depthwise_product import depthwise_product_program, fits_depthwise_product
from .expand_depthwise import (expand_depthwise_fits, expand_depthwise_program, expand_depthwise_shape,
                               expand_depthwise_unroll, pointwise_expand_program)
from .resident import expand_depthwise_resident_program, resident_fits, resident_refusal
from ..gemm import few_rows_program, product_program, tile_attr, use_few_rows, use_tiled_matmul
from ..wgsl import activation_fn, dot, elementwise_program, prelu_fn, prelude, reduction_program, split_lanes

__all__ = ["FusedBottleneck", "OUTPUT_ACTIVATIONS"]

#: Workgroups a GPU needs in flight to be busy (an H200 has 132 SMs); tiles shrink until a dispatch has this many.
_GPU_WORKGROUPS = 1024
_MAX_CHUNK = 16      # expanded channels per pass through workgroup memory
_WG_BYTES = MAX_WORKGROUP_STORAGE
_GATE_THREADS = 64   # invocations of the squeeze-excite gate's workgroup (one per image)
_SCHEDULE_KEYS = ("tile", "lanes", "out_block", "chunk", "splits")  # integers; "strategy" is the one string
_STRATEGIES = ("tiled", "staged", "blocked", "dw_projection", "expand_dw", "dw_pointwise")
#: ``output_activation``'s values: TFLite's fused activations that a block's last op may carry, and ``prelu``
#: (TFLite's PRELU after the block, slopes from the ``output_alpha`` input).
OUTPUT_ACTIVATIONS = ("linear", "relu", "relu6", "prelu")
#: The tuning attributes each strategy reads (the others it ignores): ``tiled`` its whole schedule, ``blocked``
#: (:func:`.bottleneck_cpu.blocked_program`) its tile, output block and chunk, ``dw_projection`` its product's
#: ``matmul_tile``, ``expand_dw`` its ``expand_tile``; ``staged`` and ``dw_pointwise`` none (they pick their own
#: lanes).
_READS = {"tiled": {"tile", "lanes", "out_block", "chunk", "splits"}, "blocked": {"tile", "out_block", "chunk"},
          "dw_projection": {"matmul_tile"}, "expand_dw": {"expand_tile"}, "staged": set(), "dw_pointwise": set()}
#: The software adapter runs the blocked strategy for blocks of at least this many multiply-adds, the staged
#: one below. A blocked shader takes llvmpipe 1-3 s to compile, and saves about 11 ns per multiply-add
#: (MobileNetV2's 17 blocks at 224x224, 269 M multiply-adds: 3,877 ms staged against 899 ms blocked,
#: 2026-12-01). So a block of a million multiply-adds repays its compile within a few hundred invokes, while
#: the blocks of a small model would take longer to compile than to run staged for many invokes (the test
#: suite's: its cold shader cache cost minutes). MobileNetV2's blocks at 224x224 have 7.6-29 M.
_BLOCKED_MIN_MACS = 1 << 20
_EMPTY_SCHEDULE = {"strategy": "staged", "tile": 1, "lanes": 1, "out_block": 1, "chunk": 1, "splits": 1}
_TILED_MAX_CEXP = 64  # on a GPU at batch 1, the tiled strategy for expansions up to this width (see _schedule)
_DW_PROJECTION_MIN_ROWS = 112 * 112   # output pixels from which a GPU takes dw_projection (_takes_dw_projection)
_EXPAND_DW_MAX_PIXELS, _EXPAND_DW_MAX_MACS = 56 * 56, 1 << 25   # bounds of expand_dw (_takes_expand_dw)
_RESIDENT_MIN_PIXELS = 32 * 56 * 56   # input pixels from which expand_dw's resident form is the default
_RESIDENT_MIN_IMAGE = 56 * 56         # and pixels per image (_resident_tile)
_RESIDENT_SMALL_BATCH_IMAGE = 112 * 112   # or, at stride 2, pixels per image from which fewer images take it
_FEW_ROWS_PROJECTION_MAX_ROWS = 64   # output pixels up to which the projection is a few-rows product
_FEW_ROWS_PROJECTION_MIN_COLS = 88   # or output channels from which it is, up to use_few_rows' 256 rows
_STEM_KERNEL = 3   # expand_kernel's 3x3 expand conv of stride 2 (SAME): a network's stem folded into its first block
_STEM_RESIDENT_MIN_PIXELS = 112 * 112   # the stem's output pixels from which the folded block is resident


@register("fused_bottleneck")
class FusedBottleneck(CompositeKernel):
    """Input ``x [N, H, W, Cin]`` float32 and the folded weights (see module doc) -> ``[N, OH, OW, Cout]``,
    ``OH = ceil(H / stride)``. Raises :class:`~tflfuse.kernels.KernelError` for weights whose shapes
    disagree, a stride other than 1 or 2, or a residual on a block whose input and output differ."""

    #: tuning only: the schedule (see :meth:`_schedule`) and ``matmul_tile``, the tile of the ``dw_projection``
    #: strategy's product by name (:class:`~tflfuse.kernels.gemm.MatmulTile`).
    #: ``expand_tile``: the ``expand_dw`` strategy's output tile and chunk of expanded channels, ``"THxTW/C"``,
    #: optionally with the input loads in flight, ``"THxTW/C/U"``, or its resident form, ``"THxTW/C/rP"``, with
    #: the projection in its dispatch ``"THxTW/C/rPp"`` (:meth:`_expand_tile`).
    extra_attrs = ('strategy', 'tile', 'lanes', 'out_block', 'chunk', 'splits', 'matmul_tile', 'expand_tile')

    input_names = ("x", "expand_w", "expand_b", "dw_w", "dw_b", "project_w", "project_b", "se_w1", "se_b1",
                   "se_w2", "se_b2", "expand_alpha", "output_alpha")
    attr_defaults = {"expansion": 6, "stride": 1, "residual": False, "activation": "relu6", "target": "gpu",
                     "kernel_size": 3, "squeeze_excite": False, "output_activation": "linear", "padding": "SAME",
                     "explicit_paddings": None, "residual_pool": 1, "dw_activation": None, "expand_stride": 1,
                     "expand_kernel": 0}

    def check(self):
        x = self.expect_rank(0, 4)
        n, h, w, cin = x.shape
        self.has_se = bool(self.attr("squeeze_excite"))
        self._activations()
        slopes = self.slope_names()
        counts = tuple(c + len(slopes) for c in ((9, 11) if self.has_se else (5, 7)))
        if len(self.inputs) not in counts:
            raise self.fail(f"expects {counts[0]} inputs (expansion 1) or {counts[1]} (with the expansion conv) "
                            f"{'with' if self.has_se else 'without'} squeeze_excite"
                            f"{' and with ' + str(len(slopes)) + ' PReLU slope input(s)' if slopes else ''}, got "
                            f"{len(self.inputs)}")
        self.has_expand = len(self.inputs) == counts[1]
        self.k = self._int_attr("kernel_size")
        if self.k not in (3, 5):
            raise self.fail(f"kernel_size must be 3 or 5, got {self.k}")
        k = self.k
        off = 2 if self.has_expand else 0
        self.expand_stride = self._int_attr("expand_stride")
        if self.expand_stride not in (1, 2) or (self.expand_stride == 2 and not self.has_expand):
            raise self.fail(f"expand_stride must be 1 (a 1x1 expand conv) or 2 (a 2x2 expand conv of stride 2, "
                            f"VALID) with an expand conv, got {self.expand_stride!r}")
        # the expand conv's kernel: 1x1, the 2x2 of stride 2 (VALID) that expand_stride 2 implies, or a 3x3 of
        # stride 2 (SAME: a network's stem, folded into its first block)
        given = self.attrs.get("expand_kernel")
        unset = given is None or (is_integral(given) and int(given) == 0)   # not a bool, array or string
        self.expand_kernel = self.expand_stride if unset else self._int_attr("expand_kernel")
        if self.expand_kernel not in (self.expand_stride, _STEM_KERNEL) or (
                self.expand_kernel == _STEM_KERNEL and self.expand_stride != 2):
            raise self.fail(f"expand_kernel must be 0 (the default: 1 with expand_stride 1, 2 with expand_stride 2) or "
                            f"{_STEM_KERNEL} with expand_stride 2 (a {_STEM_KERNEL}x{_STEM_KERNEL} expand conv of "
                            f"stride 2, SAME), got {given!r} with expand_stride {self.expand_stride}")
        taps = self.expand_kernel ** 2
        # the expanded tensor's size: the 2x2 conv of stride 2 (VALID) halves H and W, rounding down; the 3x3
        # (SAME) rounds up, padding as TFLite's CONV_2D
        if self.expand_kernel == _STEM_KERNEL:
            (self.eh, self.ept), (self.ewd, self.epl) = (conv_output_size(v, _STEM_KERNEL, 2, 1, "SAME")
                                                         for v in (h, w))
        else:
            self.eh, self.ewd = (h // 2, w // 2) if self.expand_stride == 2 else (h, w)
            self.ept = self.epl = 0
        if self.has_expand:
            ew, eb = self.expect_rank(1, 2).shape, self.expect_rank(2, 1).shape
            if ew[0] != cin * taps or eb[0] != ew[1]:
                k = self.expand_kernel
                raise self.fail(f"expand_w {list(ew)} / expand_b {list(eb)} do not fit {cin} input channels"
                                + (f" (a {k}x{k} expand conv: expand_w [{taps} * {cin}, Cexp], HWIO flattened)"
                                   if taps > 1 else ""))
            if not cin:
                raise self.fail("the expand conv needs input channels (x has 0)")
            cexp = ew[1]
        else:
            cexp = cin
        dw, db = self.expect_rank(1 + off, 3).shape, self.expect_rank(2 + off, 1).shape
        pw, pb = self.expect_rank(3 + off, 2).shape, self.expect_rank(4 + off, 1).shape
        if dw != (k, k, cexp) or db != (cexp,):
            raise self.fail(f"dw_w must be [{k}, {k}, {cexp}] and dw_b [{cexp}], got {list(dw)} and {list(db)}")
        if pw[0] != cexp or pb != (pw[1],):
            raise self.fail(f"project_w {list(pw)} / project_b {list(pb)} do not fit {cexp} expanded channels")
        self.cin, self.cexp, self.cout = cin, cexp, pw[1]
        if not cexp:
            raise self.fail("has no expanded channels (expand_w / dw_w with 0 channels); the block needs at least 1")
        self.csq = 0
        if self.has_se:
            w1, b1, w2, b2 = (self.expect_rank(5 + off + i, r).shape for i, r in enumerate((2, 1, 2, 1)))
            self.csq = w1[1]
            if w1[0] != cexp or b1 != (self.csq,) or w2 != (self.csq, cexp) or b2 != (cexp,) or not self.csq:
                raise self.fail(f"squeeze-excite weights se_w1 {list(w1)}, se_b1 {list(b1)}, se_w2 {list(w2)}, "
                                f"se_b2 {list(b2)} do not fit {cexp} expanded channels (expected [{cexp}, Csq], "
                                f"[Csq], [Csq, {cexp}], [{cexp}])")
            if (cexp + self.csq) * 4 > _WG_BYTES:
                raise self.fail(f"squeeze-excite over {cexp} + {self.csq} channels exceeds {_WG_BYTES} bytes of "
                                f"workgroup memory")
        self.stride = self._int_attr("stride")
        if self.stride not in (1, 2):
            raise self.fail(f"stride must be 1 or 2, got {self.stride}")
        self._padding(self.eh, self.ewd)
        self.residual = self.bool_attr("residual")
        self.residual_pool = self.attr("residual_pool")
        if self.residual_pool not in (1, 2) or isinstance(self.residual_pool, bool):
            raise self.fail(f"residual_pool must be 1 (none) or 2 (a 2x2 max pool of stride 2 of x), got "
                            f"{self.residual_pool!r}")
        pooled = self.residual_pool == 2
        # even sizes, but with the VALID 2x2 expand conv, which drops an odd last row and column as the VALID pool
        even = (h % 2 == 0 and w % 2 == 0) or self.expand_stride == 2
        if pooled and not (self.residual and self.stride * self.expand_stride == 2 and even and
                           (self.oh, self.ow) == (h // 2, w // 2) and cin <= self.cout):
            raise self.fail(f"residual_pool 2 (x's 2x2 max pool added to the output) needs residual, stride 2 (of the "
                            f"depthwise or the expand conv), even sizes (any with expand_stride 2), an output of half "
                            f"the input's size and Cin <= Cout (zero-extended); got residual {self.residual}, stride "
                            f"{self.stride}, expand_stride {self.expand_stride}, output {self.oh}x{self.ow} of "
                            f"{h}x{w}, Cin {cin}, Cout {self.cout}")
        if self.residual and not pooled and (self.stride != 1 or self.expand_stride != 1 or cin != self.cout or
                                             (self.oh, self.ow) != (h, w)):
            raise self.fail(f"residual needs stride 1, Cin == Cout and an output of the input's size, got stride "
                            f"{self.stride}, Cin {cin}, Cout {self.cout}, output {self.oh}x{self.ow} of {h}x{w}")
        if self.act == "prelu" and (not self.has_expand or self.has_se):
            raise self.fail("activation 'prelu' (the expansion's PReLU) needs the expand conv and no squeeze_excite")
        for i, (name, size) in enumerate(zip(slopes, [cexp if s == "ea" else self.cout for s in slopes])):
            shape = self.input(len(self.inputs) - len(slopes) + i).shape
            if shape != (size,):
                what = "expand_alpha (the expansion's" if name == "ea" else "output_alpha (the output's"
                raise self.fail(f"{what} PReLU slopes) must be [{size}], got {list(shape)}")
        # an empty output (no pixels or no output channels) has nothing to compute: no dispatch, as CONV_2D's
        self.empty = not (n * self.oh * self.ow * self.cout)
        default = dict(_EMPTY_SCHEDULE) if self.empty else self._schedule()
        self.strategy = str(self.attrs.get("strategy") or default["strategy"])
        if self.strategy not in _STRATEGIES or (self.has_se and self.strategy != "staged"):
            raise self.fail(f"strategy must be one of {', '.join(map(repr, _STRATEGIES))} ('staged' with "
                            f"squeeze_excite), got {self.strategy!r}")
        if self.expand_kernel == _STEM_KERNEL:
            self._check_stem(cin, cexp)
        if self.prelu and self.strategy not in ("tiled", "staged", "blocked", "dw_pointwise"):
            raise self.fail(f"strategy {self.strategy!r} does not take PReLU slopes (activation or "
                            f"output_activation 'prelu'); give 'tiled', 'staged', 'blocked' or 'dw_pointwise'")
        if self.expand_kernel != _STEM_KERNEL and self.expand_stride == 2 and \
                self.strategy not in ("tiled", "staged", "dw_pointwise"):
            raise self.fail(f"strategy {self.strategy!r} does not take a 2x2 expand conv (expand_stride 2); give "
                            f"'tiled', 'staged' or 'dw_pointwise'")
        if self.strategy == "dw_projection" and pooled:
            raise self.fail("strategy 'dw_projection' does not pool the residual (residual_pool 2); give another")
        if self.strategy == "dw_projection" and not fits_depthwise_product(cexp, self.cout):
            raise self.fail(f"strategy 'dw_projection' needs expanded ({cexp}) and output ({self.cout}) channels "
                            f"that are multiples of 4")
        if self.strategy == "dw_pointwise" and self.has_se:
            raise self.fail("strategy 'dw_pointwise' takes blocks without squeeze-excite; give 'staged'")
        if self.strategy == "dw_pointwise" and not self.empty and self._pointwise_block() == 0:
            raise self.fail(f"strategy 'dw_pointwise' needs one pixel's {cexp} depthwise values in workgroup memory "
                            f"({SEPARABLE_MAX_CHANNELS} floats at most); give another")
        if self.strategy == "expand_dw" and not (self.has_expand and
                                                 expand_depthwise_fits(self._stem_resident_cin(), cexp)):
            raise self.fail(f"strategy 'expand_dw' needs an expand conv and input ({cin}) and expanded ({cexp}) "
                            f"channels that are multiples of 4")
        tile_attr(self)
        self._check_reads()
        if self.strategy == "expand_dw":
            self._expand_tile()   # validates the expand_tile attribute
        if self.strategy != default["strategy"] and not self.empty:   # asked for: that strategy's own defaults
            default = self._blocked_schedule() if self.strategy == "blocked" else \
                self._schedule(blocked=False, dw_projection=False)
        schedule = {**default, **{k: int(self.attrs[k]) for k in _SCHEDULE_KEYS if self.attrs.get(k)}}
        self.tile, self.lanes, self.out_block, self.chunk, self.splits = (schedule[k] for k in _SCHEDULE_KEYS)
        if self.tile not in (1, 2, 4, 8) or self.lanes not in (1, 2, 4, 8, 16, 32, 64) or \
                self.tile * self.tile * self.lanes > 256 or min(self.out_block, self.chunk, self.splits) < 1:
            raise self.fail(f"tile must be 1, 2, 4 or 8, lanes 1..64 (a power of two; tile * tile * lanes at most "
                            f"256 invocations), out_block, chunk and "
                            f"splits >= 1; got {schedule}")

    def _check_stem(self, cin: int, cexp: int) -> None:
        """The 3x3 expand conv's conditions (``expand_kernel`` 3): no PReLU slopes, squeeze-excite or residual, and
        the staged, dw_projection or dw_pointwise strategy, or expand_dw in its resident form
        (:meth:`_stem_resident_cin`)."""
        if self.prelu or self.has_se or self.residual:
            raise self.fail(f"a {_STEM_KERNEL}x{_STEM_KERNEL} expand conv (expand_kernel {_STEM_KERNEL}) takes no "
                            f"PReLU slopes, squeeze_excite or residual")
        if self.strategy not in ("staged", "dw_projection", "dw_pointwise", "expand_dw"):
            raise self.fail(f"strategy {self.strategy!r} does not take a {_STEM_KERNEL}x{_STEM_KERNEL} expand conv "
                            f"(expand_kernel {_STEM_KERNEL}); give 'staged', 'dw_projection', 'dw_pointwise' or "
                            f"'expand_dw' (its resident form)")
        if self.strategy == "expand_dw" and not expand_depthwise_fits(self._stem_resident_cin(), cexp):
            raise self.fail(f"strategy 'expand_dw' needs expanded channels that are a multiple of 4, got {cexp}")

    def _stem_conv(self) -> dict | None:
        """:func:`.resident.expand_depthwise_resident_program`'s ``expand_conv`` for ``expand_kernel`` 3, else None."""
        if self.expand_kernel != _STEM_KERNEL:
            return None
        _, h, w, cin = self.input(0).shape
        return {"H": h, "W": w, "C": cin, "K": _STEM_KERNEL, "S": 2, "PT": self.ept, "PL": self.epl}

    def _stem_resident_cin(self) -> int:
        """The depth of the resident form's expansion: the input channels, or with ``expand_kernel`` 3 the
        expand conv's window (``9 Cin``) rounded up to a multiple of 4 (:func:`.resident.
        expand_depthwise_resident_program`'s ``expand_conv``)."""
        if self.expand_kernel != _STEM_KERNEL:
            return self.cin
        return -(-_STEM_KERNEL * _STEM_KERNEL * self.cin // 4) * 4

    def _activations(self) -> None:
        """Sets ``act``, ``dw_act`` and ``out_act`` (lower-case names) from ``activation``,
        ``dw_activation`` (absent: the same as ``activation``) and ``output_activation``, checked."""
        self.act = str(self.attr("activation")).lower()
        given = self.attrs.get("dw_activation")
        self.dw_act = self.act if given in (None, "") else str(given).lower()
        self.out_act = str(self.attr("output_activation")).lower()
        try:
            for name in {self.act, self.dw_act} - {"prelu"}:
                activation_fn(name)  # validates the name
        except KernelError as e:
            raise self.fail(str(e)) from None
        if self.act == "prelu" and given in (None, ""):
            raise self.fail("activation 'prelu' needs dw_activation (the depthwise conv's own activation, "
                            "e.g. 'linear')")
        if self.dw_act == "prelu":
            raise self.fail("dw_activation 'prelu' is not supported (PReLU slopes are taken for the "
                            "expansion and the output only); give another, or 'linear'")
        if self.out_act not in OUTPUT_ACTIVATIONS:
            raise self.fail(f"output_activation must be one of {', '.join(map(repr, OUTPUT_ACTIVATIONS))} (applied "
                            f"after the projection and the residual), got {self.attr('output_activation')!r}")

    def slope_names(self) -> list[str]:
        """The bindings of the PReLU slope inputs, the op's last inputs: ``ea`` (``expand_alpha``) with
        ``activation="prelu"``, then ``oa`` (``output_alpha``) with ``output_activation="prelu"``."""
        return ["ea"] * (self.act == "prelu") + ["oa"] * (self.out_act == "prelu")

    @property
    def prelu(self) -> bool:
        """Whether the block has PReLU slopes (only the tiled, staged, dw_pointwise and blocked strategies take
        them)."""
        return "prelu" in (self.act, self.out_act)

    @property
    def core_only(self) -> bool:
        """Whether only the tiled, staged, dw_pointwise and blocked strategies take the block (PReLU slopes, or a
        2x2 expand conv, which the blocked one does not take either): the defaults of the others leave it alone."""
        return self.prelu or self.expand_stride != 1

    def expand_activated(self, value: str, chan: str) -> str:
        """The expansion's activation of WGSL ``value`` of expanded channel ``chan`` (:meth:`activation_fns`)."""
        return f"eact({value}, {chan})" if self.act == "prelu" else f"act({value})"

    def _expand_act_fn(self) -> str:
        """The WGSL that :meth:`expand_activated` calls: ``act``, or ``eact(v, c)`` reading the binding ``ea``."""
        return prelu_fn("eact", "ea") if self.act == "prelu" else activation_fn(self.act)

    def dw_activated(self, value: str) -> str:
        """The depthwise conv's activation of WGSL ``value``: ``act`` (as before ``dw_activation``
        existed) where it is the expansion's, else ``dact`` (:meth:`activation_fns`)."""
        return f"act({value})" if self.dw_act == self.act else f"dact({value})"

    def activation_fns(self, output: bool = True) -> str:
        """WGSL of the block's activations: ``act`` (or ``eact(v, c)``, the expansion's PReLU reading binding
        ``ea``), ``dact`` where the depthwise conv's differs, and with ``output`` ``oact`` and ``res_at``
        (:meth:`out_act_fn`, :meth:`residual_fn`)."""
        fns = self._expand_act_fn()
        if self.dw_act != self.act:
            fns += activation_fn(self.dw_act, "dact", declared=fns)
        return fns + (self.out_act_fn(declared=fns) + self.residual_fn() if output else "")

    def _int_attr(self, name: str) -> int:
        """Attribute ``name`` as an int (:func:`~tflfuse.kernels.base.is_integral`); else the op's
        :class:`KernelError`."""
        v = self.attr(name)
        if not is_integral(v):
            raise self.fail(f"{name} must be an integer, got {v!r}")
        return int(v)

    def _padding(self, h: int, w: int) -> None:
        """The depthwise conv's output size and padding before (``oh``, ``ow``, ``pt``, ``pl``) from ``padding``:
        ``"SAME"`` and ``"VALID"`` as TFLite computes them, or ``"EXPLICIT"`` with ``explicit_paddings``, eight
        ints as ``tf.nn.conv2d`` takes them for NHWC (``[0, 0, top, bottom, left, right, 0, 0]``, each of the
        four between 0 and ``kernel_size - 1``): TFLite's PAD of zeros then a VALID DEPTHWISE_CONV_2D."""
        pad, k, s = str(self.attr("padding")).upper(), self.k, self.stride
        given = self.attrs.get("explicit_paddings")
        if pad in ("SAME", "VALID"):
            if given not in (None, [], ()):
                raise self.fail(f"explicit_paddings {given!r} needs padding 'EXPLICIT', got {pad!r}")
            self.oh, self.pt = conv_output_size(h, k, s, 1, pad)
            self.ow, self.pl = conv_output_size(w, k, s, 1, pad)
        elif pad == "EXPLICIT":
            p = list(given) if isinstance(given, (list, tuple)) else None
            if p is None or len(p) != 8 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                   for v in p) \
                    or any(p[i] for i in (0, 1, 6, 7)) or not all(0 <= v < k for v in p[2:6]):
                raise self.fail(f"explicit_paddings must be 8 ints [0, 0, top, bottom, left, right, 0, 0] (NHWC, "
                                f"as tf.nn.conv2d takes them) with each of the four in 0..{k - 1}, got {given!r}")
            t, b, lf, r = (int(v) for v in p[2:6])
            self.oh, self.pt = max(0, (h + t + b - k) // s + 1), t
            self.ow, self.pl = max(0, (w + lf + r - k) // s + 1), lf
        else:
            raise self.fail(f"padding must be 'SAME', 'VALID' or 'EXPLICIT', got {self.attr('padding')!r}")

    def output_specs(self):
        return (TensorSpec((self.input(0).shape[0], self.oh, self.ow, self.cout)),)

    def residual_term(self, pix: str, co: str, direct: str) -> str:
        """`` + `` the residual of output pixel ``pix`` (``n * OH * OW + oy * OW + ox``), channel ``co``: the
        strategy's own expression ``direct`` of x, or with ``residual_pool`` 2 ``res_at(pix, co)`` (the 2x2 max
        of x there, :meth:`residual_fn`); "" without a residual."""
        if not self.residual:
            return ""
        return f" + res_at({pix}, {co})" if self.residual_pool == 2 else f" + {direct}"

    def residual_fn(self, source: str = "x") -> str:
        """WGSL ``fn res_at(pix, co) -> f32`` (reading the op's input x from the binding ``source``; zero for
        ``co`` past x's channels, as TFLite's PAD of the last axis) with ``residual_pool`` 2, else ""."""
        if not self.residual or self.residual_pool != 2:
            return ""
        n, h, w, c = self.input(0).shape
        extend = f"  if (co >= {c}u) {{ return 0.0; }}   // zero-extended channels\n" if c < self.cout else ""
        return (f"fn res_at(pix: u32, co: u32) -> f32 {{\n{extend}"
                f"  let ox = pix % {self.ow}u;\n"
                f"  let oy = (pix / {self.ow}u) % {self.oh}u;\n"
                f"  let b = (((pix / {self.ow * self.oh}u) * {h}u + 2u * oy) * {w}u + 2u * ox) * {c}u + co;\n"
                f"  return {max_pool_2x2(source, 'b', c, w)};\n}}\n")

    def out_activated(self, value: str, chan: str | None = None) -> str:
        """``value`` (a WGSL f32 or vec4<f32> expression of the block's output, of output channel ``chan``)
        through the output activation: ``oact(value)`` (``oact(value, chan)`` for ``prelu``; :meth:`out_act_fn`
        declares it), or ``value`` itself for ``linear``, so that the shaders of blocks without one are
        unchanged."""
        if self.out_act == "prelu":
            if chan is None:
                raise AssertionError(f"{self.key}: the output PReLU needs the output channel")
            return f"oact({value}, {chan})"
        return value if self.out_act == "linear" else f"oact({value})"

    def out_act_fn(self, vec4: bool = False, declared: str = "") -> str:
        """The WGSL ``fn oact`` that :meth:`out_activated` calls (f32, or vec4<f32> with ``vec4``; for ``prelu``
        ``oact(v, c)`` reading the slopes' binding ``oa``, f32 only); "" for ``linear``. ``declared``: WGSL
        already in the program (its helpers are not declared again)."""
        if self.out_act == "linear":
            return ""
        if self.out_act == "prelu":
            if vec4:
                raise AssertionError(f"{self.key}: the output PReLU has no vec4 form")
            return prelu_fn("oact", "oa")
        if not vec4:
            return activation_fn(self.out_act, "oact", declared=declared)
        return (activation_fn(self.out_act, "oact1", declared=declared) + "fn oact(v: vec4<f32>) -> vec4<f32> { "
                "return vec4<f32>(oact1(v.x), oact1(v.y), oact1(v.z), oact1(v.w)); }\n")

    def _check_reads(self) -> None:
        """Warns (absl) where ``strategy`` names a strategy that reads none of the tuning attributes also given:
        they are ignored. Not an error: they are tuning only (every strategy computes the same values), and the
        browser export pins ``staged`` on ops that may carry another's. No ``strategy``: the target's default
        takes what it reads, silently (a file tuned for one target runs on another)."""
        if not self.attrs.get("strategy"):
            return
        given = {k for k in self.extra_attrs if k != "strategy" and self.attrs.get(k) not in (None, "", 0)}
        ignored = sorted(given - _READS[self.strategy])
        if ignored:
            readers = {k: [s for s in _STRATEGIES if k in _READS[s]] for k in ignored}
            logging.warning("%s: strategy %r ignores the tuning attribute(s) %s (read by %s)", self.key,
                            self.strategy, ", ".join(f"{k}={self.attrs[k]!r}" for k in ignored),
                            "; ".join(f"{k}: {', '.join(v)}" for k, v in readers.items()))

    def _schedule(self, blocked: bool = True, dw_projection: bool = True) -> dict:
        """The default schedule for the ``target`` attribute: tile side, lanes per pixel, output channels
        per workgroup (``out_block``), expanded channels per pass (``chunk``) and ``splits``.

        ``"cpu"`` (the software adapter: a few cores, every load from memory costly): the blocked strategy
        (:func:`.bottleneck_cpu.blocked_schedule`); the staged one with squeeze-excite or where an invocation
        of the blocked one would pass the loop cap (and, if ``strategy="tiled"`` is asked for, 8x8 tiles, 4
        lanes, blocks of up to 128 output channels).
        ``"gpu"``: the dw_projection strategy where :meth:`_takes_dw_projection` says it measured faster, the
        expand_dw one where :meth:`_takes_expand_dw` or :meth:`_resident_tile` does; for blocks with PReLU
        slopes or a 2x2 expand conv the dw_pointwise strategy where a pixel's depthwise values fit workgroup
        memory; else the staged strategy
        past batch 1 and for expansions wider than 64 channels; else for blocks
        without expansion the dw_pointwise strategy (:meth:`_takes_dw_pointwise`); otherwise
        the tiled strategy with the largest tile and output block whose dispatch has
        :data:`_GPU_WORKGROUPS` workgroups (a smaller tile or block recomputes more of the expansion). Where
        even the smallest leave the GPU idle (late, small feature maps at batch 1), the expanded channels are
        split between workgroups: each adds its share of the projection into a scratch buffer and a second
        dispatch sums the shares, adds the bias and the residual. Measured on an H200 by
        ``benchmarks/sweep_bottleneck.py``. The PReLU and 2x2-expand blocks take dw_pointwise only where its
        expanded tensor fits :data:`~tflfuse.kernels.base.DEFAULT_MAX_STORAGE_BINDING` (WebGPU's default max
        storage binding, 128 MiB): larger ones keep the tiled strategy, which needs no scratch. Tuning only:
        every schedule computes the same values; the attributes ``strategy``, ``tile``, ``lanes``,
        ``out_block``, ``chunk`` and ``splits`` override it.
        """
        n = self.input(0).shape[0]
        target = self.target()
        if self.expand_kernel == _STEM_KERNEL:   # a network's stem, folded into its first block
            return self._stem_schedule(dw_projection)
        # On the H200 the staged kernels beat the tiled one on every block with a wide expansion, and on all
        # blocks past batch 1. In MobileNetV2 (benchmarks/run.py, 2026-12-01, GPU time of 20 back-to-back
        # runs per pass), tiled blocks at batch 32 (4x4 tiles, blocks of 64, chunks of 16) took 16.7 ms, 5x
        # the whole unfused model's 3.4 ms, and with the wide blocks tiled at batch 1 the blocks took 966
        # against 328 us. The
        # tiled kernel recomputes the expansion on each tile's halo, which only pays where it is narrow.
        if target == "cpu" and not self.has_se and blocked and self.expand_stride == 1 and \
                self.macs() >= _BLOCKED_MIN_MACS:
            schedule = blocked_schedule(self)
            if schedule:
                return schedule
        if target == "gpu" and dw_projection and self._takes_dw_projection() and not self._resident_tile():
            return {"strategy": "dw_projection", "tile": 1, "lanes": 1, "out_block": self.cout, "chunk": 1,
                    "splits": 1}
        if target == "gpu" and dw_projection and (self._takes_expand_dw() or self._resident_tile()):
            return {"strategy": "expand_dw", "tile": 1, "lanes": 1, "out_block": self.cout, "chunk": 1,
                    "splits": 1}
        if target == "gpu" and dw_projection and self.core_only and self._pointwise_block() > 0 and \
                self._expanded_fits():
            # PReLU blocks and those with a 2x2 expand conv (MediaPipe's iris landmark model): the expansion, then
            # the depthwise conv and the projection in one dispatch. The tiled strategy measured 4.5x slower on
            # an H200 (2026-12-05, iris_landmark at batch 1, GPU time of its 26 blocks and 3 other ops: 875 us
            # against 197 for the model fused without this pattern; staged 262): its small maps leave one
            # workgroup per block walking the expansion's 128-term sums alone, latency-bound.
            return {"strategy": "dw_pointwise", "tile": 1, "lanes": 1, "out_block": self.cout, "chunk": 1,
                    "splits": 1}
        narrow = not self.has_expand or self.cexp <= _TILED_MAX_CEXP
        if target == "cpu" or self.has_se or n > 1 or not narrow:
            return {"strategy": "staged", "tile": 8, "lanes": 4, "out_block": min(self.cout, 128),
                    "chunk": _MAX_CHUNK, "splits": 1}
        if dw_projection and self._takes_dw_pointwise():
            return {"strategy": "dw_pointwise", "tile": 1, "lanes": 1, "out_block": self.cout, "chunk": 1,
                    "splits": 1}

        options = []
        for tile in (4, 2):  # 8x8 tiles measured slower on the H200: more workgroup memory, fewer in flight
            for block in (128, 64, 32, 16):
                block = min(block, self.cout)
                groups = n * -(-self.oh // tile) * -(-self.ow // tile) * -(-self.cout // block)
                halo = (tile - 1) * self.stride + self.k
                recompute = halo ** 2 / (tile * self.stride) ** 2 * -(-self.cout // block)
                options.append((recompute, groups, tile, block))
        enough = [o for o in options if o[1] >= _GPU_WORKGROUPS]
        if enough:
            _, groups, tile, block = min(enough)
            splits = 1
        else:  # split the expanded channels rather than shrink tiles further
            _, groups, tile, block = min(options, key=lambda o: (o[0], -o[1]) if o[1] * 32 >= _GPU_WORKGROUPS
                                         else (float("inf"), -o[1]))
            splits = min(32, -(-_GPU_WORKGROUPS // groups), max(1, self.cexp // 16))
        if self._tiled_bytes(tile, 1) > _WG_BYTES:
            # one expanded channel's halo and expand weights pass WebGPU's default 16 KiB of workgroup memory (Cin
            # of about 4,000 and more): the staged strategy, whose products take any Cin within it
            return {"strategy": "staged", "tile": 8, "lanes": 4, "out_block": min(self.cout, 128),
                    "chunk": _MAX_CHUNK, "splits": 1}
        lanes = {4: 8, 2: 16}[tile]
        if splits > 1 and self.core_only:
            # PReLU blocks and those with a 2x2 expand conv, where the tiled strategy is asked for (the default
            # is dw_pointwise, above): the invocations that splitting would add come as more lanes of one
            # workgroup instead, over all the output channels, so that no second dispatch sums the shares. For a
            # [1, 16, 16, 128] -> 64 -> 128 block: 64 workgroups of 2x2 tiles x 64 lanes, the 16,384 invocations
            # of 4 splits, each of 182 loop trips as there.
            tile, block, splits = 2, min(self.cout, 128), 1
            lanes = 256 // (tile * tile)
        while lanes > block:
            lanes //= 2
        # With the expand weights staged in workgroup memory, small chunks measured best: 16 channels, or 8
        # when many workgroups are in flight (less workgroup memory each lets more of them share an SM).
        chunk = 8 if groups * splits >= 4 * _GPU_WORKGROUPS else 16
        return {"strategy": "tiled", "tile": tile, "lanes": lanes, "out_block": block, "chunk": chunk,
                "splits": splits}

    def _stem_schedule(self, dw_projection: bool = True) -> dict:
        """The default strategy of a block whose expand conv is a network's 3x3 stem (``expand_kernel`` 3): the
        resident ``expand_dw`` form where :meth:`_resident_tile` takes the block (the expanded tensor never in
        memory; the software adapter too); else on a GPU the expand conv into a scratch buffer
        (:meth:`_expand_program`, CONV_2D's own schedule) and what the block without it would take there:
        dw_projection where :meth:`_dw_projection_shape` holds, else dw_pointwise where its values fit; otherwise
        staged."""
        one = {"tile": 1, "lanes": 1, "out_block": self.cout, "chunk": 1, "splits": 1}
        if dw_projection and self._resident_tile():   # on the software adapter too
            return {"strategy": "expand_dw", **one}
        if self.target() == "gpu" and dw_projection:
            if self._dw_projection_shape():
                return {"strategy": "dw_projection", **one}
            if self._pointwise_block() > 0 and self._expanded_fits():
                return {"strategy": "dw_pointwise", **one}
        return {"strategy": "staged", "tile": 8, "lanes": 4, "out_block": min(self.cout, 128), "chunk": _MAX_CHUNK,
                "splits": 1}

    def macs(self) -> int:
        """Multiply-adds of the block without squeeze-excite: expansion, depthwise and projection."""
        n, h, w, _ = self.input(0).shape
        expand = n * self.eh * self.ewd * self.cin * self.expand_kernel ** 2 * self.cexp if self.has_expand else 0
        return expand + n * self.oh * self.ow * self.cexp * (self.k * self.k + self.cout)

    def _expand_tile(self) -> tuple[int, int, int, int, bool]:
        """``(tile_h, tile_w, chunk, unroll or pixels, resident)`` of the ``expand_dw`` strategy: the
        ``expand_tile`` attribute (``"THxTW/C"``, ``"THxTW/C/U"``, ``"THxTW/C/rP"`` or ``"THxTW/C/rPp"``, e.g.
        ``"4x8/32"``, ``"4x8/16/4"``, ``"8x8/16/r2"``, ``"7x7/8/r4p"``; U: the input vec4s an invocation loads at
        once, :func:`.expand_depthwise.expand_depthwise_program`; rP: the resident form with P halo pixels per
        invocation, :func:`.resident.expand_depthwise_resident_program`, and rPp the same with the
        projection in its dispatch, :meth:`_projected`) or the defaults
        (:meth:`_resident_tile` where it returns one, else :func:`.expand_depthwise.expand_depthwise_shape`
        and :func:`.expand_depthwise.expand_depthwise_unroll`)."""
        text = self.attrs.get("expand_tile") or ""
        found = re.fullmatch(r"([1-9][0-9]?)x([1-9][0-9]?)/([1-9][0-9]?)(?:/([1-9][0-9]?|r[124]p?))?", text,
                             re.ASCII) if isinstance(text, str) else None
        if text and found is None:
            raise self.fail(f"expand_tile must be 'THxTW/C', 'THxTW/C/U', 'THxTW/C/rP' or 'THxTW/C/rPp' (P: 1, 2 or "
                            f"4) of positive integers below 100, e.g. '4x8/32', '4x8/16/4', '8x8/16/r2' or "
                            f"'4x8/8/r4p', got {text!r}")
        g = self._window()
        resident = found.group(4)[1:2] if found and (found.group(4) or "").startswith("r") else None
        default = None if found else self._resident_tile()
        tile = (*(int(v) for v in found.groups()[:3]), int(resident)) if resident else \
            default[:4] if default else None
        if tile:
            projected = self._projected()   # (expand_dw takes no PReLU slopes: the projection's store needs none)
            if projected and self.residual and self.residual_pool == 2:
                raise self.fail(f"expand_tile {text!r}: the projection in the resident dispatch does not pool the "
                                f"residual (residual_pool 2); drop the trailing 'p' to run the projection apart")
            why = resident_refusal(g, self._stem_resident_cin(), self.cexp, *tile, self.cout if projected else 0,
                                   self.expand_kernel)
            if why:
                raise self.fail(f"expand_tile {text!r}: {why}; " + (
                    "give another tile or chunk, or drop the trailing 'p' to run the projection apart" if projected
                    else f"give a smaller tile or chunk, or drop '/r{tile[3]}' for the per-chunk form"))
            return (*tile, True)
        if self.expand_kernel == _STEM_KERNEL:
            if text:
                raise self.fail(f"expand_tile {text!r}: a {_STEM_KERNEL}x{_STEM_KERNEL} expand conv runs expand_dw only "
                                f"in its resident form; give 'THxTW/C/rP' or 'THxTW/C/rPp'")
            why = resident_refusal(g, self._stem_resident_cin(), self.cexp, 8, 8, 8, 2, self.cout, _STEM_KERNEL)
            raise self.fail(f"strategy 'expand_dw' on a {_STEM_KERNEL}x{_STEM_KERNEL} expand conv runs its resident "
                            f"form, and no default tile fits this block" + (f" ({why})" if why else "") +
                            "; give expand_tile 'THxTW/C/rP' or 'THxTW/C/rPp', or another strategy")
        unroll = int(found.group(4)) if found and found.group(4) else expand_depthwise_unroll(self.cin)
        if self.cin % (4 * unroll):
            raise self.fail(f"expand_tile's unroll {unroll} must divide the input channels / 4 ({self.cin // 4})")
        try:
            shape = expand_depthwise_shape(g, self.cin, self.cexp, *(int(v) for v in found.groups()[:3]) if found
                                           else ())
            return (*shape, unroll, False)
        except KernelError as e:
            raise self.fail(str(e)) from None

    def _projected(self) -> bool:
        """Whether the ``expand_dw`` strategy's resident form runs the projection in its dispatch: the
        ``expand_tile`` attribute's ``rPp`` form (``"4x8/8/r4p"``), or without the attribute
        :meth:`_resident_tile`'s choice."""
        text = self.attrs.get("expand_tile")
        if text:
            return isinstance(text, str) and text.endswith("p")
        tile = self._resident_tile()
        return bool(tile and tile[4])

    def _window(self) -> dict:
        """The depthwise window's strides, size and dilations (``SH SW KH KW DH DW``) and the output's height and
        width (``OH OW``), as the halo arithmetic and the tile choice of :mod:`.expand_depthwise` take them."""
        return dict(SH=self.stride, SW=self.stride, KH=self.k, KW=self.k, DH=1, DW=1, OH=self.oh, OW=self.ow)

    def _resident_tile(self) -> tuple[int, int, int, int, bool] | None:
        """The default tile of the resident form of ``expand_dw`` (``(tile_h, tile_w, chunk, pixels,
        projected)``, ``projected``: the projection in its dispatch) on a GPU, for blocks with an expand conv,
        without squeeze-excite, with at least :data:`_RESIDENT_MIN_PIXELS` input pixels in all and
        :data:`_RESIDENT_MIN_IMAGE` per image: at stride 2 7 x 7 tiles of 8 channels, 4 halo pixels per
        invocation, projected (4 x 8 tiles without the projection where that does not fit or the residual is
        pooled, ``residual_pool`` 2); at stride 1 8 x 8 tiles of 8 channels, 2 halo pixels per invocation,
        projected; at stride 2 with fewer pixels in all but at least :data:`_RESIDENT_SMALL_BATCH_IMAGE` per
        image and more expanded channels than the tiled strategy takes (:data:`_TILED_MAX_CEXP`; narrower
        blocks keep the tiled strategy at batch 1), projected, 4 x 8 tiles of 16 channels with 1 halo pixel per
        invocation for one image, else 7 x 7 of 8 with 2; where :func:`.resident.resident_fits` takes
        them; else None (the per-chunk form is the default, and the ``expand_dw`` strategy is not the default on
        such blocks).

        Measured on an H200 (2026-12-04, whole-block GPU time of 20 back-to-back runs, 7 repeats), the resident
        form without the projection against the staged strategy: MobileNetV2's 112x112x16x6 -> 24 block at
        batch 32 136.3 against 175.9 us (4 x 8 tiles of 8 channels, 4 pixels per invocation; the best of 11
        tiles), at batch 16 69.8 against 95.3, at batch 8 39.7 against 48.8; 56x56x24x6 -> 32 at batch 32 74.9
        against 85.9. It lost on fewer pixels (56x56x24x6 -> 32 at batch 16: 52.0 against 43.4 us; 28x28x32x6
        -> 64 at batch 32: 53.0 against 34.6; 112x112x16x6 at batch 1: 17.5 against 15.2) and at stride 1
        (56x56x24x6 -> 24: 134.2 against the dw_projection strategy's 120.0); the bound per image keeps it off
        small maps in large batches, where most of a tile's halo lies outside the image.

        With the projection in the same dispatch and each chunk's weights loaded while the chunk before it is
        expanded (:data:`.resident.RESIDENT_PREFETCH`), measured on an H100 (the H200's GH100 chip with
        less, slower memory; 2026-12-05, ``benchmarks/sweep_bottleneck_strategies.py --prefetch=off,on``, 5
        repeats) at batch 32: 112x112x16x6 -> 24 122.1 us against 136.9 for the 4 x 8 tiles above (131.8 with
        their weights prefetched; 120.9 with 4 x 8 tiles projected); 56x56x24x6 -> 32 57.6 against 74.7 (56.2
        with 7 x 8 tiles; 84.8 with 4 x 8 tiles projected, whose 8 sums per invocation hold few pixels); at
        stride 1 56x56x24x6 -> 24 (with its residual) 109.0 against 127.6 for the dw_projection strategy, the
        default before; 28x28x32x6 -> 32, below the bound per image, 57.0 (4 x 8 tiles projected, without the
        prefetch) against dw_projection's 46.8. On the H200 (2026-12-05, the same sweep, batch 32):
        112x112x16x6 -> 24 121.4 against 134.1 for the 4 x 8 tiles above (129.0 prefetched), 56x56x24x6 -> 32
        57.4 against 74.5, 56x56x24x6 -> 24 109.0 (staged 136.1); MobileNetV2's GPU time at batch 32 went from
        1.25 to 1.20 ms (``benchmarks/run.py``). 112x112x16x6 -> 24 at smaller batches (the same machine and session,
        7 repeats, against the staged strategy, the default before there): at batch 8 34.2 against 47.6 us (38.0
        for the 4 x 8 tiles unprojected); at batch 1 4 x 8 tiles of 16 with 1 pixel per invocation 12.4 against
        15.0 (7 x 7 / 8 with 4 pixels 21.7; on an H100 12.5 against 15.6); at batch 2 and 4 7 x 7 / 8 with 2
        pixels 16.6 against 17.8 and 20.9 against 24.4 (the 4 x 8 / 16 tiles 18.2 and 23.9). At batch 1 on smaller
        maps it lost to the per-chunk form (an H100, 2026-12-05, ``sweep_bottleneck_strategies.py --batches=1``, the
        best of 13 projected tiles, 1 or 2 pixels per invocation): 56x56x24x6 -> 32 12.8 against 10.0 us,
        28x28x32x6 -> 32 17.7 against 10.0, 28x28x32x6 -> 64 18.3 against 9.1, and with the input-channel bound
        raised to 64 (``--resident_max_cin=64``) 14x14x64x6 -> 64 45.3 against 10.4: a workgroup walks all the
        expanded channels alone, and the few tiles leave most SMs idle. 56x56x24x6 -> 24 took 14.8 against 15.7
        (2 x 4 / 16 tiles), too little to take. At stride 1 the default held against 7 other projected tiles (an
        H100, 2026-12-06, ``sweep_bottleneck_strategies.py --blocks=2 --batches=32``, 5 repeats): 56x56x24x6 -> 24
        108.2 us with 8 x 8 / 8 and 2 pixels per invocation, 113.2 with 8 x 8 / 12, 120.0 and 121.4 with 8 x 16 and
        16 x 8 / 8, 133.0-165.7 with chunks of 4 (8 x 16, 16 x 16, 12 x 12; 145.2 with 1 pixel); staged 148.5.
        On 28x28 maps at stride 1 it lost in the whole plan too, which unlike a per-block timing does not favour forms
        that keep the expanded tensor in memory (there the block's input stays hot in L2 across runs;
        ``benchmarks/RESULTS-dispatches-sequence-h100.md``): with MobileNetV2's two 28x28x32x6 -> 32 blocks at batch 32
        taking 7 x 7 / 8 tiles, 2 pixels per invocation, projected, the model took 1237.1 against 1218.9 us (1.015x;
        an H100, 2026-12-06 17:05 UTC, ``benchmarks/switch_ab.py``, 3 alternating rounds)."""
        stem = self.expand_kernel == _STEM_KERNEL
        if (self.target() != "gpu" and not stem) or not self.has_expand or self.has_se or (self.core_only and not stem):
            return None
        n, h, w = self.input(0).shape[0], self.eh, self.ewd   # the expanded tensor's (a 1x1 expand's input's)
        if stem:
            tiles = self._stem_resident_tiles(n * h * w, self.target())
        elif (n * h * w < _RESIDENT_MIN_PIXELS and self.stride == 2 and h * w >= _RESIDENT_SMALL_BATCH_IMAGE
                and self.cexp > _TILED_MAX_CEXP):
            tiles = [(4, 8, 16, 1, True)] if n == 1 else [(7, 7, 8, 2, True)]   # few images of a large map
        elif n * h * w < _RESIDENT_MIN_PIXELS or h * w < _RESIDENT_MIN_IMAGE:
            return None
        else:
            tiles = [(8, 8, 8, 2, True)] if self.stride == 1 else [(7, 7, 8, 4, True), (4, 8, 8, 4, False)]
        pooled = self.residual and self.residual_pool == 2   # a residual the projected store does not pool
        for th, tw, chunk, pixels, projected in tiles:
            if not (projected and pooled) and resident_fits(self._window(), self._stem_resident_cin(), self.cexp, th,
                                                            tw, chunk, pixels, self.cout if projected else 0):
                return th, tw, chunk, pixels, projected
        return None

    @staticmethod
    def _stem_resident_tiles(pixels: int, target: str) -> list[tuple[int, int, int, int, bool]]:
        """:meth:`_resident_tile`'s candidates for a network's stem folded into its first block (``expand_kernel``
        3): on the software adapter 8 x 16 tiles of 8 channels with 2 halo pixels per invocation (else 8 x 8); on a
        GPU by the pixels of the stem's output in all: none below :data:`_STEM_RESIDENT_MIN_PIXELS`, 4 x 8 of 16 with
        1 (else 4 x 8 of 8 with 2) below 8 images of 112x112, 8 x 8 of 8 with 2 below 32, 8 x 16 of 8 with 2 from
        there (else 8 x 8); all projected.

        Measured on an H100 (Vulkan, 2026-12-06 18:30 UTC, ``benchmarks/sweep_stem.py``, ``benchmarks/RESULTS-stem.md``;
        GPU time of 20 runs back to back, median of 7 passes) on MobileNetV2's stem (224x224x3 -> 32, RELU6) and
        first block (-> 16) against the two ops apart (CONV_2D, then the block's dw_projection, in one plan): at
        batch 1 4 x 8 / 16 / r1 7.5 against 11.8 us (float16 6.5 against 11.0; 4 x 8 / 8 / r2 9.3, 8 x 8 / 8 / r2
        9.6, the stem's CONV_2D program then dw_projection 11.7); at batch 8 8 x 8 / 8 / r2 27.3 against 34.6
        (float16 20.6 against 28.5; 4 x 8 / 16 / r1 35.2); at batch 32 8 x 16 / 8 / r2 86.6 against 116.3 (float16
        63.9 against 77.0; 8 x 8 / 8 / r2 99.0 and 65.3, 16 x 8 / 8 / r4 89.5 and 57.6, 7 x 7 / 8 / r4 119.6). On
        the software adapter (llvmpipe on a 2-core CPU, 2026-12-06, the same sweep with ``--target=cpu``, the
        unfolded block taking its blocked strategy), at batch 1: 8 x 16 / 8 / r2 11.3 and 14.9 ms against 21.7 and
        31.3 ms apart in two runs (16 x 8 / 8 / r4 12.9 in the second, 7 x 7 / 8 / r4 16.5 in the first), the
        staged strategy 47.0 and 45.2 ms; on 96x96 images at batch 2 5.1 against 12.1 ms (8 x 8 / 8 / r2 7.6,
        staged 15.7), at batch 1 3.2 against 6.0 (8 x 8 / 8 / r2 2.5, staged 5.7)."""
        if target != "gpu":
            return [(8, 16, 8, 2, True), (8, 8, 8, 2, True)]
        if pixels < _STEM_RESIDENT_MIN_PIXELS:
            return []
        if pixels < 8 * _STEM_RESIDENT_MIN_PIXELS:
            return [(4, 8, 16, 1, True), (4, 8, 8, 2, True)]
        if pixels < 32 * _STEM_RESIDENT_MIN_PIXELS:
            return [(8, 8, 8, 2, True)]
        return [(8, 16, 8, 2, True), (8, 8, 8, 2, True)]

    def _takes_expand_dw(self) -> bool:
        """Whether a GPU runs the ``expand_dw`` strategy by default: a block with an expand conv, without
        squeeze-excite, channels that are multiples of 4, more expanded channels than the tiled strategy takes
        (:data:`_TILED_MAX_CEXP`), at most :data:`_EXPAND_DW_MAX_PIXELS` input pixels
        and :data:`_EXPAND_DW_MAX_MACS` multiply-adds (small feature maps, where the staged expand conv's
        product has too few rows to fill the GPU).

        Measured on an H200 (``benchmarks/sweep_bottleneck_strategies.py``, 2026-12-01, whole-block GPU time,
        one dispatch fewer): on MobileNetV2's blocks at batch 1, 16.9 against 18.1 us (56x56x24x6), 11.3
        against 12.7 (28x28x32x6), 12.9 against 15.0 (14x14x64x6 -> 96), 17.9 against 18.9 (7x7x160x6), ten
        of eleven faster; slower on the 112x112x16x6 block (16.5 against 15.5) and at batch 32 on every block
        (up to 2.2x: 7x7x160x6 145 against 81 us), where the recomputed halos cost more than the expanded
        tensor's bytes. Tiles of a whole image (7 x 7 of 8 or 16 channels, 14 x 14 of 4 or 8), which recompute no
        halo between tiles, lost there too (an H100, 2026-12-05, the six 14x14 and 7x7 blocks at batch 32): 1.4 to
        1.9x the staged strategy's time (7x7x160x6 -> 320 102.9 against 68.8 us, 14x14x96x6 -> 96 123.9 against
        76.8).

        At batch 1 the projection after this strategy is a dispatch of its own. A form that ran all three convs in
        one dispatch (a workgroup of 256 per tile of 1 x 1 to 4 x 4 output pixels holding the input halo, every
        chunk's expansion spread over its invocations, the projection's sums in registers) was timed on an H100
        (2026-12-06, ``sweep_bottleneck_strategies.py --batches=1``, 35 tiles and chunks): it lost on 9 of
        MobileNetV2's 10 blocks here, 1.2x on 56x56 and 28x28 maps and 1.7 to 4.6x on 14x14 and 7x7 ones
        (7x7x160x6 -> 160 61.2 against 14.5 us), since every workgroup reads all of the block's weights (1.2 MB
        on 7x7x160x6 -> 160); it won only on 28x28x32x6 -> 64 at stride 2 (7.7 against 9.0 us). Not kept."""
        n, h, w, _ = self.input(0).shape
        return (self.has_expand and not self.has_se and not self.core_only and
                expand_depthwise_fits(self.cin, self.cexp)
                and self.cexp > _TILED_MAX_CEXP and n * h * w <= _EXPAND_DW_MAX_PIXELS
                and self.macs() <= _EXPAND_DW_MAX_MACS)

    def _takes_dw_pointwise(self) -> bool:
        """Whether a GPU runs the ``dw_pointwise`` strategy by default (where the tiled one would otherwise): a
        block without expansion conv or squeeze-excite whose depthwise values fit workgroup memory.

        Measured on an H200 (2026-12-04, whole-block GPU time, one run) against the tiled strategy on the
        expansion-free blocks of MediaPipe's pose landmark model at batch 1: 212 against 316 us for its 18
        such blocks, 14 of them one dispatch instead of two (e.g. [1, 2, 2, 288] -> 288 17.5 against 31.3 us,
        [1, 32, 32, 32] -> 48 5.9 against 11.3, [1, 64, 64, 24] -> 48 9.9 against 15.9); slower on one,
        [1, 8, 8, 864] -> 48 (17.3 against 15.9 us, with one dispatch fewer). The dw_projection strategy,
        where it applies, measured faster than both (e.g. [1, 112, 112, 32] -> 16 24.8 against 46.3 us)."""
        return not self.has_expand and not self.has_se and not self.core_only and self._pointwise_block() > 0

    def _takes_dw_projection(self) -> bool:
        """Whether a GPU runs the ``dw_projection`` strategy by default: without squeeze-excite, at stride 1,
        with channels that are multiples of 4, an output width that is a multiple of 4 (four neighbouring
        pixels of a row share their window's loads) and at least :data:`_DW_PROJECTION_MIN_ROWS` output pixels.

        Measured on an H200 (``benchmarks/sweep_bottleneck_strategies.py``, 2026-12-01, whole-block GPU time, 64x64
        tiles), against the staged strategy: at batch 32 112x112x32 (no expansion) 70 against 114 us,
        56x56x24x6 126 against 150, 28x28x32x6 49 against 52; at batch 1 112x112x32 15 against 15 (19 for the
        tiled strategy). It lost elsewhere: with output widths of 7 or 14 (each pixel alone) 1.6-2.3x slower at
        batch 32, at stride 2 up to 1.7x, and with fewer pixels (56x56 at batch 1: 116 against 78 us) too few
        workgroups carry the depthwise work. With the product's rows padded to a multiple of 4 pixels on those
        widths (:func:`.depthwise_product.padded_width`) it still lost at batch 32 (an H100, 2026-12-07,
        ``sweep_bottleneck_strategies.py --max_padded_share=1.0,1.15``, the best of 4 tiles): 14x14x64x6 -> 64
        46.3 us (49.6 unpadded) against 40.5 staged, 7x7x160x6 -> 320 142.6 (166.7) against 69.4; taken on
        MobileNetV2's nine such blocks, the model's GPU time went from 1226.5 to 1488.8 us (1.21x,
        ``benchmarks/RESULTS-switch-ab.md``)."""
        return not self.core_only and self._dw_projection_shape()

    def _dw_projection_shape(self) -> bool:
        """:meth:`_takes_dw_projection`'s conditions but the PReLU and expand-conv kinds (:attr:`core_only`)."""
        return (not self.has_se and self.stride == 1 and self.ow % 4 == 0
                and fits_depthwise_product(self.cexp, self.cout)
                and self.input(0).shape[0] * self.oh * self.ow >= _DW_PROJECTION_MIN_ROWS)

    def _blocked_schedule(self) -> dict:
        """The blocked strategy's schedule (:func:`.bottleneck_cpu.blocked_schedule`; where that would pass
        the software adapter's loop cap, 1-pixel tiles, which the planner then refuses on that adapter)."""
        return blocked_schedule(self) or {"strategy": "blocked", "tile": 1, "lanes": 1, "out_block": self.cout,
                                          "chunk": 16, "splits": 1}

    def _blocking(self):
        """(halo side, expanded channels per chunk, output channels per block, number of blocks,
        expanded channels per split, number of splits).

        The chunk divides Cexp (so every chunk is full), its halo fits in workgroup memory beside the
        depthwise results, and each split is a whole number of chunks."""
        halo = (self.tile - 1) * self.stride + self.k
        # the largest chunk whose workgroup memory fits (1 where none does: a block whose expand weights alone pass
        # it, which the default schedule gives the staged strategy instead, _schedule)
        chunk = max(d for d in range(1, min(self.cexp, self.chunk) + 1) if self.cexp % d == 0 and
                    (d == 1 or self._tiled_bytes(self.tile, d) <= _WG_BYTES))
        nblocks = -(-self.cout // self.out_block)
        block = -(-self.cout // nblocks)
        chunks = self.cexp // chunk
        per_split = -(-chunks // min(self.splits, chunks)) * chunk
        return halo, chunk, block, nblocks, per_split, -(-self.cexp // per_split)

    def _tiled_bytes(self, tile: int, chunk: int) -> int:
        """Bytes of workgroup memory the tiled strategy declares for ``tile`` and ``chunk`` expanded channels per
        pass, as WebGPU counts them (each array rounded up to 16 bytes): the expanded halo, the depthwise results
        of the tile and the chunk's expand weights (``Cin * expand_kernel**2`` per channel)."""
        halo = (tile - 1) * self.stride + self.k
        staged = self.cin * self.expand_kernel ** 2 if self.has_expand else 0
        return sum(-(-4 * v * chunk // 16) * 16 for v in (halo * halo, tile * tile, staged) if v)

    def loop_trips(self) -> int:
        """Loop iterations one invocation runs, at most (see :func:`tflfuse.kernels.wgsl.dot`)."""
        if self.strategy == "blocked":
            return blocked_loop_trips(self)
        if self.strategy == "dw_pointwise":
            return max(p.loop_trips for p in self._dw_pointwise_programs())
        halo, ec, cb, _, per_split, _ = self._blocking()
        chunks = per_split // ec
        threads = self.tile * self.tile * self.lanes
        depth = self.cin * self.expand_kernel ** 2   # the expand conv's terms per output
        per_chunk = -(-halo * halo * ec // threads) * (1 + depth // 4) + -(-ec // self.lanes) + \
            -(-cb // self.lanes) + (-(-depth * ec // threads) if self.has_expand else 0)
        return chunks * (1 + per_chunk) + -(-cb // self.lanes)

    def _expanded_bytes(self) -> int:
        """Bytes of the expanded tensor as float32 scratch (the staged, dw_projection and dw_pointwise
        strategies')."""
        return self.input(0).shape[0] * self.eh * self.ewd * self.cexp * 4

    def _expanded_fits(self) -> bool:
        """Whether dw_pointwise's expanded tensor (float32 scratch, in a float16 plan too) fits
        :data:`~tflfuse.kernels.base.DEFAULT_MAX_STORAGE_BINDING`, the binding every adapter grants: where it
        does not, a PReLU or 2x2-expand block keeps the tiled strategy by default."""
        return self._expanded_bytes() <= DEFAULT_MAX_STORAGE_BINDING

    def scratch_sizes(self) -> tuple[int, ...]:
        n, h, w, _ = self.input(0).shape
        if self.strategy == "blocked" and not self.empty:   # the projection sums where no private array holds them
            sums = blocked_sums_bytes(self)
            return (sums,) if sums else ()
        if self.strategy == "dw_pointwise" and self.has_expand and not self.empty:   # the expanded tensor
            return (self._expanded_bytes(),)
        if self.strategy in ("blocked", "dw_pointwise") or self.empty:
            return ()
        if self.strategy == "expand_dw":   # the depthwise output only (none where the projection is in its dispatch)
            return () if self._projected() else (n * self.oh * self.ow * self.cexp * 4,)
        if self.strategy == "dw_projection":   # the expanded tensor (when expanding)
            return (self._expanded_bytes(),) if self.has_expand else ()
        if self.strategy == "staged":  # the expanded tensor (when expanding), the depthwise output, the gate
            return (((self._expanded_bytes(),) if self.has_expand else ()) +
                    (n * self.oh * self.ow * self.cexp * 4,)
                    + ((n * self.cexp * 4,) if self.has_se else ()))
        *_, splits = self._blocking()
        return (splits * self.output_specs()[0].nbytes,) if splits > 1 else ()

    def half_scratch(self) -> tuple[int, ...]:
        """The expanded tensor and the depthwise output of the staged, dw_projection and expand_dw strategies
        (not the squeeze-excite gate, a small sum after them, nor the tiled strategy's split sums): a float16
        plan stores them as f16, as it stores the unfused graph's tensors, and so moves half their bytes
        (MobileNetV2's first blocks at batch 32 are bound by them)."""
        if self.empty or self.strategy not in ("staged", "dw_projection", "expand_dw"):
            return ()
        return tuple(range(len(self.scratch_sizes()) - (1 if self.has_se else 0)))

    def _staged_programs(self) -> list[Program]:
        """Dispatches through scratch buffers: 1x1 expand, KxK depthwise, (squeeze-excite gate,) 1x1 projection
        (+ bias and residual). Faster on the software adapter, whose barriers and workgroup memory are costly;
        still one op of the model, with fewer dispatches than the unfused ops."""
        n, h, w, cin = self.input(0).shape
        cexp, cout = self.cexp, self.cout
        inputs = self._input_bindings()
        sizes = self.scratch_sizes()
        progs, src = [], inputs["x"]
        g = dict(N=n, H=self.eh, W=self.ewd, OH=self.oh, OW=self.ow, SH=self.stride, SW=self.stride, DH=1, DW=1,
                 PT=self.pt, PL=self.pl, KH=self.k, KW=self.k)
        if self.strategy == "expand_dw" and self._projected():   # one dispatch: expansion, depthwise, projection
            *tile, pixels, _ = self._expand_tile()
            co4 = cout // 4
            res = self.residual_term("pix", "co4", f"x[pix * {co4}u + co4]")   # never pooled: _expand_tile
            binds = tuple(inputs[k] for k in ("x", "ew", "eb", "dw", "db", "pw", "pb")) + (
                self.binding("y", "output", 0, self.output_specs()[0]),)
            store = f"y[pix * {co4}u + co4] = {self.out_activated(f'acc + pb[co4]{res}')};"
            return [expand_depthwise_resident_program(
                f"{self.key}_expand_dw_project", binds, g, self._stem_resident_cin(), cexp, self.act, self.dw_act,
                *tile, pixels, cout, store,
                self.out_act_fn(True, declared=activation_fn(self.act) + activation_fn(self.dw_act)),
                expand_conv=self._stem_conv())]
        if self.strategy == "expand_dw":   # the expansion and the depthwise conv in one dispatch, d into scratch
            d_out = self.binding("d", "scratch", 0, sizes[0])
            ed_binds = tuple(inputs[k] for k in ("x", "ew", "eb", "dw", "db")) + (d_out,)
            act, dw_act = self.act, self.dw_act
            *tile, unroll, resident = self._expand_tile()   # unroll: the resident form's pixels
            progs.append(expand_depthwise_resident_program(f"{self.key}_expand_dw", ed_binds, g,
                                                           self._stem_resident_cin(), cexp, act, dw_act, *tile, unroll,
                                                           expand_conv=self._stem_conv()) if resident else
                         expand_depthwise_program(f"{self.key}_expand_dw", ed_binds, g, cin, cexp, act, dw_act, *tile,
                                                  unroll))
        elif self.has_expand:
            progs.append(self._expand_program(inputs))
            src = self.binding("x", "scratch", 0, sizes[0], access="read")
        d_index = 1 if self.has_expand and self.strategy != "expand_dw" else 0
        if self.strategy == "dw_projection":   # the depthwise conv computed as the projection reads it
            res = (dataclasses.replace(inputs["x"], name="res"),) if self.residual else ()
            binds = (dataclasses.replace(src, name="x"), inputs["dw"], inputs["db"], inputs["pw"], inputs["pb"],
                     *res, self.binding("y", "output", 0, self.output_specs()[0]))
            value = self.out_activated(f"acc + pb[col4 / 4u]{' + res[idx4]' if self.residual else ''}")
            helpers = self.out_act_fn(True, declared=activation_fn(self.dw_act))   # beside its dact
            progs.append(depthwise_product_program(f"{self.key}_dw_project", binds, g, cexp, cout,
                                                   self.dw_act, f"y[idx4] = {value};", tile_attr(self),
                                                   helpers=helpers))
            return progs
        residual = self.residual_term("pix", "co", f"x[pix * {cin}u + co]")
        out = self.binding("y", "output", 0, self.output_specs()[0])
        rows = n * self.oh * self.ow
        dw_binds = (src, dataclasses.replace(inputs["dw"], name="w"), dataclasses.replace(inputs["db"], name="b"),
                    self.binding("y", "scratch", d_index, sizes[d_index]))
        if self.strategy != "expand_dw":
            progs.append(depthwise_program(f"{self.key}_depthwise", dw_binds, g, cexp, 1, True, self.dw_act))
        d_read = self.binding("d", "scratch", d_index, sizes[d_index], access="read")
        gated, gate_binds = "", ()
        if self.has_se:
            gate = self.binding("gate", "scratch", d_index + 1, sizes[d_index + 1])
            progs.append(self._gate_program(d_read, [inputs[k] for k in ("sw1", "sb1", "sw2", "sb2")], gate))
            gate_binds = (dataclasses.replace(gate, access="read"),)
            gated = f" * gate[(pix / {self.oh * self.ow}u) * {cexp}u + {{k}}]"
        total = rows * cout
        proj_binds = ((inputs["x"],) if self.residual else ()) + (d_read,) + gate_binds + (
            inputs["pw"], inputs["pb"]) + ((inputs["oa"],) if self.out_act == "prelu" else ()) + (out,)
        if not self.has_se and use_tiled_matmul(total // cout, cexp, cout, self.target()):
            value = self.out_activated(f"acc + pb[co]{residual}", "co")
            progs.append(product_program(
                f"{self.key}_project", proj_binds, total // cout, cexp, cout, "d", "pw", "y",
                f"let co = col;\n          let pix = row;\n          y[idx] = {value};",
                self.out_act_fn() + self.residual_fn()))
            return progs
        if self._few_rows_projection(total // cout):
            renamed = (dataclasses.replace(d_read, name="x"), dataclasses.replace(inputs["pw"], name="w"),
                       dataclasses.replace(inputs["pb"], name="b"))
            res = (dataclasses.replace(inputs["x"], name="res"),) if self.residual else ()
            progs.append(few_rows_program(f"{self.key}_project", renamed + res + (out,), total // cout, cexp, cout,
                                          activation_fn(self.out_act) if self.out_act != "linear" else "", True,
                                          self.residual))
            return progs
        # The per-output form, split between lanes. gemm.few_rows_program measured slower here over all the
        # projections (H200, 2026-12-04, batch 1, its store taking the bias, residual and output activation):
        # MobileNetV2's 16 projections 107.3 against 101.9 us, hand_landmark_lite's 13 75.8 against 65.7, the model
        # 253 against 240 us of GPU time; on at most 64 rows it is faster (_few_rows_projection).
        lanes = split_lanes(total, cexp, self.target())
        body = (f"  let co = idx % {cout}u;\n  let pix = idx / {cout}u;\n  var v = 0.0;\n  "
                + dot(cexp, f"d[pix * {cexp}u + {{k}}]{gated}", f"pw[({{k}}) * {cout}u + co]", lanes=lanes))
        progs.append(reduction_program(f"{self.key}_project", proj_binds, total, body,
                                       f"y[idx] = {self.out_activated(f'v + pb[co]{residual}', 'co')};",
                                       self.out_act_fn() + self.residual_fn(), lanes=lanes, acc="v",
                                       loop_trips=-(-(cexp // 4) // lanes)))
        return progs

    def _few_rows_projection(self, rows: int) -> bool:
        """Whether the staged and expand_dw strategies' projection runs as
        :func:`~tflfuse.kernels.gemm.few_rows_program` (each weight it loads serving several output pixels): on a
        GPU, for products that :func:`~tflfuse.kernels.gemm.use_few_rows` takes (at most 256 output pixels) with
        at most :data:`_FEW_ROWS_PROJECTION_MAX_ROWS` output pixels or at least :data:`_FEW_ROWS_PROJECTION_MIN_COLS`
        output channels, without squeeze-excite, a pooled residual or an output PReLU.

        Measured on an H100 (2026-12-05, ``sweep_bottleneck_strategies.py --batches=1``, once with
        ``--few_rows_projection_max_rows=64`` and once with ``=0``, whole-block GPU time of 20 runs back to back,
        median of 10 passes) against the per-output form with split lanes, on MobileNetV2's blocks with 7x7
        outputs: 7x7x160x6 -> 160 14.4 against 16.1 us, 7x7x160x6 -> 320 16.5 against 18.7, 14x14x96x6 -> 160
        at stride 2 14.0 against 14.2; the model at batch 1 (``benchmarks/run.py``, the same call) 0.230 ms of
        GPU time against 0.238 in the full runs of that session. On MobileNetV2's 14x14 maps (196 rows) the
        few-rows form lost before (below), so the bound stays at 64 rows. MediaPipe's blocks of 7x7 (hand
        landmark) and 8x8 (pose landmark) outputs take it too, not timed on their own.

        Since the few-rows form loads each trip's operands a trip early (``gemm.FEW_ROWS_EARLY_LOADS``), it wins
        on 14x14 and 16x16 maps too where the projection has 88 or more output channels
        (an H100, 2026-12-06, ``benchmarks/switch_ab.py``, 5 alternating rounds, batch 1): MobileNetV2's
        14x14x64x6 -> 96 and 14x14x96x6 -> 96 projections 5.30 against 6.14 us and 6.40-6.48 against 7.62-7.65
        (float16 0.69-0.77x), the model 217.7 against 221.2 us of GPU time (float16 219.2 against 228.4);
        hand_landmark_full's three 14x14 (196-row) projections 0.73-0.77x (float16 0.57-0.63x), the model 252.3
        against 261.2 us (float16 245.3 against 258.5); pose_landmark_full's 16x16 (256-row) projections to 88
        channels 0.82-0.86x (float16 0.62-0.64x), 3.8 us in all. With 64 output channels it lost in float32
        (MobileNetV2's 14x14x64x6 -> 64 and 28x28x32x6 -> 64 at stride 2: 5.53-5.59 against 4.94-5.00 us, 4.71
        against 3.98), hence the bound on channels: 88, the fewest measured faster. An expansion-free block whose
        projection this takes, run staged (its depthwise conv, then this product) rather than as ``dw_pointwise``,
        lost (pose_landmark_full's, the same machine and day: the model 481.9 against 456.3 us)."""
        return ((rows <= _FEW_ROWS_PROJECTION_MAX_ROWS or self.cout >= _FEW_ROWS_PROJECTION_MIN_COLS)
                and not self.has_se and self.out_act != "prelu"
                and not (self.residual and self.residual_pool == 2)
                and use_few_rows(rows, self.cexp, self.cout, self.target()))

    def _input_bindings(self) -> dict:
        """The op's inputs as bindings, by the names the staged programs give them."""
        names = (["x", "ew", "eb"] if self.has_expand else ["x"]) + ["dw", "db", "pw", "pb"] + (
            ["sw1", "sb1", "sw2", "sb2"] if self.has_se else []) + self.slope_names()
        return {name: self.binding(name, "input", i, self.inputs[i]) for i, name in enumerate(names)}

    def _expand_program(self, inputs: dict) -> Program:
        """The expansion into scratch buffer 0 (``[N, EH, EW, Cexp]``, through the expansion's activation): the
        1x1 conv (:func:`.conv.pointwise_expand_program`) or the 2x2 conv of stride 2
        (:meth:`_strided_expand_program`). ``inputs``: :meth:`_input_bindings`."""
        n, h, w, cin = self.input(0).shape
        e_out = self.binding("expanded", "scratch", 0, self.scratch_sizes()[0])
        slopes = (inputs["ea"],) if self.act == "prelu" else ()
        e_binds = (inputs["x"], inputs["ew"], inputs["eb"], *slopes, e_out)
        if self.expand_kernel == _STEM_KERNEL:
            return self._stem_expand_program(e_binds)
        if self.expand_stride == 2:
            return self._strided_expand_program(e_binds)
        return pointwise_expand_program(f"{self.key}_expand", e_binds, n * h * w, cin, self.cexp, self.act,
                                        self.target())

    def _stem_expand_program(self, bindings) -> Program:
        """The 3x3 expand conv of stride 2 (SAME, ``expand_kernel`` 3) into ``expanded`` ``[N, EH, EW, Cexp]``:
        CONV_2D's own program for that conv (:class:`~tflfuse.kernels.conv.Conv2D`, the filter HWIO, its
        schedule on this target), over bindings named ``x``, ``ew``, ``eb`` and ``expanded``, so the block runs
        the dispatch the unfolded stem would."""
        cin, k = self.input(0).shape[3], _STEM_KERNEL
        conv = Conv2D([self.input(0), TensorSpec((k, k, cin, self.cexp)), TensorSpec((self.cexp,))],
                      {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": self.act,
                       "filter_layout": "HWIO", "target": self.target()})
        (program,) = conv.programs()
        by_role = {("input", 0): bindings[0], ("input", 1): bindings[1], ("input", 2): bindings[2],
                   ("output", 0): bindings[-1]}
        return dataclasses.replace(program, name=f"{self.key}_expand", bindings=tuple(
            dataclasses.replace(b, role=by_role[b.role].role, size=by_role[b.role].size) for b in program.bindings))

    def _strided_expand_program(self, bindings) -> Program:
        """The staged strategy's 2x2 expand conv of stride 2 (VALID, ``expand_stride`` 2) over bindings named
        ``x``, ``ew`` (``[4 Cin, Cexp]``, tap ``(dy, dx)`` at rows ``(2 dy + dx) Cin``), ``eb`` (, ``ea``) and
        ``expanded`` ``[N, H // 2, W // 2, Cexp]``: one invocation per output, or lanes sharing its four 1x1 sums
        (:func:`~tflfuse.kernels.wgsl.split_lanes`), as TFLite's CONV_2D 2x2 of stride 2 then the activation."""
        n, h, w, cin = self.input(0).shape
        cexp = self.cexp
        total = n * self.eh * self.ewd * cexp
        lanes = split_lanes(total, 4 * cin, self.target())
        body = (f"  let e = idx % {cexp}u;\n  let pix = idx / {cexp}u;\n  let ox = pix % {self.ewd}u;\n"
                f"  let oy = (pix / {self.ewd}u) % {self.eh}u;\n  let n = pix / {self.ewd * self.eh}u;\n"
                f"  var v = 0.0;\n")
        for t in range(4):
            body += (f"  let xb{t} = ((n * {h}u + 2u * oy + {t // 2}u) * {w}u + 2u * ox + {t % 2}u) * {cin}u;\n  "
                     + dot(cin, f"x[xb{t} + {{k}}]", f"ew[({t * cin}u + {{k}}) * {cexp}u + e]", lanes=lanes) + "\n")
        return reduction_program(f"{self.key}_expand", bindings, total, body,
                                 f"expanded[idx] = {self.expand_activated('v + eb[e]', 'e')};", self._expand_act_fn(),
                                 lanes=lanes, acc="v", loop_trips=4 * -(-(cin // 4) // lanes))

    def _pointwise_block(self) -> int:
        """Output pixels per workgroup of the ``dw_pointwise`` strategy (:func:`.conv.pixel_block`, any size), or
        0 where a pixel's depthwise values do not fit workgroup memory."""
        n = self.input(0).shape[0]
        return pixel_block(n * self.oh * self.ow, self.cexp, self.cout, "gpu", any_size=True)

    def _dw_pointwise_programs(self) -> list[Program]:
        """The ``dw_pointwise`` strategy: the expansion where there is one (:meth:`_expand_program`, into scratch),
        then :func:`.conv.depthwise_pointwise_program` (the depthwise values of a block of output pixels in
        workgroup memory, through the depthwise bias and activation, then the 1x1 projection's sums, split
        between lanes as :func:`.conv.pointwise_split` models) with the projection's bias, the residual and the
        output activation in its store: the dispatches of the unfused graph's 1x1 conv and of
        fused_separable_conv2d, with the residual's pool and channel padding and the PReLUs in their stores."""
        n, h, w, cin = self.input(0).shape
        cexp = self.cexp
        g = dict(N=n, H=self.eh, W=self.ewd, OH=self.oh, OW=self.ow, SH=self.stride, SW=self.stride, DH=1, DW=1,
                 PT=self.pt, PL=self.pl, KH=self.k, KW=self.k)
        npix = n * self.oh * self.ow
        block, chunk, lanes = pointwise_split(npix, self._pointwise_block(), cexp, self.cout)
        act = activation_fn(self.dw_act)
        slopes = ["oa"] * (self.out_act == "prelu")
        if not self.has_expand:   # one dispatch over the op's input
            binds, progs, res = self.io_bindings(["x", "w", "db", "pw", "pb", *slopes, "y"]), [], "x"
        else:
            inputs = self._input_bindings()
            progs = [self._expand_program(inputs)]
            binds = ((self.binding("x", "scratch", 0, self.scratch_sizes()[0], access="read"),
                      dataclasses.replace(inputs["dw"], name="w"), inputs["db"], inputs["pw"], inputs["pb"])
                     + ((dataclasses.replace(inputs["x"], name="res"),) if self.residual else ())
                     + tuple(inputs[k] for k in slopes) + (self.binding("y", "output", 0, self.output_specs()[0]),))
            res = "res"
        residual = self.residual_term("q", "co", f"{res}[q * {cin}u + co]")
        return progs + [depthwise_pointwise_program(
            f"{self.key}_dw_pointwise", binds, g, cexp, 1, self.cout,
            block, f"y[idx] = {self.out_activated(f'acc + pb[co]{residual}', 'co')};",
            act + self.out_act_fn(declared=act) + self.residual_fn(res), chunk=chunk, lanes=lanes,
            dw_value="act(v + db[c])")]

    def _gate_program(self, d, se_binds, gate) -> Program:
        """The squeeze-excite gate ``[N, Cexp]``: one workgroup per image averages the depthwise output ``d``
        over its pixels (invocations stride over the channels, so neighbours read neighbouring floats), then
        the reduce 1x1 conv + ReLU and the expand 1x1 conv + hard_sigmoid run in workgroup memory. Matches
        MEAN over H, W, CONV_2D 1x1 + RELU, CONV_2D 1x1, ADD 3, RELU6, MUL 1/6 of the unfused graph."""
        n = self.input(0).shape[0]
        cexp, csq, pixels = self.cexp, self.csq, self.oh * self.ow
        threads = _GATE_THREADS
        main, tail = pixels - pixels % 4, pixels % 4
        sums = " + ".join(f"d[base + (p + {u}u) * {cexp}u]" for u in range(4))
        tails = "".join(f"\n    v += d[base + {main + u}u * {cexp}u];" for u in range(tail))
        source = prelude((d, *se_binds, gate)) + activation_fn("relu") + f"""
var<workgroup> pooled: array<f32, {cexp}>;
var<workgroup> squeezed: array<f32, {csq}>;

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let n = wid.x;
  for (var c = lidx; c < {cexp}u; c += {threads}u) {{
    let base = n * {pixels * cexp}u + c;
    var v = 0.0;
    for (var p = 0u; p < {main}u; p += 4u) {{ v += {sums or "0.0"}; }}{tails}
    pooled[c] = v / {pixels}.0;
  }}
  workgroupBarrier();
  for (var j = lidx; j < {csq}u; j += {threads}u) {{
    var v = sb1[j];
    {dot(cexp, "pooled[{k}]", f"sw1[({{k}}) * {csq}u + j]")}
    squeezed[j] = act(v);
  }}
  workgroupBarrier();
  for (var c = lidx; c < {cexp}u; c += {threads}u) {{
    var v = sb2[c];
    {dot(csq, "squeezed[{k}]", f"sw2[({{k}}) * {cexp}u + c]")}
    gate[n * {cexp}u + c] = clamp(v + 3.0, 0.0, 6.0) / 6.0;
  }}
}}
"""
        per = lambda c: -(-c // threads)  # noqa: E731
        trips = per(cexp) * (1 + main // 4) + per(csq) * (1 + cexp // 4) + per(cexp) * (1 + csq // 4)
        if n > MAX_WORKGROUPS_PER_DIM:
            raise self.fail(f"batch {n} exceeds {MAX_WORKGROUPS_PER_DIM} workgroups of the squeeze-excite pool")
        return Program(f"{self.key}_gate", source, (threads, 1, 1), (n, 1, 1), (d, *se_binds, gate),
                       loop_trips=trips)

    def programs(self):
        if self.strategy in ("staged", "dw_projection", "expand_dw"):
            return [dataclasses.replace(p, half_scratch=self.half_scratch()) for p in self._staged_programs()]
        if self.strategy == "blocked":
            names = (["x", "ew", "eb", "dw", "db", "pw", "pb"] if self.has_expand else
                     ["x", "dw", "db", "pw", "pb"]) + self.slope_names() + ["y"]
            return [blocked_program(self, self.io_bindings(names))]
        if self.strategy == "dw_pointwise":
            return self._dw_pointwise_programs()
        n, h, w, cin = self.input(0).shape
        cexp, cout, s = self.cexp, self.cout, self.stride
        hw, ec, cb, nblocks, per_split, splits = self._blocking()
        T = self.tile
        threads = T * T * self.lanes
        jb = -(-cb // self.lanes)  # accumulators per invocation
        names = (["x", "ew", "eb", "dw", "db", "pw", "pb"] if self.has_expand else ["x", "dw", "db", "pw", "pb"]) + \
            self.slope_names() + ["y"]
        binds = self.io_bindings(names)
        by_name = {b.name: b for b in binds}
        pixels = n * self.oh * self.ow
        if splits > 1:  # the main pass writes each split's share of the projection into scratch
            part = self.binding("part", "scratch", 0, splits * pixels * cout * 4)
            binds = tuple(b for b in binds if b.name not in ("pb", "oa", "y")) + (part,)
        depth = cin * self.expand_stride ** 2   # the expand conv's terms per output
        if self.has_expand and self.expand_stride == 1:
            expand = (f"        var v = eb[e];\n        let xb = ((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {cin}u;\n"
                      + "        " + dot(cin, "x[xb + {k}]", f"wsh[({{k}}) * {ec}u + c]"))
        elif self.has_expand:   # the 2x2 conv of stride 2: a 1x1 sum per tap (dy, dx), weights at (2 dy + dx) Cin + c
            expand = "        var v = eb[e];\n" + "".join(
                f"        let xb{t} = ((n * {h}u + 2u * u32(iy) + {t // 2}u) * {w}u + 2u * u32(ix) + {t % 2}u)"
                f" * {cin}u;\n        {dot(cin, f'x[xb{t} + {{k}}]', f'wsh[({t * cin}u + {{k}}) * {ec}u + c]')}\n"
                for t in range(4))
        if self.has_expand:
            expand += f"\n        val = {self.expand_activated('v', 'e')};"
            stage = f"""    // stage this chunk's expand weights in workgroup memory (coalesced reads)
    for (var i = lidx; i < {depth * ec}u; i += {threads}u) {{
      wsh[i] = ew[(i / {ec}u) * {cexp}u + e0 + i % {ec}u];
    }}
    workgroupBarrier();
"""
            stage_decl = f"var<workgroup> wsh: array<f32, {depth * ec}>;         // expand weights of the chunk\n"
        else:
            expand = f"        val = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {cin}u + e];"
            stage, stage_decl = "", ""
        K = self.k
        taps = " + ".join(f"halo[(u32(ly + {ky}) * {hw}u + u32(lx + {kx})) * {ec}u + c]"
                          f" * dw[{ky * K + kx}u * {cexp}u + e]" for ky in range(K) for kx in range(K))
        residual = self.residual_term(f"(n * {self.oh}u + u32(oy)) * {self.ow}u + u32(ox)", "co",
                                      f"x[((n * {h}u + u32(oy)) * {w}u + u32(ox)) * {cin}u + co]")
        lanes = self.lanes
        proj = " + ".join(f"dv[p * {ec}u + {c}u] * pw[(e0 + {c}u) * {cout}u + co]" for c in range(ec))
        out_at = f"((n * {self.oh}u + u32(oy)) * {self.ow}u + u32(ox)) * {cout}u + co"
        finish = (f"y[{out_at}] = {self.out_activated(f'acc[j] + pb[co]{residual}', 'co')};" if splits == 1 else
                  f"part[split * {pixels * cout}u + {out_at}] = acc[j];")
        source = prelude(binds) + self.activation_fns(output=splits == 1 or self.out_act != "prelu") + f"""
var<workgroup> halo: array<f32, {hw * hw * ec}>;   // expanded input halo, one chunk of channels
var<workgroup> dv: array<f32, {T * T * ec}>;          // depthwise results of the tile, same chunk
{stage_decl}
@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let split = wid.z % {splits}u;
  let n = wid.z / {splits * nblocks}u;
  let co0 = ((wid.z / {splits}u) % {nblocks}u) * {cb}u;
  let co_end = min(co0 + {cb}u, {cout}u);
  let ty0 = i32(wid.y) * {T};
  let tx0 = i32(wid.x) * {T};
  let p = lidx % {T * T}u;       // the output pixel of this invocation within the tile
  let lane = lidx / {T * T}u;    // which share of the output channels it handles
  let oy = ty0 + i32(p / {T}u);
  let ox = tx0 + i32(p % {T}u);
  let live = oy < {self.oh} && ox < {self.ow};
  let ly = (oy - ty0) * {s};
  let lx = (ox - tx0) * {s};
  var acc: array<f32, {jb}>;
  for (var e0 = split * {per_split}u; e0 < min(split * {per_split}u + {per_split}u, {cexp}u); e0 += {ec}u) {{
{stage}    // 1x1 expansion of the input halo for channels e0..e0+{ec}; zero outside the image (the padding).
    for (var i = lidx; i < {hw * hw * ec}u; i += {threads}u) {{
      let c = i % {ec}u;
      let e = e0 + c;
      let hx = i32((i / {ec}u) % {hw}u);
      let hy = i32(i / {ec * hw}u);
      let iy = ty0 * {s} - {self.pt} + hy;
      let ix = tx0 * {s} - {self.pl} + hx;
      var val = 0.0;
      if (iy >= 0 && iy < {self.eh} && ix >= 0 && ix < {self.ewd}) {{
{expand}
      }}
      halo[i] = val;
    }}
    workgroupBarrier();
    // {K}x{K} depthwise conv for this pixel, channels lane, lane + {lanes}, ...
    for (var c = lane; c < {ec}u; c += {lanes}u) {{
      let e = e0 + c;
      dv[p * {ec}u + c] = {self.dw_activated(f"db[e] + {taps}")};
    }}
    workgroupBarrier();
    // 1x1 projection: output channels co0 + lane + {lanes} j.
    for (var j = 0u; j < {jb}u; j++) {{
      let co = min(co0 + lane + {lanes}u * j, {cout - 1}u);
      acc[j] += {proj};
    }}
    workgroupBarrier();
  }}
  if (!live) {{ return; }}
  for (var j = 0u; j < {jb}u; j++) {{
    let co = co0 + lane + {lanes}u * j;
    if (co >= co_end) {{ break; }}
    {finish}
  }}
}}
"""
        dispatch = (-(-self.ow // T), -(-self.oh // T), n * nblocks * splits)
        if max(dispatch) > MAX_WORKGROUPS_PER_DIM:
            raise self.fail(f"dispatch {dispatch} exceeds {MAX_WORKGROUPS_PER_DIM} workgroups in a dimension")
        main = Program(self.key, source, (threads, 1, 1), dispatch, binds, loop_trips=self.loop_trips())
        if splits == 1:
            return [main]
        # The second pass: y = project_b + the splits' shares (+ x), one invocation per output element.
        res = self.residual_term(f"idx / {cout}u", f"idx % {cout}u", f"x[(idx / {cout}u) * {cin}u + idx % {cout}u]")
        body = (f"  var v = pb[idx % {cout}u]{res};\n"
                f"  for (var s = 0u; s < {splits}u; s++) {{ v += part[s * {pixels * cout}u + idx]; }}\n"
                f"  y[idx] = {self.out_activated('v', f'idx % {cout}u')};")
        slopes = (by_name["oa"],) if self.out_act == "prelu" else ()
        sum_binds = ((by_name["x"],) if self.residual else ()) + (by_name["pb"], *slopes, part, by_name["y"])
        total = pixels * cout
        return [main, elementwise_program(f"{self.key}_sum", sum_binds, total, body,
                                          self.out_act_fn() + self.residual_fn(), loop_trips=splits)]

"""fused_squeeze_excite: a squeeze-and-excitation block (SENet, MobileNetV3, EfficientNet) as one op.

Semantics (``composites.squeeze_excite.squeeze_excite``), for ``x [N, H, W, C]``::

    s = mean(x, axes H, W)                 # [N, C]        (keras GlobalAveragePooling2D)
    s = activation(s @ w1 + b1)            # [N, Cr]       (1x1 Conv2D or Dense, "relu" by default)
    s = gate(s @ w2 + b2)                  # [N, C]
    y = x * s[:, None, None, :]            # [N, H, W, C]

Op inputs: ``x``, ``w1`` ([C, Cr], or a 1x1 conv kernel [1, 1, C, Cr]), ``b1 [Cr]``, ``w2`` ([Cr, C] or
[1, 1, Cr, C]), ``b2 [C]``. Attributes: ``activation`` (a name of :data:`tflfuse.kernels.wgsl.ACTIVATIONS`) and
``gate``, one of :data:`GATES`, and two flags for the channel-attention blocks of segmentation decoders
(MediaPipe's selfie segmentation: a gate pooled from one tensor scales another, then a skip is added), each
adding an input after ``b2`` when set:

* ``has_scaled``: the gate scales ``scaled [N, H', W', C']`` instead of ``x`` (``w2`` is then ``[Cr, C']``):
  ``y = scaled * s[:, None, None, :]``;
* ``has_addend``: ``addend``, of the output's shape, is added last: ``y = ... * s[:, None, None, :] + addend``;
* ``has_squeeze`` (default true): false drops the first layer and its inputs ``w1``, ``b1`` (``w2`` is then
  ``[C, C']``): ``s = gate(mean(x) @ w2 + b2)``, a gate of one layer (the attention of MediaPipe's selfie
  segmentation decoder);
* ``pool_addend`` (with ``has_addend``, without ``has_scaled``, ``addend`` of x's shape): the mean is taken of
  ``x + addend``, the sum the decoder adds for its pool alone (``s = mean(x + addend, axes H, W)``): the ADD
  before the block goes with it.

The gate's values:

* ``"sigmoid"``: ``1 / (1 + exp(-v))``;
* ``"hard_sigmoid"``: ``relu6(v + 3) * (1 / 6)``, MobileNetV3's (``keras.applications.mobilenet_v3``); Keras 3's
  ``keras.activations.hard_sigmoid`` (``relu6(v + 3) / 6``) is the same function up to one rounding;
* ``"hard_sigmoid_keras2"``: ``clip(0.2 v + 0.5, 0, 1)``, the hard sigmoid of Keras 2 / ``tf.keras.backend``.

Dispatches: where one workgroup per image holds the C + Cr channels in workgroup memory, past 32 pixels a
partial sum of each chunk of 16 pixels per channel (many invocations, so one workgroup does not walk every
pixel), then the gate (the workgroup's invocations share the rows of each block of channels, reduce them in
workgroup memory, then run both fully-connected layers, each sum shared by up to 16 lanes that meet by a tree
in workgroup memory) and the scaling (one invocation per element of ``y``): two or three. On a GPU, where the
gate's C + C' + Cr values fit in workgroup memory, the gate and the scaling are one dispatch: each of its
workgroups computes its image's gate, then scales 2,048 elements with it (one dispatch fewer, whose fixed cost
on an NVIDIA H200 is 2-3 microseconds of GPU time and more of the host's); and where C is a multiple of 4 and an
image has at most 65,536 elements, each of those workgroups also sums the image itself (vec4 loads, a tree in
workgroup memory) instead of reading the partial sums: one dispatch in all; past 65,536 elements (C still a
multiple of 4) the workgroups sum the partial sums that way. Otherwise four or five (five or six with
``pool_addend``, whose x + addend is written first): the
mean as a two-pass parallel reduction (:func:`~tflfuse.kernels.fused.pool.reduce_hw_programs`), the two
fully-connected layers (one invocation per output), and the scaling, through scratch buffers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..base import (MAX_WORKGROUP_STORAGE, MAX_WORKGROUPS_PER_DIM, CompositeKernel, Program, TensorSpec,
                    linear_dispatch)
from ..registry import register
from ..wgsl import ACTIVATIONS, activation_fn, dot, elementwise_program, fmt_f32, helpers_for, lane_tree, prelude
from .pool import reduce_hw_chunks, reduce_hw_programs

__all__ = ["FusedSqueezeExcite", "GATES"]

_GATE_WG = 256          # invocations of the gate's workgroup (one workgroup per image)
_CHUNK = 16             # pixels per partial sum before the gate (past 32 pixels)
_WG_BYTES = MAX_WORKGROUP_STORAGE
_GATE_MAX_TRIPS = 16384  # loop iterations per invocation of the gate, well inside the software adapter's cap
#: Elements each invocation of the merged gate-and-scale dispatch scales (GPUs): every workgroup computes its
#: image's gate first, so fewer, fuller workgroups repeat that work less often, but each scales its share after
#: the gate, in series with it.
#: The most elements of one image that every workgroup of the merged dispatch sums itself (:meth:`_direct`),
#: and the vec4 loads each invocation keeps in flight while it does.
#: Measured on an H200 (2026-12-04, each of MediaPipe selfie segmentation's ten squeeze-excite ops alone, GPU
#: time of 20 back-to-back runs, one process per op): 4 elements and 8 loads in flight, against 8 and 4 before:
#: 16x16x128 5.8 against 6.2 us, 32x32x24 6.6 against 7.8, 64x64x16 7.8 against 9.0, the decoder's 64x64x16
#: with pool_addend 9.6 against 12.7, 128x128x16 9.2 against 9.9. Partial sums in a dispatch before would take
#: 0.5 and 2.0 us off the two 64x64x16 ones, but add a dispatch each, and that model's invokes back to back
#: are bound by the host's recording (about 4.5 us a dispatch on the H200's host), not by the GPU.
_SCALE_PER_INVOCATION = 4
_DIRECT_MAX_ELEMENTS, _DIRECT_UNROLL = 1 << 16, 8

#: gate name -> WGSL body of ``fn gate(v: f32) -> f32`` (NaN stays NaN, as in TensorFlow; the helpers they
#: call: :data:`~tflfuse.kernels.wgsl.HELPERS`).
GATES = {
    "sigmoid": "return 1.0 / (1.0 + exp_f(-v));",
    "hard_sigmoid": f"return select(clamp(v + 3.0, 0.0, 6.0) * {fmt_f32(1 / 6)}, v, is_nan(v));",
    "hard_sigmoid_keras2": "return select(clamp(0.2 * v + 0.5, 0.0, 1.0), v, is_nan(v));",
}


def _layer_lanes(rows: int, cols: int) -> int:
    """Invocations of the gate's workgroup that share each of a layer's ``cols`` sums of ``rows`` terms: the
    largest power of two up to 16 that leaves every lane an unrolled group of four terms and every sum of a
    pass a lane. One invocation per sum (the schedule before) walked a chain of ``rows / 4`` global loads of
    the weights: on an NVIDIA H200 the gate of a [1, 16, 16, 128] block (128 -> 32 -> 128) took 11.4
    microseconds, most of it that chain."""
    lanes = 1
    while lanes < 16 and 2 * lanes * 4 <= rows and 2 * lanes * min(cols, _GATE_WG) <= _GATE_WG:
        lanes *= 2
    return lanes


def _layer_trips(rows: int, cols: int) -> int:
    """Loop iterations of one invocation in :func:`_shared_layer`."""
    lanes = _layer_lanes(rows, cols)
    return -(-cols // (_GATE_WG // lanes)) * (-(-rows // (4 * lanes)) + 1 + lanes.bit_length())


def _shared_layer(src: str, w: str, b: str, rows: int, cols: int, store: str) -> str:
    """WGSL of the gate's workgroup computing a fully-connected layer from ``var<workgroup> {src}`` (``rows``
    values) with weights ``{w} [rows, cols]``: the ``cols`` sums in passes of ``256 / lanes``, each shared by
    :func:`_layer_lanes` lanes that meet in ``shares`` by a tree; ``store`` runs once per sum with ``j`` (the
    column) and ``acc`` (the sum, bias not added), then a barrier."""
    lanes = _layer_lanes(rows, cols)
    per = _GATE_WG // lanes
    return f"""  for (var j0 = 0u; j0 < {cols}u; j0 += {per}u) {{
    let lane = lidx / {per}u;
    let j = j0 + lidx % {per}u;
    var acc = 0.0;
    if (j < {cols}u) {{
      {dot(rows, f"{src}[{{k}}]", f"{w}[({{k}}) * {cols}u + j]", "acc", lanes=lanes)}
    }}
    shares[lidx] = acc;
    workgroupBarrier();
{lane_tree(lanes, per)}
    if (lane == 0u && j < {cols}u) {{
      let acc = shares[lidx];
      {store}
    }}
    workgroupBarrier();
  }}"""


@register("fused_squeeze_excite")
class FusedSqueezeExcite(CompositeKernel):
    """``x [N, H, W, C]`` float32 and the two layers' weights -> ``x * gate(act(mean(x) @ w1 + b1) @ w2 + b2)``,
    ``[N, H, W, C]``; with ``has_scaled`` the gate scales ``scaled [N, H', W', C']`` instead (the output's
    shape), with ``has_addend`` ``addend`` is added (see the module doc). Raises
    :class:`~tflfuse.kernels.KernelError` for weights whose shapes disagree with C and C', a scaled tensor of
    another batch, an addend not of the output's shape, no channels in x or in the squeeze (C or Cr 0), flags
    that are not bools, an unknown activation or gate."""

    input_names = ("x", "w1", "b1", "w2", "b2", "scaled", "addend")   # the last two as the has_* flags say
    attr_defaults = {"activation": "relu", "gate": "sigmoid", "has_scaled": False, "has_addend": False,
                     "pool_addend": False, "has_squeeze": True,
                     "target": "gpu"}

    def _matrix(self, i: int, name: str) -> tuple[int, int]:
        shape = self.expect_rank(i, 2, 4).shape
        if len(shape) == 4 and shape[:2] != (1, 1):
            raise self.fail(f"{name} must be [rows, cols] or a 1x1 conv kernel [1, 1, rows, cols], got {list(shape)}")
        return shape[-2], shape[-1]

    def check(self):
        self.has_scaled, self.has_addend = self.bool_attr("has_scaled"), self.bool_attr("has_addend")
        self.pool_addend = self.bool_attr("pool_addend")
        if self.pool_addend and (self.has_scaled or not self.has_addend):
            raise self.fail("pool_addend (the mean taken of x + addend) needs has_addend and not has_scaled")
        self.has_squeeze = self.bool_attr("has_squeeze")
        names = self._names()
        if len(self.inputs) != len(names):
            raise self.fail(f"expects {len(names)} inputs ({', '.join(names)}), got {len(self.inputs)}")
        at = {name: i for i, name in enumerate(names)}
        n, h, w, c = self.expect_rank(0, 4).shape
        out = self.expect_rank(at["scaled"], 4).shape if self.has_scaled else (n, h, w, c)
        cg = out[3]   # the gate's channels: those of the tensor it scales
        (cr2, c2), b2 = self._matrix(at["w2"], "w2"), self.expect_rank(at["b2"], 1).shape
        if self.has_squeeze:
            (c1, cr), b1 = self._matrix(1, "w1"), self.expect_rank(2, 1).shape
        else:   # the mean goes to the second layer as it is
            (c1, cr), b1 = (c, c), (c,)
        if c1 != c or cr2 != cr or c2 != cg or b1 != (cr,) or b2 != (cg,):
            first = f"w1 must be [{c}, Cr], b1 [Cr], w2 [Cr, {cg}]" if self.has_squeeze else f"w2 must be [{c}, {cg}]"
            got = f"w1 {list(self.input(1).shape)}, b1 {list(b1)}, " if self.has_squeeze else ""
            raise self.fail(f"weights do not fit {c} channels in and {cg} gates: {first}, b2 [{cg}]; got {got}"
                            f"w2 {list(self.input(at['w2']).shape)}, b2 {list(b2)}")
        if out[0] != n:
            raise self.fail(f"scaled {list(out)} must have the batch of x {list(self.input(0).shape)}")
        if c == 0 or cr == 0:
            raise self.fail(f"the mean and the squeeze need channels: x has {c} and w1 {cr} (give both at least "
                            f"one)")
        if self.has_addend and self.input(len(names) - 1).shape != tuple(out):
            raise self.fail(f"addend {list(self.input(len(names) - 1).shape)} must have the output's shape "
                            f"{list(out)}")
        self.c, self.cr, self.cg, self.out_shape = c, cr, cg, tuple(out)
        act, gate = str(self.attr("activation")).lower(), str(self.attr("gate")).lower()
        if act not in ACTIVATIONS:
            raise self.fail(f"unsupported activation {self.attr('activation')!r}; supported: {sorted(ACTIVATIONS)}")
        if gate not in GATES:
            raise self.fail(f"unsupported gate {self.attr('gate')!r}; supported: {sorted(GATES)}")
        self.activation, self.gate = act, gate

    def output_specs(self):
        return (TensorSpec(self.out_shape),)

    def _names(self) -> list[str]:
        """The names of the op's inputs, as its flags say."""
        return ["x"] + ["w1", "b1"] * self.has_squeeze + ["w2", "b2"] + ["scaled"] * self.has_scaled + \
            ["addend"] * self.has_addend

    def _binds(self) -> dict:
        """Binding name -> binding of every input and the output ``y``."""
        return {b.name: b for b in self.io_bindings(self._names() + ["y"])}

    def _layers(self) -> tuple:
        """The layers' bindings, as the programs bind them: (w1, b1, w2, b2), or (w2, b2) without the squeeze."""
        binds = self._binds()
        return tuple(binds[k] for k in ("w1", "b1", "w2", "b2") if k in binds)

    def _first_layer(self) -> str:
        """WGSL of the gate's workgroup computing ``squeezed`` from ``pooled`` (nothing without the squeeze, whose
        second layer reads ``pooled``)."""
        if not self.has_squeeze:
            return ""
        return _shared_layer("pooled", "w1", "b1", self.c, self.cr, "squeezed[j] = act(acc + b1[j]);")

    def _second_source(self) -> str:
        return "squeezed" if self.has_squeeze else "pooled"

    def _scaling(self, g: str, gi: str, vec4: tuple[str, ...] = ()) -> tuple[tuple, str]:
        """The scaling's bindings (the tensor scaled, the addend, ``y``; not the gate ``g``) and its WGSL
        statement for output ``idx``, the element's gate read as ``{g}[{gi}]``. The inputs named in ``vec4``
        (``"x"``, ``"addend"``) are read through the vec4 views the program binds for its mean (``x4[idx >> 2u][idx
        & 3u]``: the same element, the same address) and are left out of the bindings: a buffer bound twice
        takes two of WebGPU's default 8 storage buffers per shader stage, which the merged program with
        ``pool_addend`` (x4, addend4, the four weights, x, addend and y) passed."""
        binds = self._binds()
        src = "scaled" if self.has_scaled else "x"

        def read(name: str) -> str:
            return f"{name}4[idx >> 2u][idx & 3u]" if name in vec4 else f"{name}[idx]"
        names = [n for n in [src] + ["addend"] * self.has_addend if n not in vec4] + ["y"]
        add = f" + {read('addend')}" if self.has_addend else ""
        return tuple(binds[n] for n in names), f"y[idx] = {read(src)} * {g}[{gi}]{add};"

    def scratch_sizes(self):
        """Bytes of the gate ``[N, C']`` (two dispatches) and the partial sums (past 32 pixels; on a GPU these
        alone); or, stepwise, of the mean ``[N, C]``, the hidden layer ``[N, Cr]``, the gate ``[N, C']`` and
        (where the reduction takes two passes) its partial sums."""
        n, h, w, c = self.input(0).shape
        if self._two_dispatches():
            rows = self._rows()
            partial = (n * rows * c * 4,) if rows != h * w and not self._direct() else ()
            return partial if self._merged() else (n * self.cg * 4,) + partial
        _, chunks = reduce_hw_chunks(h * w)
        sizes = (n * c * 4, n * self.cr * 4, n * self.cg * 4)
        return sizes + ((n * chunks * c * 4,) if chunks > 1 else ()) + \
            ((n * h * w * c * 4,) if self.pool_addend else ())   # the partial sums, x + addend

    def programs(self):
        return self._gate_and_scale() if self._two_dispatches() else self._stepwise()

    def _two_dispatches(self) -> bool:
        """Whether one workgroup per image holds the channels and loops within bounds."""
        n, _, _, c = self.input(0).shape
        return (c + self.cr + _GATE_WG) * 4 <= _WG_BYTES and n <= MAX_WORKGROUPS_PER_DIM and \
            self._gate_trips() <= _GATE_MAX_TRIPS

    def _rows(self) -> int:
        """Rows the gate's workgroup reduces per channel: the pixels, or past :data:`_CHUNK` * 2 pixels the
        partial sums of chunks of :data:`_CHUNK` pixels (one workgroup per image then reads few values)."""
        _, h, w, _ = self.input(0).shape
        return h * w if h * w <= 2 * _CHUNK else -(-h * w // _CHUNK)

    def _gate_trips(self) -> int:
        n, h, w, c = self.input(0).shape
        cb = max(1, min(c, _GATE_WG))
        lanes = _GATE_WG // cb
        mean = -(-c // cb) * (-(-self._rows() // lanes) + lanes)
        if self._vec4_rows():   # passes over the vec4 columns: the loads, then the tree's levels
            cols = min(c // 4, _GATE_WG)
            lanes = _GATE_WG // cols
            mean = -(-(c // 4) // cols) * (-(-self._vec4_rows() // (lanes * _DIRECT_UNROLL)) + lanes.bit_length() + 1)
        return mean + _layer_trips(c, self.cr) * self.has_squeeze + _layer_trips(self.cr, self.cg)

    def _direct(self) -> bool:
        """Whether each workgroup of the merged dispatch (:meth:`_merged`) sums its image's pixels itself, as
        vec4s, instead of reading partial sums of a dispatch before it: one dispatch in all where an image has
        more than :data:`_CHUNK` * 2 pixels, C is a multiple of 4 and the image at most
        :data:`_DIRECT_MAX_ELEMENTS` elements (every workgroup then reads at most 256 KiB, from the GPU's L2).
        MediaPipe's selfie segmentation has nine such blocks of ten (16x16x96 to 64x64x16)."""
        _, h, w, c = self.input(0).shape
        return self._merged() and c % 4 == 0 and 2 * _CHUNK < h * w and h * w * c <= _DIRECT_MAX_ELEMENTS and \
            (c + self.cg + self.cr + 5 * _GATE_WG) * 4 <= _WG_BYTES   # and msums, 256 vec4s

    def _vec4_rows(self) -> int | None:
        """The rows of each image the merged dispatch sums as vec4s (:meth:`_vec4_mean`): its pixels where the
        mean is :meth:`_direct`; the partial sums of the dispatch before it where C is a multiple of 4 and the
        image is too large for that (the last blocks of MediaPipe's selfie segmentation, 128x128x16); else None
        (one value per load, each lane's loads in a chain)."""
        _, h, w, c = self.input(0).shape
        if self._direct():
            return h * w
        if self._merged() and c % 4 == 0 and self._rows() != h * w and \
                (c + self.cg + self.cr + 5 * _GATE_WG) * 4 <= _WG_BYTES:
            return self._rows()
        return None

    def _vec4_mean(self) -> str:
        """WGSL of the merged dispatch's mean into ``pooled`` (:meth:`_vec4_rows`), from ``x4`` (the pixels, with
        ``addend4`` where ``pool_addend``) or ``s4`` (the partial sums): invocation ``lidx`` sums vec4 column
        ``lidx % (C / 4)`` of every ``P``-th row (``P`` the rows one pass of the workgroup covers),
        :data:`_DIRECT_UNROLL` loads in flight, then the ``P`` sums of each column meet by a tree in workgroup
        memory."""
        _, h, w, c = self.input(0).shape
        rows, cq = self._vec4_rows(), c // 4
        pixels = h * w
        src, add = ("x4", self.pool_addend) if rows == pixels else ("s4", False)
        lanes = _GATE_WG // cq if cq <= _GATE_WG else 1
        cols = min(cq, _GATE_WG)
        tree = 1 << (lanes - 1).bit_length()
        step = lanes * _DIRECT_UNROLL
        at = [f"(n * {rows}u + min(p + {u * lanes}u, {rows - 1}u)) * {cq}u + q" for u in range(_DIRECT_UNROLL)]
        loads = "\n".join(
            f"      a{u} += select(vec4<f32>(0.0), {src}[{i}]{f' + addend4[{i}]' if add else ''}, "
            f"p + {u * lanes}u < {rows}u);" for u, i in enumerate(at))
        total = " + ".join(f"a{u}" for u in range(_DIRECT_UNROLL))
        return f"""  for (var q0 = 0u; q0 < {cq}u; q0 += {cols}u) {{
    let q = q0 + lidx % {cols}u;
    let pl = lidx / {cols}u;
    {" ".join(f"var a{u} = vec4<f32>(0.0);" for u in range(_DIRECT_UNROLL))}
    if (pl < {lanes}u && q < {cq}u) {{
      for (var p = pl; p < {rows}u; p += {step}u) {{
{loads}
      }}
    }}
    msums[lidx] = {total};
    workgroupBarrier();
    for (var s = {tree // 2}u; s > 0u; s >>= 1u) {{
      if (pl < s && pl + s < {lanes}u) {{ msums[lidx] += msums[lidx + s * {cols}u]; }}
      workgroupBarrier();
    }}
    if (pl == 0u && q < {cq}u) {{
      let m = msums[lidx] / {fmt_f32(float(pixels))};
      pooled[4u * q] = m.x;
      pooled[4u * q + 1u] = m.y;
      pooled[4u * q + 2u] = m.z;
      pooled[4u * q + 3u] = m.w;
    }}
    workgroupBarrier();
  }}"""

    def _merged(self) -> bool:
        """Whether the gate and the scaling share one dispatch (GPUs: every workgroup of the scaling computes its
        image's gate first, in workgroup memory, rather than reading it from a dispatch of one workgroup per
        image)."""
        c = self.input(0).shape[3]
        return self.target() == "gpu" and (c + self.cg + self.cr + _GATE_WG) * 4 <= _WG_BYTES

    def _gate_and_scale(self):
        """Two or three dispatches: (past 32 pixels, partial sums over chunks of pixels,) one workgroup per
        image computing the gate ``[N, C]`` (the mean, the two fully-connected layers in workgroup memory),
        then one invocation per element scaling ``x``. On a GPU (:meth:`_merged`) the last two are one: each
        workgroup of the scaling computes its image's gate, then scales :data:`_SCALE_PER_INVOCATION` elements
        per invocation with it."""
        n, h, w, c = self.input(0).shape
        cr, cg, pixels, rows = self.cr, self.cg, h * w, self._rows()
        size_out = int(np.prod(self.out_shape[1:]))   # elements of one image's output
        merged = self._merged()
        cb = max(1, min(c, _GATE_WG))           # channels per pass of the mean
        lanes = _GATE_WG // cb          # invocations sharing one channel's rows
        x, layers = self._binds()["x"], self._layers()
        g_w = self.binding("g", "scratch", 0, n * cg * 4)
        g_r = self.binding("g", "scratch", 0, n * cg * 4, access="read")
        progs, src, slot = [], x, 0 if merged else 1
        direct = self._direct()
        # pool_addend: the addend read beside x wherever x is summed (as vec4s too where the mean is direct)
        pool_binds = (self._binds()["addend"],) if self.pool_addend else ()

        def pooled_add(i: str) -> str:
            return f" + addend[{i}]" if self.pool_addend else ""
        if rows != pixels and not direct:   # partial sums over chunks of pixels, one per (image, chunk, channel)
            size = n * rows * c * 4
            body = f"""  let ch = idx % {c}u;
  let k = (idx / {c}u) % {rows}u;
  let img = idx / {c * rows}u;
  var v = 0.0;
  for (var p = k * {_CHUNK}u; p < min((k + 1u) * {_CHUNK}u, {pixels}u); p++) {{
    let i = (img * {pixels}u + p) * {c}u + ch;
    v += x[i]{pooled_add("i")};
  }}
  s[idx] = v;"""
            progs.append(elementwise_program(f"{self.key}_partial",
                                             (x, *pool_binds, self.binding("s", "scratch", slot, size)),
                                             n * rows * c, body, loop_trips=_CHUNK))
            src = self.binding("s", "scratch", slot, size, access="read")
        mean = f"""  for (var c0 = 0u; c0 < {c}u; c0 += {cb}u) {{
    var v = 0.0;
    if (c0 + cl < {c}u && part < {lanes}u) {{
      for (var p = part; p < {rows}u; p += {lanes}u) {{
        let i = (n * {rows}u + p) * {c}u + c0 + cl;
        v += {src.name}[i]{pooled_add("i") if src is x else ""};
      }}
    }}
    shares[lidx] = v;
    workgroupBarrier();
    if (part == 0u && c0 + cl < {c}u) {{
      var t = 0.0;
      for (var k = 0u; k < {lanes}u; k++) {{ t += shares[k * {cb}u + cl]; }}
      pooled[c0 + cl] = t / {fmt_f32(float(max(pixels, 1)))};
    }}
    workgroupBarrier();
  }}
"""
        if rows != pixels and not direct:
            pool_binds = ()   # summed into the partial sums
        vec4_rows = self._vec4_rows()
        if vec4_rows:   # the pixels (x read as vec4s too, the same buffer) or the partial sums, as vec4s
            mean = self._vec4_mean() + "\n"
            src = dataclasses.replace(src, name="x4" if direct else "s4", elem_type="vec4<f32>")
            pool_binds = tuple(dataclasses.replace(b, name="addend4", elem_type="vec4<f32>") for b in pool_binds)
        act, gate = activation_fn(self.activation), f"fn gate(v: f32) -> f32 {{ {GATES[self.gate]} }}\n"
        helpers = act + helpers_for(gate, declared=act) + gate + f"""
var<workgroup> shares: array<f32, {_GATE_WG}>;
var<workgroup> pooled: array<f32, {max(c, 1)}>;       // (WGSL has no arrays of 0 elements)
var<workgroup> squeezed: array<f32, {max(cr, 1)}>;
"""
        if merged:
            per = _GATE_WG * _SCALE_PER_INVOCATION          # elements each workgroup scales
            blocks = max(1, -(-size_out // per))
            groups = n * blocks
            # where the mean reads x (and the addend) as vec4s, the scaling reads them through the same views
            vec4 = ("x",) + ("addend",) * self.pool_addend if direct else ()
            scale_binds, scale = self._scaling("gates", f"e % {cg}u", vec4)
            binds = tuple(dict.fromkeys((src, *pool_binds, *layers) + scale_binds))
            sums = f"var<workgroup> msums: array<vec4<f32>, {_GATE_WG}>;\n" if vec4_rows else ""
            source = prelude(binds) + helpers + sums + f"""var<workgroup> gates: array<f32, {max(cg, 1)}>;

@compute @workgroup_size({_GATE_WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let grp = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (grp >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let n = grp / {blocks}u;
  let first = (grp % {blocks}u) * {per}u;
  let cl = lidx % {cb}u;
  let part = lidx / {cb}u;
{mean}
{self._first_layer()}
{_shared_layer(self._second_source(), "w2", "b2", cr, cg, "gates[j] = gate(acc + b2[j]);")}
  for (var e = first + lidx; e < min(first + {per}u, {size_out}u); e += {_GATE_WG}u) {{
    let idx = n * {size_out}u + e;
    {scale}
  }}
}}
"""
            trips = self._gate_trips() + _SCALE_PER_INVOCATION
            return progs + [Program(f"{self.key}_gate_scale", source, (_GATE_WG, 1, 1),
                                    linear_dispatch(groups * _GATE_WG, _GATE_WG), binds, loop_trips=trips)]
        source = prelude((src, *pool_binds, *layers, g_w)) + helpers + f"""
@compute @workgroup_size({_GATE_WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let n = wid.x;
  let cl = lidx % {cb}u;
  let part = lidx / {cb}u;
{mean}
{self._first_layer()}
{_shared_layer(self._second_source(), "w2", "b2", cr, cg, f"g[n * {cg}u + j] = gate(acc + b2[j]);")}
}}
"""
        progs.append(Program(f"{self.key}_gate", source, (_GATE_WG, 1, 1), (n, 1, 1),
                             (src, *pool_binds, *layers, g_w), loop_trips=self._gate_trips()))
        scale_binds, scale = self._scaling("g", f"(idx / {size_out}u) * {cg}u + idx % {cg}u")
        return progs + [elementwise_program(f"{self.key}_scale", (scale_binds[0], g_r) + scale_binds[1:],
                                            n * size_out, "  " + scale)]

    def _stepwise(self):
        """Where one workgroup per image cannot hold the channels (or would loop too long): the mean as a
        two-pass parallel reduction, each fully-connected layer, and the scaling, through scratch buffers."""
        n, h, w, c = self.input(0).shape
        cr, cg = self.cr, self.cg
        size_out = int(np.prod(self.out_shape[1:]))
        binds = self._binds()
        x, w2, b2 = binds["x"], binds["w2"], binds["b2"]
        sizes = self.scratch_sizes()
        s_w, hid_w, g_w = (self.binding(nm, "scratch", i, sizes[i]) for i, nm in enumerate(("s", "hid", "g")))
        s_r, hid_r, g_r = (self.binding(nm, "scratch", i, sizes[i], access="read")
                           for i, nm in enumerate(("s", "hid", "g")))
        partial = self.binding("part", "scratch", 3, sizes[3]) if len(sizes) > 3 + self.pool_addend else None
        progs = []
        if self.pool_addend:   # x + addend into a scratch buffer, the mean taken of it
            k = len(sizes) - 1
            progs.append(elementwise_program(f"{self.key}_pool_sum", (x, self._binds()["addend"],
                                                                      self.binding("xs", "scratch", k, sizes[k])),
                                             n * h * w * c, "  xs[idx] = x[idx] + addend[idx];"))
            x = self.binding("xs", "scratch", k, sizes[k], access="read")
        progs += reduce_hw_programs(f"{self.key}_mean", x, s_w, partial, n, h * w, c, "sum",
                                    f"acc / {fmt_f32(float(max(h * w, 1)))}")
        if self.has_squeeze:
            fc1 = (f"  let r = idx % {cr}u;\n  let img = idx / {cr}u;\n  var v = b1[r];\n  "
                   + dot(c, f"s[img * {c}u + {{k}}]", f"w1[({{k}}) * {cr}u + r]") + "\n  hid[idx] = act(v);")
            progs.append(elementwise_program(f"{self.key}_fc1", (s_r, binds["w1"], binds["b1"], hid_w), n * cr, fc1,
                                             activation_fn(self.activation), loop_trips=c // 4))
        else:   # the second layer reads the mean
            hid_r = dataclasses.replace(s_r, name="hid")
        fc2 = (f"  let ch = idx % {cg}u;\n  let img = idx / {cg}u;\n  var v = b2[ch];\n  "
               + dot(cr, f"hid[img * {cr}u + {{k}}]", f"w2[({{k}}) * {cg}u + ch]") + "\n  g[idx] = gate(v);")
        progs.append(elementwise_program(f"{self.key}_fc2", (hid_r, w2, b2, g_w), n * cg, fc2,
                                         f"fn gate(v: f32) -> f32 {{ {GATES[self.gate]} }}\n", loop_trips=cr // 4))
        scale_binds, scale = self._scaling("g", f"(idx / {size_out}u) * {cg}u + idx % {cg}u")
        progs.append(elementwise_program(f"{self.key}_scale", (scale_binds[0], g_r) + scale_binds[1:],
                                         n * size_out, "  " + scale))
        return progs

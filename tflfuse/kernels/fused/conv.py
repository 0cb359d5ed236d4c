"""The fused convolution ops: ``fused_conv2d``, ``fused_depthwise_conv2d`` and ``fused_separable_conv2d``.

Each computes ``act(conv(x) + bias + residual)`` in one op (TensorFlow.js' fused-conv semantics: the
residual is added BEFORE the activation), the convolution as TensorFlow's (``tf.nn.conv2d``,
``tf.nn.depthwise_conv2d``, ``tf.nn.separable_conv2d``), NHWC float32, filters in TensorFlow's / Keras'
layouts (not TFLite's):

* ``fused_conv2d``: inputs ``x [N, H, W, Cin]``, ``filters [KH, KW, Cin, Cout]`` (HWIO);
* ``fused_depthwise_conv2d``: ``x``, ``filters [KH, KW, Cin, M]`` -> ``Cout = Cin * M`` (channel
  ``c * M + m``);
* ``fused_separable_conv2d``: ``x``, ``depthwise_filter [KH, KW, Cin, M]``, ``pointwise_filter
  [1, 1, Cin * M, Cout]`` (or ``[Cin * M, Cout]``): the depthwise conv (strides, dilations, padding) then
  the 1x1 pointwise conv.

then, present as the flags say (the composite sets them; absent inputs are not in the op at all):
``bias [Cout]`` (``has_bias``), ``residual`` broadcastable to the output or ``[N, OH, OW, Cr]`` with ``1 < Cr <
Cout`` channels, zero-extended at the end as TFLite's PAD of the last axis would, or with ``Cr > Cout``, whose
first ``Cout`` channels are added, as TFLite's STRIDED_SLICE of the last axis from 0 would take them
(``has_residual``; the forms :func:`tflfuse.fuse` folds a channel PAD or slice before the residual ADD into;
with ``residual_pool`` 2 the residual is
``[N, H, W, Cr]`` that a 2x2 max pool of stride 2, VALID, brings to ``OH = H // 2``, ``OW = W // 2`` first:
BlazeFace's and BlazePalm's downsampling blocks), PReLU slopes
broadcastable to the output, e.g. ``[Cout]``, ``[1, 1, Cout]`` or ``[OH, OW, Cout]`` (``has_prelu``, with
``activation="prelu"``), and ``post_affine [2, Cout]`` (``has_post_affine``): per-channel scales, then shifts,
applied last, ``y = y * post_affine[0] + post_affine[1]`` (TFLite's DEPTHWISE_CONV_2D 1x1 of multiplier 1 after
the activation, a BatchNorm left in the file, as in MediaPipe's hand_recrop); and for ``fused_conv2d`` alone,
``input_prelu_alpha [Cin]`` (``has_input_prelu``): the PReLU slopes of a PRELU applied to ``x`` before the conv.
Output ``[N, OH, OW, Cout]``,
``OH`` as TensorFlow computes it for the padding.

Attributes: ``strides`` and ``dilations`` (lists of 2 ints), ``padding`` (``"SAME"``/``"VALID"``),
``residual_pool`` (1, the default, or 2: see above),
``activation`` (one of :data:`FUSED_ACTIVATIONS`), ``alpha`` (float: leaky_relu's negative slope, elu's
alpha; default Keras'), ``has_bias``, ``has_residual``, ``has_prelu``, ``has_post_affine``, ``has_input_prelu``
(bools), and
``residual_after_activation`` (bool, default False: ``act(conv(x) + bias) + residual``, as TFLite's ADD after
a conv with a fused RELU computes it).

:class:`FusedEpilogue` (bias, residual, activation) is shared with ``fused_matmul``.
"""

from __future__ import annotations

import numpy as np

from ..base import MAX_WORKGROUP_STORAGE, CompositeKernel, KernelError, Program, TensorSpec, linear_dispatch
from ..conv import (SUM_STORED_LATER, conv_output_size, conv_strip, conv_strip_program, conv_strip_quads,
                    depthwise_program, is_pointwise, window_body, window_lanes, window_taps)
from ..elementwise import broadcast_index
from ..registry import register
from ..gemm import MatmulTile, product_program, tile_attr, use_tiled_matmul
from ..wgsl import (activation_fn, activation_uniforms, dot, elementwise_program, lane_tree, prelude,
                    reduction_program, split_lanes)
from .depthwise_product import depthwise_product_program, fits_depthwise_product

__all__ = ["FUSED_ACTIVATIONS", "FusedConv2D", "FusedDepthwiseConv2D", "FusedEpilogue", "FusedSeparableConv2D",
           "MEASURED_SEPARABLE", "SEPARABLE_MAX_CHANNELS", "SEPARABLE_PRODUCT_MAX_COUT", "SEPARABLE_STRATEGIES",
           "depthwise_pointwise_program", "max_pool_2x2", "padded_channels", "pixel_block", "separable_product_tile",
           "sliced_channels", "window_geometry"]

#: Workgroup memory (floats) of the one-dispatch separable schedule: 16 KiB, WebGPU's default limit.
_SEP_SHARED_FLOATS = MAX_WORKGROUP_STORAGE // 4
#: The most depthwise channels (Cin * M) of a :func:`depthwise_pointwise_program`: one pixel's depthwise values
#: beside the lanes' shares in workgroup memory.
SEPARABLE_MAX_CHANNELS = _SEP_SHARED_FLOATS - 256
#: Most 1x1 terms one invocation of the one-dispatch separable schedule may sum alone (MediaPipe's separable
#: convs, measured faster in one dispatch, need 128-256).
_PIXEL_BLOCK_MAX_TERMS = 512

#: The fused convs' refusal of an input without channels (a sum of no terms: nothing to fuse).
_NO_CHANNELS = ("the input has no channels (Cin 0): the conv's sums have no terms; give the op at least one "
                "input channel")
#: Activations of the fused ops (Keras' semantics; ``prelu`` takes its slopes from an input tensor).
FUSED_ACTIVATIONS = ("linear", "relu", "relu6", "elu", "leaky_relu", "prelu", "sigmoid", "tanh", "hard_swish",
                     "gelu", "gelu_tanh")
_FLAGS = ("has_bias", "has_residual", "has_prelu", "has_post_affine", "has_input_prelu")
_OPTIONAL_NAMES = {"has_bias": "bias", "has_residual": "res", "has_prelu": "slope", "has_post_affine": "post",
                   "has_input_prelu": "in_slope"}


def max_pool_2x2(buf: str, base: str, channels: int, width: int) -> str:
    """WGSL of the max of a 2x2 window of NHWC binding ``buf`` whose top-left element is at index ``base``, in
    rows of ``width`` pixels of ``channels`` channels: TFLite's MAX_POOL_2D 2x2 at one output element."""
    c, w = channels, width
    return (f"max(max({buf}[{base}], {buf}[{base} + {c}u]), "
            f"max({buf}[{base} + {w * c}u], {buf}[{base} + {(w + 1) * c}u]))")


def padded_channels(out_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a residual of ``shape`` is the output's shape with fewer channels (``1 < Cr < Cout``, the last
    axis), which the fused ops zero-extend at the end: TFLite's PAD of the last axis by ``[0, Cout - Cr]``.
    One channel broadcasts instead, as TensorFlow's ADD would."""
    return (len(shape) == len(out_shape) >= 1 and tuple(shape[:-1]) == tuple(out_shape[:-1])
            and 1 < shape[-1] < out_shape[-1])


def sliced_channels(out_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a residual of ``shape`` is the output's shape with more channels (``Cr > Cout``, the last
    axis), of which the fused ops add the first ``Cout``: TFLite's STRIDED_SLICE of the last axis from 0 that
    takes every other axis whole (``x[..., :Cout]``)."""
    return (len(shape) == len(out_shape) >= 1 and tuple(shape[:-1]) == tuple(out_shape[:-1])
            and shape[-1] > out_shape[-1])


class FusedEpilogue(CompositeKernel):
    """Base of the fused ops: ``main_inputs`` leading inputs, then the optional bias, residual and PReLU
    slopes named by the ``has_*`` flags, and the WGSL ``fn epilogue(v, idx, co) -> f32`` that adds the
    bias (``b[co]``) and residual (broadcast from output index ``idx``) and applies the activation."""

    main_inputs: tuple[str, ...] = ()
    #: after main_inputs, as their flags say
    input_names = ("bias", "residual", "prelu_alpha", "post_affine", "input_prelu_alpha")
    attr_defaults = {"activation": "linear", "alpha": None, "has_bias": True, "has_residual": False,
                     "has_prelu": False, "residual_pool": 1, "target": "gpu", "residual_after_activation": False,
                     "has_post_affine": False, "has_input_prelu": False}
    #: Whether the op takes ``has_input_prelu`` (a PReLU of its input, applied as the input is read).
    takes_input_prelu = False

    def check_epilogue(self, out_shape: tuple[int, ...], cout: int) -> None:
        """Validates the flags against the inputs, their shapes, and the activation; sets ``self.flags``."""
        self.flags = {f: self.bool_attr(f) for f in _FLAGS}
        expected = len(self.main_inputs) + sum(self.flags.values())
        if len(self.inputs) != expected:
            raise self.fail(f"expects {expected} inputs ({', '.join(self.main_inputs)} and "
                            f"{', '.join(f for f, v in self.flags.items() if v) or 'no optional input'}), got "
                            f"{len(self.inputs)}")
        self.activation = str(self.attr("activation")).lower()
        if self.activation not in FUSED_ACTIVATIONS:
            raise self.fail(f"unsupported activation {self.activation!r}; supported: {list(FUSED_ACTIVATIONS)}")
        if (self.activation == "prelu") != self.flags["has_prelu"]:
            raise self.fail(f"activation {self.activation!r} with has_prelu={self.flags['has_prelu']}: the PReLU "
                            f"slopes are an input exactly when the activation is 'prelu'")
        alpha = self.attr("alpha")
        if alpha is not None and not isinstance(alpha, (int, float)):
            raise self.fail(f"attribute alpha must be a float, got {alpha!r}")
        self.out_shape, self.cout = tuple(out_shape), cout
        self.residual_pool = self.attr("residual_pool")
        if self.residual_pool not in (1, 2) or isinstance(self.residual_pool, bool):
            raise self.fail(f"attribute residual_pool must be 1 (none) or 2 (a 2x2 max pool of stride 2), got "
                            f"{self.residual_pool!r}")
        if self.residual_pool == 2 and not self.flags["has_residual"]:
            raise self.fail("residual_pool 2 pools the residual: it needs has_residual")
        self.residual_after = self.bool_attr("residual_after_activation")
        if self.residual_after and not self.flags["has_residual"]:
            raise self.fail("residual_after_activation adds the residual after the activation: it needs has_residual")
        pos = len(self.main_inputs)
        self.optional = []  # binding names of the present optional inputs, in order
        for flag in _FLAGS:
            if not self.flags[flag]:
                continue
            spec = self.expect_rank(pos, *range(0, 7))
            if flag == "has_input_prelu":
                self._check_input_prelu(spec.shape)
            elif flag == "has_bias" and spec.shape != (cout,):
                raise self.fail(f"bias must have shape [{cout}], got {list(spec.shape)}")
            if flag == "has_post_affine" and spec.shape != (2, cout):
                raise self.fail(f"post_affine must have shape [2, {cout}] (per-channel scales, then shifts), got "
                                f"{list(spec.shape)}")
            if flag == "has_residual" and self.residual_pool == 2:
                self._check_pooled_residual(spec.shape)
            elif flag not in ("has_bias", "has_post_affine", "has_input_prelu"):
                try:
                    ok = np.broadcast_shapes(out_shape, spec.shape) == tuple(out_shape)
                except ValueError:
                    ok = False
                if not ok and flag == "has_residual" and (padded_channels(out_shape, spec.shape)
                                                          or sliced_channels(out_shape, spec.shape)):
                    ok = True   # fewer channels, zero-extended at the end (a folded channel PAD), or more
                if not ok:
                    what = "residual" if flag == "has_residual" else "prelu_alpha"
                    raise self.fail(f"{what} of shape {list(spec.shape)} does not broadcast to the output "
                                    f"shape {list(out_shape)}"
                                    + (f" and is not [{', '.join(map(str, out_shape[:-1]))}, Cr] with Cr > 1 "
                                       f"(fewer channels are zero-extended, more cut to the first {cout})"
                                       if flag == "has_residual" and out_shape else ""))
            self.optional.append((_OPTIONAL_NAMES[flag], spec))
            pos += 1

    def _check_input_prelu(self, shape: tuple[int, ...]) -> None:
        """``input_prelu_alpha``: one slope per input channel, ``[Cin]`` or ``[1, ..., 1, Cin]`` (TFLite's PRELU
        slopes of a per-channel PReLU: Keras' ``PReLU(shared_axes=[1, 2])``), on an op that takes it."""
        if not self.takes_input_prelu:
            raise self.fail("has_input_prelu (a PReLU of the input, applied as it is read) is taken by fused_conv2d "
                            "only: run the PRELU as its own op before this one")
        cin = self.input(0).shape[-1]
        if not shape or shape[-1] != cin or any(d != 1 for d in shape[:-1]):
            raise self.fail(f"input_prelu_alpha must hold one slope per input channel, [{cin}] or [1, ..., 1, "
                            f"{cin}], got {list(shape)}")

    def input_prelu_fn(self) -> str:
        """WGSL ``fn xin(i: u32, c: u32) -> f32``: the input's element ``x[i]`` of channel ``c`` through the input
        PReLU where ``has_input_prelu`` (TFLite's PRELU: ``x >= 0 ? x : x * alpha[c]``; NaN stays NaN), else
        ``x[i]``."""
        value = "select(v * in_slope[c], v, v >= 0.0)" if self.flags["has_input_prelu"] else "v"
        return f"fn xin(i: u32, c: u32) -> f32 {{\n  let v = x[i];\n  return {value};\n}}\n"

    def _check_pooled_residual(self, shape: tuple[int, ...]) -> None:
        """A residual that a 2x2 max pool of stride 2 (VALID) brings to the output's pixels: ``[N, H, W, Cr]``
        with ``H // 2 == OH``, ``W // 2 == OW`` and ``Cr`` the output's channels or fewer (zero-extended)."""
        if len(self.out_shape) != 4:
            raise self.fail(f"residual_pool 2 needs an NHWC output, got {list(self.out_shape)}")
        n, oh, ow, cout = self.out_shape
        if len(shape) != 4 or shape[0] != n or shape[1] // 2 != oh or shape[2] // 2 != ow or \
                not (shape[3] >= cout or padded_channels(self.out_shape, (n, oh, ow, shape[3]))):
            raise self.fail(f"residual of shape {list(shape)} with residual_pool 2 must be [{n}, H, W, Cr] with H // 2 "
                            f"= {oh}, W // 2 = {ow} and Cr >= {cout} or 1 < Cr < {cout}")

    def _pooled_residual(self, cr: int) -> tuple[str, str]:
        """WGSL lines and the term of the residual pooled by a 2x2 max pool of stride 2 at output ``idx``."""
        _, oh, ow, cout = self.out_shape
        rh, rw = dict(self.optional)["res"].shape[1:3]
        lines = (f"  let rq = idx / {cout}u;\n  let rox = rq % {ow}u;\n  let roy = (rq / {ow}u) % {oh}u;\n"
                 f"  let rb = (((rq / {ow * oh}u) * {rh}u + 2u * roy) * {rw}u + 2u * rox) * {cr}u + "
                 f"min(co, {max(cr - 1, 0)}u);\n"
                 f"  let rv = {max_pool_2x2('res', 'rb', cr, rw)};\n")
        return lines, ("rv" if cr >= cout else f"select(0.0, rv, co < {cr}u)")

    def epilogue_names(self) -> list[str]:
        return [name for name, _ in self.optional]

    def epilogue_fn(self) -> str:
        """WGSL ``fn epilogue(v: f32, idx: u32, co: u32) -> f32`` (and ``act``): ``v + bias + residual`` through
        the activation; with ``residual_after_activation`` the residual is added after it instead; then, with
        ``has_post_affine``, ``* post_affine[0, co] + post_affine[1, co]``."""
        lines, terms, after = [], ["v"], []
        for name, spec in self.optional:
            if name == "bias":
                terms.append("bias[co]")
            elif name == "res" and self.residual_pool == 2:
                pooled, term = self._pooled_residual(spec.shape[-1])
                lines.append(pooled)
                terms.append(term)
            elif name == "res" and padded_channels(self.out_shape, spec.shape):
                cr = spec.shape[-1]   # channels co >= cr are the PAD's zeros; the index stays in bounds
                lines.append(f"  let ri = (idx / {self.cout}u) * {cr}u + min(co, {max(cr - 1, 0)}u);\n")
                terms.append(f"select(0.0, res[ri], co < {cr}u)")
            elif name == "res" and sliced_channels(self.out_shape, spec.shape):   # its first cout channels
                lines.append(f"  let ri = (idx / {self.cout}u) * {spec.shape[-1]}u + co;\n")
                terms.append("res[ri]")
            elif name == "res":
                lines.append(broadcast_index(self.out_shape, spec.shape, "ri"))
                terms.append("res[ri]")
        if self.residual_after:   # the residual's term (the last one taken) goes after the activation
            after.append(terms.pop())
        if self.activation == "prelu":
            slope = dict(self.optional)["slope"]
            lines.append(broadcast_index(self.out_shape, slope.shape, "si"))
            activated = "select(r * slope[si], r, r >= 0.0)"
            act = ""
        else:
            activated = "act(r)"
            act = activation_fn(self.activation, uniform_alpha=True)
        if not after and not self.flags["has_post_affine"]:
            finish = f"  return {activated};"
        else:
            finish = f"  var o = {' + '.join([activated] + after)};\n"
            if self.flags["has_post_affine"]:
                finish += f"  o = o * post[co] + post[{self.cout}u + co];\n"
            finish += "  return o;"
        return (act + "fn epilogue(v: f32, idx: u32, co: u32) -> f32 {\n" + "".join(lines)
                + f"  let r = {' + '.join(terms)};\n{finish}\n}}\n")

    def epilogue_uniforms(self):
        return activation_uniforms(self.activation, self.attr("alpha"))


def window_geometry(kernel, kh: int, kw: int) -> dict:
    """The window geometry (:func:`~tflfuse.kernels.conv.window_body`'s ``g``) of a ``kh x kw`` filter over
    ``kernel``'s input 0 ``[N, H, W, C]`` from its ``strides`` and ``dilations`` (2 ints >= 1, or one for
    both) and ``padding`` (``"SAME"`` / ``"VALID"``) attributes, as TFLite computes it
    (:func:`~tflfuse.kernels.conv.conv_output_size`). Raises the kernel's :class:`~tflfuse.kernels.KernelError`
    for other values or an empty window."""
    n, h, w, _ = kernel.input(0).shape
    pairs = {}
    for name in ("strides", "dilations"):
        v = kernel.attr(name)
        v = [v, v] if isinstance(v, (int, np.integer)) else list(v) if isinstance(v, (list, tuple, np.ndarray)) \
            else None
        if v is None or len(v) != 2 or not all(isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_))
                                               and e >= 1 for e in v):
            raise kernel.fail(f"{name} must be 2 ints >= 1 (or one for both), got {kernel.attr(name)!r}")
        pairs[name] = [int(e) for e in v]
    (sh, sw), (dh, dw) = pairs["strides"], pairs["dilations"]
    pad = str(kernel.attr("padding")).upper()
    if pad not in ("SAME", "VALID"):
        raise kernel.fail(f"padding must be 'SAME' or 'VALID', got {kernel.attr('padding')!r}")
    if min(kh, kw) < 1:
        raise kernel.fail(f"filter window {kh}x{kw} is empty")
    oh, pt = conv_output_size(h, kh, sh, dh, pad)
    ow, pl = conv_output_size(w, kw, sw, dw, pad)
    return dict(N=n, H=h, W=w, OH=oh, OW=ow, SH=sh, SW=sw, DH=dh, DW=dw, PT=pt, PL=pl, KH=kh, KW=kw)


class _FusedWindow(FusedEpilogue):
    """Shared geometry of the fused convolutions (``strides``, ``dilations``, ``padding`` attributes)."""

    attr_defaults = {**FusedEpilogue.attr_defaults, "strides": [1, 1], "dilations": [1, 1], "padding": "VALID"}

    def geometry(self, kh: int, kw: int) -> dict:
        return window_geometry(self, kh, kw)

    def output_specs(self):
        return (TensorSpec(self.out_shape),)


@register("fused_conv2d")
class FusedConv2D(_FusedWindow):
    """``act(tf.nn.conv2d(x, filters, strides, padding, dilations) + bias + residual)``: input
    ``x [N, H, W, Cin]``, ``filters [KH, KW, Cin, Cout]`` (HWIO) -> ``[N, OH, OW, Cout]`` float32. One
    invocation per output element. With ``has_input_prelu``, ``input_prelu_alpha`` (``[Cin]`` or ``[1, ..., 1,
    Cin]``, the last optional input) makes it ``conv(prelu(x))``: TFLite's PRELU of the input, applied as each
    element is read (padding stays zero), in the per-output form (the tiled 1x1 and 4-channel strip forms read
    the input directly): a PRELU whose input another op reads too, such as MediaPipe's hand_recrop's, then needs
    no dispatch of its own. Raises :class:`~tflfuse.kernels.KernelError` for filters whose Cin
    differs from the input's (grouped convolution is not supported), bad strides/dilations/padding, flags
    that disagree with the inputs, an unknown activation."""

    main_inputs = ("x", "filters")
    input_names = main_inputs + FusedEpilogue.input_names
    takes_input_prelu = True

    def check(self):
        x, f = self.expect_rank(0, 4), self.expect_rank(1, 4)
        kh, kw, fcin, cout = f.shape
        if fcin != x.shape[3]:
            raise self.fail(f"filters [KH, KW, Cin, Cout] have Cin {fcin}, the input has {x.shape[3]} channels "
                            f"(grouped convolution is not supported)")
        if fcin == 0:
            raise self.fail(_NO_CHANNELS)
        self.g = self.geometry(kh, kw)
        self.check_epilogue((x.shape[0], self.g["OH"], self.g["OW"], cout), cout)

    def _form(self) -> tuple[str, int]:
        """``("tiled", 0)``: a tiled 1x1 product; ``("strip", pixels)``: strips of four (or eight:
        :func:`~tflfuse.kernels.conv.conv_strip_quads`) output channels (:func:`~tflfuse.kernels.conv.conv_strip`);
        ``("window", 0)``: one invocation (or a few lanes) per output element, the form that alone applies
        ``has_input_prelu`` (so always with it)."""
        g, cin = self.g, self.input(0).shape[3]
        if self.flags["has_input_prelu"]:
            return "window", 0
        if is_pointwise(g) and use_tiled_matmul(g["N"] * g["OH"] * g["OW"], cin, self.cout, self.target()):
            return "tiled", 0
        strip = conv_strip(g, cin, self.cout, self.target())
        return ("strip", strip) if strip else ("window", 0)

    def reads_per_output(self) -> bool:
        """Whether the op runs one invocation (or a few lanes) per output element (:meth:`_form`), the form that
        alone applies ``has_input_prelu``."""
        return self._form()[0] == "window"

    def programs(self):
        g, cin, cout = self.g, self.input(0).shape[3], self.cout
        total = int(np.prod(self.out_shape))
        names = ["x", "w"] + self.epilogue_names() + ["y"]
        form, strip = self._form()
        if form == "tiled":
            rows = g["N"] * g["OH"] * g["OW"]
            return [product_program(self.key, self.io_bindings(names), rows, cin, cout, "x", "w", "y",
                                    "y[idx] = epilogue(acc, idx, col);", self.epilogue_fn(),
                                    self.epilogue_uniforms())]
        if form == "strip":   # vec4s of output channels, a strip of pixels per invocation; epilogue per channel
            comps = ", ".join(f"epilogue(acc.{c}, base + {j}u, c * 4u + {j}u)" for j, c in enumerate("xyzw"))
            store = f"let base = pix * {cout}u + c * 4u;\n    y[pix * {cout // 4}u + c] = vec4<f32>({comps});"
            return [conv_strip_program(self.key, self.io_bindings(names), g, cin, cout, strip, store,
                                       self.epilogue_fn(), self.epilogue_uniforms(),
                                       quads=conv_strip_quads(g, cin, cout, strip))]
        pre = self.flags["has_input_prelu"]   # the per-output form alone reads the input through xin()
        lanes = window_lanes(total, g, cin, self.target())
        inner = f"""      let xb = ((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u;
      let wb = (u32(ky) * {g['KW']}u + u32(kx)) * {cin * cout}u + co;
      {dot(cin, 'xin(xb + {k}, {k})' if pre else 'x[xb + {k}]', f'w[wb + ({{k}}) * {cout}u]', 'acc', lanes=lanes)}"""
        body = window_body(g, cout, "  var acc = 0.0;", inner, "acc", store=SUM_STORED_LATER)
        trips = g["KH"] * (1 + g["KW"] * (1 + -(-(cin // 4) // lanes)))
        helpers = self.epilogue_fn() + (self.input_prelu_fn() if pre else "")
        return [reduction_program(self.key, self.io_bindings(names), total, body, "y[idx] = epilogue(acc, idx, co);",
                                  helpers, self.epilogue_uniforms(), lanes=lanes, loop_trips=trips)]


def _depthwise_body(g: dict, cin: int, mult: int, src: str, store: str) -> str:
    """Window body of a depthwise conv over ``src`` (NHWC, ``cin`` channels) with filter ``w`` ``[KH, KW,
    cin * mult]``; ``acc`` holds the sum when ``store`` runs."""
    cout = cin * mult
    inner = f"""      acc += {src}[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + ci]
           * w[(u32(ky) * {g['KW']}u + u32(kx)) * {cout}u + co];"""
    return window_body(g, cout, f"  let ci = co / {mult}u;\n  var acc = 0.0;", inner, "acc", store=store)


@register("fused_depthwise_conv2d")
class FusedDepthwiseConv2D(_FusedWindow):
    """``act(tf.nn.depthwise_conv2d(x, filters, strides, padding, dilations) + bias + residual)``: input
    ``x [N, H, W, Cin]``, ``filters [KH, KW, Cin, M]`` (M the depth multiplier) -> ``[N, OH, OW, Cin * M]``
    float32, output channel ``c * M + m``. Raises :class:`~tflfuse.kernels.KernelError` for filters whose
    Cin differs from the input's, bad strides/dilations/padding, flags that disagree with the inputs."""

    main_inputs = ("x", "filters")
    input_names = main_inputs + FusedEpilogue.input_names

    def check(self):
        x, f = self.expect_rank(0, 4), self.expect_rank(1, 4)
        kh, kw, fcin, self.mult = f.shape
        if fcin != x.shape[3] or self.mult < 1:
            raise self.fail(f"filters [KH, KW, Cin, M] must have Cin {x.shape[3]} (the input's) and M >= 1, "
                            f"got {list(f.shape)}")
        self.g = self.geometry(kh, kw)
        cout = fcin * self.mult
        self.check_epilogue((x.shape[0], self.g["OH"], self.g["OW"], cout), cout)

    def programs(self):
        g = self.g
        body = _depthwise_body(g, self.input(0).shape[3], self.mult, "x", "y[idx] = epilogue(acc, idx, co);")
        names = ["x", "w"] + self.epilogue_names() + ["y"]
        return [elementwise_program(self.key, self.io_bindings(names), int(np.prod(self.out_shape)), body,
                                    self.epilogue_fn(), self.epilogue_uniforms(), loop_trips=g["KH"] * (1 + g["KW"]))]


@register("fused_separable_conv2d")
class FusedSeparableConv2D(_FusedWindow):
    """``act(tf.nn.separable_conv2d(x, depthwise_filter, pointwise_filter, strides, padding, dilations) +
    bias + residual)``: input ``x [N, H, W, Cin]``, ``depthwise_filter [KH, KW, Cin, M]``,
    ``pointwise_filter [1, 1, Cin * M, Cout]`` (or ``[Cin * M, Cout]``) -> ``[N, OH, OW, Cout]`` float32.

    Three schedules (the ``strategy`` tuning attribute), the same values:

    * ``one_dispatch`` (GPUs, small layers: :func:`pixel_block`, and the layers of :data:`MEASURED_SEPARABLE`):
      a workgroup computes the depthwise values of
      a block of output pixels into workgroup memory, then those pixels' outputs from them, each 1x1 sum
      shared between lanes where the model of :func:`pointwise_split` says so;
    * ``depthwise_product`` (GPUs, layers whose pointwise product is tiled,
      :func:`~tflfuse.kernels.gemm.use_tiled_matmul`, with depth multiplier 1, Cin and Cout multiples of 4 and
      at most :data:`SEPARABLE_PRODUCT_MAX_COUT` output channels):
      one dispatch of the tiled product whose A slices are the depthwise values, computed as they are staged
      (:func:`.depthwise_product.depthwise_product_program`): no tensor between the two convs, one dispatch
      fewer (measured on an H200 against two dispatches: :func:`separable_product_tile`);
    * ``two_dispatches`` (the software adapter, and large layers the product does not take): the depthwise conv
      into a scratch buffer ``[N, OH, OW, Cin * M]`` (DEPTHWISE_CONV_2D's program:
      :func:`~tflfuse.kernels.conv.depthwise_program`), then the pointwise conv with bias, residual and
      activation (tiled in workgroup memory where it is large).

    On an NVIDIA H200 two other one-dispatch forms measured slower than two dispatches: a tiled kernel that
    recomputed the depthwise values per block of 64 output channels, behind a barrier per chunk of 32 (2.0
    ms for face_landmark's 20 separable convs against 0.47 ms), and one that recomputed each depthwise value
    per output channel (35 against 13 microseconds for iris_landmark's [1, 16, 16, 64] -> 128 blocks).

    Raises :class:`~tflfuse.kernels.KernelError` for filters that do not fit the input or each other."""

    main_inputs = ("x", "depthwise_filter", "pointwise_filter")
    input_names = main_inputs + FusedEpilogue.input_names
    #: tuning only: ``strategy`` (one of :data:`SEPARABLE_STRATEGIES`; absent: :meth:`strategy`'s choice),
    #: ``pointwise_lanes``, the lanes of the one-dispatch schedule's 1x1 sums (a power of two up to 16;
    #: :func:`pointwise_split` chooses where absent), and ``matmul_tile``, the depthwise product's tile.
    extra_attrs = ("strategy", "pointwise_lanes", "matmul_tile")

    def check(self):
        x, dwf = self.expect_rank(0, 4), self.expect_rank(1, 4)
        pwf = self.expect_rank(2, 2, 4)
        kh, kw, fcin, self.mult = dwf.shape
        if fcin != x.shape[3] or self.mult < 1:
            raise self.fail(f"depthwise_filter [KH, KW, Cin, M] must have Cin {x.shape[3]} (the input's) and "
                            f"M >= 1, got {list(dwf.shape)}")
        if fcin == 0:
            raise self.fail(_NO_CHANNELS)
        self.cmid = fcin * self.mult
        if pwf.shape[:-2] not in ((), (1, 1)) or pwf.shape[-2] != self.cmid:
            raise self.fail(f"pointwise_filter must be [1, 1, {self.cmid}, Cout] or [{self.cmid}, Cout] "
                            f"(Cin * M = {self.cmid}), got {list(pwf.shape)}")
        self.g = self.geometry(kh, kw)
        cout = pwf.shape[-1]
        self.check_epilogue((x.shape[0], self.g["OH"], self.g["OW"], cout), cout)
        self.target()
        lanes = self.attrs.get("pointwise_lanes")
        if lanes is not None and (isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1
                                  or lanes > _MAX_LANES or lanes & (lanes - 1)):
            raise self.fail(f"pointwise_lanes must be a power of two from 1 to {_MAX_LANES}, got {lanes!r}")
        self.strategy()
        tile_attr(self)

    def strategy(self) -> str:
        """The schedule (the class docstring): the ``strategy`` attribute where given (checked: a
        :class:`~tflfuse.kernels.KernelError` naming what the op lacks for it), else ``one_dispatch`` where
        :func:`pixel_block` gives a block or :data:`MEASURED_SEPARABLE` names it on a GPU (output pixels, depthwise
        channels and output channels), ``depthwise_product`` where it takes the layer on a GPU, the
        pointwise product is tiled and has at most :data:`SEPARABLE_PRODUCT_MAX_COUT` output channels, else
        ``two_dispatches``; and ``two_dispatches`` for an empty output (no pixels: its programs' invocations
        return at once), whichever is asked for."""
        given = self.attrs.get("strategy")
        g = self.g
        rows = g["N"] * g["OH"] * g["OW"]
        product = self.mult == 1 and fits_depthwise_product(self.cmid, self.cout)
        if given not in (None, "") + SEPARABLE_STRATEGIES:
            raise self.fail(f"strategy must be one of {', '.join(map(repr, SEPARABLE_STRATEGIES))}, got {given!r}")
        if not rows:   # an empty output: nothing to compute, whichever schedule is asked for
            return "two_dispatches"
        if given in (None, ""):
            if self._pixel_block():
                return "one_dispatch"
            if self.target() == "gpu" and (rows, self.cmid, self.cout) in MEASURED_SEPARABLE and \
                    self._pixel_block(True):
                return "one_dispatch"
            if product and self.cout <= SEPARABLE_PRODUCT_MAX_COUT and \
                    use_tiled_matmul(rows, self.cmid, self.cout, self.target()):
                return "depthwise_product"
            return "two_dispatches"
        if given == "one_dispatch" and not self._pixel_block(True):
            raise self.fail(f"strategy 'one_dispatch': one pixel's {self.cmid} depthwise values do not fit "
                            f"workgroup memory (at most {SEPARABLE_MAX_CHANNELS}); give 'two_dispatches'")
        if given == "depthwise_product" and not product:
            raise self.fail(f"strategy 'depthwise_product' needs depth multiplier 1 and Cin and Cout multiples "
                            f"of 4, got M {self.mult}, Cin * M {self.cmid}, Cout {self.cout}; give "
                            f"'two_dispatches'")
        return given

    def scratch_sizes(self):
        if self.strategy() != "two_dispatches":
            return ()
        g = self.g
        return (g["N"] * g["OH"] * g["OW"] * self.cmid * 4,)

    def _pixel_block(self, any_size: bool = False) -> int:
        """Output pixels per workgroup of the one-dispatch schedule (:func:`pixel_block`), or 0."""
        g = self.g
        return pixel_block(g["N"] * g["OH"] * g["OW"], self.cmid, self.cout, self.target(), any_size=any_size)

    def programs(self) -> list[Program]:
        strategy = self.strategy()
        if strategy == "one_dispatch":
            return [self._one_dispatch()]
        if strategy == "depthwise_product":
            return [self._depthwise_product()]
        g, cmid, cout = self.g, self.cmid, self.cout
        size = self.scratch_sizes()[0]
        inputs = {n: self.binding(n, "input", i, self.inputs[i]) for i, n in enumerate(["x", "w", "pw"])}
        dw_binds = (inputs["x"], inputs["w"], self.binding("y", "scratch", 0, size))   # DEPTHWISE_CONV_2D's
        depthwise = depthwise_program(f"{self.key}_depthwise", dw_binds, g, self.input(0).shape[3], self.mult,
                                      False, None)
        opt = [self.binding(n, "input", len(self.main_inputs) + i, s) for i, (n, s) in enumerate(self.optional)]
        pw_binds = (self.binding("d", "scratch", 0, size, access="read"), inputs["pw"], *opt,
                    self.binding("y", "output", 0, self.output_specs()[0]))
        total = int(np.prod(self.out_shape))
        rows = g["N"] * g["OH"] * g["OW"]
        if use_tiled_matmul(rows, cmid, cout, self.target()):
            return [depthwise, product_program(f"{self.key}_pointwise", pw_binds, rows, cmid, cout, "d", "pw", "y",
                                               "y[idx] = epilogue(acc, idx, col);", self.epilogue_fn(),
                                               self.epilogue_uniforms())]
        lanes = split_lanes(total, cmid, self.target())
        body = f"""  let co = idx % {cout}u;
  let pix = idx / {cout}u;
  var acc = 0.0;
  {dot(cmid, f'd[pix * {cmid}u + {{k}}]', f'pw[({{k}}) * {cout}u + co]', 'acc', lanes=lanes)}"""
        pointwise = reduction_program(f"{self.key}_pointwise", pw_binds, total, body,
                                      "y[idx] = epilogue(acc, idx, co);", self.epilogue_fn(), self.epilogue_uniforms(),
                                      lanes=lanes, loop_trips=-(-(cmid // 4) // lanes))
        return [depthwise, pointwise]

    def _depthwise_product(self) -> Program:
        g = self.g
        binds = self.io_bindings(["x", "dw", "pw"] + self.epilogue_names() + ["y"])
        tile = tile_attr(self) or separable_product_tile(self.cmid)
        return depthwise_product_program(self.key, binds, g, self.cmid, self.cout, None,
                                         "y[idx] = epilogue(acc, idx, col);", tile, self.epilogue_fn(),
                                         scalar_store=True, uniforms=self.epilogue_uniforms())

    def _one_dispatch(self) -> Program:
        binds = self.io_bindings(["x", "w", "pw"] + self.epilogue_names() + ["y"])
        g = self.g
        block, chunk, lanes = pointwise_split(g["N"] * g["OH"] * g["OW"], self._pixel_block(True), self.cmid, self.cout,
                                              self.attrs.get("pointwise_lanes"))
        return depthwise_pointwise_program(
            self.key, binds, self.g, self.input(0).shape[3], self.mult, self.cout, block,
            "y[idx] = epilogue(acc, idx, co);", self.epilogue_fn(), self.epilogue_uniforms(), chunk=chunk,
            lanes=lanes)


def pixel_block(rows: int, cmid: int, cout: int, target: str, any_size: bool = False) -> int:
    """Output pixels per workgroup of a :func:`depthwise_pointwise_program`, or 0 where two dispatches (a
    depthwise conv into a scratch buffer, then the 1x1 conv) serve better; with ``any_size`` (for a caller that
    has its own reasons, on any target) 0 only where a pixel's depthwise values do not fit workgroup memory.

    On a GPU, where the 1x1 product (``rows`` pixels x ``cmid`` -> ``cout`` channels) is too small to tile
    (:func:`~tflfuse.kernels.wgsl.use_tiled_matmul`) and a pixel's ``cmid`` depthwise values fit in
    workgroup memory, one dispatch computes a block of pixels' depthwise values there and then the block's
    outputs from them: small layers at batch 1 are bound by each dispatch's fixed cost (on an NVIDIA H200
    about 4 microseconds of GPU time and as much CPU time to record: in one run MediaPipe's face detector,
    iris and palm models took 11-17% less time per invoke this way, face_landmark 10% more, each with
    10-15% more GPU time). The block is the fewest pixels (a power of two up to 64) that give the
    workgroup's 256 invocations a value each.
    """
    if not rows or not cout or cmid > SEPARABLE_MAX_CHANNELS or (not any_size and (
            target != "gpu" or use_tiled_matmul(rows, cmid, cout, "gpu"))):
        return 0
    block = 1
    while block < 64 and block * min(cmid, cout) < 256 and 2 * block * cmid <= _SEP_SHARED_FLOATS:
        block *= 2
    # Each invocation computes ceil(block * cout / 256) outputs of cmid terms alone: past a few hundred
    # terms (few pixels, wide channels) the two dispatches, whose 1x1 conv splits long sums, serve better.
    if not any_size and -(-block * cout // 256) * cmid > _PIXEL_BLOCK_MAX_TERMS:
        return 0
    return block


#: The schedules of ``fused_separable_conv2d`` (its ``strategy`` tuning attribute; :class:`FusedSeparableConv2D`).
SEPARABLE_STRATEGIES = ("one_dispatch", "depthwise_product", "two_dispatches")


#: Separable convs (``(N * OH * OW, Cin * M, Cout)``) that a GPU runs in the one-dispatch schedule although their
#: pointwise product is tiled (so that :func:`pixel_block` gives none): measured faster than the depthwise
#: product and two dispatches on an H200 (``benchmarks/sweep_separable.py --product``, 2026-12-04, GPU time
#: of 20 runs back to back, median of 9), with 5x5 windows at stride 1: [1, 48, 48, 64] -> 64 6.8 us against
#: 9.3 (depthwise product) and 9.6 (two dispatches); [1, 96, 96, 32] -> 64 5.4 against 6.0 and 8.2;
#: [1, 96, 96, 16] -> 16 4.0 against 4.4 and 6.5. It lost on [1, 96, 96, 32] -> 32 (8.6 against 6.6 and 9.4).
MEASURED_SEPARABLE: frozenset[tuple[int, int, int]] = frozenset({(2304, 64, 64), (9216, 32, 64), (9216, 16, 16)})
#: The most output channels for which a GPU runs a separable conv as a depthwise product by default (the
#: widest measured; each tile of 32 columns computes the depthwise values again).
SEPARABLE_PRODUCT_MAX_COUT = 64


def separable_product_tile(cmid: int) -> MatmulTile:
    """The tile of a separable conv's ``depthwise_product`` schedule with ``cmid`` depthwise channels: 32 x 32
    outputs in two slice groups of 16 depths each (``"32x32/4x4/32/2"``), or ``"64x32/4x8/16"`` on fewer than 32
    depthwise channels, which would leave half of a 32-deep slice empty.

    Measured on an H200 (``benchmarks/sweep_separable.py --product``, 2026-12-04, GPU time of 20 runs back to
    back, median of 9) on the MediaPipe models' separable convs that two dispatches ran (one dispatch of the
    depthwise conv, one of the tiled 1x1 conv), 5x5 windows at stride 1: [1, 96, 96, 32] -> 32 6.6 us against
    9.3 for two dispatches and 9.3-12.8 for 8 other tiles; [1, 96, 96, 32] -> 64 6.1 against 8.4;
    [1, 48, 48, 64] -> 64 9.2 against 9.4 (the other tiles 13.0-21.4); [1, 96, 96, 16] -> 16 4.4 (64x32/4x8/16)
    against 6.5. In all, these 18 layers 134 against 161 us (:data:`MEASURED_SEPARABLE` takes three of the four
    shapes to the one-dispatch schedule, faster still)."""
    return MatmulTile.parse("32x32/4x4/32/2" if cmid >= 32 else "64x32/4x8/16")


#: :func:`pointwise_split`'s model: invocations in flight at once and the most lanes it picks, fitted to
#: ``benchmarks/sweep_separable.py`` on an NVIDIA H200 (2026-12-02); ``pointwise_lanes`` may ask for up to 16.
_IN_FLIGHT, _SPLIT_MAX_LANES, _MAX_LANES = 1 << 17, 8, 16


def pointwise_split(npix: int, block: int, cmid: int, cout: int, lanes: int | None = None) -> tuple[int, int, int]:
    """``(block, chunk, lanes)`` of a :func:`depthwise_pointwise_program` on a GPU, given the pixels per
    workgroup :func:`pixel_block` chose: ``lanes`` invocations share each 1x1 sum of ``cmid`` terms, and a
    workgroup computes ``chunk`` of the ``cout`` output channels of ``block`` pixels.

    A small layer at batch 1 is bound by the latency of each invocation's serial chain of loads, not by its
    arithmetic. Unless given, the lanes are the power of two up to 8 with the least modelled time: ``max(1,
    npix * cout * lanes / 2**17)`` waves of invocations times the steps of one invocation, ``ceil(cmid / (4
    lanes))`` unrolled groups of loads plus a quarter step for each level of the tree that adds the shares
    (ties to fewer lanes). Fitted to ``benchmarks/sweep_separable.py`` over the 41 distinct one-dispatch
    separable convs of the MediaPipe models (92 in all) on an NVIDIA H200 (2026-12-02): 2968 us in all against
    4496 us with one invocation per sum (the schedule before), 3274 us with 2 lanes everywhere and 2927 us
    for the best lanes of each; (1, 12, 12, 256) -> 256 (11 of them) 61 against 84 us, (1, 6, 6, 256) -> 256
    39 against 82 us. With lanes, the workgroup's 256 invocations hold ``256 / lanes`` outputs: ``block``
    pixels of ``chunk`` channels each, the block the largest power of two whose pixels' channels fit those
    outputs (at most ``npix``, its depthwise values in workgroup memory; the given block is not used); each
    chunk of channels recomputes its pixels' depthwise values (``KH * KW`` multiply-adds each). ``lanes ==
    1``: the given block, every channel (``chunk == cout``).
    """
    outputs = npix * cout
    if lanes is None:
        def cost(n: int) -> tuple[float, int]:   # waves x (unrolled steps + a quarter step per tree level)
            return max(1.0, outputs * n / _IN_FLIGHT) * (-(-cmid // (4 * n)) + (n.bit_length() - 1) / 4), n
        lanes = min((1 << i for i in range(_SPLIT_MAX_LANES.bit_length()) if (1 << i) * 4 <= max(cmid, 4)),
                    key=cost)
    if lanes == 1:
        return block, cout, 1
    per = 256 // lanes
    block = 1
    while block * 2 * cout <= per and block * 2 <= npix and (block * 2) * cmid <= _SEP_SHARED_FLOATS - 256:
        block *= 2
    return block, per // block, lanes


def depthwise_pointwise_program(name: str, binds, g: dict, cin: int, mult: int, cout: int, block: int, store: str,
                                helpers: str = "", uniforms=(), chunk: int | None = None,
                                lanes: int = 1, dw_value: str = "v") -> Program:
    """One dispatch of a depthwise conv (``x [N, H, W, cin]``, filter ``w [KH, KW, cin * mult]``, geometry
    ``g`` of :func:`~tflfuse.kernels.conv.window_body`) then a 1x1 conv (``pw [cin * mult, cout]``).

    A workgroup of 256 invocations owns ``block`` output pixels (:func:`pixel_block`): it writes their
    depthwise values to workgroup memory, then computes their outputs from there. ``store`` runs once per
    output with ``acc`` (the 1x1 sum), ``q`` (the output pixel), ``co`` and ``idx = q * cout + co``.

    With ``lanes > 1`` (:func:`pointwise_split`), a workgroup owns ``chunk`` output channels of its
    ``block`` pixels (``block * chunk * lanes == 256``), ``lanes`` invocations share each 1x1 sum (the
    unrolled groups of :func:`~tflfuse.kernels.wgsl.dot`) and the shares meet in workgroup memory by a tree.

    ``dw_value``: the WGSL expression, over the depthwise sum ``v`` and its channel ``c``, that the 1x1 conv
    reads (e.g. ``act(v + db[c])``: a bottleneck block's depthwise bias and activation, whose bindings and
    functions ``binds`` and ``helpers`` hold).

    Four output channels per invocation of the second phase (vec4 loads of ``pw``, the block unchanged)
    measured slower on an NVIDIA H200 (2026-12-01): fused_separable_conv2d took 660 against 478-529 us
    in palm_detection_full and 245 against 177-181 us in face_landmark (two runs without it), three quarters of the invocations idle.

    The same schedule measured slower for MobileNetV2's bottleneck blocks (depthwise, then the projection
    over up to 960 channels into far fewer): 0.98 against 0.36 ms of GPU time for the whole model on an
    NVIDIA H200, each invocation walking a long projection sum alone.
    """
    cmid = cin * mult
    npix = g["N"] * g["OH"] * g["OW"]
    if lanes > 1:
        return _split_pointwise_program(name, binds, g, cin, mult, cout, block, chunk or cout, lanes, store,
                                        helpers, uniforms, dw_value)
    groups = -(-npix // block)
    trips = -(-block * cmid // 256) * (1 + g["KH"] * (1 + g["KW"])) + -(-block * cout // 256) * (1 + cmid // 4)
    source = prelude(binds, uniforms) + helpers + f"""
var<workgroup> dsh: array<f32, {block * cmid}>;   // the depthwise values of the workgroup's pixels

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let grp = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (grp >= {groups}u) {{ return; }}   // a whole workgroup: the barrier stays uniform
  let pix0 = grp * {block}u;
{_depthwise_phase(g, cin, mult, block, npix, "pix0", dw_value)}
  workgroupBarrier();
  for (var i = lidx; i < {block * cout}u; i += 256u) {{
    let q = pix0 + i / {cout}u;
    if (q >= {npix}u) {{ break; }}
    let co = i % {cout}u;
    let base = (i / {cout}u) * {cmid}u;
    var acc = 0.0;
    {dot(cmid, 'dsh[base + {k}]', f'pw[({{k}}) * {cout}u + co]', 'acc')}
    let idx = q * {cout}u + co;
    {store}
  }}
}}
"""
    return Program(name, source, (256, 1, 1), linear_dispatch(groups * 256, 256), binds, uniforms, loop_trips=trips)


def _depthwise_phase(g: dict, cin: int, mult: int, block: int, npix: int, pix0: str, value: str = "v") -> str:
    """WGSL filling ``dsh`` with the depthwise values of the ``block`` pixels from ``pix0`` (``value`` of the sum
    ``v`` and channel ``c``; ``v`` zero past the tensor): phase 1 of :func:`depthwise_pointwise_program`."""
    cmid = cin * mult
    taps = window_taps(g, f"""          v += x[((n * {g['H']}u + u32(iy)) * {g['W']}u + u32(ix)) * {cin}u + ci]
               * w[(u32(ky) * {g['KW']}u + u32(kx)) * {cmid}u + c];""", indent="      ")
    return f"""  for (var i = lidx; i < {block * cmid}u; i += 256u) {{
    let q = {pix0} + i / {cmid}u;
    let c = i % {cmid}u;
    var v = 0.0;
    if (q < {npix}u) {{
      let ox = i32(q % {g['OW']}u);
      let oy = i32((q / {g['OW']}u) % {g['OH']}u);
      let n = q / {g['OW'] * g['OH']}u;
      let ci = c / {mult}u;
{taps}
    }}
    dsh[i] = {value};
  }}"""


def _split_pointwise_program(name: str, binds, g: dict, cin: int, mult: int, cout: int, block: int, chunk: int,
                             lanes: int, store: str, helpers: str, uniforms, dw_value: str = "v") -> Program:
    """:func:`depthwise_pointwise_program` with ``lanes`` invocations per 1x1 sum and ``chunk`` output channels
    per workgroup."""
    cmid = cin * mult
    npix = g["N"] * g["OH"] * g["OW"]
    per = 256 // lanes
    if block * chunk != per or block * cmid > _SEP_SHARED_FLOATS - 256:
        raise KernelError(f"{name}: {block} pixels x {chunk} channels x {lanes} lanes must be 256 invocations "
                          f"and {block} x {cmid} depthwise values fit in workgroup memory")
    chunks = -(-cout // chunk)
    groups = -(-npix // block) * chunks
    trips = (-(-block * cmid // 256) * (1 + g["KH"] * (1 + g["KW"])) + -(-cmid // (4 * lanes)) + 1
             + lanes.bit_length())
    source = prelude(binds, uniforms) + helpers + f"""
var<workgroup> dsh: array<f32, {block * cmid}>;   // the depthwise values of the workgroup's pixels
var<workgroup> shares: array<f32, 256>;           // the lanes' shares of the 1x1 sums

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let grp = (wid.z * nwg.y + wid.y) * nwg.x + wid.x;
  if (grp >= {groups}u) {{ return; }}   // a whole workgroup: the barriers stay uniform
  let part = grp % {chunks}u;           // the chunk of output channels
  let pix0 = (grp / {chunks}u) * {block}u;
{_depthwise_phase(g, cin, mult, block, npix, "pix0", dw_value)}
  workgroupBarrier();
  let lane = lidx / {per}u;
  let o = lidx % {per}u;
  let q = pix0 + o / {chunk}u;
  let co = part * {chunk}u + o % {chunk}u;
  let live = q < {npix}u && co < {cout}u;
  var acc = 0.0;
  if (live) {{
    let base = (o / {chunk}u) * {cmid}u;
    {dot(cmid, 'dsh[base + {k}]', f'pw[({{k}}) * {cout}u + co]', 'acc', lanes=lanes)}
  }}
  shares[lidx] = acc;
  workgroupBarrier();
{lane_tree(lanes, per)}
  if (lane == 0u && live) {{
    let acc = shares[lidx];
    let idx = q * {cout}u + co;
    {store}
  }}
}}
"""
    return Program(name, source, (256, 1, 1), linear_dispatch(groups * 256, 256), binds, uniforms, loop_trips=trips)


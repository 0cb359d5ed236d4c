"""Transposed convolutions: TFLite's TRANSPOSE_CONV and MediaPipe's custom op ``Convolution2DTransposeBias``.

Both scatter each input pixel ``(iy, ix)`` through the filter onto output ``(iy * stride - pad + ky,
ix * stride - pad + kx)`` (tensorflow/lite/kernels/internal/reference/transpose_conv.h). Here each output
element gathers instead: for output row ``oy`` the filter rows that reach it are ``ky ≡ oy + pad (mod
stride)``, from input row ``iy = (oy + pad - ky) / stride``; so one invocation runs ``ceil(KH / stride_h) *
ceil(KW / stride_w)`` window taps of an unrolled ``Cin`` dot product, and no output is written twice.

Layouts are TFLite's: activations NHWC, weights OHWI ``[Cout, KH, KW, Cin]``.

* TRANSPOSE_CONV (tensorflow/lite/kernels/transpose_conv.cc): inputs ``output_shape`` (constant int32 ``[4]``),
  weights, input, optional bias; options ``padding``, ``stride_h``, ``stride_w``, ``fused_activation_function``.
  The padding is that of a forward convolution from the output size: SAME pads
  ``max((ceil(OH / s) - 1) * s + KH - OH, 0) // 2`` rows before, VALID none.
* ``Convolution2DTransposeBias`` (mediapipe/util/tflite/operations/transpose_conv_bias.cc): inputs input,
  weights, bias; its custom options are the raw little-endian C struct ``TfLiteTransposeConvParams``
  (int32 ``padding``: 1 SAME, 2 VALID; int32 ``stride_width``; int32 ``stride_height``), not a flexbuffer.
  The output size is derived: SAME pads ``p = max(0, KH - (H - 1) % s - 1)`` in all, ``OH = s * (H - 1) + KH
  - p``, ``p // 2`` before; VALID: ``OH = s * (H - 1) + KH``. No fused activation.
"""

from __future__ import annotations

import struct

import numpy as np

from .base import Kernel, KernelError, TensorSpec
from .conv import conv_output_size
from .registry import register
from .wgsl import activation_fn, dot, elementwise_program

__all__ = ["TransposeConv", "Convolution2DTransposeBias", "FusedTransposeConv2D", "decode_transpose_conv_params",
           "encode_transpose_conv_params"]

#: TfLitePadding values (tensorflow/lite/core/c/builtin_op_data.h).
_TFLITE_PADDING = {1: "SAME", 2: "VALID"}


def decode_transpose_conv_params(raw: bytes) -> dict:
    """Decodes MediaPipe's raw ``TfLiteTransposeConvParams`` custom options.

    Args:
      raw: the op's custom option bytes: little-endian int32 ``padding`` (1 SAME, 2 VALID), ``stride_width``,
        ``stride_height`` (a fourth int32, the activation of newer TFLite headers, is ignored: MediaPipe's
        kernel applies none).
    Returns:
      ``{"padding": "SAME" | "VALID", "stride_w": int, "stride_h": int}``.
    Raises:
      ValueError: fewer than 12 bytes, an unknown padding value or a stride below 1.
    """
    raw = bytes(raw)
    if len(raw) < 12:
        raise ValueError(f"Convolution2DTransposeBias custom options are {len(raw)} bytes ({raw.hex()}); "
                         f"expected at least 12 (int32 padding, stride_width, stride_height)")
    padding, sw, sh = struct.unpack_from("<iii", raw)
    if padding not in _TFLITE_PADDING:
        raise ValueError(f"Convolution2DTransposeBias padding is {padding}; expected 1 (SAME) or 2 (VALID)")
    if sw < 1 or sh < 1:
        raise ValueError(f"Convolution2DTransposeBias strides must be >= 1, got width {sw}, height {sh}")
    return {"padding": _TFLITE_PADDING[padding], "stride_w": sw, "stride_h": sh}


def encode_transpose_conv_params(padding: str, stride_w: int, stride_h: int) -> bytes:
    """MediaPipe's raw ``TfLiteTransposeConvParams`` custom options (the inverse of
    :func:`decode_transpose_conv_params`): little-endian int32 padding (1 SAME, 2 VALID), stride_width,
    stride_height.

    Raises:
      ValueError: a padding other than "SAME" or "VALID", or a stride below 1.
    """
    codes = {v: k for k, v in _TFLITE_PADDING.items()}
    if padding not in codes or int(stride_w) < 1 or int(stride_h) < 1:
        raise ValueError(f"Convolution2DTransposeBias needs padding SAME or VALID and strides >= 1, got padding "
                         f"{padding!r}, strides ({stride_h}, {stride_w})")
    return struct.pack("<iii", codes[padding], int(stride_w), int(stride_h))


class _TransposeConv(Kernel):
    """Shared gather kernel; subclasses set ``_x``, ``_w``, ``_b`` (input positions) and the geometry."""

    _x = _w = _b = 0

    def _strides(self) -> tuple[int, int]:
        sh, sw = int(self.attr("stride_h")), int(self.attr("stride_w"))
        if min(sh, sw) < 1:
            raise self.fail(f"strides must be >= 1, got ({sh}, {sw})")
        pad = str(self.attr("padding"))
        if pad not in ("SAME", "VALID"):
            raise self.fail(f"padding must be SAME or VALID, got {pad!r}")
        self.pad = pad
        return sh, sw

    def _check_tensors(self):
        x, w = self.expect_rank(self._x, 4), self.expect_rank(self._w, 4)
        self.cout, self.kh, self.kw, self.cin = w.shape
        if x.shape[3] != self.cin:
            raise self.fail(f"input has {x.shape[3]} channels, the weights (OHWI) {self.cin}")
        if self.has_input(self._b):
            b = self.expect_rank(self._b, 1)
            if b.shape[0] != self.cout:
                raise self.fail(f"bias has {b.shape[0]} elements, the weights have {self.cout} output channels")

    def output_specs(self):
        return (TensorSpec((self.input(self._x).shape[0], self.oh, self.ow, self.cout)),)

    def _activation(self) -> str:
        return "NONE"

    def programs(self):
        bias = "b[co]" if self.has_input(self._b) else "0.0"
        return [self._window_program("0.0", "x[xb + {k}]", "w[wb + {k}]", f"  y[idx] = act(acc + {bias});",
                                     activation_fn(self._activation()))]

    def _window_program(self, zero: str, x_term: str, w_term: str, store: str, helpers: str, uniforms=()):
        """The per-output program: ``acc`` (starting at ``zero``) sums ``x_term * w_term`` (``{k}`` the input
        channel; ``xb``/``wb`` the tap's bases) over the window taps that reach the output, then ``store``."""
        n, h, w, cin = self.input(self._x).shape
        cout, kh, kw = self.cout, self.kh, self.kw
        body = f"""  let co = idx % {cout}u;
  let tx = i32((idx / {cout}u) % {self.ow}u) + {self.pl};
  let ty = i32((idx / {cout * self.ow}u) % {self.oh}u) + {self.pt};
  let nb = idx / {cout * self.ow * self.oh}u;
  var acc = {zero};
  for (var ky = ty % {self.sh}; ky < {kh}; ky += {self.sh}) {{
    let iy = (ty - ky) / {self.sh};
    if (iy < 0) {{ break; }}
    if (iy >= {h}) {{ continue; }}
    for (var kx = tx % {self.sw}; kx < {kw}; kx += {self.sw}) {{
      let ix = (tx - kx) / {self.sw};
      if (ix < 0) {{ break; }}
      if (ix >= {w}) {{ continue; }}
      let xb = ((nb * {h}u + u32(iy)) * {w}u + u32(ix)) * {cin}u;
      let wb = ((co * {kh}u + u32(ky)) * {kw}u + u32(kx)) * {cin}u;
      {dot(cin, x_term, w_term, 'acc')}
    }}
  }}
{store}"""
        names = {self._x: "x", self._w: "w", self._b: "b"}
        present = [i for i in sorted(names) if self.has_input(i)]
        trips = -(-kh // self.sh) * (1 + -(-kw // self.sw) * (1 + cin // 4))
        total = n * self.oh * self.ow * cout
        return elementwise_program(self.key, self.io_bindings([names[i] for i in present] + ["y"]), total, body,
                                   helpers, uniforms, loop_trips=trips)


@register("TRANSPOSE_CONV")
class TransposeConv(_TransposeConv):
    """TRANSPOSE_CONV: ``output_shape`` (constant ``[4]``: ``[N, OH, OW, Cout]``), weights OHWI
    ``[Cout, KH, KW, Cin]``, input ``[N, H, W, Cin]``, bias ``[Cout]`` (optional) -> ``[N, OH, OW, Cout]``,
    float32; SAME/VALID padding, strides and the fused activation of TransposeConvOptions."""

    static_inputs = {0: "output_shape"}
    optional_inputs = frozenset({3})
    input_names = ("output_shape", "weights", "input", "bias")
    attr_defaults = {"padding": "SAME", "stride_h": 1, "stride_w": 1, "fused_activation_function": "NONE"}
    _x, _w, _b = 2, 1, 3

    def check(self):
        self._check_tensors()
        self.sh, self.sw = self._strides()
        if min(self.input(self._x).shape[1:]) < 1:   # LiteRT's Prepare: input rows, columns, channels > 0
            raise self.fail("the input needs at least one row, one column and one channel (LiteRT's TRANSPOSE_CONV "
                            "refuses it too); only its batch may be 0")
        if min(self.kh, self.kw) < 1:   # LiteRT's Prepare (transpose_conv.cc) refuses such weights too
            raise self.fail(f"the weights have {self.kh} rows and {self.kw} columns: give them at least one of each "
                            f"(LiteRT's TRANSPOSE_CONV refuses them too)")
        shape = self.attrs.get("output_shape")
        flat = [int(v) for v in np.ravel(shape)] if shape is not None else []
        n = self.input(self._x).shape[0]
        if len(flat) != 4 or flat[0] < 0 or min(flat[1:]) < 1:
            raise self.fail(f"output_shape must be a constant [4] int32 tensor of sizes [N, OH, OW, Cout], each "
                            f"positive but the batch N (0 for an empty batch), got {shape}")
        if flat[0] != n or flat[3] != self.cout:
            raise self.fail(f"output_shape {flat} disagrees with the input batch {n} or the weights' "
                            f"{self.cout} output channels")
        _, self.oh, self.ow, _ = flat
        self.pt = conv_output_size(self.oh, self.kh, self.sh, 1, self.pad)[1]
        self.pl = conv_output_size(self.ow, self.kw, self.sw, 1, self.pad)[1]

    def _activation(self) -> str:
        return str(self.attr("fused_activation_function"))


@register("Convolution2DTransposeBias")
class Convolution2DTransposeBias(_TransposeConv):
    """MediaPipe's ``Convolution2DTransposeBias``: input ``[N, H, W, Cin]``, weights OHWI ``[Cout, KH, KW,
    Cin]``, bias ``[Cout]`` -> ``[N, OH, OW, Cout]`` float32, with ``OH = stride_h * (H - 1) + KH - p`` (``p``
    the SAME padding, 0 for VALID). Attributes ``padding``, ``stride_h``, ``stride_w``, decoded from the raw
    custom options by :meth:`decode_custom_options`."""

    input_names = ("input", "weights", "bias")
    attr_defaults = {"padding": "SAME", "stride_h": 1, "stride_w": 1}
    _x, _w, _b = 0, 1, 2

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        """``{"_raw": bytes}`` (from :meth:`tflfuse.model.Model.op_attrs`) -> the op's attributes.

        Raises:
          KernelError: the options are missing or malformed (the message shows the bytes).
        """
        if "_raw" not in options:
            raise KernelError(f"Convolution2DTransposeBias needs its raw custom options (padding, strides); "
                              f"got {sorted(options)}")
        try:
            return decode_transpose_conv_params(options["_raw"])
        except ValueError as e:
            raise KernelError(str(e)) from None

    def check(self):
        if not self.has_input(self._b):
            raise self.fail("the bias input is required")
        self._check_tensors()
        self.sh, self.sw = self._strides()
        _, h, w, _ = self.input(self._x).shape
        if min(h, w, self.kh, self.kw) < 1:
            raise self.fail("the input and the filter need at least one row and one column")
        ph = max(0, self.kh - (h - 1) % self.sh - 1) if self.pad == "SAME" else 0
        pw = max(0, self.kw - (w - 1) % self.sw - 1) if self.pad == "SAME" else 0
        self.oh, self.ow = self.sh * (h - 1) + self.kh - ph, self.sw * (w - 1) + self.kw - pw
        self.pt, self.pl = ph // 2, pw // 2


#: The activations :class:`FusedTransposeConv2D` applies (those without a parameter).
TRANSPOSE_ACTIVATIONS = ("linear", "relu", "relu6", "sigmoid", "tanh", "hard_swish")


@register("fused_transpose_conv2d")
class FusedTransposeConv2D(Convolution2DTransposeBias):
    """MediaPipe's ``Convolution2DTransposeBias`` (:class:`Convolution2DTransposeBias`: its geometry and bias),
    then an activation, in one dispatch: ``act(conv2d_transpose(input, weights) + bias)``, float32 ``[N, OH, OW,
    Cout]``. Attributes ``padding`` (SAME/VALID), ``stride_h``, ``stride_w`` and ``activation`` (one of
    :data:`TRANSPOSE_ACTIVATIONS`), a flexbuffer map as every fused op's; ``tflfuse.fuse`` writes it for the op
    and the activation op after it (selfie segmentation's LOGISTIC mask). Raises
    :class:`~tflfuse.kernels.KernelError` as the MediaPipe op does, and for another activation."""

    attr_defaults = {"padding": "SAME", "stride_h": 1, "stride_w": 1, "activation": "linear"}
    decode_custom_options = None   # a flexbuffer map, not MediaPipe's raw struct

    def check(self):
        super().check()
        act = str(self.attr("activation")).lower()
        if act not in TRANSPOSE_ACTIVATIONS:
            raise self.fail(f"unsupported activation {self.attr('activation')!r}; supported: "
                            f"{list(TRANSPOSE_ACTIVATIONS)}")
        self.act = act

    def _activation(self) -> str:
        return self.act

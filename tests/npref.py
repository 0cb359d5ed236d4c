"""Float64 NumPy references of TensorFlow's 2-D convolutions, written from TF's documented semantics.

TensorFlow's own CPU kernels are not a reference that holds on every machine: which kernel runs depends on
the instruction set and on oneDNN (``TF_ENABLE_ONEDNN_OPTS``), and the Eigen ``DepthwiseConv2dNative`` kernel
refuses strides that differ per axis ("Current implementation only supports equal length strides in the
row and column dimensions") where oneDNN's computes them. These functions compute every case the same way
everywhere. ``tests/test_composite_conv.py::test_numpy_conv_reference_matches_tf`` checks them against TF
on cases that TF computes on every machine.

Semantics (``tf.nn.conv2d``, ``tf.nn.depthwise_conv2d``, ``tf.nn.separable_conv2d``; NHWC):
- the effective window is ``(K - 1) * dilation + 1``; VALID: ``out = ceil((in - window + 1) / stride)``, no
  padding; SAME: ``out = ceil(in / stride)``, ``pad = max((out - 1) * stride + window - in, 0)`` zeros split
  ``pad // 2`` before and the rest after;
- ``out[n, i, j, o] = sum_{a, b, c} x[n, i * sh + a * dh - pad_top, j * sw + b * dw - pad_left, c] * f[a, b, c, o]``;
- depthwise, filter ``[KH, KW, C, M]``: output channel ``c * M + m`` is input channel ``c`` with ``f[..., c, m]``;
- separable: depthwise, then a 1x1 stride-1 conv with the pointwise filter ``[1, 1, C * M, Cout]``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _pair(v) -> tuple[int, int]:
    v = [int(v)] * 2 if np.isscalar(v) else [int(a) for a in v]
    return (v[1], v[2]) if len(v) == 4 else (v[0], v[1])


def _windows(x: np.ndarray, kh: int, kw: int, strides, padding: str, dilations):
    """Yields ``(a, b, patch)``: the [N, OH, OW, C] input values that filter tap (a, b) multiplies."""
    (sh, sw), (dh, dw) = _pair(strides), _pair(dilations)
    n, h, w, c = x.shape
    pads = []
    for size, k, s, d in ((h, kh, sh, dh), (w, kw, sw, dw)):
        window = (k - 1) * d + 1
        if padding == "VALID":
            out = max(0, -(-(size - window + 1) // s))
            pads.append((out, 0, 0))
        elif padding == "SAME":
            out = -(-size // s)
            total = max((out - 1) * s + window - size, 0)
            pads.append((out, total // 2, total - total // 2))
        else:
            raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}")
    (oh, pt, pb), (ow, pl, pr) = pads
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    for a in range(kh):
        for b in range(kw):
            yield a, b, xp[:, a * dh:a * dh + (oh - 1) * sh + 1:sh, b * dw:b * dw + (ow - 1) * sw + 1:sw, :] \
                if oh and ow else np.zeros((n, oh, ow, c))


def conv2d(x: np.ndarray, filters: np.ndarray, strides: int | Sequence[int], padding: str,
           dilations: int | Sequence[int] = 1) -> np.ndarray:
    """``tf.nn.conv2d`` (NHWC, filter [KH, KW, Cin, Cout]) in float64; returns [N, OH, OW, Cout]."""
    f = np.asarray(filters, np.float64)
    kh, kw, _, cout = f.shape
    out = None
    for a, b, patch in _windows(x, kh, kw, strides, padding, dilations):
        term = np.einsum("nhwc,co->nhwo", patch, f[a, b])
        out = term if out is None else out + term
    return out


def depthwise_conv2d(x: np.ndarray, filters: np.ndarray, strides: int | Sequence[int], padding: str,
                     dilations: int | Sequence[int] = 1) -> np.ndarray:
    """``tf.nn.depthwise_conv2d`` (filter [KH, KW, C, M]) in float64, any strides with any dilations;
    returns [N, OH, OW, C * M]."""
    f = np.asarray(filters, np.float64)
    kh, kw, c, m = f.shape
    out = None
    for a, b, patch in _windows(x, kh, kw, strides, padding, dilations):
        term = (patch[..., :, None] * f[a, b]).reshape(*patch.shape[:3], c * m)
        out = term if out is None else out + term
    return out


def separable_conv2d(x: np.ndarray, depthwise_filter: np.ndarray, pointwise_filter: np.ndarray,
                     strides: int | Sequence[int], padding: str, dilations: int | Sequence[int] = 1) -> np.ndarray:
    """``tf.nn.separable_conv2d`` in float64: depthwise, then the [1, 1, C * M, Cout] pointwise filter."""
    y = depthwise_conv2d(x, depthwise_filter, strides, padding, dilations)
    pw = np.asarray(pointwise_filter, np.float64)
    return np.einsum("nhwc,co->nhwo", y, pw.reshape(pw.shape[-2], pw.shape[-1]))

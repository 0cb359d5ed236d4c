"""FULLY_CONNECTED: a tiled matrix product on many rows, a few-rows product or a reduction per output on few.

Semantics: TFLite's FULLY_CONNECTED with float32 weights ``[Cout, Cin]`` (tensorflow/lite/kernels/internal/
reference/fully_connected.h); sums run in another order than TFLite's, so results differ from it by rounding
only. Weights of no columns (``Cin`` 0) give zeros, as LiteRT's kernel does (fully_connected.cc fills the output
with zeros, leaving out the bias and the activation), in rows of the input's leading dimensions.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Kernel, TensorSpec
from .gemm import few_rows_program, product_program, tile_attr, use_few_rows, use_tiled_matmul
from .registry import register
from .wgsl import activation_fn, dot, elementwise_program, reduction_program, split_lanes

__all__ = ["FullyConnected"]


@register("FULLY_CONNECTED")
class FullyConnected(Kernel):
    """FULLY_CONNECTED: input ``[..., Cin]`` (flattened to ``[B, Cin]``), weights ``[Cout, Cin]``, bias
    ``[Cout]`` (optional) -> ``[B, Cout]``, or ``[..., Cout]`` with ``keep_num_dims``; float32."""

    optional_inputs = frozenset({2})
    input_names = ("input", "weights", "bias")
    attr_defaults = {"fused_activation_function": "NONE", "keep_num_dims": False, "weights_layout": "OI",
                     "target": "gpu"}
    #: a constant ``[Cout, Cin]`` matrix is transposed at load, so neighbouring invocations read neighbouring
    #: weights (``weights_layout="IO"``); see :class:`~tflfuse.kernels.conv.Conv2D`.
    relayout = {1: ("weights_layout", "IO", np.transpose)}
    #: ``matmul_tile``: the tiled product's tile by name, e.g. ``"128x128/8x8/16"``
    #: (:class:`~tflfuse.kernels.gemm.MatmulTile`; tuning only).
    extra_attrs = ("matmul_tile", "weights_format")

    def check(self):
        if str(self.attrs.get("weights_format", "DEFAULT")) not in ("DEFAULT", "0"):   # shuffled: a uint8 format
            raise self.fail(f"weights_format {self.attrs.get('weights_format')!r} (shuffled weights) is not "
                            f"supported for float weights; the file needs weights_format DEFAULT (0)")
        act = str(self.attr("fused_activation_function") or "NONE").upper()
        if act in ("TANH", "SIGN_BIT"):   # LiteRT's Prepare takes NONE, RELU, RELU_N1_TO_1 and RELU6 only
            raise self.fail(f"fused activation {act} is not supported (LiteRT's FULLY_CONNECTED refuses it too); "
                            f"give NONE and a separate {act} op")
        x, wt = self.expect_rank(0, *range(1, 7)), self.expect_rank(1, 2)
        self.layout = str(self.attr("weights_layout")).upper()
        if self.layout not in ("OI", "IO"):
            raise self.fail(f"weights_layout must be 'OI' or 'IO', got {self.attr('weights_layout')!r}")
        self.cout, self.cin = wt.shape if self.layout == "OI" else wt.shape[::-1]
        if self.cin and x.size % self.cin:
            raise self.fail(f"input of {x.size} elements does not flatten to rows of {self.cin}")
        # no columns: LiteRT's rows are the input's leading dimensions (its sums have no terms: zeros)
        self.rows = x.size // self.cin if self.cin else math.prod(x.shape[:-1])
        tile_attr(self)
        if self.attr("keep_num_dims") and x.shape[-1] != self.cin:
            raise self.fail(f"keep_num_dims needs the input's last dimension to be {self.cin}")
        if self.has_input(2):
            b = self.expect_rank(2, 1)
            if b.shape[0] != self.cout:
                raise self.fail(f"bias has {b.shape[0]} elements, weights have {self.cout} rows")

    def output_specs(self):
        if self.attr("keep_num_dims"):
            return (TensorSpec(self.input(0).shape[:-1] + (self.cout,)),)
        return (TensorSpec((self.rows, self.cout)),)

    def programs(self):
        if self.cin == 0:   # LiteRT's zeros (no bias, no activation); the empty input and weights are not bound
            out = self.output_specs()[0]
            return [elementwise_program(self.key, (self.binding("y", "output", 0, out),), out.size, "  y[idx] = 0.0;")]
        bias = "b[co]" if self.has_input(2) else "0.0"
        weight = f"w[co * {self.cin}u + {{k}}]" if self.layout == "OI" else f"w[({{k}}) * {self.cout}u + co]"
        total = self.rows * self.cout
        names = ["x", "w", "b", "y"] if self.has_input(2) else ["x", "w", "y"]
        act = activation_fn(self.attr("fused_activation_function"))
        if self.layout == "IO" and use_tiled_matmul(self.rows, self.cin, self.cout, self.target()):
            return [product_program(self.key, self.io_bindings(names), self.rows, self.cin, self.cout, "x", "w",
                                    "y", f"let co = col;\n          y[idx] = act(acc + {bias});", act,
                                    tile=tile_attr(self))]
        if self.layout == "IO" and use_few_rows(self.rows, self.cin, self.cout, self.target()):
            return [few_rows_program(self.key, self.io_bindings(names), self.rows, self.cin, self.cout, act,
                                     self.has_input(2))]
        lanes = split_lanes(total, self.cin, self.target())
        body = f"""  let co = idx % {self.cout}u;
  let r = idx / {self.cout}u;
  var acc = 0.0;
  {dot(self.cin, f'x[r * {self.cin}u + {{k}}]', weight, 'acc', lanes=lanes)}"""
        return [reduction_program(self.key, self.io_bindings(names), total, body, f"y[idx] = act(acc + {bias});",
                                  act, lanes=lanes, loop_trips=-(-(self.cin // 4) // lanes))]

"""The int8/uint8 matrix product of a 1x1 CONV_2D or a FULLY_CONNECTED, tiled for a GPU.

``acc[r, c] = sum_k (x[r, k] + x_off) * (w[k, c] + w_off)`` over quantized values held one per i32, the input
rows ``[rows, depth]`` (NHWC pixels or FULLY_CONNECTED rows) and the weights laid out ``[depth, cols]`` (HWIO /
IO, as the planner re-lays out a constant filter for a GPU: :attr:`tflfuse.kernels.conv.Conv2D.relayout`),
then per output channel the bias added, requantized by its fixed-point multiplier, the output zero point
added and clamped: TFLite's ``integer_ops/conv.h`` and ``fully_connected.h``. The sums are
:func:`tflfuse.kernels.gemm.tiled_matmul_program`'s with ``elem="i32"``: the same register-blocked tiles as the
float products, with exact integer multiply-adds, so every output equals the serial loop's bit for bit
(integer addition is associative; TFLite's int32 accumulators wrap the same way where they would overflow).
Where depth and columns are multiples of 4 (:func:`tflfuse.kernels.gemm.use_vec4`), the input, the weights
and the output are read and written as ``vec4<i32>``.
"""

from __future__ import annotations

import dataclasses

from ..base import Program
from ..gemm import tiled_matmul_program, use_vec4
from .arith import WGSL

__all__ = ["quantized_product_program"]


def quantized_product_program(kernel, names: list[str], rows: int, depth: int, cols: int, *, x_off: int,
                              w_off: int, y_off: int, lo: int, hi: int, tables, requant: str,
                              tile=None) -> Program:
    """The tiled int8/uint8 product of ``kernel`` (a QuantizedConv2D or QuantizedFullyConnected).

    Args:
      kernel: the kernel; its ``io_bindings(names)`` gives the bindings ``x`` (``[rows, depth]``), ``w``
        (``[depth, cols]``), ``b`` (int32 ``[cols]``, where named) and ``y`` (``[rows, cols]``).
      names: the binding names, ``["x", "w", "b", "y"]`` or ``["x", "w", "y"]``.
      rows, depth, cols: the product's sizes.
      x_off, w_off: added to each input and weight value (minus their zero points).
      y_off, lo, hi: the output zero point and the clamp, in the output's quantized domain.
      tables, requant: the :class:`~tflfuse.kernels.quant.ops.Tables` of the per-channel multipliers and the
        requantizing expression over ``acc`` (the sum with the bias) and ``co`` (the output channel), as
        :func:`tflfuse.kernels.quant.ops._requant` gives them.
      tile: a :class:`~tflfuse.kernels.gemm.MatmulTile` or its name, or None for the model's choice.
    Returns:
      one :class:`~tflfuse.kernels.base.Program`, one workgroup per tile of the output.
    """
    bias = "b" in names
    bindings = kernel.io_bindings(names)

    def term(v: str, off: int, vec: bool) -> str:
        if not off:
            return v
        return f"({v} + vec4<i32>({off}))" if vec else f"({v} + {off})"

    def stored(acc: str, co: str) -> str:
        """The output value of sum ``acc`` in channel ``co``: bias, requantization, zero point, clamp."""
        total = f"{acc} + b[{co}]" if bias else acc
        return (f"{{ let co = {co}; let acc = {total}; "
                f"q = clamp({requant} + {y_off}, {lo}, {hi}); }}")

    if use_vec4(depth, cols):
        vec = {"x", "w", "y"}
        bindings = tuple(dataclasses.replace(b, elem_type="vec4<i32>") if b.name in vec else b for b in bindings)
        parts = "\n".join(f"        {{ var q = 0; {stored(f'acc4.{c}', f'col4 + {j}u')} v.{c} = q; }}"
                          for j, c in enumerate("xyzw"))
        store_vec = f"""let acc4 = acc;
        var v: vec4<i32>;
{parts}
        y[idx4] = v;"""
        return tiled_matmul_program(
            kernel.key, bindings, rows, depth, cols, f"x[r * {depth}u + k]", f"w[k * {cols}u + c]",
            "", WGSL + tables.decls, tables.uniforms, tile=tile, a_vec=term(f"x[(r * {depth}u + k) / 4u]", x_off, True),
            b_vec=term(f"w[(k * {cols}u + c) / 4u]", w_off, True), store_vec=store_vec, elem="i32")
    store = f"var q = 0; {stored('acc', 'col')} y[idx] = q;"
    return tiled_matmul_program(kernel.key, bindings, rows, depth, cols, term(f"x[r * {depth}u + k]", x_off, False),
                                term(f"w[k * {cols}u + c]", w_off, False), store, WGSL + tables.decls,
                                tables.uniforms, tile=tile,
                                elem="i32")

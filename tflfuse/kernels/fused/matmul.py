"""``fused_matmul``: ``act(matmul(a, b) + bias + residual)`` in one op (TensorFlow.js' fused matMul).

Semantics of ``tf.linalg.matmul(a, b, transpose_a, transpose_b)`` (batch dimensions broadcast NumPy-style)
then the epilogue of :class:`~tflfuse.kernels.fused.conv.FusedEpilogue`. Inputs: ``a [..., M, K]``
(``[..., K, M]`` with ``transpose_a``), ``b [..., K, N]`` (``[..., N, K]`` with ``transpose_b``; often
``[K, N]``, a Dense kernel), then as the flags say ``bias [N]``, ``residual`` and PReLU slopes broadcastable
to the output ``[broadcast(batch), M, N]``. Attributes: ``transpose_a``, ``transpose_b`` (bools) and the
epilogue's (``activation``, ``alpha``, ``has_bias``, ``has_residual``, ``has_prelu``).
"""

from __future__ import annotations

import numpy as np

from ..base import TensorSpec
from ..elementwise import broadcast_index
from ..registry import register
from ..wgsl import dot, reduction_program, split_lanes
from .conv import FusedEpilogue

__all__ = ["FusedMatMul"]


@register("fused_matmul")
class FusedMatMul(FusedEpilogue):
    """``act(tf.linalg.matmul(a, b, transpose_a, transpose_b) + bias + residual)``, float32, one invocation
    per output element (or several sharing each sum where the outputs are few: see
    :func:`~tflfuse.kernels.wgsl.split_lanes`). Raises :class:`~tflfuse.kernels.KernelError` for operands of
    rank < 2, inner dimensions that differ, batch dimensions that do not broadcast, flags that disagree with
    the inputs."""

    main_inputs = ("a", "b")
    input_names = main_inputs + FusedEpilogue.input_names
    attr_defaults = {**FusedEpilogue.attr_defaults, "transpose_a": False, "transpose_b": False}

    def check(self):
        a, b = self.expect_rank(0, *range(2, 7)), self.expect_rank(1, *range(2, 7))
        self.ta, self.tb = bool(self.attr("transpose_a")), bool(self.attr("transpose_b"))
        self.m, self.k = a.shape[-2:][::-1] if self.ta else a.shape[-2:]
        kb, self.n = b.shape[-2:][::-1] if self.tb else b.shape[-2:]
        if kb != self.k:
            raise self.fail(f"inner dimensions differ: a {list(a.shape)} (transpose_a={self.ta}) has K {self.k}, "
                            f"b {list(b.shape)} (transpose_b={self.tb}) has K {kb}")
        try:
            self.batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError:
            raise self.fail(f"batch dimensions {list(a.shape[:-2])} and {list(b.shape[:-2])} do not "
                            f"broadcast") from None
        self.check_epilogue(self.batch + (self.m, self.n), self.n)

    def output_specs(self):
        return (TensorSpec(self.out_shape),)

    def programs(self):
        a, b = self.input(0).shape, self.input(1).shape
        m, n, k = self.m, self.n, self.k
        helpers = ""
        for name, shape in (("a", a), ("b", b)):
            helpers += (f"fn {name}_batch(idx: u32) -> u32 {{\n{broadcast_index(self.batch, shape[:-2], 'i')}"
                        f"  return i;\n}}\n")
        total = int(np.prod(self.out_shape))
        lanes = split_lanes(total, k, self.target())
        a_el = f"a[ab + ({{k}}) * {m}u + m]" if self.ta else f"a[ab + m * {k}u + {{k}}]"
        b_el = f"b[bb + n * {k}u + {{k}}]" if self.tb else f"b[bb + ({{k}}) * {n}u + n]"
        body = f"""  let n = idx % {n}u;
  let m = (idx / {n}u) % {m}u;
  let bt = idx / {m * n}u;
  let ab = a_batch(bt) * {m * k}u;
  let bb = b_batch(bt) * {k * n}u;
  var acc = 0.0;
  {dot(k, a_el, b_el, 'acc', lanes=lanes)}"""
        names = ["a", "b"] + self.epilogue_names() + ["y"]
        return [reduction_program(self.key, self.io_bindings(names), total, body, "y[idx] = epilogue(acc, idx, n);",
                                  helpers + self.epilogue_fn(), self.epilogue_uniforms(), lanes=lanes,
                                  loop_trips=-(-(k // 4) // lanes))]

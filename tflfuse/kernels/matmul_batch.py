"""BATCH_MATMUL: batched matrix products with broadcast batch dimensions.

Semantics are TFLite's (tensorflow/lite/kernels/batch_matmul.cc): ``lhs [..., M, K]`` (``[..., K, M]`` with
``adj_x``) times ``rhs [..., K, N]`` (``[..., N, K]`` with ``adj_y``) -> ``[..., M, N]``; the batch dimensions
are aligned from the right, a missing or size-1 one broadcasting against the other.
"""

from __future__ import annotations

import math

from .base import Kernel, TensorSpec
from .gemm import product_program, tile_attr, tiled_matmul_program, use_tiled_matmul
from .registry import register
from .wgsl import dot, elementwise_program, reduction_program, split_lanes

__all__ = ["BatchMatmul"]


def _batch_offset(out_batch: tuple[int, ...], in_batch: tuple[int, ...], var: str) -> str:
    """A WGSL u32 expression: the batch index into a tensor of batch dimensions ``in_batch`` (aligned right,
    size 1 broadcasting) of output batch ``var``, which runs over ``out_batch`` row-major."""
    padded = (1,) * (len(out_batch) - len(in_batch)) + tuple(in_batch)
    terms, out_div, in_stride = [], 1, 1
    for d in range(len(out_batch) - 1, -1, -1):
        if padded[d] != 1:
            coord = f"(({var} / {out_div}u) % {out_batch[d]}u)"
            terms.append(coord if in_stride == 1 else f"{coord} * {in_stride}u")
        in_stride *= padded[d]
        out_div *= out_batch[d]
    return " + ".join(terms) or "0u"


@register("BATCH_MATMUL")
class BatchMatmul(Kernel):
    """BATCH_MATMUL: ``lhs`` and ``rhs`` float32 of rank 2 to 5 -> ``[*batch, M, N]``, ``batch`` the broadcast of
    their batch dimensions (each pair equal or one of them 1), with ``adj_x``/``adj_y`` transposing the last two
    dimensions of ``lhs``/``rhs`` first (TFLite's BATCH_MATMUL; ``asymmetric_quantize_inputs`` concerns hybrid
    int8 models only).

    A product whose ``rhs`` has no batch (or batch 1 everywhere) is one ``[batch * M, K] x [K, N]`` matrix product,
    tiled on a GPU when large (:func:`~tflfuse.kernels.gemm.use_tiled_matmul`); others take one invocation per
    output element (lanes sharing each dot product where few outputs would leave a GPU idle). The sums run in
    another order than TFLite's: results differ from it by rounding only.

    Raises:
      KernelError: a dtype other than float32, a rank outside 2 to 5, depths that differ, or batch dimensions
        that do not broadcast; the message names the op.
    """

    input_names = ("lhs", "rhs")
    attr_defaults = {"adj_x": False, "adj_y": False, "asymmetric_quantize_inputs": False, "target": "gpu"}
    #: ``matmul_tile``: the tiled product's tile by name (tuning only; see FULLY_CONNECTED).
    extra_attrs = ("matmul_tile",)

    def check(self):
        lhs, rhs = self.expect_rank(0, 2, 3, 4, 5), self.expect_rank(1, 2, 3, 4, 5)
        self.adj_x, self.adj_y = bool(self.attr("adj_x")), bool(self.attr("adj_y"))
        self.m, k_l = (lhs.shape[-1], lhs.shape[-2]) if self.adj_x else lhs.shape[-2:]
        k_r, self.n = (rhs.shape[-1], rhs.shape[-2]) if self.adj_y else rhs.shape[-2:]
        if k_l != k_r:
            raise self.fail(f"lhs depth {k_l} (adj_x={self.adj_x}) differs from rhs depth {k_r} "
                            f"(adj_y={self.adj_y})")
        self.k = k_l
        rank = max(len(lhs.shape), len(rhs.shape))
        bl = (1,) * (rank - len(lhs.shape)) + lhs.shape[:-2]
        br = (1,) * (rank - len(rhs.shape)) + rhs.shape[:-2]
        batch = []
        for d, (a, b) in enumerate(zip(bl, br)):
            if a != b and 1 not in (a, b):
                raise self.fail(f"batch dimension {d} of lhs ({a}) and rhs ({b}) do not broadcast")
            batch.append(b if a == 1 else a)
        self.batch = tuple(batch)
        tile_attr(self)

    def output_specs(self):
        return (TensorSpec(self.batch + (self.m, self.n)),)

    def programs(self):
        lhs, rhs = self.input(0), self.input(1)
        m, n, k = self.m, self.n, self.k
        total = math.prod(self.batch) * m * n
        if k == 0:   # sums of no terms: zeros (as TFLite's), a program that binds only the output
            return [elementwise_program(self.key, (self.binding("y", "output", 0, self.output_specs()[0]),), total,
                                        "  y[idx] = 0.0;")]
        names = ["a", "b", "y"]
        # element (row, depth) of the lhs matrix of batch bl; (depth, col) of the rhs matrix of batch br
        a_at = (f"a[(bl * {k}u + {{k}}) * {m}u + {{r}}]" if self.adj_x else f"a[(bl * {m}u + {{r}}) * {k}u + {{k}}]")
        b_at = (f"b[(br * {n}u + {{c}}) * {k}u + {{k}}]" if self.adj_y else f"b[(br * {k}u + {{k}}) * {n}u + {{c}}]")
        rows = math.prod(self.batch) * m
        if math.prod(rhs.shape[:-2]) == 1 and use_tiled_matmul(rows, k, n, self.target()):
            # one [batch * M, K] x [K, N] product; row r is row r % M of lhs batch r / M
            a_expr = a_at.replace("bl", f"(r / {m}u)").format(r=f"(r % {m}u)", k="k")
            b_expr = b_at.replace("br", "0u").format(k="k", c="c")
            tile = tile_attr(self)
            if not (self.adj_x or self.adj_y):   # both row-major: the vec4 forms where the sizes allow
                return [product_program(self.key, self.io_bindings(names), rows, k, n, "a", "b", "y",
                                        "y[idx] = acc;", tile=tile)]
            return [tiled_matmul_program(self.key, self.io_bindings(names), rows, k, n, a_expr, b_expr,
                                         "y[idx] = acc;", tile=tile)]
        lanes = split_lanes(total, k, self.target())
        body = f"""  let col = idx % {n}u;
  let row = (idx / {n}u) % {m}u;
  let bo = idx / {m * n}u;
  let bl = {_batch_offset(self.batch, lhs.shape[:-2], "bo")};
  let br = {_batch_offset(self.batch, rhs.shape[:-2], "bo")};
  var acc = 0.0;
  {dot(k, a_at.format(r="row", k="{k}"), b_at.format(k="{k}", c="col"), "acc", lanes=lanes)}"""
        return [reduction_program(self.key, self.io_bindings(names), total, body, "y[idx] = acc;", lanes=lanes,
                                  loop_trips=-(-(k // 4) // lanes))]

"""The error bound of a float16 plan's matrix products (:func:`tflfuse.kernels.gemm.tiled_matmul_program`'s
f16 form): workgroup memory and multiply-adds in f16, the partial sums of each ``tk`` steps (a tile's
``slice_depth``: its staged slice's depth over its slice groups) added into f32 accumulators, the output rounded
once to f16 at the store.

For ``C = A @ B + bias`` with ``S = |A| @ |B| + |bias|`` (float64 NumPy, elementwise), one output obeys

    |got - C| <= gamma(2 tk, 2**-11) S + gamma(depth + 2, 2**-24) S + 2 depth 2**-14 + 2**-10 max(|got|, |C|, 2**-14)

- ``gamma(n, u) = n u / (1 - n u)``, the classic bound of a sum of products that went through ``n`` roundings
  of unit roundoff ``u`` each (Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1): within a slice
  each of the ``tk`` f16 steps may round twice (WGSL's ``fma`` inherits the accuracy of ``x * y + z``), with
  f16's unit roundoff ``2**-11``;
- the f32 sum across the ``depth / tk`` slices, the bias and the conversions: fewer than ``depth + 2`` f32
  roundings;
- ``2 depth 2**-14``: WGSL lets f16 subnormals (below ``2**-14``) be flushed to zero, up to ``2**-14`` lost by
  each of the two roundings of each of the ``depth`` steps. A flushed subnormal *operand* loses up to ``2**-14``
  times the other operand's magnitude: covered by the same term while operands are at most 1 in magnitude,
  and by ``depth (1 + M) 2**-14`` for operands up to ``M`` (``operand_max``; llvmpipe, where the tests run,
  keeps f16 subnormals, so no test reaches this term);
- ``2**-10 max(...)``: one f16 ulp at the store (WGSL lets a conversion to f16 round to either neighbour).

Where ``A`` is rounded to f16 only as it is staged (a float32 scratch operand), add one f16 ulp of each of its
values: ``2**-10 S``. With tk = 16 (the largest ``slice_depth`` of :data:`tflfuse.kernels.gemm.TILES`) the first term is
about 1.6% of ``S``: the price of f16 math, against ``depth 2**-24`` of ``S`` for the float32 plan's sums.
"""

import numpy as np

from tflfuse.kernels.gemm import TILES

#: The most f16 steps of any tile's partial sums: the bound for a product whose tile is the plan's choice.
MAX_TK = max(t.slice_depth for t in TILES.values())


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def half(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to float16 (round to nearest even, NumPy), as float32."""
    return a.astype(np.float16).astype(np.float32)


def sum_bound(s: np.ndarray, depth: int, tk: int = MAX_TK, operand_max: float = 1.0) -> np.ndarray:
    """The module docstring's bound before the store: a sum of ``depth`` products of f16 values (``s`` the sum
    of their magnitudes and the bias's; every operand at most ``operand_max`` in magnitude) taken as f16
    multiply-adds in runs of at most ``tk``, each run's sum added into float32."""
    flushed = depth * (1 + max(1.0, operand_max)) * 2.0 ** -14
    return (gamma(2 * tk, 2.0 ** -11) + gamma(depth + 2, 2.0 ** -24)) * s + flushed


def product_bound(s: np.ndarray, got: np.ndarray, want: np.ndarray, depth: int, tk: int = MAX_TK,
                  staged_a: bool = False, operand_max: float = 1.0) -> np.ndarray:
    """The module docstring's bound on ``|got - want|``, elementwise: ``s = |A| @ |B| + |bias|``, ``want`` the
    float64 product (through a 1-Lipschitz activation, which keeps the bound)."""
    mag = np.maximum(np.maximum(np.abs(got), np.abs(want)), 2.0 ** -14)
    return sum_bound(s, depth, tk, operand_max) + (2.0 ** -10 * s if staged_a else 0.0) + 2.0 ** -10 * mag

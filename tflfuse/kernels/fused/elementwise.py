"""fused_hard_swish and fused_clip: the elementwise composites of ``composites.activations``.

* ``fused_hard_swish``: ``y = x * relu6(x + 3) / 6`` (TFLite's HARD_SWISH, Keras 3's ``hard_swish``).
  :func:`tflfuse.convert` lowers it to the builtin HARD_SWISH (``tflfuse/passes/activations.py``); this kernel
  runs files that keep the custom op.
* ``fused_clip``: ``y = max(min(x, clip_max), clip_min)``, the semantics of ``tf.clip_by_value``: a NaN input
  stays NaN; with ``clip_min > clip_max`` every value becomes ``clip_min``. The bounds are uniforms, so one
  pipeline serves every pair of bounds. Bounds that match a TFLite activation (RELU6, RELU_N1_TO_1, RELU_0_TO_1,
  RELU) are lowered to that builtin by :func:`tflfuse.convert`.

Both: one input ``x`` of any shape, float32; one output of the same shape; one invocation per element.
"""

from __future__ import annotations

import math

from ..base import CompositeKernel, TensorSpec, Uniform
from ..registry import register
from ..wgsl import activation_fn, elementwise_program

__all__ = ["FusedClip", "FusedHardSwish"]


class _Elementwise(CompositeKernel):
    input_names = ("x",)

    def check(self):
        self.expect_rank(0, *range(0, 7))

    def output_specs(self):
        return (TensorSpec(self.input(0).shape),)


@register("fused_hard_swish")
class FusedHardSwish(_Elementwise):
    """``x [...]`` float32 -> ``x * relu6(x + 3) / 6``, same shape (TFLite HARD_SWISH)."""

    def programs(self):
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size,
                                    "  y[idx] = act(x[idx]);", activation_fn("hard_swish"))]


_CLIP = """fn clip(v: f32) -> f32 {
  // min then max, as tf.clip_by_value; NaN passes through (WGSL's min/max may drop it; tested on the bits)
  let c = max(min(v, params.clip_max), params.clip_min);
  return select(c, v, is_nan(v));
}
"""


@register("fused_clip")
class FusedClip(_Elementwise):
    """``x [...]`` float32 -> ``max(min(x, clip_max), clip_min)``, same shape (``tf.clip_by_value``; NaN stays
    NaN). Raises :class:`~tflfuse.kernels.KernelError` for a NaN bound."""

    attr_defaults = {"clip_min": 0.0, "clip_max": 6.0}

    def check(self):
        super().check()
        for name in ("clip_min", "clip_max"):
            if math.isnan(float(self.attr(name))):
                raise self.fail(f"{name} is NaN")

    def programs(self):
        uniforms = (Uniform("clip_min", "f32", float(self.attr("clip_min"))),
                    Uniform("clip_max", "f32", float(self.attr("clip_max"))))
        return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size,
                                    "  y[idx] = clip(x[idx]);", _CLIP, uniforms=uniforms)]

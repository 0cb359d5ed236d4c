"""The int8 fused inverted-residual bottleneck: ``fused_bottleneck`` whose tensors are int8.

The op stands for the int8 builtin chain that TFLite's full-integer converter makes of a bottleneck (and that
``tflfuse.passes.fuse_int8`` fuses): CONV_2D 1x1 (fused RELU6/RELU) -> DEPTHWISE_CONV_2D KxK (the same
activation) -> CONV_2D 1x1 (no activation) [-> ADD of the block's input]; without the first conv for
expansion 1. Its inputs are the chain's own tensors in the builtins' layouts, so the op's weights and their
quantization are the file's:

* ``x`` int8 ``[N, H, W, Cin]`` (per-tensor scale and zero point);
* ``expand_w`` int8 ``[Cexp, 1, 1, Cin]`` (per-channel along 0, zero points 0), ``expand_b`` int32 ``[Cexp]``
  (absent for expansion 1: the op then has 5 inputs);
* ``dw_w`` int8 ``[1, K, K, Cexp]`` (per-channel along 3), ``dw_b`` int32 ``[Cexp]``;
* ``project_w`` int8 ``[Cout, 1, 1, Cexp]`` (per-channel along 0), ``project_b`` int32 ``[Cout]``;
* output int8 ``[N, ceil(H / stride), ceil(W / stride), Cout]``.

For a GPU, the planner re-lays the two 1x1 filters out HWIO ``[1, 1, Cin, Cout]`` at load (attributes
``expand_layout`` and ``project_layout`` ``"HWIO"``; ``"OHWI"`` by default), as it does a CONV_2D's, so that
those stages run as the tiled int8 product.

The scales and zero points of the tensors between the chain's ops, which the file no longer holds as tensors,
are attributes of the op: ``expand_scale`` / ``expand_zero_point`` (the expanded tensor; with an expand conv),
``dw_scale`` / ``dw_zero_point`` (the depthwise output) and, with ``residual``, ``project_scale`` /
``project_zero_point`` (the projection before the ADD). The float attributes (``expansion``, ``stride``,
``residual``, ``activation``, ``kernel_size``, ``squeeze_excite`` False) are as in the float op.

Semantics: each stage is the int8 builtin kernel of :mod:`tflfuse.kernels.quant.ops` (TFLite's reference
integer kernels ``integer_ops/conv.h``, ``depthwise_conv.h``, ``add.h`` with the rounding of LiteRT's builtin
CPU kernels), intermediates requantized to int8 exactly as the builtins do, so the op equals LiteRT running the
chain bit for bit. The stages run as separate dispatches with the intermediates in scratch buffers.
"""

from __future__ import annotations

import math

from ...model import Quantization
from ..base import KernelError, TensorSpec
from ..compose import Chain, ComposedKernel, Value, _Step

__all__ = ["QuantizedFusedBottleneck", "INTERMEDIATE_ATTRS"]

#: Attributes that carry the intermediate tensors' quantization (name -> which tensor).
INTERMEDIATE_ATTRS = {"expand": "expanded tensor", "dw": "depthwise output", "project": "projection before ADD"}

_ACTS = {"relu6": "RELU6", "relu": "RELU"}


class QuantizedFusedBottleneck(ComposedKernel):
    """``fused_bottleneck`` on int8 tensors (module docstring: inputs, attributes, semantics).

    Raises:
      KernelError: a dtype other than int8 for ``x``, the weights or the output (int32 for biases); weights not
        of the builtin layouts above or whose shapes disagree; ``squeeze_excite``; an activation other than
        relu6/relu; a kernel size other than 3/5, a stride other than 1/2; a missing intermediate
        scale/zero point; ``residual`` with stride 2 or Cin != Cout; per-tensor quantization refused by a stage
        (each stage's own error, naming it).
    """

    key = "fused_bottleneck"
    input_names = ("x", "expand_w", "expand_b", "dw_w", "dw_b", "project_w", "project_b")
    attr_defaults = {"expansion": 6, "stride": 1, "residual": False, "activation": "relu6", "kernel_size": 3,
                     "squeeze_excite": False, "expand_scale": None, "expand_zero_point": None, "dw_scale": None,
                     "dw_zero_point": None, "project_scale": None, "project_zero_point": None, "target": "gpu",
                     "expand_layout": "OHWI", "project_layout": "OHWI", "output_activation": "linear",
                     "padding": "SAME", "explicit_paddings": None, "residual_pool": 1}
    extra_attrs = ("input_quantization", "output_quantization", "output_dtype")
    needs_io_quantization = True
    needs_output_dtype = True

    @classmethod
    def relayout_of(cls, n_inputs: int) -> dict:
        """The constant 1x1 filters re-laid out HWIO at load for a GPU (``expand_layout``, ``project_layout``),
        by input position (7 inputs, or 5 without the expand conv): the stages' CONV_2D then runs as the tiled
        int8 product, as a CONV_2D of the file does."""
        hwio = ("HWIO", lambda f: f.transpose(1, 2, 3, 0))
        return {1: ("expand_layout", *hwio), 5: ("project_layout", *hwio)} if n_inputs == 7 else \
            {3: ("project_layout", *hwio)}

    def _filter(self, i: int, name: str) -> str:
        """The layout of the 1x1 filter input ``i`` (attribute ``{name}_layout``), checked: OHWI
        ``[Cout, 1, 1, Cin]`` or HWIO ``[1, 1, Cin, Cout]``."""
        layout = str(self.attr(f"{name}_layout")).upper()
        shape = self.input(i).shape
        if layout not in ("OHWI", "HWIO") or shape[slice(1, 3) if layout == "OHWI" else slice(0, 2)] != (1, 1):
            raise self.fail(f"{name}_w must be [C{'exp' if name == 'expand' else 'out'}, 1, 1, Cin] (OHWI) or "
                            f"[1, 1, Cin, Cout] (HWIO), got {list(shape)} as {layout}")
        return layout

    def check(self):
        n_in = len(self.inputs)
        if n_in not in (5, 7):
            raise self.fail(f"an int8 fused_bottleneck has 7 inputs (x, expand_w, expand_b, dw_w, dw_b, project_w, "
                            f"project_b) or 5 without the expand conv, got {n_in}")
        if self.attr("squeeze_excite"):
            raise self.fail("squeeze_excite has no int8 form")
        if str(self.attr("output_activation")).lower() != "linear":
            raise self.fail(f"output_activation {self.attr('output_activation')!r} has no int8 form (the int8 "
                            f"output's quantization clamps it); give 'linear' or leave it out")
        if str(self.attr("padding")).upper() != "SAME" or self.attrs.get("explicit_paddings"):
            raise self.fail(f"padding {self.attr('padding')!r} has no int8 form here (the int8 block is SAME); "
                            f"give 'SAME' or leave it out")
        if self.attr("residual_pool") != 1:
            raise self.fail(f"residual_pool {self.attr('residual_pool')!r} has no int8 form here (the int8 residual "
                            f"is x itself); give 1 or leave it out")
        act = str(self.attr("activation"))
        if act not in _ACTS:
            raise self.fail(f"activation {act!r} has no int8 form here; supported: {sorted(_ACTS)}")
        stride, k = int(self.attr("stride")), int(self.attr("kernel_size"))
        if stride not in (1, 2) or k not in (3, 5):
            raise self.fail(f"stride must be 1 or 2 and kernel_size 3 or 5, got {stride} and {k}")
        expand = n_in == 7
        names = self.input_names if expand else ("x",) + self.input_names[3:]
        for i, name in enumerate(names):
            want = "int32" if name.endswith("_b") else "int8"
            if self.input(i).dtype != want:
                raise self.fail(f"input {i} ({name}) must be {want}, got {self.input(i).dtype}")
        if str(self.attrs.get("output_dtype") or "int8") != "int8":
            raise self.fail(f"the output must be int8, got {self.attrs.get('output_dtype')}")
        x = self.input(0)
        if len(x.shape) != 4:
            raise self.fail(f"x must be NHWC, got shape {list(x.shape)}")
        qin = list(self.attrs.get("input_quantization") or [None] * n_in)
        qout = list(self.attrs.get("output_quantization") or [None])
        if len(qin) != n_in or len(qout) != 1:
            raise self.fail("needs the quantization of each input and of the output (planned from a .tflite)")
        self.chain = Chain(self.key)
        ins = [Value(s, ("input", i)) for i, s in enumerate(self.inputs)]
        fa = _ACTS[act]
        h = ins[0]
        q_h = qin[0]
        if expand:
            layout = self._filter(1, "expand")
            q_e = self._intermediate("expand")
            h = self._step("CONV_2D", [h, ins[1], ins[2]], [q_h, qin[1], qin[2]], q_e, fused_activation_function=fa,
                           filter_layout=layout, target=self.target())
            q_h, rest, qrest = q_e, ins[3:], qin[3:]
        else:
            rest, qrest = ins[1:], qin[1:]
        dw_w, dw_b, pw, pb = rest
        if dw_w.shape[:3] != (1, k, k):
            raise self.fail(f"dw_w must be [1, {k}, {k}, Cexp], got {list(dw_w.shape)}")
        project_layout = self._filter(n_in - 2, "project")
        residual = bool(self.attr("residual"))
        q_d = self._intermediate("dw")
        h = self._step("DEPTHWISE_CONV_2D", [h, dw_w, dw_b], [q_h, qrest[0], qrest[1]], q_d, padding="SAME",
                       stride_h=stride, stride_w=stride, fused_activation_function=fa, depth_multiplier=1)
        q_p = self._intermediate("project") if residual else qout[0]
        h = self._step("CONV_2D", [h, pw, pb], [q_d, qrest[2], qrest[3]], q_p, filter_layout=project_layout,
                       target=self.target())
        if residual:
            if stride != 1 or h.shape != x.shape:
                raise self.fail(f"residual needs stride 1 and an output of the input's shape {list(x.shape)}, got "
                                f"stride {stride} and {list(h.shape)}")
            h = self._step("ADD", [h, ins[0]], [q_p, qin[0]], qout[0])
        self.outs = (h,)
        self._place()

    def _intermediate(self, name: str) -> Quantization:
        scale, zp = self.attrs.get(f"{name}_scale"), self.attrs.get(f"{name}_zero_point")
        if scale is None or zp is None:
            raise self.fail(f"missing attributes {name}_scale and {name}_zero_point (the quantization of the "
                            f"{INTERMEDIATE_ATTRS[name]})")
        scale = float(scale)
        if not (scale > 0 and math.isfinite(scale)) or not -128 <= int(zp) <= 127:
            raise self.fail(f"{name}_scale {scale} must be positive and finite and {name}_zero_point {zp} an int8")
        return Quantization((scale,), (int(zp),))

    def _step(self, key: str, inputs: list[Value], q_in: list, q_out, **attrs) -> Value:
        """Adds the int8 builtin kernel ``key`` as a stage; returns its output."""
        from . import _KERNELS   # the package imports this module

        attrs.update(input_quantization=q_in, output_quantization=[q_out], output_dtype="int8")
        where = f"stage {len(self.chain.steps)} ({key})"
        try:
            kernel = _KERNELS[key]([v.spec for v in inputs], attrs)
            outs = kernel.output_specs()
        except KernelError as e:
            raise self.fail(f"{where}: {e}") from None
        j = len(self.chain.steps)
        values = [Value(TensorSpec(s.shape, s.dtype), ("step", j, i)) for i, s in enumerate(outs)]
        self.chain.steps.append(_Step(key, kernel, list(inputs), values))
        return values[0]


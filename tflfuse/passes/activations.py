"""Lowerings of the activation composites (``composites.activations``) to TFLite builtins.

* ``fused_hard_swish`` -> HARD_SWISH: the same function (``x * relu6(x + 3) / 6``); stock LiteRT runs it and
  the file keeps one op per call.
* ``fused_clip`` -> RELU6 (bounds 0, 6), RELU_N1_TO_1 (-1, 1), RELU_0_TO_1 (0, 1) or RELU (0, +inf): the
  builtin that clamps to the same bounds. Other bounds keep the custom op (its kernel takes any bounds).

Each lowering rewrites the op in place: same input and output tensors, the builtin's operator code (added to
the model's table where missing), no custom options. An op that does not have exactly one float32 input and
output, or whose attributes cannot be decoded, is left as it is.
"""

from __future__ import annotations

import math

from ai_edge_litert import schema_py_generated as schema
from absl import logging

from . import lowering

__all__ = ["CLIP_BUILTINS", "set_builtin"]

#: (clip_min, clip_max) -> the TFLite builtin that clamps to those bounds.
CLIP_BUILTINS = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, 1.0): "RELU_0_TO_1",
                 (0.0, math.inf): "RELU"}


def set_builtin(model, subgraph: int, index: int, builtin: str) -> None:
    """Turns operator ``index`` of ``subgraph`` into the option-less builtin ``builtin`` (e.g. ``"RELU6"``),
    keeping its input and output tensors; adds the operator code where the model has none for it."""
    code = int(getattr(schema.BuiltinOperator, builtin))
    codes = model.m.operatorCodes
    for i, oc in enumerate(codes):
        if max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)) == code:
            opcode_index = i
            break
    else:
        oc = schema.OperatorCodeT()
        oc.builtinCode = code
        # codes past 127 are written as PLACEHOLDER_FOR_GREATER_OP_CODES in the deprecated int8 field
        oc.deprecatedBuiltinCode = min(code, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
        oc.version = 1
        codes.append(oc)
        opcode_index = len(codes) - 1
    op = model.m.subgraphs[subgraph].operators[index]
    op.opcodeIndex = opcode_index
    op.customOptions = None
    op.customOptionsFormat = 0
    op.builtinOptionsType = 0
    op.builtinOptions = None


def _unary_float(model, subgraph: int, index: int) -> bool:
    ins, outs = model.op_inputs(subgraph, index), model.op_outputs(subgraph, index)
    if len(ins) != 1 or len(outs) != 1 or ins[0] < 0:
        return False
    return all(model.tensor_type_name(subgraph, t) == "FLOAT32" for t in (ins[0], outs[0]))


def _attrs(model, subgraph: int, index: int) -> dict | None:
    from ..annotate import decode_attrs

    try:
        return decode_attrs(model.op_attrs(subgraph, index))
    except (TypeError, ValueError) as e:
        logging.warning("op %d of subgraph %d: custom options not decoded (%s); not lowered", index, subgraph, e)
        return None


@lowering("fused_hard_swish")
def lower_hard_swish(model, subgraph: int, index: int) -> bool:
    """fused_hard_swish -> HARD_SWISH."""
    if not _unary_float(model, subgraph, index) or _attrs(model, subgraph, index) is None:
        return False
    set_builtin(model, subgraph, index, "HARD_SWISH")
    return True


@lowering("fused_clip")
def lower_clip(model, subgraph: int, index: int) -> bool:
    """fused_clip with the bounds of RELU6, RELU_N1_TO_1, RELU_0_TO_1 or RELU -> that builtin."""
    attrs = _attrs(model, subgraph, index) if _unary_float(model, subgraph, index) else None
    if attrs is None:
        return False
    try:
        bounds = (float(attrs["clip_min"]), float(attrs["clip_max"]))
    except (KeyError, TypeError, ValueError):
        return False
    builtin = CLIP_BUILTINS.get(bounds)
    if builtin is None:
        return False
    set_builtin(model, subgraph, index, builtin)
    return True

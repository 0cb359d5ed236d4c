"""Lowering ``fused_lstm`` to TFLite's builtin ``UNIDIRECTIONAL_SEQUENCE_LSTM``, where it is expressible.

The builtin (LiteRT's ``unidirectional_sequence_lstm`` kernel) computes exactly Keras' LSTM with
``activation="tanh"`` and ``recurrent_activation="sigmoid"`` over a whole sequence, from a zero state, and
returns the whole output sequence. So a ``fused_lstm`` op is lowered when its attributes say
``activation="tanh"``, ``recurrent_activation="sigmoid"``, ``return_sequences=True``, ``return_state=False``,
``go_backwards=False``, ``initial_state=False`` and its weights are constants; any other op is left as it
is (the lowering returns False) and runs as the custom op.

The builtin's 24 inputs, built here from the Keras-layout weights (kernel [F, 4U], recurrent kernel
[U, 4U], bias [4U], gates in the order i, f, c, o, which is also the builtin's):

====  ==========================================  ==========================================
 #    builtin input                               value
====  ==========================================  ==========================================
 0    input [N, T, F]                             the op's ``x`` (``time_major=False``)
 1-4  input-to-{input,forget,cell,output} [U, F]  ``kernel[:, g*U:(g+1)*U].T``
 5-8  recurrent-to-... [U, U]                     ``recurrent_kernel[:, g*U:(g+1)*U].T``
 9-11 peephole weights                            absent (-1)
12-15 {input,forget,cell,output} gate bias [U]    ``bias[g*U:(g+1)*U]`` (zeros without a bias)
16-17 projection weights and bias                 absent (-1)
18    output (h) state [N, U]                     a new variable tensor (zero at allocation)
19    cell state [N, U]                           a new variable tensor (zero at allocation)
20-23 layer-norm coefficients                     absent (-1)
====  ==========================================  ==========================================

Options: ``fused_activation_function=TANH``, ``cell_clip=0``, ``proj_clip=0`` (no clipping),
``time_major=False``. Output: [N, T, U], the op's only output.

LiteRT writes the final state back into the two variable tensors, so a second ``invoke()`` of LiteRT's
interpreter starts from the first one's final state unless ``reset_all_variables()`` is called between
them (tflfuse's interpreter starts every invoke from zeros, as Keras does).
"""

from __future__ import annotations

import numpy as np
from absl import logging
from ai_edge_litert import schema_py_generated as schema

from ..annotate import decode_attrs
from . import lowering

__all__ = ["lower_fused_lstm"]

_NUM_INPUTS = 24
_STATE_INPUTS = (18, 19)


def _constant(model, sg: int, t: int) -> np.ndarray | None:
    if t < 0:
        return None
    try:
        data = model.tensor_data(sg, t)
    except ValueError:
        return None
    return None if data is None or data.dtype != np.float32 else data


def _add_buffer(model, data: np.ndarray | None) -> int:
    buf = schema.BufferT()
    if data is not None:
        buf.data = np.frombuffer(np.ascontiguousarray(data, np.float32).tobytes(), np.uint8)
    model.m.buffers.append(buf)
    return len(model.m.buffers) - 1


def _add_tensor(model, sg: int, name: str, shape, data: np.ndarray | None = None, variable: bool = False) -> int:
    t = schema.TensorT()
    t.shape = np.asarray(shape, np.int32)
    t.type = schema.TensorType.FLOAT32
    t.name = name
    t.isVariable = variable
    t.buffer = _add_buffer(model, data)
    tensors = model.m.subgraphs[sg].tensors
    tensors.append(t)
    return len(tensors) - 1


def _opcode_index(model) -> int:
    code = schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM
    for i, oc in enumerate(model.m.operatorCodes):
        if max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)) == code:
            return i
    oc = schema.OperatorCodeT()
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = code   # < 127: the field old readers use holds it too
    oc.version = 1
    model.m.operatorCodes.append(oc)
    return len(model.m.operatorCodes) - 1


def _release(model, sg: int, tensors) -> None:
    """Drops the data of weight tensors no op reads any more (the file would otherwise hold them twice)."""
    subgraph = model.m.subgraphs[sg]
    read = {int(t) for op in subgraph.operators for t in op.inputs}
    read |= {int(t) for t in subgraph.outputs}
    for t in tensors:
        if t in read:
            continue
        buffer = subgraph.tensors[t].buffer
        shared = any(x.buffer == buffer for i, x in enumerate(subgraph.tensors) if i != t)
        if buffer > 0 and not shared:
            model.m.buffers[buffer].data = None


@lowering("fused_lstm")
def lower_fused_lstm(model, sg: int, index: int) -> bool:
    """Rewrites ``fused_lstm`` op ``index`` of subgraph ``sg`` into ``UNIDIRECTIONAL_SEQUENCE_LSTM``.

    Args:
      model: a :class:`tflfuse.model.Model`, edited in place (``model.m``).
      sg: the subgraph index.
      index: the operator index of a ``fused_lstm`` op.

    Returns:
      True if the op was rewritten; False (nothing edited) where the builtin cannot express it: another
      activation, ``return_sequences=False``, ``return_state``, ``go_backwards``, an initial state, weights
      that are not float32 constants, or shapes that disagree.
    """
    try:
        attrs = decode_attrs(model.op_attrs(sg, index))
    except ValueError as e:
        logging.warning("fused_lstm (operator %d of subgraph %d) not lowered: %s", index, sg, e)
        return False
    wanted = dict(activation="tanh", recurrent_activation="sigmoid", return_sequences=True, return_state=False,
                  go_backwards=False, initial_state=False)
    if any(attrs.get(k) != v for k, v in wanted.items()):
        return False
    ins, outs = model.op_inputs(sg, index), model.op_outputs(sg, index)
    use_bias = bool(attrs.get("use_bias", True))
    if len(ins) != (4 if use_bias else 3) or len(outs) != 1:
        return False
    x_shape = model.tensor_shape(sg, ins[0])
    kernel, recurrent = _constant(model, sg, ins[1]), _constant(model, sg, ins[2])
    bias = _constant(model, sg, ins[3]) if use_bias else None
    if len(x_shape) != 3 or model.tensor_type_name(sg, ins[0]) != "FLOAT32" or kernel is None or recurrent is None:
        return False
    n, _, f = x_shape
    if kernel.ndim != 2 or kernel.shape[0] != f or kernel.shape[1] % 4:
        return False
    u = kernel.shape[1] // 4
    if recurrent.shape != (u, 4 * u) or (use_bias and (bias is None or bias.shape != (4 * u,))):
        return False
    if bias is None:
        bias = np.zeros(4 * u, np.float32)

    name = model.tensor_name(sg, outs[0]) or f"fused_lstm_{index}"
    gates = ("input", "forget", "cell", "output")
    new_inputs = [-1] * _NUM_INPUTS
    new_inputs[0] = ins[0]
    for g, gate in enumerate(gates):
        cols = slice(g * u, (g + 1) * u)
        new_inputs[1 + g] = _add_tensor(model, sg, f"{name}/input_to_{gate}_w", (u, f), kernel[:, cols].T)
        new_inputs[5 + g] = _add_tensor(model, sg, f"{name}/recurrent_to_{gate}_w", (u, u), recurrent[:, cols].T)
        new_inputs[12 + g] = _add_tensor(model, sg, f"{name}/{gate}_gate_bias", (u,), bias[cols])
    new_inputs[18] = _add_tensor(model, sg, f"{name}/output_state", (n, u), variable=True)
    new_inputs[19] = _add_tensor(model, sg, f"{name}/cell_state", (n, u), variable=True)

    options = schema.UnidirectionalSequenceLSTMOptionsT()
    options.fusedActivationFunction = schema.ActivationFunctionType.TANH
    options.cellClip = 0.0
    options.projClip = 0.0
    options.timeMajor = False
    options.asymmetricQuantizeInputs = False
    options.diagonalRecurrentTensors = False
    op = model.m.subgraphs[sg].operators[index]
    old_inputs = list(ins[1:])
    op.opcodeIndex = _opcode_index(model)
    op.inputs = new_inputs
    op.outputs = list(outs)
    op.builtinOptionsType = schema.BuiltinOptions.UnidirectionalSequenceLSTMOptions
    op.builtinOptions = options
    op.customOptions = None
    op.customOptionsFormat = 0
    op.mutatingVariableInputs = None
    _release(model, sg, old_inputs)
    return True

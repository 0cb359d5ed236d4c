"""A run of ops of a .tflite as a .tflite of its own (LiteRT's schema, written by
:meth:`tflfuse.model.Model.to_bytes`): what the CPU fallback (:mod:`tflfuse.runtime.fallback`) hands LiteRT's CPU
interpreter, and how run-time shape values are computed (:mod:`tflfuse.runtime.specialise`). No GPU, no
TensorFlow."""

from __future__ import annotations

import copy
from typing import Mapping, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from ..model import Model

__all__ = ["called_subgraphs", "segment_tflite"]


def _raw_buffer(model: Model, index: int) -> bytes | None:
    """The bytes of buffer ``index`` of the file (inline or stored after the flatbuffer), None when empty."""
    buf = model.m.buffers[index] if 0 <= index < len(model.m.buffers or []) else None
    if buf is None:
        return None
    if buf.offset is not None and buf.offset > 1:
        return model._file[buf.offset:buf.offset + buf.size]
    if buf.data is not None and len(buf.data):
        return np.asarray(buf.data, np.uint8).tobytes()
    return None


def _is_constant(model: Model, sg: int, t: int) -> bool:
    return _raw_buffer(model, model.tensor(sg, t).buffer) is not None


def called_subgraphs(op) -> list[int]:
    """The subgraphs an op's options name (IF's branches, WHILE's cond and body, CALL_ONCE's, StableHLO's
    WHILE/REDUCE/CASE...), for an ``OperatorT`` of LiteRT's schema."""
    found: list[int] = []
    for opts in (op.builtinOptions, op.builtinOptions2):
        for k, v in (vars(opts).items() if opts is not None else ()):
            if "ubgraph" in k and v is not None:
                found += [int(i) for i in np.ravel(v)]
    return found


def segment_tflite(model: Model, sg: int, ops: Sequence[int], inputs: Sequence[int],
                   outputs: Sequence[int], values: Mapping[int, np.ndarray] | None = None) -> bytes:
    """A .tflite holding exactly ops ``ops`` of subgraph ``sg`` of ``model``, with their constant buffers, whose
    inputs and outputs are the tensors ``inputs`` and ``outputs`` (ids of ``sg``), in that order. Where an op
    runs other subgraphs (IF, WHILE), every other subgraph of the file comes along at its index (the segment
    takes subgraph 0's place). ``values``: tensors of ``sg`` written as constants of these values (in the
    tensor's dtype and with the value's shape: run-time shape inputs a plan is specialised on)."""
    values = dict(values or {})
    src = model.subgraphs[sg]
    tree = schema.ModelT()
    tree.version = model.m.version or 3
    tree.description = b"tflfuse CPU segment"
    tree.buffers = [schema.BufferT()]
    tree.operatorCodes = []
    code_map: dict[int, int] = {}
    buffer_map: dict[int, int] = {}

    def buffer(index: int) -> int:
        if index not in buffer_map:
            raw = _raw_buffer(model, index)
            if raw is None:
                return 0
            b = schema.BufferT()
            b.data = np.frombuffer(raw, np.uint8).copy()
            buffer_map[index] = len(tree.buffers)
            tree.buffers.append(b)
        return buffer_map[index]

    def subgraph(g, op_ids, ins, outs, whole: bool):
        tmap: dict[int, int] = {}
        new = schema.SubGraphT()
        new.name, new.tensors, new.operators = g.name, [], []

        def tensor(t: int) -> int:
            t = int(t)
            if t < 0:
                return t
            if t not in tmap:
                tt = copy.copy(g.tensors[t])
                tt.buffer = buffer(tt.buffer)
                if g is src and t in values:   # a run-time value the plan is specialised on, as a constant
                    value = np.asarray(values[t], dtype=model.tensor_dtype(sg, t))   # (0-d stays 0-d)
                    b = schema.BufferT()
                    b.data = np.frombuffer(value.tobytes(), np.uint8).copy()
                    tree.buffers.append(b)
                    tt.buffer = len(tree.buffers) - 1
                    tt.shape, tt.shapeSignature = list(value.shape), None
                tmap[t] = len(new.tensors)
                new.tensors.append(tt)
            return tmap[t]

        if whole:
            for t in range(len(g.tensors)):
                tensor(t)
        for oi in op_ids:
            op = copy.copy(g.operators[oi])
            if op.opcodeIndex not in code_map:
                code_map[op.opcodeIndex] = len(tree.operatorCodes)
                tree.operatorCodes.append(copy.copy(model.m.operatorCodes[op.opcodeIndex]))
            op.opcodeIndex = code_map[op.opcodeIndex]
            op.inputs = [tensor(t) for t in op.inputs]
            op.outputs = [tensor(t) for t in op.outputs]
            if op.intermediates is not None:
                op.intermediates = [tensor(t) for t in op.intermediates]
            if op.largeCustomOptionsSize:   # custom options stored after the flatbuffer: inline them
                start = int(op.largeCustomOptionsOffset)
                op.customOptions = list(model._file[start:start + int(op.largeCustomOptionsSize)])
                op.largeCustomOptionsOffset = op.largeCustomOptionsSize = 0
            new.operators.append(op)
        new.inputs = [tensor(t) for t in ins]
        new.outputs = [tensor(t) for t in outs]
        return new

    seg = subgraph(src, ops, inputs, outputs, whole=False)
    tree.subgraphs = [seg]
    if any(called_subgraphs(src.operators[oi]) for oi in ops):
        for k in range(1, len(model.subgraphs)):
            g = model.subgraphs[k]
            tree.subgraphs.append(subgraph(g, range(len(g.operators)), g.inputs, g.outputs, whole=True))
    return model.derived(tree).to_bytes()

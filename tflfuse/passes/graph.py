"""Editing one subgraph of a :class:`~tflfuse.model.Model`: who reads and writes each tensor, constant values,
new tensors, constants and ops (builtin or tflfuse custom), and replacing a chain of ops by others.

Used by the pattern fusion (:mod:`tflfuse.passes.fuse`) and its inverse (:mod:`tflfuse.passes.unfuse`).
Edits are queued and applied by :meth:`Graph.commit`, which keeps the operators in a valid execution order.
"""

from __future__ import annotations

import collections
import functools
from typing import Mapping, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from ..model import Model

__all__ = ["Graph", "Replacement", "dispatches", "drop_unused_buffers"]

_TENSOR_TYPES = {np.dtype(np.float32): schema.TensorType.FLOAT32, np.dtype(np.int32): schema.TensorType.INT32,
                 np.dtype(np.float16): schema.TensorType.FLOAT16}


class Replacement:
    """Ops ``old`` (indices) replaced by ``new`` (OperatorT, in order), placed where the last old op was."""

    def __init__(self, old: Sequence[int], new: Sequence):
        self.old, self.new = sorted(old), list(new)


class Graph:
    """One subgraph of ``model`` opened for editing.

    ``values`` maps tensor index -> float32/int32 value for every constant, including the outputs of
    DEQUANTIZE ops of constants (float16 or int8 weights) and other ops the runtime folds at load; ``shapes``
    maps every tensor index to its static shape. Both come from :func:`tflfuse.runtime.plan.lower`.

    Raises:
      tflfuse.kernels.UnsupportedOpError / KernelError: the subgraph does not plan (an op without a kernel,
        shapes that disagree); passes rewrite only graphs that tflfuse can run.
    """

    def __init__(self, model: Model, subgraph: int = 0, target: str = "gpu"):
        from ..runtime.plan import lower

        self.model, self.index = model, subgraph
        self.sg = model.m.subgraphs[subgraph]
        lowered = lower(model, subgraph, target=target, relayout=False)   # the file's own tensors and layouts
        self._lowered = lowered
        self.values: dict[int, np.ndarray] = dict(lowered.consts)
        self.shapes: dict[int, tuple[int, ...]] = {t: s.shape for t, s in lowered.specs.items()}
        self.shapes.update({t: tuple(np.shape(v)) for t, v in self.values.items()})
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list[int]] = collections.defaultdict(list)
        for oi, op in enumerate(self.sg.operators or []):
            for t in op.outputs if op.outputs is not None else []:
                if t >= 0:   # -1: an absent output
                    self.producer[int(t)] = oi
            for t in op.inputs if op.inputs is not None else []:
                if t >= 0:
                    self.consumers[int(t)].append(oi)
        self.outputs = {int(t) for t in (self.sg.outputs if self.sg.outputs is not None else [])}
        self._replacements: list[Replacement] = []
        self._claimed: set[int] = set()

    # ---- reading ---------------------------------------------------------------------------------
    @functools.cached_property
    def dispatches(self) -> int:
        """Dispatches of the subgraph as it was opened (planned for ``target``), before any edit."""
        return dispatches(self._lowered)

    def op_name(self, oi: int) -> str:
        return self.model.op_name(self.index, oi)

    def attrs(self, oi: int) -> dict:
        return self.model.op_attrs(self.index, oi)

    def inputs(self, oi: int) -> list[int]:
        return self.model.op_inputs(self.index, oi)

    def outputs_of(self, oi: int) -> list[int]:
        return self.model.op_outputs(self.index, oi)

    def const(self, t: int) -> np.ndarray | None:
        """The value of tensor ``t`` when it is a constant (after load-time folding), else None."""
        return None if t < 0 else self.values.get(t)

    def is_runtime(self, t: int) -> bool:
        return t >= 0 and t not in self.values

    def private(self, t: int, reader: int) -> bool:
        """True when ``t`` is read by ``reader`` alone and is not a subgraph output: removing its producer
        with ``reader`` changes nothing else."""
        return t not in self.outputs and self.consumers.get(t, []) == [reader]

    def sole_reader(self, t: int) -> int | None:
        """The one op reading ``t`` (which is not a subgraph output), else None."""
        readers = self.consumers.get(t, [])
        return readers[0] if len(readers) == 1 and t not in self.outputs else None

    def free(self, *ops: int) -> bool:
        """No op of ``ops`` is part of an earlier queued replacement."""
        return not (set(ops) & self._claimed)

    # ---- adding ----------------------------------------------------------------------------------
    def add_tensor(self, shape: Sequence[int], name: str, data: np.ndarray | None = None) -> int:
        """A new float32 (or int32 / float16, from ``data``) tensor; with ``data`` a constant. Returns its index."""
        t = schema.TensorT()
        t.shape = [int(d) for d in shape]
        dtype = np.dtype(np.float32) if data is None else np.asarray(data).dtype
        t.type = _TENSOR_TYPES[dtype]
        t.name = name.encode()
        t.buffer = 0
        if data is not None:
            b = schema.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8).copy()
            self.model.m.buffers.append(b)
            t.buffer = len(self.model.m.buffers) - 1
        self.sg.tensors.append(t)
        index = len(self.sg.tensors) - 1
        self.shapes[index] = tuple(t.shape)
        if data is not None:
            self.values[index] = np.asarray(data)
        return index

    def add_const(self, data: np.ndarray, name: str) -> int:
        data = np.asarray(data)
        data = data.astype(np.int32 if data.dtype.kind in "iu" else np.float32)
        return self.add_tensor(data.shape, name, data)

    def add_weight(self, data: np.ndarray, name: str) -> tuple[int, list]:
        """A float32 constant input for a new op: stored as float16 behind a DEQUANTIZE op when that is
        lossless (weights that came from float16 stay float16, as the file had them).

        Returns:
          ``(tensor, ops)``: the float32 tensor to read, and the DEQUANTIZE op (or none) to place before the
          reader.
        """
        data = np.asarray(data, np.float32)
        half = data.astype(np.float16)
        if data.size < 16 or not np.array_equal(half.astype(np.float32), data):
            return self.add_const(data, name), []
        stored = self.add_tensor(half.shape, f"{name}/fp16", half)
        out = self.add_tensor(half.shape, name)
        self.values[out] = data
        return out, [self.builtin_op("DEQUANTIZE", [stored], [out])]

    def _opcode(self, name: str) -> int:
        codes = self.model.m.operatorCodes
        builtin = getattr(schema.BuiltinOperator, name, None) if name.isupper() else None
        for i, c in enumerate(codes):
            code = max(int(c.builtinCode), int(c.deprecatedBuiltinCode))
            if builtin is not None and code == builtin:
                return i
            if builtin is None and code == schema.BuiltinOperator.CUSTOM and c.customCode is not None and \
                    (c.customCode.decode() if isinstance(c.customCode, bytes) else str(c.customCode)) == name:
                return i
        c = schema.OperatorCodeT()
        if builtin is not None:
            c.builtinCode = builtin
            c.deprecatedBuiltinCode = min(builtin, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
        else:
            c.builtinCode = c.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
            c.customCode = name.encode()
        c.version = 1
        codes.append(c)
        return len(codes) - 1

    def builtin_op(self, name: str, inputs: Sequence[int], outputs: Sequence[int],
                   options: tuple[str, Mapping] | None = None):
        """A builtin op (``"CONV_2D"``) with its options table (``("Conv2DOptions", {"strideH": 2, ...})``,
        the schema's field names)."""
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = self._opcode(name), list(inputs), list(outputs)
        if options is not None:
            kind, values = options
            table = getattr(schema, kind + "T")()
            for k, v in values.items():
                if not hasattr(table, k):
                    raise AttributeError(f"{kind} has no field {k!r}")
                setattr(table, k, v)
            op.builtinOptionsType, op.builtinOptions = getattr(schema.BuiltinOptions, kind), table
        return op

    def custom_op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], attrs: Mapping):
        """A tflfuse fused op ``name`` whose custom options are ``attrs`` encoded as a composite's are
        (:func:`tflfuse.annotate.encode_attrs`, a flexbuffer map), so kernels decode both alike."""
        from ..annotate import encode_attrs

        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = self._opcode(name), list(inputs), list(outputs)
        op.customOptions = list(flexbuffers.Dumps(encode_attrs(dict(attrs))))
        op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        return op

    def raw_custom_op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], options: bytes):
        """A custom op whose custom options are ``options`` as they are (MediaPipe's ops store C structs)."""
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = self._opcode(name), list(inputs), list(outputs)
        op.customOptions = list(options)
        return op

    # ---- replacing -------------------------------------------------------------------------------
    def replace(self, old: Sequence[int], new: Sequence) -> None:
        """Queues replacing ops ``old`` by ``new``. The new ops' inputs must be available where the last old
        op stands (true when they are inputs of the old ops, or constants), and ``old`` must not overlap an
        earlier replacement."""
        if not self.free(*old):
            raise ValueError(f"ops {sorted(set(old) & self._claimed)} are already replaced")
        self._claimed.update(old)
        self._replacements.append(Replacement(old, new))

    def commit(self) -> int:
        """Applies the queued replacements; returns how many there were."""
        if not self._replacements:
            return 0
        at_last = {r.old[-1]: r for r in self._replacements}
        ops = []
        for oi, op in enumerate(self.sg.operators or []):
            if oi in at_last:
                ops.extend(at_last[oi].new)
            elif oi not in self._claimed:
                ops.append(op)
        self.sg.operators = ops
        n = len(self._replacements)
        self._replacements, self._claimed = [], set()
        self._prune()
        return n

    def _prune(self) -> None:
        """Drops DEQUANTIZE/DENSIFY ops of constants whose outputs nothing reads any more (weights that a
        replacement re-laid out as new constants)."""
        ops = list(self.sg.operators or [])
        while True:
            read = {int(t) for op in ops for t in (op.inputs if op.inputs is not None else [])} | self.outputs
            keep = [op for op in ops if not (
                _builtin_code(self.model, op) in (schema.BuiltinOperator.DEQUANTIZE, schema.BuiltinOperator.DENSIFY)
                and not any(int(t) in read for t in (op.outputs if op.outputs is not None else [])))]
            if len(keep) == len(ops):
                break
            ops = keep
        self.sg.operators = ops


def dispatches(lowered) -> int:
    """Dispatches one invoke of a :class:`~tflfuse.runtime.plan.LoweredGraph` runs (no GPU needed)."""
    return sum(0 if op.kernel.view else len(op.kernel.programs()) for op in lowered.ops)


def _builtin_code(model: Model, op) -> int:
    c = model.m.operatorCodes[op.opcodeIndex]
    return max(int(c.builtinCode), int(c.deprecatedBuiltinCode))


def drop_unused_buffers(model: Model) -> None:
    """Empties the buffers that no tensor still read or written by an op (or a subgraph input/output) uses,
    so weights replaced by re-laid-out copies do not stay in the file."""
    used: set[int] = {0}
    for sg in model.m.subgraphs:
        live = {int(t) for op in (sg.operators or []) for t in [*(op.inputs if op.inputs is not None else []),
                                                                 *(op.outputs if op.outputs is not None else [])]}
        live |= {int(t) for t in (sg.inputs if sg.inputs is not None else [])}
        live |= {int(t) for t in (sg.outputs if sg.outputs is not None else [])}
        used |= {int(sg.tensors[t].buffer) for t in live if t >= 0}
    for i, b in enumerate(model.m.buffers or []):
        if i not in used and b is not None and (b.data is not None or b.offset):
            b.data, b.offset, b.size = None, 0, 0

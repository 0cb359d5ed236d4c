"""Reading and writing .tflite files on LiteRT's own flatbuffer schema.

A :class:`Model` wraps the schema's object API (``ModelT``) so that graph passes can edit it and
:meth:`Model.to_bytes` can write it back. Everything the runtime needs from a file goes through here:
op names as they stand in the file (``CONV_2D``, or a custom op's code such as ``fused_bottleneck``),
builtin options as a plain ``dict`` with snake_case keys, custom options decoded from their flexbuffer
map, and constant tensor data as NumPy arrays (including buffers stored after the flatbuffer, located by
``Buffer.offset``/``Buffer.size`` relative to the start of the file).

This module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

__all__ = ["CompositeOp", "Model", "ModelError", "OpRef", "Quantization", "TENSOR_DTYPES", "builtin_op_name",
           "is_builtin_name"]

_FILE_IDENTIFIER = b"TFL3"
# The largest tensor the runtime accepts, in elements: past this a shape is a corrupt file, not a model.
MAX_TENSOR_ELEMENTS = 1 << 32


class ModelError(ValueError):
    """A .tflite file is malformed, truncated or refers to something that does not exist."""


def _enum_names(enum_cls) -> dict[int, str]:
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


_BUILTIN_NAMES = _enum_names(schema.BuiltinOperator)
_TENSOR_TYPE_NAMES = _enum_names(schema.TensorType)
_PADDING_NAMES = _enum_names(schema.Padding)
_ACTIVATION_NAMES = _enum_names(schema.ActivationFunctionType)

#: TFLite ``TensorType`` value -> NumPy dtype, for the types the runtime decodes.
TENSOR_DTYPES: dict[int, np.dtype] = {
    schema.TensorType.FLOAT32: np.dtype(np.float32),
    schema.TensorType.FLOAT16: np.dtype(np.float16),
    schema.TensorType.FLOAT64: np.dtype(np.float64),
    schema.TensorType.INT32: np.dtype(np.int32),
    schema.TensorType.INT64: np.dtype(np.int64),
    schema.TensorType.INT16: np.dtype(np.int16),
    schema.TensorType.INT8: np.dtype(np.int8),
    schema.TensorType.UINT8: np.dtype(np.uint8),
    schema.TensorType.UINT16: np.dtype(np.uint16),
    schema.TensorType.UINT32: np.dtype(np.uint32),
    schema.TensorType.UINT64: np.dtype(np.uint64),
    schema.TensorType.BOOL: np.dtype(np.bool_),
}


def builtin_op_name(code: int) -> str:
    """The TFLite name (``"CONV_2D"``) of a ``BuiltinOperator`` value."""
    return _BUILTIN_NAMES.get(code, f"BUILTIN_{code}")


def is_builtin_name(name: str) -> bool:
    """Whether ``name`` is a TFLite builtin op's name (``"CONV_2D"``), not a custom op's or composite's."""
    return name in _BUILTIN_SET


_BUILTIN_SET = frozenset(_BUILTIN_NAMES.values())


def _text(value) -> str:
    """A name from the file as str; bytes that are not UTF-8 (a corrupt file) show as escapes, not errors."""
    if value is None:
        return ""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", name).lower()


@dataclasses.dataclass(frozen=True)
class CompositeOp:
    """What a ``STABLEHLO_COMPOSITE`` op carries (``StableHLOCompositeOptions``).

    Attributes:
      name: the composite's name (a tflfuse composite's name, e.g. ``fused_bottleneck``).
      decomposition: index of the subgraph that computes the op from builtins.
      version: the composite's version.
    """

    name: str
    decomposition: int
    version: int


def _flexbuffer_map(raw: bytes) -> dict:
    try:
        opts = flexbuffers.Loads(raw)
    except Exception:  # not a flexbuffer: whatever the flexbuffers reader raises on foreign bytes
        opts = None
    return opts if isinstance(opts, dict) else {"_raw": raw}


@dataclasses.dataclass(frozen=True)
class Quantization:
    """A tensor's affine quantization (``QuantizationParameters``): real = scale * (q - zero_point).

    Attributes:
      scale: one float32 scale per tensor, or one per slice along ``axis`` (per-channel).
      zero_point: as many zero points as scales (a file giving one for several scales has it repeated).
      axis: the quantized dimension of per-channel parameters (0 for per-tensor ones).
    """

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1


@dataclasses.dataclass(frozen=True)
class OpRef:
    """Where an operator stands: subgraph index and operator index within it."""

    subgraph: int
    index: int


class Model:
    """A parsed .tflite model.

    Args:
      data: the file's bytes (the ``TFL3`` flatbuffer, possibly followed by out-of-flatbuffer buffers).

    Raises:
      ModelError: the bytes are not a .tflite model (too short, wrong file identifier, a flatbuffer
        that cannot be decoded, or indices that point outside their tables, signatures included).
      TypeError: ``data`` is not bytes (a path: use :meth:`from_path`).
    """

    def __init__(self, data: bytes | bytearray | memoryview):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a .tflite model is bytes, got {type(data).__name__}"
                            + ("; to read a file use Model.from_path()" if isinstance(data, (str, Path)) else ""))
        data = bytes(data)
        if len(data) < 8:
            raise ModelError(f"not a .tflite model: {len(data)} bytes is too short for a flatbuffer")
        if data[4:8] != _FILE_IDENTIFIER:
            raise ModelError(
                f"not a .tflite model: file identifier is {data[4:8]!r}, expected {_FILE_IDENTIFIER!r}")
        try:
            self.m = schema.ModelT.InitFromPackedBuf(data, 0)
        except Exception as e:  # the flatbuffers runtime raises anything from struct.error to IndexError
            raise ModelError(f"malformed .tflite flatbuffer: {type(e).__name__}: {e}") from e
        self._file = data
        self._check_indices()

    @classmethod
    def from_path(cls, path: str | Path) -> "Model":
        """Reads a .tflite file. Raises ``FileNotFoundError`` or :class:`ModelError`."""
        return cls(Path(path).read_bytes())

    def derived(self, tree) -> "Model":
        """A Model over ``tree`` (an edited copy of :attr:`m`) whose buffers stored after the flatbuffer are
        read from this model's file, as passes that rewrite a graph at load need."""
        model = object.__new__(Model)
        model.m, model._file = tree, self._file
        model._check_indices()
        return model

    def to_bytes(self) -> bytes:
        """Serializes the (possibly edited) model with the ``TFL3`` identifier."""
        import flatbuffers

        b = flatbuffers.Builder(1024)
        b.Finish(self.m.Pack(b), file_identifier=_FILE_IDENTIFIER)
        return bytes(b.Output())

    # ---- structure -------------------------------------------------------------------------------
    def _check_indices(self) -> None:
        m = self.m
        if not m.subgraphs:
            raise ModelError("model has no subgraphs")
        n_codes = len(m.operatorCodes or [])
        n_buffers = len(m.buffers or [])
        for si, sg in enumerate(m.subgraphs):
            # An absent vector reads as None; make every one a list so that no caller meets None.
            for field in ("tensors", "inputs", "outputs", "operators"):
                if getattr(sg, field) is None:
                    setattr(sg, field, [])
            for op in sg.operators:
                op.inputs = [] if op.inputs is None else op.inputs
                op.outputs = [] if op.outputs is None else op.outputs
            n_t = len(sg.tensors or [])
            for t_i, t in enumerate(sg.tensors or []):
                if not 0 <= t.buffer < max(n_buffers, 1):
                    raise ModelError(f"subgraph {si} tensor {t_i} refers to buffer {t.buffer}, "
                                     f"but the model has {n_buffers} buffers")
                shape = [int(d) for d in (t.shape if t.shape is not None else [])]
                if any(d < 0 for d in shape) and t.shapeSignature is None:
                    raise ModelError(f"subgraph {si} tensor {t_i} has a negative dimension {shape}")
                if math.prod(max(d, 1) for d in shape) > MAX_TENSOR_ELEMENTS:   # Python ints: no overflow
                    shown = shape if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ...] (rank {len(shape)})"
                    raise ModelError(f"subgraph {si} tensor {t_i} has an implausible shape {shown}")
            for name, idxs in (("inputs", sg.inputs), ("outputs", sg.outputs)):
                for i in (idxs if idxs is not None else []):
                    if not 0 <= i < n_t:
                        raise ModelError(f"subgraph {si} {name} refer to tensor {i}; it has {n_t}")
            for oi, op in enumerate(sg.operators or []):
                if not 0 <= op.opcodeIndex < n_codes:
                    raise ModelError(f"subgraph {si} operator {oi} has opcode index {op.opcodeIndex}, "
                                     f"but the model has {n_codes} operator codes")
                comp = self.composite(si, oi)
                if comp is not None and not 0 <= comp.decomposition < len(m.subgraphs):
                    raise ModelError(f"subgraph {si} operator {oi} (STABLEHLO_COMPOSITE {comp.name!r}) has "
                                     f"decomposition subgraph {comp.decomposition}; the model has "
                                     f"{len(m.subgraphs)} subgraphs")
                for i in list(op.inputs if op.inputs is not None else []) + list(
                        op.outputs if op.outputs is not None else []):
                    if not -1 <= i < n_t:
                        raise ModelError(f"subgraph {si} operator {oi} ({self.op_name(si, oi)}) refers to "
                                         f"tensor {i}; the subgraph has {n_t}")
        self._check_calls()
        for sd in m.signatureDefs or []:
            key = _text(sd.signatureKey)
            if not 0 <= sd.subgraphIndex < len(m.subgraphs):
                raise ModelError(f"signature {key!r} refers to subgraph {sd.subgraphIndex}; the model has "
                                 f"{len(m.subgraphs)}")
            n_t = len(m.subgraphs[sd.subgraphIndex].tensors)
            for tm in list(sd.inputs or []) + list(sd.outputs or []):
                if not 0 <= tm.tensorIndex < n_t:
                    raise ModelError(f"signature {key!r} maps {_text(tm.name)!r} to tensor {tm.tensorIndex}; "
                                     f"subgraph {sd.subgraphIndex} has {n_t}")

    def _check_calls(self) -> None:
        """ModelError for an op (WHILE, IF, CALL_ONCE...) naming a subgraph outside the file, or one that
        (through the ops it runs) runs the op's own subgraph again: LiteRT would recurse until it crashes.
        Composites' decompositions are checked where they are planned (KernelError)."""
        calls: dict[int, list[tuple[int, int]]] = {}   # subgraph -> (operator, called subgraph)
        n = len(self.m.subgraphs)
        for si, sg in enumerate(self.m.subgraphs):
            for oi, op in enumerate(sg.operators):
                for k in called_subgraph_indices(op):
                    if not 0 <= k < n:
                        raise ModelError(f"{self.op_name(si, oi)} (operator {oi} of subgraph {si}) runs subgraph "
                                         f"{k}; the model has {n} subgraphs")
                    calls.setdefault(si, []).append((oi, k))
        for start, edges in calls.items():
            for oi, first in edges:
                seen, todo = set(), [first]
                while todo:
                    g = todo.pop()
                    if g == start:
                        how = "its own subgraph" if first == start else f"subgraph {first}, which runs subgraph"
                        raise ModelError(f"{self.op_name(start, oi)} (operator {oi} of subgraph {start}) runs {how} "
                                         f"{start} again: a malformed file (recursive control flow) that LiteRT "
                                         f"would crash on; re-convert the model")
                    if g not in seen:
                        seen.add(g)
                        todo.extend(k for _, k in calls.get(g, ()))

    @property
    def subgraphs(self):
        return self.m.subgraphs

    def op_name(self, subgraph: int, index: int) -> str:
        """The op's name as it stands in the file: the builtin name, or a custom op's custom code."""
        code = self.m.operatorCodes[self.m.subgraphs[subgraph].operators[index].opcodeIndex]
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        if builtin == schema.BuiltinOperator.CUSTOM:
            cc = code.customCode
            return _text(cc)
        return builtin_op_name(builtin)

    def composite(self, subgraph: int, index: int) -> CompositeOp | None:
        """The name, decomposition subgraph and version of a ``STABLEHLO_COMPOSITE`` op; None for other ops."""
        opts = self.m.subgraphs[subgraph].operators[index].builtinOptions2
        if not isinstance(opts, schema.StableHLOCompositeOptionsT):
            return None
        return CompositeOp(_text(opts.name), int(opts.decompositionSubgraphIndex), int(opts.version))

    def decompositions(self) -> set[int]:
        """The subgraphs that are some ``STABLEHLO_COMPOSITE`` op's decomposition."""
        return {c.decomposition for si, sg in enumerate(self.m.subgraphs) for oi in range(len(sg.operators))
                if (c := self.composite(si, oi)) is not None}

    def called_subgraphs(self) -> set[int]:
        """The subgraphs that some op's options name (WHILE's cond and body, IF's branches, CALL_ONCE's,
        StableHLO's...): tflfuse hands such ops to LiteRT's CPU interpreter, which runs those subgraphs too, so
        they must hold only what LiteRT runs."""
        from .runtime.segment import called_subgraphs

        return {k for sg in self.m.subgraphs for op in (sg.operators or []) for k in called_subgraphs(op)}

    def op_names(self, subgraph: int = 0) -> list[str]:
        return [self.op_name(subgraph, i) for i in range(len(self.m.subgraphs[subgraph].operators or []))]

    def op_inputs(self, subgraph: int, index: int) -> list[int]:
        op = self.m.subgraphs[subgraph].operators[index]
        return [int(i) for i in (op.inputs if op.inputs is not None else [])]

    def op_outputs(self, subgraph: int, index: int) -> list[int]:
        op = self.m.subgraphs[subgraph].operators[index]
        return [int(i) for i in (op.outputs if op.outputs is not None else [])]

    def op_attrs(self, subgraph: int, index: int) -> dict:
        """The op's attributes as a dict with snake_case keys.

        Builtin options keep their schema names (``stride_w``, ``padding``, ``fused_activation_function``);
        enums become their names (``"SAME"``, ``"RELU6"``). A fused TANH or SIGN_BIT reads as ``"NONE"`` on the
        ops whose TFLite kernels compute none for it (:func:`~tflfuse.kernels.base.clamped_activation`: CONV_2D,
        ADD, the pools...). A custom op's flexbuffer map is decoded as it is
        (:mod:`tflfuse.annotate` turns it back into the attributes the user wrote). Custom options that are
        not a flexbuffer map (MediaPipe's ``Convolution2DTransposeBias`` stores a raw C struct) come back as
        ``{"_raw": bytes}``, for the op's kernel to decode. A ``STABLEHLO_COMPOSITE``'s attributes are its
        ``composite_attributes`` flexbuffer map, decoded the same way (its name and decomposition subgraph:
        :meth:`composite`).
        """
        op = self.m.subgraphs[subgraph].operators[index]
        if op.customOptions is not None and len(op.customOptions):
            return _flexbuffer_map(bytes(bytearray(op.customOptions)))
        if isinstance(op.builtinOptions2, schema.StableHLOCompositeOptionsT):
            raw = op.builtinOptions2.compositeAttributes
            return _flexbuffer_map(bytes(bytearray(raw))) if raw is not None and len(raw) else {}
        from .kernels.base import clamped_activation   # (the kernels import this module)

        attrs: dict = {}
        for options in (op.builtinOptions, op.builtinOptions2):
            if options is None:
                continue
            for key, value in vars(options).items():
                k = _snake(key)
                if k == "padding":
                    value = _PADDING_NAMES.get(value, value)
                elif k == "fused_activation_function":
                    value = _ACTIVATION_NAMES.get(value, value)
                    value = clamped_activation(self.op_name(subgraph, index), value)
                elif isinstance(value, np.ndarray):
                    value = value.tolist()
                attrs[k] = value
        return attrs

    # ---- tensors ---------------------------------------------------------------------------------
    def tensor(self, subgraph: int, index: int):
        return self.m.subgraphs[subgraph].tensors[index]

    def tensor_name(self, subgraph: int, index: int) -> str:
        n = self.tensor(subgraph, index).name
        return _text(n)

    def tensor_shape(self, subgraph: int, index: int) -> tuple[int, ...]:
        s = self.tensor(subgraph, index).shape
        return tuple(int(d) for d in (s if s is not None else []))

    def tensor_shape_signature(self, subgraph: int, index: int) -> tuple[int, ...]:
        t = self.tensor(subgraph, index)
        s = t.shapeSignature if t.shapeSignature is not None else t.shape
        return tuple(int(d) for d in (s if s is not None else []))

    def tensor_dtype(self, subgraph: int, index: int) -> np.dtype:
        t = self.tensor(subgraph, index)
        if t.type not in TENSOR_DTYPES:
            raise ModelError(f"subgraph {subgraph} tensor {index} ({self.tensor_name(subgraph, index)!r}) "
                             f"has type {_TENSOR_TYPE_NAMES.get(t.type, t.type)}, which tflfuse does not read")
        return TENSOR_DTYPES[t.type]

    def tensor_quantization(self, subgraph: int, index: int) -> Quantization | None:
        """The tensor's affine quantization parameters, or None where the file gives no scale.

        Raises:
          ModelError: zero points that are neither one nor one per scale, or per-channel scales whose count is
            not the size of their quantized dimension (the message names the tensor).
        """
        q = self.tensor(subgraph, index).quantization
        if q is None or q.scale is None or not len(q.scale):
            return None
        scale = tuple(float(np.float32(s)) for s in q.scale)
        zps = tuple(int(z) for z in (q.zeroPoint if q.zeroPoint is not None and len(q.zeroPoint) else [0]))
        where = f"subgraph {subgraph} tensor {index} ({self.tensor_name(subgraph, index)!r})"
        if len(zps) not in (1, len(scale)):
            raise ModelError(f"{where} has {len(scale)} quantization scales but {len(zps)} zero points")
        axis, shape = int(q.quantizedDimension), self.tensor_shape(subgraph, index)
        if len(scale) > 1 and not (0 <= axis < len(shape) and shape[axis] == len(scale)):
            raise ModelError(f"{where} of shape {list(shape)} has {len(scale)} quantization scales along "
                             f"dimension {axis}; they must match that dimension's size")
        return Quantization(scale, zps * len(scale) if len(zps) == 1 else zps, axis if len(scale) > 1 else 0)

    def tensor_type_name(self, subgraph: int, index: int) -> str:
        t = self.tensor(subgraph, index).type
        return _TENSOR_TYPE_NAMES.get(t, str(t))

    def tensor_data(self, subgraph: int, index: int) -> np.ndarray | None:
        """The constant data of a tensor as an array of its dtype and shape, or None for a variable tensor.

        Raises:
          ModelError: the buffer lies outside the file or its size disagrees with the tensor's shape.
        """
        t = self.tensor(subgraph, index)
        buf = self.m.buffers[t.buffer] if t.buffer < len(self.m.buffers or []) else None
        if buf is None:
            return None
        if buf.offset is not None and buf.offset > 1:
            if buf.offset + buf.size > len(self._file):
                raise ModelError(f"subgraph {subgraph} tensor {index}: buffer {t.buffer} spans bytes "
                                 f"{buf.offset}..{buf.offset + buf.size}, past the end of the file "
                                 f"({len(self._file)} bytes)")
            raw = np.frombuffer(self._file, np.uint8, count=buf.size, offset=buf.offset)
        elif buf.data is not None and len(buf.data):
            raw = np.asarray(buf.data, dtype=np.uint8)
        else:
            return None
        dtype = self.tensor_dtype(subgraph, index)
        shape = self.tensor_shape(subgraph, index)
        count = int(np.prod(shape, dtype=np.int64))
        if raw.size != count * dtype.itemsize:
            raise ModelError(f"subgraph {subgraph} tensor {index} ({self.tensor_name(subgraph, index)!r}): "
                             f"buffer holds {raw.size} bytes, shape {list(shape)} of {dtype} needs "
                             f"{count * dtype.itemsize}")
        return raw.view(dtype).reshape(shape).copy()

    # ---- signatures ------------------------------------------------------------------------------
    def signature_defs(self) -> dict[str, dict]:
        """``{signature_key: {"subgraph": i, "inputs": {name: tensor}, "outputs": {name: tensor}}}``."""
        out = {}
        for sd in self.m.signatureDefs or []:
            key = _text(sd.signatureKey)
            out[key] = {
                "subgraph": int(sd.subgraphIndex),
                "inputs": {_text(tm.name): int(tm.tensorIndex)
                           for tm in sd.inputs or []},
                "outputs": {_text(tm.name): int(tm.tensorIndex)
                            for tm in sd.outputs or []},
            }
        return out


def called_subgraph_indices(op) -> list[int]:
    """The subgraphs an op's options name (IF's branches, WHILE's cond and body, CALL_ONCE's, StableHLO's
    WHILE/REDUCE/CASE...), for an ``OperatorT`` of LiteRT's schema; a composite's decomposition is left out."""
    found: list[int] = []
    for opts in (op.builtinOptions, op.builtinOptions2):
        if opts is None or isinstance(opts, schema.StableHLOCompositeOptionsT):
            continue
        for k, v in vars(opts).items():
            if "ubgraph" in k and v is not None:
                found += [int(i) for i in np.ravel(v)]
    return found

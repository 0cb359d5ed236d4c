"""Lowering: kernel lookup, shape inference and load-time constant folding for one subgraph (no GPU).

:func:`lower` turns a :class:`~tflfuse.model.Model` subgraph into a :class:`LoweredGraph`: static shapes (given
the inputs' shapes, and the values of run-time shape inputs where the plan is specialised on them), one
:class:`~tflfuse.kernels.base.Kernel` per op, and the constants folded at load. :mod:`tflfuse.runtime.plan`
builds the GPU resources from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from ..kernels import kernel_class, supported_ops
from ..kernels.base import Kernel, KernelError, TensorSpec
from ..kernels.quant import quantized_kernel
from ..kernels.quant.hybrid import hybrid_kernel
from ..kernels.registry import missing_kernels_error
from ..model import Model, is_builtin_name
from ..passes.portable import inline_composites
from .int64 import INT64_REASON, int64_arithmetic

__all__ = ["LoweredGraph", "LoweredOp", "MAX_FOLDED_ELEMENTS", "OpRefusal", "Probe", "check_supported", "held",
           "lower"]

#: File dtype -> the dtype name of the runtime tensor holding it. bool is held as one i32 per element (0/1),
#: as are int8 and uint8 (quantized tensors; their constants too, widened when the plan uploads them),
#: int64 narrowed to int32 (its values must fit: set_tensor and constants are checked); set_tensor and get_tensor
#: convert, so users see the file's dtypes (:meth:`tflfuse.runtime.plan.ExecutionPlan.host_dtype`).
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool",
                np.dtype(np.int64): "int32", np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8"}
_QUANTIZED_TYPES = (9, 3)   # TensorType.INT8, UINT8: an op touching one is planned with quantized_kernel()


def _narrow_int64(value: np.ndarray, what: str) -> np.ndarray:
    """int64 values as int32, the dtype the runtime holds them in; KernelError naming ``what`` if one does not
    fit. Other arrays come back as they are."""
    value = np.asarray(value)
    if value.dtype != np.int64:
        return value
    if value.size and (value.min() < -2 ** 31 or value.max() >= 2 ** 31):
        bad = value.ravel()[(value.ravel() < -2 ** 31) | (value.ravel() >= 2 ** 31)][0]
        raise KernelError(f"{what} holds the int64 value {int(bad)}, outside int32: the WebGPU runtime holds int64 "
                          f"tensors as int32, so their values must lie in [-2**31, 2**31)")
    return value.astype(np.int32)


_INT64 = 4   # TensorType.INT64


@dataclasses.dataclass
class LoweredOp:
    """One op of the graph with its kernel (None when folded at load or a view)."""

    index: int
    name: str
    kernel: Kernel
    inputs: list[int]     # tensor indices, -1 for absent/static
    outputs: list[int]


@dataclasses.dataclass
class LoweredGraph:
    subgraph: int
    ops: list[LoweredOp]
    specs: dict[int, TensorSpec]       # every runtime tensor
    consts: dict[int, np.ndarray]      # constants, float32 after folding
    inputs: list[int]
    outputs: list[int]
    aliases: dict[int, int]            # view output -> tensor whose buffer it shares
    names: dict[int, str] = dataclasses.field(default_factory=dict)   # tensor -> its name in the file
    crossing: list[int] = dataclasses.field(default_factory=list)   # moved to/from CPU segments: own buffers
    segments: list = dataclasses.field(default_factory=list)   # CPU fallback's (runtime.fallback.CpuSegment)
    narrowed: set[int] = dataclasses.field(default_factory=set)   # int64 in the file, held as int32
    dynamic: set[int] = dataclasses.field(default_factory=set)   # shapes following from run-time values (known=)

    def describe(self, t: int) -> str:
        """``tensor 3 ('conv1/weights')`` for messages (the name where the file gives one)."""
        return f"tensor {t} ({self.names[t]!r})" if t in self.names else f"tensor {t}"

    def storage_root(self, t: int) -> int:
        while t in self.aliases:
            t = self.aliases[t]
        return t

    @property
    def dispatch_count(self) -> int:
        return sum(len(op.kernel.programs()) for op in self.ops if not op.kernel.view)


def check_supported(model: Model, subgraph: int | None = None) -> None:
    """Checks that every op has a kernel (of ``subgraph``, or of every subgraph but the decompositions of
    composites that run as one kernel). Touches no GPU.

    Raises:
      UnsupportedOpError: naming EVERY op without a kernel at once, each with its operator index and
        subgraph (``.ops`` holds them), and how to give an op a kernel (see
        :func:`tflfuse.kernels.registry.missing_kernels_error`).
      KernelError: a composite whose decomposition subgraph contains itself.
    """
    if subgraph is None:  # decomposition subgraphs are checked where their composite has no kernel
        skip = model.decompositions()
        sgs = [si for si in range(len(model.subgraphs)) if si not in skip]
    else:
        sgs = [subgraph]
    missing: dict[tuple[str, int, int], None] = {}   # ordered, once each (decompositions may be shared)
    for si in sgs:
        _check_ops(model, si, (), missing)
    if missing:
        raise missing_kernels_error(list(missing))


def _has_fused_kernel(name: str) -> bool:
    """Whether a STABLEHLO_COMPOSITE named ``name`` runs as one tflfuse kernel (a non-builtin name with one)."""
    return not is_builtin_name(name) and name in supported_ops()


def _check_ops(model: Model, si: int, chain: tuple[int, ...], missing: dict) -> None:
    """Adds ``(name, subgraph, index)`` to ``missing`` for each op of subgraph ``si`` (and of the
    decompositions it runs) without a kernel."""
    known = set(supported_ops())
    for oi, name in enumerate(model.op_names(si)):
        comp = model.composite(si, oi)
        if comp is None:
            if name not in known:
                missing[(name, si, oi)] = None
        elif not _has_fused_kernel(comp.name):   # runs its decomposition, inlined by lower()
            if comp.decomposition in chain + (si,):
                raise KernelError(f"STABLEHLO_COMPOSITE {comp.name!r} (operator {oi} of subgraph {si}): its "
                                  f"decomposition subgraph {comp.decomposition} contains itself")
            _check_ops(model, comp.decomposition, chain + (si,), missing)


def held(model: Model, sg: int, t: int) -> bool:
    """Whether tensor ``t`` of subgraph ``sg`` has a type the WebGPU runtime holds (:data:`_DTYPE_NAMES`).
    Raises ModelError for a type tflfuse does not read at all (string, complex)."""
    return model.tensor_dtype(sg, t) in _DTYPE_NAMES


def _runtime_spec(model: Model, sg: int, t: int, shape=None) -> TensorSpec:
    dtype = model.tensor_dtype(sg, t)
    if dtype not in _DTYPE_NAMES:
        raise KernelError(f"tensor {t} ({model.tensor_name(sg, t)!r}) is {dtype}; the WebGPU runtime "
                          f"holds float32, int32, bool, int8, uint8 and int64 (as int32) tensors")
    return TensorSpec(shape if shape is not None else model.tensor_shape(sg, t), _DTYPE_NAMES[dtype])


@dataclasses.dataclass(frozen=True)
class OpRefusal:
    """An op whose kernel refused it while :func:`lower` probed the graph (``probe=``).

    Attributes:
      index, name: the operator index (of the subgraph as planned) and the op's name.
      error: the kernel's :class:`KernelError`, naming the op (what ``lower`` raises without a probe).
      runtime: tensor ids of the op's shape inputs (begin, size, axis, shape, perm...: the kernel's
        ``static_inputs``) that are computed at run time; empty for any other refusal.
      uncertain: the op reads a tensor whose shape the probe could not know (an output of a refused op, or a
        tensor computed from one): the refusal may go away once the plan is specialised on run-time values.
    """

    index: int
    name: str
    error: KernelError
    runtime: tuple[int, ...] = ()
    uncertain: bool = False

    @property
    def reason(self) -> str:
        """The kernel's message without the ``OP (operator i of subgraph s): `` prefix, for fallback reports."""
        text = str(self.error)
        prefix = f"{self.name} (operator {self.index} of subgraph "
        return text.split("): ", 1)[1] if text.startswith(prefix) and "): " in text else text


@dataclasses.dataclass
class Probe:
    """What :func:`lower` found refused when given one (``probe=Probe()``): instead of raising at the first op
    whose kernel refuses, it records each (:attr:`refusals`, by operator index) and lowers on, giving a refused
    op's outputs the shapes the file declares; those tensors, and every tensor computed from them, are
    :attr:`uncertain`. Structural faults of the file (a tensor written twice, an input read before it is
    written, a wrong output count) are still raised."""

    refusals: dict[int, OpRefusal] = dataclasses.field(default_factory=dict)
    uncertain: set[int] = dataclasses.field(default_factory=set)

    @property
    def runtime(self) -> list[int]:
        """The run-time shape inputs of every refused op, in op order, once each."""
        return list(dict.fromkeys(t for r in self.refusals.values() for t in r.runtime))

    def certain(self) -> list[OpRefusal]:
        """The refusals that no run-time value can lift: not for a run-time shape input, and on inputs whose
        shapes are known."""
        return [r for r in self.refusals.values() if not r.runtime and not r.uncertain]


class _Refused(Exception):
    """Raised inside :func:`lower` when probing: the op is recorded, not the graph refused."""

    def __init__(self, error: KernelError, runtime: Sequence[int] = ()):
        super().__init__(str(error))
        self.error, self.runtime = error, tuple(runtime)


def _declared_mismatch(model: Model, sg: int, t: int, shape: Sequence[int]) -> list[int] | None:
    """The file's declared shape of tensor ``t`` where it disagrees with ``shape`` (a dimension its shape
    signature leaves dynamic, -1, agrees with any size), else None."""
    declared = model.tensor_shape(sg, t)
    if not declared or tuple(declared) == tuple(shape):
        return None
    sig = model.tensor_shape_signature(sg, t) if model.tensor(sg, t).shapeSignature is not None else declared
    if len(sig) == len(shape) and all(s == -1 or s == d for s, d in zip(sig, shape)):
        return None
    return list(declared)


def lower(model: Model, subgraph: int = 0, input_shapes: Mapping[int, Sequence[int]] | None = None,
          target: str = "gpu", relayout: bool = True, host_ops: Mapping | None = None,
          known: Mapping[int, np.ndarray] | None = None, probe: Probe | None = None) -> LoweredGraph:
    """Kernel lookup, shape inference and load-time folding for one subgraph. No GPU work.

    Args:
      input_shapes: tensor index -> shape, for inputs resized with ``resize_tensor_input``.
      target: ``"gpu"`` or ``"cpu"`` (the software adapter): passed to kernels that tune their schedule
        (workgroup shape, blocking) by it; the values computed do not depend on it.
      relayout: for ``"gpu"``, give kernels with a ``relayout`` (CONV_2D, FULLY_CONNECTED) their constant
        weights re-laid out, as new constants with ids past the file's tensors. False keeps every op reading
        the file's own tensors in the file's layouts (graph passes, shader manifests).
      host_ops: op index -> ``f(specs, consts)`` for ops that run elsewhere (LiteRT's CPU interpreter:
        :mod:`tflfuse.runtime.fallback`, which has checked the ops): each is skipped, ``f`` returning the
        :class:`TensorSpec` of the tensors its CPU segment writes that GPU ops read. Subgraph inputs of a type
        the runtime does not hold are then left to them.
      known: tensor id -> the value a run-time tensor has at this invoke, for ops that read it as a shape input
        (a kernel's ``static_inputs``: SLICE's begin, RESHAPE's shape, MEAN's axis, TOPK_V2's k...): the plan
        is specialised on those values (:mod:`tflfuse.runtime.specialise`). The tensor is still computed where
        other ops read it as data; the shapes that follow from it are not checked against the file's.
      probe: record refusals there instead of raising them (:class:`Probe`).

    A shape the file declares for an op's output is checked where the file's shape signature fixes it (a -1
    dimension is free), unless inputs were resized. An absent op output (tensor index -1: nothing reads it,
    :mod:`tflfuse.passes.prune`) gets a tensor of its own, with an id past the file's; the kernel writes it
    there and its buffer is reused at once.
    Raises:
      UnsupportedOpError: an op has no kernel (named with its index and subgraph).
      KernelError: an op's shapes or attributes are not supported, or disagree with the file; a shape input
        (begin, axis, shape...) computed at run time and not in ``known``; a graph that is not a dataflow graph
        (a tensor written twice, or read and written by one op; too many inputs); a constant folded at load
        past :data:`MAX_FOLDED_ELEMENTS`. With a ``probe``, only the structural ones.
    """
    if host_ops is None:
        check_supported(model, subgraph)
    model = inline_composites(model, subgraph, keep=_has_fused_kernel)  # decompositions without a kernel
    input_shapes = dict(input_shapes or {})
    known = dict(known or {})
    sg = model.subgraphs[subgraph]
    inputs = [int(i) for i in (sg.inputs if sg.inputs is not None else [])]
    outputs = [int(i) for i in (sg.outputs if sg.outputs is not None else [])]
    specs: dict[int, TensorSpec] = {}
    consts: dict[int, np.ndarray] = {}
    aliases: dict[int, int] = {}
    host_written: set[int] = set()
    for t in inputs:
        if host_ops is None or held(model, subgraph, t):
            specs[t] = _runtime_spec(model, subgraph, t, input_shapes.get(t))
    ops: list[LoweredOp] = []
    written: set[int] = set()
    relaid: dict[tuple[int, str], int] = {}     # (tensor, layout) -> the re-laid-out constant's id
    extra_names: dict[int, str] = {}
    n_file = len(sg.tensors)
    fresh = itertools.count(n_file)   # ids past the file's tensors: re-laid-out constants, absent outputs
    inexact = int64_arithmetic(model, subgraph)   # refused below unless folded (partition sends them to the CPU)
    dynamic: set[int] = set()   # shapes that follow from ``known`` values: the file's declared ones do not hold
    uncertain = probe.uncertain if probe is not None else set()

    def refuse(error: KernelError, runtime: Sequence[int] = ()):
        if probe is None:
            raise error
        raise _Refused(error, runtime)

    for oi in range(len(sg.operators or [])):
        if host_ops is not None and oi in host_ops:   # runs on the CPU (a segment of the fallback)
            specs.update(host_ops[oi](specs, consts))
            outs = model.op_outputs(subgraph, oi)
            host_written.update(outs)
            written.update(outs)
            if any(t in uncertain for t in model.op_inputs(subgraph, oi)):
                uncertain.update(outs)
            dynamic.update(outs)   # LiteRT's shapes (or a run's): the file's declared ones need not hold
            continue
        name = model.op_name(subgraph, oi)
        if name == "STABLEHLO_COMPOSITE":   # kept by inline_composites: it has a fused kernel
            name = model.composite(subgraph, oi).name
        cls = kernel_class(name)
        if _quantized_op(model, subgraph, oi):   # int8/uint8: TFLite's integer (or dynamic-range) kernels
            cls = hybrid_kernel(model, subgraph, oi) or quantized_kernel(name, cls)
        where = f"{name} (operator {oi} of subgraph {subgraph})"
        attrs = _op_attrs(model, subgraph, oi, cls, where)
        if "target" in cls.attr_defaults:
            attrs.setdefault("target", target)
        in_ids = model.op_inputs(subgraph, oi)
        out_ids = model.op_outputs(subgraph, oi)
        for k, t in enumerate(out_ids):   # absent (-1, nothing reads it): computed into a tensor of its own
            if t < 0:
                out_ids[k] = next(fresh)
                extra_names[out_ids[k]] = f"output {k} of {where}, absent in the file"
        _check_op_tensors(cls, where, in_ids, out_ids)
        for t in out_ids:  # each tensor is written once (buffer lifetimes and views rely on it)
            if t in specs or t in consts:
                what = ("a subgraph input" if t in inputs else "written by an earlier op" if t in written
                        else "a constant")
                raise KernelError(f"{where}: output tensor {t} is {what}; a tensor may be written only once")
            written.add(t)
        unsure = any(t in uncertain for t in in_ids)
        # Output shapes checked against the file's unless they follow from run-time values or uncertain ones.
        free = bool(input_shapes) or unsure or any(t in dynamic for t in in_ids)
        # constant inputs the kernel takes re-laid out: by position, or by position for this many inputs
        relayouts = (cls.relayout_of(len(in_ids)) if hasattr(cls, "relayout_of") else getattr(cls, "relayout", {})) \
            if target == "gpu" and relayout else {}
        try:
            in_specs: list[TensorSpec | None] = []
            runtime_static: list[int] = []
            for pos, t in enumerate(in_ids):
                if t < 0:
                    if pos not in cls.optional_inputs:
                        raise KernelError(f"{where}: input {pos} is absent but required")
                    in_specs.append(None)
                    continue
                if t not in consts and t not in specs:
                    sparse = model.tensor(subgraph, t).sparsity is not None   # DENSIFY expands it at load
                    data = _stored_values(model, subgraph, t) if sparse else model.tensor_data(subgraph, t)
                    if (data is None and t not in inputs and 0 in model.tensor_shape(subgraph, t)
                            and t not in written):
                        data = np.zeros(model.tensor_shape(subgraph, t), model.tensor_dtype(subgraph, t))  # no bytes
                    if data is not None:
                        consts[t] = data
                if pos in cls.static_inputs:
                    if t in consts:
                        attrs[cls.static_inputs[pos]] = consts[t].tolist()
                    elif t in known:   # a run-time value the plan is specialised on
                        attrs[cls.static_inputs[pos]] = np.asarray(known[t]).tolist()
                        free = True
                    else:
                        runtime_static.append(t)
                    in_specs.append(None)
                elif t in consts:
                    if pos in getattr(cls, "constant_attrs", {}):  # also read at plan time (GATHER's range check)
                        attrs[cls.constant_attrs[pos]] = consts[t]
                    layout = relayouts.get(pos)
                    if layout is not None and layout[0] not in attrs:   # a weight re-laid out at load
                        attr, value, transform = layout
                        key = (t, value)
                        if key not in relaid:   # a new tensor id, past the file's, shared by the ops reading it
                            relaid[key] = next(fresh)
                            consts[relaid[key]] = np.ascontiguousarray(transform(consts[t]))
                            extra_names[relaid[key]] = f"{model.tensor_name(subgraph, t)} ({value})"
                        attrs[attr] = value
                        in_ids = [relaid[key] if i == pos else u for i, u in enumerate(in_ids)]
                        t = relaid[key]
                    in_specs.append(TensorSpec(consts[t].shape,
                                               _DTYPE_NAMES.get(consts[t].dtype, str(consts[t].dtype))))
                elif t in specs:
                    in_specs.append(specs[t])
                elif pos in getattr(cls, "state_inputs", ()) and model.tensor(subgraph, t).isVariable:
                    in_specs.append(None)   # a variable tensor holding a state (an LSTM's): zero at each invoke
                else:
                    raise KernelError(f"{where}: input {pos} (tensor {t}, {model.tensor_name(subgraph, t)!r}) "
                                      f"is read before any op writes it")
            if runtime_static:
                pos = in_ids.index(runtime_static[0])
                refuse(KernelError(f"{where}: input {pos} ({cls.static_inputs[pos]}) must be a constant"),
                       runtime_static)
            with _refusable(where, refuse):
                kernel = cls(in_specs, attrs)
            runtime_in = [t for pos, t in enumerate(in_ids) if t >= 0 and pos not in cls.static_inputs]
            # Folded at load: every input a constant, or an op of the input's shape alone (SHAPE).
            folded = hasattr(kernel, "fold") and (getattr(kernel, "folds_from_shape", False)
                                                   or all(t in consts for t in runtime_in))
            if folded:
                _check_fold_size(kernel, where)
                with _refusable(where, refuse):
                    values = kernel.fold([consts.get(t) for t in runtime_in])
            elif oi in inexact:
                refuse(KernelError(f"{where}: {INT64_REASON} would wrap its int64 result at int32; run it on "
                                   f"LiteRT's CPU interpreter (Interpreter(..., cpu_fallback=True), the default)"))
            else:
                with _refusable(where, refuse):
                    out_specs = kernel.output_specs()
        except _Refused as r:   # recorded; lowered on with the shapes the file declares, marked uncertain
            probe.refusals[oi] = OpRefusal(oi, name, r.error, r.runtime, unsure)
            for t in out_ids:
                specs[t] = _declared_spec(model, subgraph, t)
                uncertain.add(t)
            continue
        if free:
            (uncertain if unsure else dynamic).update(out_ids)
        if folded:
            for t, value in zip(out_ids, values):
                bad = None if free or t >= n_file else _declared_mismatch(model, subgraph, t, np.shape(value))
                if bad is not None:
                    raise KernelError(f"{where}: output tensor {t} is declared {bad} but folding the "
                                      f"op's constant inputs gives {list(np.shape(value))}")
                consts[t] = value
            continue
        if len(out_specs) != len(out_ids):
            raise KernelError(f"{where}: the file lists {len(out_ids)} outputs, the op has {len(out_specs)}")
        for t, s in zip(out_ids, out_specs):
            bad = None if free or t >= n_file else _declared_mismatch(model, subgraph, t, s.shape)
            if bad is not None:
                raise KernelError(f"{where}: output tensor {t} is declared {bad} but the op's "
                                  f"inputs and attributes give {list(s.shape)}")
            specs[t] = s
        for t in runtime_in:  # constants read by a GPU kernel become runtime tensors with a weight buffer
            if t in consts:
                what = f"{where}: constant tensor {t} ({extra_names.get(t) or model.tensor_name(subgraph, t)!r})"
                # (np.ascontiguousarray makes a 0-d array 1-d: the shape is kept as it was)
                consts[t] = np.ascontiguousarray(_narrow_int64(consts[t], what)).reshape(np.shape(consts[t]))
        if kernel.view:
            aliases[out_ids[0]] = runtime_in[0]
        ops.append(LoweredOp(oi, name, kernel, in_ids, out_ids))
    for t in outputs:
        if t not in specs and t not in consts and t not in host_written:
            data = model.tensor_data(subgraph, t)   # a constant output (as LiteRT, its data is the result)
            if data is None and t < n_file and 0 in model.tensor_shape(subgraph, t):   # empty: no bytes to hold
                data = np.zeros(model.tensor_shape(subgraph, t), model.tensor_dtype(subgraph, t))
            if data is None:
                raise KernelError(f"subgraph {subgraph} output tensor {t} is never written")
            consts[t] = data
    names = {t: extra_names.get(t) or model.tensor_name(subgraph, t) for t in (*specs, *consts)}
    graph = LoweredGraph(subgraph, ops, specs, consts, inputs, outputs, aliases, names)
    graph.narrowed = {t for t in (*specs, *consts) if t < n_file and sg.tensors[t].type == _INT64}
    graph.dynamic = dynamic
    return graph


def _declared_spec(model: Model, sg: int, t: int) -> TensorSpec:
    """The spec the file declares for tensor ``t`` (float32 where its type is not one the runtime holds; ``()``
    for a tensor past the file's), for the outputs of an op a probe refused."""
    if t >= len(model.subgraphs[sg].tensors):
        return TensorSpec(())
    try:
        return _runtime_spec(model, sg, t)
    except KernelError:
        return TensorSpec(model.tensor_shape(sg, t))


@contextlib.contextmanager
def _refusable(where: str, refuse):
    """As :func:`_located`, the error then given to ``refuse`` (raised, or recorded by a probe)."""
    try:
        with _located(where):
            yield
    except KernelError as e:
        refuse(e)


#: The largest constant that folding an op at load may make, in elements (1 GiB of float32): GATHER, PACK
#: or CONCATENATION of constants can describe outputs far larger than the file (a corrupt or hostile one).
MAX_FOLDED_ELEMENTS = 1 << 28
_DENSE_LEVEL = 0   # DimensionType.DENSE of a sparse tensor's dim_metadata


def _check_fold_size(kernel: Kernel, where: str) -> None:
    """Refuses to fold an op whose output (known before it is computed) is implausibly large."""
    shape = getattr(kernel, "out", None)
    if not isinstance(shape, tuple):
        shape = kernel.attrs.get("dense_shape") if getattr(kernel, "needs_sparsity", False) else None
    if shape is not None and math.prod(int(d) for d in shape) > MAX_FOLDED_ELEMENTS:
        raise KernelError(f"{where}: folding its constant inputs at load would make a tensor of shape "
                          f"{list(shape)} ({math.prod(shape)} elements, over {MAX_FOLDED_ELEMENTS})")
    sparsity = kernel.attrs.get("sparsity") if getattr(kernel, "needs_sparsity", False) else None
    if sparsity is not None and shape is not None:
        # Each DENSE level multiplies the nodes walked by its size; a valid format never walks more nodes
        # than the dense tensor has elements, a corrupt one could ask for terabytes.
        dense = [int(m.denseSize) for m in (getattr(sparsity, "dimMetadata", None) or [])
                 if int(m.format) == _DENSE_LEVEL]
        if math.prod(dense) > max(math.prod(int(d) for d in shape), 1):
            raise KernelError(f"{where}: sparsity parameters with dense levels of sizes {dense} describe more "
                              f"elements than the dense shape {list(shape)} holds")


@contextlib.contextmanager
def _located(where: str, what: str = "unusable shapes or attributes"):
    """Re-raises an error of a kernel built from a file's op as a :class:`KernelError` naming the op.

    Attributes come from the file, so a value of the wrong type (a string stride) is bad input, not a bug:
    the TypeError or ValueError it causes inside a kernel becomes a KernelError too."""
    try:
        yield
    except KernelError as e:
        raise KernelError(f"{where}: {e}") from None
    except (TypeError, ValueError, IndexError) as e:
        raise KernelError(f"{where}: {what} ({type(e).__name__}: {e})") from e


def _check_op_tensors(cls: type[Kernel], where: str, in_ids: list[int], out_ids: list[int]) -> None:
    """Input count, and no tensor both read and written by one op (LiteRT refuses both alike)."""
    names = tuple(cls.input_names)
    if names and not in_ids:
        raise KernelError(f"{where}: the op has no inputs; it takes {', '.join(names)}")
    if names and not any(n.endswith("...") for n in names) and len(in_ids) > len(names):
        raise KernelError(f"{where}: the op has {len(in_ids)} inputs; it takes at most {len(names)} "
                          f"({', '.join(names)})")
    if len(set(out_ids)) != len(out_ids):
        raise KernelError(f"{where}: the op lists an output tensor twice: {out_ids}")
    both = sorted(set(t for t in in_ids if t >= 0) & set(out_ids))
    if both:
        raise KernelError(f"{where}: tensor {both[0]} is both an input and an output of the op")


def _op_attrs(model: Model, sg: int, oi: int, cls: type[Kernel], where: str = "") -> dict:
    where = where or f"{model.op_name(sg, oi)} (operator {oi} of subgraph {sg})"
    attrs = model.op_attrs(sg, oi)
    if getattr(cls, "decode_custom_options", None):
        with _located(where, "unreadable custom options"):
            attrs = cls.decode_custom_options(attrs)
    ins = model.op_inputs(sg, oi)
    if getattr(cls, "needs_quantization", False) and ins and ins[0] >= 0:
        t = ins[0]
        q = model.tensor(sg, t).quantization
        if q is not None and q.scale is not None and len(q.scale):
            scale = [float(s) for s in q.scale]
            zero_point = [int(z) for z in (q.zeroPoint if q.zeroPoint is not None and len(q.zeroPoint) else [0])]
            dim, shape = int(q.quantizedDimension), model.tensor_shape(sg, t)
            if len(zero_point) not in (1, len(scale)):
                raise KernelError(f"{where}: tensor {t} has {len(scale)} quantization scales but "
                                  f"{len(zero_point)} zero points")
            if len(scale) > 1 and not (0 <= dim < len(shape) and shape[dim] == len(scale)):
                raise KernelError(f"{where}: tensor {t} of shape {list(shape)} has {len(scale)} quantization "
                                  f"scales along dimension {dim}; they must match that dimension's size")
            attrs["scale"], attrs["zero_point"], attrs["quantized_dimension"] = scale, zero_point, dim
    outs = model.op_outputs(sg, oi)
    if getattr(cls, "needs_io_quantization", False):   # int8/uint8 kernels: every tensor's scales, zero points
        attrs["input_quantization"] = [model.tensor_quantization(sg, t) if t >= 0 else None for t in ins]
        attrs["output_quantization"] = [model.tensor_quantization(sg, t) if t >= 0 else None for t in outs]
    if getattr(cls, "needs_output_dtype", False) and outs and outs[0] >= 0:   # CAST: the file's output type
        attrs["output_dtype"] = str(model.tensor_dtype(sg, outs[0]))
    if getattr(cls, "needs_sparsity", False) and ins and ins[0] >= 0:  # DENSIFY: its constant's format
        attrs["sparsity"] = model.tensor(sg, ins[0]).sparsity
        attrs["dense_shape"] = list(model.tensor_shape(sg, ins[0]))
    return attrs


def _quantized_op(model: Model, sg: int, oi: int) -> bool:
    """Whether operator ``oi`` reads or writes an int8 or uint8 tensor."""
    tensors = model.subgraphs[sg].tensors
    return any(0 <= t < len(tensors) and tensors[t].type in _QUANTIZED_TYPES
               for t in model.op_inputs(sg, oi) + model.op_outputs(sg, oi))


def _stored_values(model: Model, sg: int, t: int) -> np.ndarray | None:
    """The values a sparse constant stores, flat (its shape is the dense one, which DENSIFY gives it)."""
    buf = model.m.buffers[model.tensor(sg, t).buffer]
    if buf.offset is not None and buf.offset > 1:
        raw = model._file[buf.offset:buf.offset + buf.size]
        if len(raw) != buf.size:
            raise KernelError(f"tensor {t} ({model.tensor_name(sg, t)!r}): buffer runs past the end of the file")
    elif buf.data is not None and len(buf.data):
        raw = np.asarray(buf.data, np.uint8).tobytes()
    else:
        return None
    dtype = model.tensor_dtype(sg, t)
    if len(raw) % dtype.itemsize:
        raise KernelError(f"tensor {t} ({model.tensor_name(sg, t)!r}): {len(raw)} bytes are not {dtype} values")
    return np.frombuffer(raw, dtype).copy()



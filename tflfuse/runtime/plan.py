"""ExecutionPlan: static shapes, one kernel per op, buffer lifetimes, pipelines and bind groups.

The plan is derived from a :class:`~tflfuse.model.Model` subgraph and never edited by hand. Building it
has two halves: :func:`lower` (no GPU: kernel lookup, shape inference, load-time constant folding) and
:class:`ExecutionPlan` (GPU: weight upload, reused buffers, pipelines and bind groups, built once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from ..kernels import kernel_class, supported_ops
from ..kernels.base import Kernel, KernelError, Program, TensorSpec
from ..kernels.half import half_binding_size, half_storage
from ..kernels.registry import missing_kernels_error
from ..model import Model, is_builtin_name
from ..passes.portable import inline_composites
from .device import ShaderCompileError
from .int64 import INT64_REASON, int64_arithmetic
from .profile import SUSTAINED_REPS, gpu_time_plan, pass_gpu_us, profile_plan, wall_seconds  # noqa: F401 (re-exported)

__all__ = ["ExecutionPlan", "LoweredOp", "LoweredGraph", "PRECISIONS", "check_supported", "lower"]

#: The plan-level precisions: ``"float32"`` (the default) and ``"float16"`` (float tensors stored as IEEE
#: binary16 on the GPU, arithmetic in f32: :mod:`tflfuse.kernels.half`; needs the ``shader-f16`` feature).
PRECISIONS = ("float32", "float16")

#: File dtype -> the dtype name of the runtime tensor holding it. bool is held as one i32 per element (0/1),
#: int64 narrowed to int32 (its values must fit: set_tensor and constants are checked); set_tensor and get_tensor
#: convert, so users see the file's dtypes (:meth:`ExecutionPlan.host_dtype`).
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool",
                np.dtype(np.int64): "int32"}


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
                          f"holds float32, int32, bool and int64 (as int32) tensors")
    return TensorSpec(shape if shape is not None else model.tensor_shape(sg, t), _DTYPE_NAMES[dtype])


def lower(model: Model, subgraph: int = 0, input_shapes: Mapping[int, Sequence[int]] | None = None,
          target: str = "gpu", relayout: bool = True, host_ops: Mapping | None = None) -> LoweredGraph:
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

    An absent op output (tensor index -1: nothing reads it, :mod:`tflfuse.passes.prune`) gets a tensor of its
    own, with an id past the file's; the kernel writes it there and its buffer is reused at once.
    Raises:
      UnsupportedOpError: an op has no kernel (named with its index and subgraph).
      KernelError: an op's shapes or attributes are not supported, or disagree with the file; a graph that is
        not a dataflow graph (a tensor written twice, or read and written by one op; too many inputs); a
        constant folded at load past :data:`MAX_FOLDED_ELEMENTS`.
    """
    if host_ops is None:
        check_supported(model, subgraph)
    model = inline_composites(model, subgraph, keep=_has_fused_kernel)  # decompositions without a kernel
    input_shapes = dict(input_shapes or {})
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
    for oi in range(len(sg.operators or [])):
        if host_ops is not None and oi in host_ops:   # runs on the CPU (a segment of the fallback)
            specs.update(host_ops[oi](specs, consts))
            host_written.update(model.op_outputs(subgraph, oi))
            written.update(model.op_outputs(subgraph, oi))
            continue
        name = model.op_name(subgraph, oi)
        if name == "STABLEHLO_COMPOSITE":   # kept by inline_composites: it has a fused kernel
            name = model.composite(subgraph, oi).name
        cls = kernel_class(name)
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
        in_specs: list[TensorSpec | None] = []
        for pos, t in enumerate(in_ids):
            if t < 0:
                if pos not in cls.optional_inputs:
                    raise KernelError(f"{where}: input {pos} is absent but required")
                in_specs.append(None)
                continue
            if t not in consts and t not in specs:
                sparse = model.tensor(subgraph, t).sparsity is not None   # DENSIFY expands it at load
                data = _stored_values(model, subgraph, t) if sparse else model.tensor_data(subgraph, t)
                if data is None and t not in inputs and 0 in model.tensor_shape(subgraph, t) and t not in written:
                    data = np.zeros(model.tensor_shape(subgraph, t), model.tensor_dtype(subgraph, t))   # no bytes
                if data is not None:
                    consts[t] = data
            if pos in cls.static_inputs:
                if t not in consts:
                    raise KernelError(f"{where}: input {pos} ({cls.static_inputs[pos]}) must be a constant")
                attrs[cls.static_inputs[pos]] = consts[t].tolist()
                in_specs.append(None)
            elif t in consts:
                if pos in getattr(cls, "constant_attrs", {}):  # also read at plan time (GATHER's range check)
                    attrs[cls.constant_attrs[pos]] = consts[t]
                layout = getattr(cls, "relayout", {}).get(pos) if target == "gpu" and relayout else None
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
                in_specs.append(TensorSpec(consts[t].shape, _DTYPE_NAMES.get(consts[t].dtype, str(consts[t].dtype))))
            elif t in specs:
                in_specs.append(specs[t])
            elif pos in getattr(cls, "state_inputs", ()) and model.tensor(subgraph, t).isVariable:
                in_specs.append(None)   # a variable tensor holding a state (an LSTM's): zero at each invoke
            else:
                raise KernelError(f"{where}: input {pos} (tensor {t}, {model.tensor_name(subgraph, t)!r}) "
                                  f"is read before any op writes it")
        with _located(where):
            kernel = cls(in_specs, attrs)
        runtime_in = [t for pos, t in enumerate(in_ids) if t >= 0 and pos not in cls.static_inputs]
        # Folded at load: every input a constant, or an op of the input's shape alone (SHAPE).
        folded = hasattr(kernel, "fold") and (getattr(kernel, "folds_from_shape", False)
                                               or all(t in consts for t in runtime_in))
        if folded:
            _check_fold_size(kernel, where)
            with _located(where):
                values = kernel.fold([consts.get(t) for t in runtime_in])
            for t, value in zip(out_ids, values):
                declared = model.tensor_shape(subgraph, t) if t < n_file else ()
                if not input_shapes and declared and tuple(declared) != np.shape(value):
                    raise KernelError(f"{where}: output tensor {t} is declared {list(declared)} but folding the "
                                      f"op's constant inputs gives {list(np.shape(value))}")
                consts[t] = value
            continue
        if oi in inexact:
            raise KernelError(f"{where}: {INT64_REASON} would wrap its int64 result at int32; run it on LiteRT's "
                              f"CPU interpreter (Interpreter(..., cpu_fallback=True), the default)")
        with _located(where):
            out_specs = kernel.output_specs()
        if len(out_specs) != len(out_ids):
            raise KernelError(f"{where}: the file lists {len(out_ids)} outputs, the op has {len(out_specs)}")
        for t, s in zip(out_ids, out_specs):
            declared = model.tensor_shape(subgraph, t) if t < n_file else ()
            if not input_shapes and declared and tuple(declared) != s.shape:
                raise KernelError(f"{where}: output tensor {t} is declared {list(declared)} but the op's "
                                  f"inputs and attributes give {list(s.shape)}")
            specs[t] = s
        for t in runtime_in:  # constants read by a GPU kernel become runtime tensors with a weight buffer
            if t in consts:
                what = f"{where}: constant tensor {t} ({extra_names.get(t) or model.tensor_name(subgraph, t)!r})"
                consts[t] = np.ascontiguousarray(_narrow_int64(consts[t], what))
        if kernel.view:
            aliases[out_ids[0]] = runtime_in[0]
        ops.append(LoweredOp(oi, name, kernel, in_ids, out_ids))
    for t in outputs:
        if t not in specs and t not in consts and t not in host_written:
            data = model.tensor_data(subgraph, t)   # a constant output (as LiteRT, its data is the result)
            if data is None:
                raise KernelError(f"subgraph {subgraph} output tensor {t} is never written")
            consts[t] = data
    names = {t: extra_names.get(t) or model.tensor_name(subgraph, t) for t in (*specs, *consts)}
    graph = LoweredGraph(subgraph, ops, specs, consts, inputs, outputs, aliases, names)
    graph.narrowed = {t for t in (*specs, *consts) if t < n_file and sg.tensors[t].type == _INT64}
    return graph


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
    if getattr(cls, "needs_output_dtype", False) and outs and outs[0] >= 0:   # CAST: the file's output type
        attrs["output_dtype"] = str(model.tensor_dtype(sg, outs[0]))
    if getattr(cls, "needs_sparsity", False) and ins and ins[0] >= 0:  # DENSIFY: its constant's format
        attrs["sparsity"] = model.tensor(sg, ins[0]).sparsity
        attrs["dense_shape"] = list(model.tensor_shape(sg, ins[0]))
    return attrs


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


class ExecutionPlan:
    """GPU resources for a lowered graph: weight buffers, reused activation buffers, pipelines and bind
    groups, all made once; :meth:`run` submits every dispatch in one command buffer.

    Args:
      graph: the lowered graph.
      device: the :class:`~tflfuse.runtime.device.Device`.
      preserve_all_tensors: give every tensor its own buffer, so that intermediates can be read.
      precision: one of :data:`PRECISIONS`. ``"float16"`` stores every float32 tensor (inputs, outputs,
        intermediates, weights) as float16 on the GPU: :meth:`write` rounds float32 values to float16 and
        :meth:`read` returns float32 again. int32 tensors, scratch buffers and the arithmetic stay 32-bit.
    Raises:
      ValueError: an unknown ``precision``, or ``"float16"`` on a device without the ``shader-f16`` feature.
      KernelError: a tensor is larger than the device's max storage binding.
      ShaderCompileError: a kernel's WGSL does not compile; the message names the op, its index, the program
        and the op's input shapes.
      DeviceLostError: the device is lost (as :meth:`write`, :meth:`run` and :meth:`read`).
    """

    def __init__(self, graph: LoweredGraph, device, preserve_all_tensors: bool = False,
                 precision: str = "float32"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        if precision == "float16" and "shader-f16" not in device.features:
            raise ValueError(f"precision 'float16' needs the WebGPU feature 'shader-f16', which the adapter "
                             f"{device.name} does not offer; use precision='float32'")
        self.precision = precision
        self._half = precision == "float16"
        self.graph = graph
        self.preserve_all_tensors = preserve_all_tensors
        self.device = device
        self.buffers: dict[int, object] = {}       # tensor -> GPU buffer (runtime tensors and weights)
        self.buffer_count = 0
        self.activation_bytes = 0   # GPU memory of the (reused) buffers for inputs, outputs, intermediates, scratch
        self.constant_bytes = 0     # GPU memory of the weights
        with device.guard("allocate_tensors()"):
            self._alloc()
            self._build()

    def _build(self) -> None:
        graph, device = self.graph, self.device
        self.steps: list[tuple[Program, object, object]] = []   # (program, pipeline, bind group)
        self.step_ops: list[LoweredOp] = []                      # the op of each step
        for op in graph.ops:
            if op.kernel.view:
                continue
            scratch = self._scratch.get(op.index, [])
            for prog in op.kernel.programs():
                if self._half:
                    prog = half_storage(prog)
                if device.loop_limit is not None and prog.loop_trips >= device.loop_limit:
                    raise KernelError(
                        f"{op.name} (operator {op.index}): its shader runs about {prog.loop_trips} loop "
                        f"iterations per invocation; the adapter {device.name} stops loops after "
                        f"{device.loop_limit} and would return wrong values (input shapes "
                        f"{[list(s.shape) if s else None for s in op.kernel.inputs]})")
                try:
                    pipeline = device.pipeline(prog)
                except ShaderCompileError as e:
                    raise ShaderCompileError(
                        f"{op.name} (operator {op.index} of subgraph {graph.subgraph}, program {prog.name}, "
                        f"input shapes {[list(s.shape) if s else None for s in op.kernel.inputs]}): {e}") from e
                self.steps.append((prog, pipeline, self._bind_group(op, prog, scratch)))
                self.step_ops.append(op)
        self._record = _pass_recorder(self.steps)
        # Outputs (the smallest first, up to _STAGING_LIMIT bytes in all) are copied to mappable buffers by each
        # run's own command buffer, so that get_tensor() maps them instead of recording and submitting a copy.
        wgpu = device._wgpu
        self._staging = {}
        staged_bytes = 0
        for t in sorted(dict.fromkeys(t for t in graph.outputs if t in graph.specs and graph.specs[t].nbytes),
                        key=self.storage_nbytes):
            nbytes = self.storage_nbytes(t)
            if staged_bytes + nbytes > _STAGING_LIMIT:
                break
            self._staging[t] = device.device.create_buffer(
                size=nbytes, label=f"read-back {t}", usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            staged_bytes += nbytes
        self.activation_bytes += staged_bytes
        self._staged: set[int] = set()   # outputs whose read-back buffer holds the last run's values
        self._next = None   # the next run's command buffer, recorded ahead

    # ---- buffers ---------------------------------------------------------------------------------
    def _is_half(self, t: int) -> bool:
        """Whether tensor ``t`` is stored as float16 (a float tensor of a float16 plan)."""
        if not self._half:
            return False
        spec = self.graph.specs.get(t)
        return spec.dtype == "float32" if spec is not None else self.graph.consts[t].dtype.kind == "f"

    def _dtype_name(self, t: int) -> str:
        spec = self.graph.specs.get(t)
        return spec.dtype if spec is not None else str(self.graph.consts[t].dtype)

    def storage_nbytes(self, t: int) -> int:
        """Bytes of tensor ``t``'s values on the GPU (float16 ones: 2 each, rounded up to a multiple of 4)."""
        spec = self.graph.specs[t]
        return half_binding_size(spec.size) if self._is_half(t) else spec.nbytes

    def _alloc(self) -> None:
        g, dev = self.graph, self.device
        limit = dev.max_storage_binding
        gpu_read = {t for op in g.ops for pos, t in enumerate(op.inputs)
                    if t >= 0 and pos not in op.kernel.static_inputs}
        for t, value in g.consts.items():
            if t in gpu_read:
                data = np.ascontiguousarray(value, dtype=np.float32 if value.dtype.kind == "f" else
                                            np.int32 if value.dtype.kind == "b" else value.dtype)
                if self._is_half(t):
                    data = _half_bytes(data)
                if data.nbytes > limit:
                    raise KernelError(f"constant {g.describe(t)} {list(data.shape)} is {data.nbytes} bytes, over "
                                      f"the device's max storage binding of {limit} bytes")
                self.buffers[t] = dev.create_buffer(data.nbytes, data=data.tobytes(), label=f"const{t}")
                self.constant_bytes += data.nbytes
        # Lifetimes over storage roots: first op writing, last op reading; inputs/outputs are pinned.
        keep = list(g.specs) if self.preserve_all_tensors else g.inputs + g.outputs + g.crossing
        pinned = {g.storage_root(t) for t in keep if t in g.specs}
        last_use: dict[int, int] = {}
        first_def: dict[int, int] = {}
        for pos, op in enumerate(g.ops):
            for t in op.inputs:
                if t in g.specs:
                    last_use[g.storage_root(t)] = pos
            for t in op.outputs:
                r = g.storage_root(t)
                first_def.setdefault(r, pos)
                last_use[r] = max(last_use.get(r, pos), pos)
        free: list[tuple[int, object]] = []
        self._scratch: dict[int, list] = {}

        def take(size: int, label: str):
            if size > limit:
                raise KernelError(f"{label} needs {size} bytes, over the device's max storage binding "
                                  f"of {limit} bytes")
            fits = [(s, b) for s, b in free if s >= size]
            if fits:
                best = min(fits, key=lambda sb: sb[0])
                free.remove(best)
                return best
            self.buffer_count += 1
            size16 = max(16, -(-size // 16) * 16)
            self.activation_bytes += size16
            return size16, dev.create_buffer(size16, label=label)

        roots: dict[int, tuple[int, object]] = {}
        for r in sorted(pinned):
            nbytes = self.storage_nbytes(r)
            if nbytes > limit:
                raise KernelError(f"{g.describe(r)} {list(g.specs[r].shape)} needs {nbytes} bytes, "
                                  f"over the device's max storage binding of {limit} bytes")
            self.buffer_count += 1
            self.activation_bytes += nbytes
            roots[r] = (0, dev.create_buffer(nbytes, label=f"io{r}"))
        for pos, op in enumerate(g.ops):
            for t in op.outputs:
                r = g.storage_root(t)
                if r not in roots:
                    roots[r] = take(self.storage_nbytes(r), f"{g.describe(t)} {list(g.specs[r].shape)}")
            scratch = [take(n, f"scratch of op {op.index}") for n in op.kernel.scratch_sizes()]
            self._scratch[op.index] = [b for _, b in scratch]
            free.extend(scratch)
            for r, last in list(last_use.items()):
                if last == pos and r not in pinned and r in roots:
                    free.append(roots[r])
        for t in g.specs:
            r = g.storage_root(t)
            if r in roots:
                self.buffers[t] = roots[r][1]

    def _bind_group(self, op: LoweredOp, prog: Program, scratch: list):
        entries = []
        for i, b in enumerate(prog.bindings):
            kind, k = b.role
            t = op.inputs[k] if kind == "input" else op.outputs[k] if kind == "output" else None
            buf = scratch[k] if kind == "scratch" else self.buffers[t]
            if t is not None and self._half and ("f16" in b.elem_type) != self._is_half(t):
                raise KernelError(f"{op.name} (operator {op.index}, program {prog.name}): binding {b.name!r} "
                                  f"declares {b.elem_type} for {self.graph.describe(t)}, stored as "
                                  f"{'f16' if self._is_half(t) else self._dtype_name(t)}")
            # A zero-size binding is invalid (wgpu-native aborts on it): an empty tensor binds its 16-byte
            # buffer, which the shader never reads (its invocations all return at once).
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": 0, "size": max(b.size, 16)}})
        if prog.uniforms:
            data = prog.uniform_bytes()
            ubuf = self.device.create_buffer(len(data), data=data, uniform=True, label=f"{prog.name} params")
            entries.append({"binding": len(prog.bindings), "resource": {"buffer": ubuf, "offset": 0,
                                                                        "size": len(data)}})
        pipeline = self.device.pipeline(prog)
        return self.device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    def memory_report(self) -> dict:
        """Bytes of GPU memory the plan holds, beside what one buffer per tensor would take.

        ``activations``: the reused buffers (inputs, outputs, intermediates, scratch) and the outputs'
        read-back buffers; ``constants``: weights;
        ``all_tensors``: the sum of every runtime tensor's size (what no reuse would allocate).
        """
        return {"activations": self.activation_bytes, "constants": self.constant_bytes,
                "all_tensors": sum(self.storage_nbytes(t) for t in self.graph.specs)}

    # ---- execution -------------------------------------------------------------------------------
    @property
    def dispatch_count(self) -> int:
        return len(self.steps)

    def host_dtype(self, tensor: int) -> np.dtype:
        """The dtype users set and get tensor ``tensor`` in (the file's): float32, int32, bool, or int64 for a
        tensor held as int32 (:data:`_DTYPE_NAMES`)."""
        if tensor in self.graph.narrowed:
            return np.dtype(np.int64)
        return np.dtype({"float32": np.float32, "bool": np.bool_}.get(self.graph.specs[tensor].dtype, np.int32))

    def write(self, tensor: int, value: np.ndarray, source: str | None = None) -> None:
        """Uploads ``value`` (of the tensor's dtype and shape) into an input's buffer; a float16 plan rounds
        float32 values to float16 (to nearest even; past 65504 they become inf, as float16 does). bool values
        are stored as int32 0/1, int64 ones as int32 (KernelError naming the tensor, or ``source``, what
        computed the value, if one does not fit)."""
        value = np.ascontiguousarray(value)
        if value.dtype == np.bool_:
            value = value.astype(np.int32)
        elif value.dtype == np.int64:
            what = (f"{self.graph.describe(tensor)}, computed by {source} and read by a GPU op," if source else
                    f"the value set for {self.graph.describe(tensor)}")
            value = _narrow_int64(value, what)
        data = (_half_bytes(value) if self._is_half(tensor) else value).tobytes()
        self._staged.discard(tensor)   # a passthrough output's staged copy is now stale
        if data:  # wgpu refuses an empty write; an empty tensor has nothing to upload
            with self.device.guard("set_tensor()"):
                self.device.device.queue.write_buffer(self.buffers[tensor], 0, data)

    def _encode(self):
        """One command buffer: every dispatch in one compute pass, then the outputs' copies to their
        read-back buffers."""
        encoder = self.device.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        self._record(cpass)
        cpass.end()
        for tensor, staging in self._staging.items():
            encoder.copy_buffer_to_buffer(self.buffers[tensor], 0, staging, 0, self.storage_nbytes(tensor))
        return encoder.finish()

    def run(self) -> None:
        """Submits one command buffer with every dispatch, then records the next invoke's command buffer
        while the GPU runs this one (WebGPU command buffers are single-use; the queue's buffer writes still
        land before the submit that follows them).

        Raises:
          DeviceLostError: the device is lost (now or before).
        """
        with self.device.guard("invoke()"):
            command_buffer, self._next = self._next, None
            if command_buffer is None:
                command_buffer = self._encode()
            else:
                self.device.check_alive()   # a buffer recorded before a loss must never be submitted
            self.device.device.queue.submit([command_buffer])
            self._staged = set(self._staging)
            self._next = self._encode()

    def read(self, tensor: int) -> np.ndarray:
        if tensor in self.graph.consts:   # an int64 constant read by a GPU op was narrowed: int64 again
            value = self.graph.consts[tensor].copy()
            return value.astype(np.int64) if tensor in self.graph.narrowed else value
        spec = self.graph.specs[tensor]
        dtype = np.float32 if spec.dtype == "float32" else np.int32
        if spec.dtype == "bool" or tensor in self.graph.narrowed:   # held as int32: the file's dtype back
            return self._read_raw(tensor, spec, dtype).astype(self.host_dtype(tensor))
        return self._read_raw(tensor, spec, dtype)

    def _read_raw(self, tensor: int, spec: TensorSpec, dtype) -> np.ndarray:
        if spec.size == 0:
            return np.zeros(spec.shape, dtype)
        nbytes = self.storage_nbytes(tensor)
        with self.device.guard("get_tensor()"):
            if tensor in self._staged:   # an output copied by the last run's own command buffer
                staging = self._staging[tensor]
                staging.map_sync(self.device._wgpu.MapMode.READ)
                try:
                    raw = staging.read_mapped(0, nbytes)
                finally:
                    staging.unmap()
            else:
                raw = self.device.device.queue.read_buffer(self.buffers[tensor], 0, nbytes)
        if self._is_half(tensor):
            return np.frombuffer(raw, np.float16)[:spec.size].astype(np.float32).reshape(spec.shape)
        return np.frombuffer(raw, dtype=dtype).reshape(spec.shape).copy()

    def time_run(self, repeats: int = 10) -> float:
        """Median wall-clock seconds of ``run`` plus a read-back of the first output (after one warm-up)."""
        return wall_seconds(self.run, self.read, self.graph.outputs[0], repeats)


_STAGING_LIMIT = 64 << 20


def _half_bytes(values: np.ndarray) -> np.ndarray:
    """Float values as float16 (round to nearest even), padded with a zero to a multiple of 4 bytes (WebGPU's
    unit for buffer writes and copies)."""
    with np.errstate(over="ignore"):
        half = values.astype(np.float16).ravel()
    return np.concatenate([half, np.zeros(1, np.float16)]) if half.size % 2 else half


def _pass_recorder(steps: Sequence[tuple[Program, object, object]]):
    """A function that records every step (set pipeline, set bind group, dispatch) into a compute pass.

    With wgpu's wgpu-native backend it calls the three C entry points directly on the objects' handles:
    the Python wrappers' per-call error capture and argument conversion cost more than wgpu-native's own
    recording (about 250 of 740 microseconds for 53 dispatches on the H200's host). Errors still surface:
    wgpu-native validates a pass when the encoder finishes, which goes through the Python API. Any other
    backend records through the Python API.
    """
    try:
        from wgpu.backends.wgpu_native import _api

        native = all(isinstance(p, _api.GPUComputePipeline) and isinstance(b, _api.GPUBindGroup)
                     for _, p, b in steps)
        lib, null = _api.lib, _api.ffi.NULL
    except (ImportError, AttributeError):
        native = False
    if not native:
        def record(cpass) -> None:
            for prog, pipeline, bind_group in steps:
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, bind_group)
                cpass.dispatch_workgroups(*prog.dispatch)
        return record

    set_pipeline = lib.wgpuComputePassEncoderSetPipeline
    set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
    dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
    handles = [(p._internal, b._internal, *(tuple(prog.dispatch) + (1, 1))[:3]) for prog, p, b in steps]

    def record(cpass) -> None:
        h = cpass._internal
        for pipeline, bind_group, x, y, z in handles:
            set_pipeline(h, pipeline)
            set_bind_group(h, 0, bind_group, 0, null)
            dispatch(h, x, y, z)
    record.objects = steps   # the handles stay valid while the wrappers live
    return record


def run_op(device, key: str, inputs: Sequence[np.ndarray | None], attrs: Mapping | None = None,
           constant: Sequence[bool] | None = None, precision: str = "float32") -> list[np.ndarray]:
    """Runs one kernel on arrays: the first input as a runtime tensor, the rest as constants (weights).

    For kernel tests and shader checks: the same plan, buffers and dispatch path as a model's op.

    Args:
      device: a :class:`~tflfuse.runtime.device.Device`.
      key: the op name (``"CONV_2D"``, ``"fused_bottleneck"``).
      inputs: float32 (or int32, or bool) arrays in the op's input order (``None`` for an absent optional input).
      attrs: the op's attributes.
      constant: per input, whether it is a constant (default: all but the first).
      precision: the plan's precision (:data:`PRECISIONS`).
    Returns:
      the op's outputs as arrays of their dtypes (float32, int32, bool).
    """
    cls = kernel_class(key)
    inputs = [None if a is None else np.asarray(a, np.int32 if np.asarray(a).dtype.kind in "iu" else
                                                np.bool_ if np.asarray(a).dtype.kind == "b" else np.float32)
              for a in inputs]
    specs = [None if a is None else TensorSpec(a.shape, _DTYPE_NAMES[a.dtype]) for a in inputs]
    kernel = cls(specs, dict(attrs or {}))
    constant = list(constant) if constant is not None else [i > 0 for i in range(len(inputs))]
    n_in = len(inputs)
    outs = kernel.output_specs()
    out_ids = list(range(n_in, n_in + len(outs)))
    in_ids = [-1 if a is None else i for i, a in enumerate(inputs)]
    specs_map = {t: s for t, s in zip(out_ids, outs)}
    consts = {}
    runtime = []
    for i, a in enumerate(inputs):
        if a is None:
            continue
        if constant[i]:
            consts[i] = np.ascontiguousarray(a)
        else:
            specs_map[i] = specs[i]
            runtime.append(i)
    graph = LoweredGraph(0, [LoweredOp(0, key, kernel, in_ids, out_ids)], specs_map, consts, runtime,
                         out_ids, {out_ids[0]: in_ids[0]} if kernel.view else {})
    plan = ExecutionPlan(graph, device, precision=precision)
    for i in runtime:
        plan.write(i, np.ascontiguousarray(inputs[i]))
    plan.run()
    return [plan.read(t) for t in out_ids]

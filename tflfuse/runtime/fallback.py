"""The CPU fallback: ops the WebGPU runtime cannot run go to LiteRT's CPU interpreter in the same invoke.

A builtin op without a tflfuse kernel, one whose GPU kernel refuses it (``partition``'s ``kernel_refused``, found
by :mod:`tflfuse.runtime.specialise`), and (transitively) an op reading a tensor of a type the runtime does not
hold (uint8, int8, float16...) that such an op or a subgraph input gives, or writing one from a runtime value,
runs on ``ai_edge_litert.interpreter.Interpreter`` with its builtin kernels (:data:`OP_RESOLVER`), as does a
custom op LiteRT has a kernel for (:data:`LITERT_CUSTOM_OPS`). An op its GPU kernel refuses for shape values that
are invalid (:mod:`tflfuse.runtime.validate`) does not fall back: it is refused. The subgraph is split in file
(topological) order into GPU and CPU segments; only the tensors that cross between them move (read back from the
GPU before a CPU segment, uploaded after it). The split is data, as the rest of the plan: each
:class:`CpuSegment` (in ``LoweredGraph.segments``) holds the bytes of a small .tflite with exactly its ops and
their constants (written on LiteRT's schema by :func:`tflfuse.runtime.segment.segment_tflite`) and the tensor ids
it takes and gives; :func:`partition` decides the split without a GPU, :func:`lower_split` lowers the GPU ops
around it, and :class:`SegmentRunner` runs both.

This module does not import TensorFlow; LiteRT's interpreter is imported when a CPU segment is first made.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
from absl import logging

from .._litert import info_lines_to_log
from ..kernels import UnsupportedOpError, supported_ops
from ..kernels.base import KernelError, TensorSpec
from ..model import Model, ModelError, is_builtin_name
from ..passes.portable import inline_composites
from .int64 import int64_arithmetic
from .profile import wall_seconds
from .lower import _DTYPE_NAMES, LoweredGraph, Probe, _has_fused_kernel, check_supported, held, lower
from .plan import ExecutionPlan, _pass_recorder
from .segment import _is_constant, called_subgraphs, segment_tflite  # noqa: F401 (re-exported)

__all__ = ["LITERT_CUSTOM_OPS", "OP_RESOLVER", "CpuSegment", "FallbackOp", "Partition", "SegmentRunner",
           "ShapeChanged", "called_subgraphs", "litert_runs", "log_fallback", "lower_split", "partition",
           "segment_tflite"]

#: The op resolver of the segments' LiteRT interpreters: LiteRT's builtin kernels (tflite/kernels/*.cc), without
#: the XNNPACK delegate that ``AUTO`` adds. A segment's run-time shape values are constants of its file (the plan
#: is specialised on them), which XNNPACK takes as static: it clamps a SLICE whose begin and size leave the tensor
#: (begin [2, 1], size [3, 2] of a [3, 4] input gives a [1, 2] result) where the builtin kernel fails ("Invalid
#: begin and size"), as TensorFlow does; and the builtin kernels are the reference the tests hold every kernel to.
#: Ops falling back are few and small (control flow, types the GPU does not hold), so XNNPACK's speed matters little:
#: a Keras LSTM's WHILE (batch 2, 32 steps, 16 features, 64 units) invokes in 1.38 ms against XNNPACK's 1.22 ms.
OP_RESOLVER = "BUILTIN_WITHOUT_DEFAULT_DELEGATES"

#: Builtin codes that are no op LiteRT's CPU interpreter runs (markers of the schema, not ops).
_NOT_OPS = frozenset({"DELEGATE", "PLACEHOLDER_FOR_GREATER_OP_CODES", "CUSTOM"})

#: Custom ops that LiteRT's builtin op resolver runs beside the builtins (tflite/core/kernels/register.cc adds
#: them): they fall back as builtins do.
LITERT_CUSTOM_OPS = frozenset({"TFLite_Detection_PostProcess", "AudioSpectrogram", "Mfcc", "NumericVerify"})


def litert_runs(name: str) -> bool:
    """Whether LiteRT's CPU interpreter has a kernel for an op of this name (a builtin op, or one of
    :data:`LITERT_CUSTOM_OPS`): one that may fall back."""
    return (is_builtin_name(name) and name not in _NOT_OPS) or name in LITERT_CUSTOM_OPS


@dataclasses.dataclass(frozen=True)
class FallbackOp:
    """One op that runs on LiteRT's CPU interpreter: its operator ``index`` (in the subgraph as planned:
    composites without a kernel inlined), builtin ``name`` and the ``reason`` (``"no GPU kernel"``, or the
    tensor of a type the runtime does not hold that it reads or writes)."""

    index: int
    name: str
    reason: str


@dataclasses.dataclass
class Partition:
    """Which ops of one subgraph run on the CPU (GPU-free; :func:`partition`).

    Attributes:
      subgraph: the subgraph's index.
      model: the model as planned (composites without a fused kernel inlined: what op indices refer to).
      cpu: the ops that fall back, in op order.
      refused: ``(op name, subgraph, index)`` of ops that neither runs (custom ops without a kernel).
      kernel_refused: operator index -> the refusal of the GPU kernel, for the ops that fall back because their
        kernel refused them (``partition``'s ``kernel_refused``).
    """

    subgraph: int
    model: Model
    cpu: list[FallbackOp]
    refused: list[tuple[str, int, int]]
    kernel_refused: dict[int, str] = dataclasses.field(default_factory=dict)
    _segments: dict = dataclasses.field(default_factory=dict, repr=False)   # keep_all -> segments(), made once

    @property
    def indices(self) -> set[int]:
        return {f.index for f in self.cpu}


def partition(model: Model, subgraph: int, kernel_refused: Mapping[int, str] | None = None) -> Partition:
    """Decides which ops of ``subgraph`` run on LiteRT's CPU interpreter, touching no GPU.

    An op falls back when it is a builtin without a tflfuse kernel (``"no GPU kernel"``), or reads a tensor of
    a type the runtime does not hold (:func:`tflfuse.runtime.plan.held`) that a subgraph input or a falling-back
    op gives (``"reads UINT8 tensor 3 ('q'), a type the GPU runtime does not hold"``), or writes one from a
    runtime value (``"writes UINT8 tensor..."``), or computes an int64 tensor from a runtime value with
    arithmetic that int32 (what the runtime holds int64 in) would wrap (:func:`tflfuse.runtime.int64.int64_arithmetic`,
    ``"int64 arithmetic (the GPU holds int64 as int32)"``). A custom op without a kernel cannot fall back (LiteRT has
    none either; but those of :data:`LITERT_CUSTOM_OPS`): it is listed in ``refused``. ``kernel_refused`` (operator
    index -> reason): ops whose GPU kernel refused them (:class:`tflfuse.runtime.lower.OpRefusal`, found by
    :mod:`tflfuse.runtime.specialise`), which fall back too, with that reason.

    Returns:
      a :class:`Partition`; ``cpu`` is empty where every op runs on the GPU.
    Raises:
      KernelError: a composite whose decomposition subgraph contains itself.
      ModelError: a composite's decomposition that cannot be inlined (see
        :func:`tflfuse.passes.portable.inline_composites`); an input or op output of a type tflfuse does not
        read at all (string, complex), named with the tensor.
    """
    try:   # what lower() refuses first (a decomposition containing itself) is refused here first too
        check_supported(model, subgraph)
    except UnsupportedOpError:
        pass
    model = inline_composites(model, subgraph, keep=_has_fused_kernel)
    known = set(supported_ops())
    sg = model.subgraphs[subgraph]
    cpu: dict[int, str] = {}
    refused: list[tuple[str, int, int]] = []
    names = model.op_names(subgraph)
    for oi, name in enumerate(names):
        if model.composite(subgraph, oi) is not None or name in known:
            continue   # a composite left by inline_composites has a fused kernel
        if litert_runs(name):
            cpu[oi] = "no GPU kernel"
        else:
            refused.append((name, subgraph, oi))
    for oi, reason in (kernel_refused or {}).items():
        if oi not in cpu:
            cpu[oi] = reason
    refused_ops = {oi for _, _, oi in refused}
    for oi, op in enumerate(sg.operators):   # a runtime value into a type the runtime does not hold
        if oi in cpu or oi in refused_ops or model.composite(subgraph, oi) is not None:
            continue
        out = [int(t) for t in op.outputs if t >= 0 and _unheld(model, subgraph, int(t))]
        if out and any(t >= 0 and not _is_constant(model, subgraph, int(t)) for t in op.inputs):
            cpu[oi] = (f"writes {model.tensor_type_name(subgraph, out[0])} tensor {out[0]} "
                       f"({model.tensor_name(subgraph, out[0])!r}), a type the GPU runtime does not hold")
    unheld = {int(t) for t in sg.inputs if not held(model, subgraph, t)}   # ModelError for a string input
    for oi, op in enumerate(sg.operators):   # one pass in op order (topological): readers follow writers
        hit = [int(t) for t in op.inputs if int(t) in unheld]
        if hit and oi not in cpu and oi not in refused_ops:
            cpu[oi] = (f"reads {model.tensor_type_name(subgraph, hit[0])} tensor {hit[0]} "
                       f"({model.tensor_name(subgraph, hit[0])!r}), a type the GPU runtime does not hold")
        if oi in cpu:
            unheld |= {int(t) for t in op.outputs if t >= 0 and _unheld(model, subgraph, int(t))}
    for oi, reason in int64_arithmetic(model, subgraph).items():   # would wrap at int32 on the GPU
        if oi not in cpu and oi not in refused_ops:
            cpu[oi] = reason
    ops = [FallbackOp(oi, names[oi], cpu[oi]) for oi in sorted(cpu)]
    return Partition(subgraph, model, ops, refused, {oi: r for oi, r in (kernel_refused or {}).items()
                                                    if cpu.get(oi) == r})


def _unheld(model: Model, sg: int, t: int) -> bool:
    """Whether tensor ``t`` has a type the GPU runtime does not hold, or one tflfuse does not read at all."""
    try:
        return not held(model, sg, t)
    except ModelError:
        return True


def log_fallback(part: Partition, only: Sequence[int] | None = None) -> None:
    """Logs (absl, once per call: an interpreter calls it once per op) the ops of ``part`` that run on the CPU and
    why (of them, those in ``only`` where given)."""
    ops = [f for f in part.cpu if only is None or f.index in only]
    if ops:
        logging.warning("tflfuse: %d op(s) of subgraph %d run on LiteRT's CPU interpreter: %s", len(ops),
                        part.subgraph, "; ".join(f"{f.name} (operator {f.index}): {f.reason}" for f in ops))


# ---- the segments as data ----------------------------------------------------------------------------------
@dataclasses.dataclass
class CpuSegment:
    """A run of consecutive ops that LiteRT's CPU interpreter runs as one small model.

    Attributes:
      ops: operator indices (of the subgraph as planned), in order.
      inputs: tensor ids (of the subgraph) the segment reads and does not compute, constants of the file
        excepted; the segment file's inputs, in this order.
      outputs: tensor ids it computes that later ops (GPU or CPU) or the subgraph's outputs read (every one
        it computes when all tensors are kept); the segment file's outputs, in this order.
      to_gpu: the outputs that GPU ops read (uploaded after the segment runs).
      tflite: the segment's .tflite bytes (LiteRT schema; its constants inline).
    """

    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    to_gpu: list[int]
    tflite: bytes


def segments(part: Partition, keep_all: bool = False) -> list[CpuSegment]:
    """The CPU segments of a partition: maximal runs of consecutive falling-back ops (file order is
    topological), each with its .tflite (:func:`segment_tflite`). ``keep_all``: every tensor a segment
    computes is one of its outputs (for ``experimental_preserve_all_tensors``)."""
    model, si = part.model, part.subgraph
    sg = model.subgraphs[si]
    cpu = part.indices
    runs: list[list[int]] = []
    for oi in sorted(cpu):
        if runs and runs[-1][-1] == oi - 1:
            runs[-1].append(oi)
        else:
            runs.append([oi])
    readers: dict[int, list[int]] = {}
    for oi, op in enumerate(sg.operators):
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(int(t), []).append(oi)
    sub_outputs = {int(t) for t in sg.outputs}
    out = []
    for run in runs:
        inside = set(run)
        written = [int(t) for oi in run for t in sg.operators[oi].outputs if t >= 0]
        inputs: list[int] = []
        for oi in run:
            for t in sg.operators[oi].inputs:
                t = int(t)
                if (t >= 0 and t not in written and t not in inputs and not _is_constant(model, si, t)
                        and not model.tensor(si, t).isVariable):
                    inputs.append(t)
        outputs = [t for t in written if keep_all or t in sub_outputs
                   or any(r not in inside for r in readers.get(t, ()))]
        to_gpu = [t for t in outputs if any(r not in cpu for r in readers.get(t, ()))]
        out.append(CpuSegment(run, inputs, outputs, to_gpu, segment_tflite(model, si, run, inputs, outputs)))
    return out


# ---- lowering and running -----------------------------------------------------------------------------------
def _litert(part: Partition, seg: CpuSegment, what: str, num_threads: int | None = None):
    """LiteRT's interpreter of a segment, with its builtin kernels alone (:data:`OP_RESOLVER`), on
    ``num_threads`` threads (None: LiteRT's default)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter, OpResolverType

    try:
        return LiteRTInterpreter(model_content=seg.tflite, num_threads=num_threads,
                                 experimental_op_resolver_type=getattr(OpResolverType, OP_RESOLVER))
    except (ValueError, RuntimeError) as e:
        raise _refusal(part, seg, what, "cannot load them", e) from e


def _where(part: Partition, seg: CpuSegment) -> str:
    """``CPU fallback of REVERSE_V2 (operator 2 of subgraph 0), ...`` (the first 5 ops of the segment)."""
    names = part.model.op_names(part.subgraph)
    shown = ", ".join(f"{names[oi]} (operator {oi} of subgraph {part.subgraph})" for oi in seg.ops[:5])
    return f"CPU fallback of {shown}" + (f" and {len(seg.ops) - 5} more ops" if len(seg.ops) > 5 else "")


def _with_values(part: Partition, seg: CpuSegment, known: Mapping[int, np.ndarray]) -> CpuSegment:
    """``seg`` with the tensors of ``known`` it reads written into its file as constants, no longer inputs."""
    inputs = [t for t in seg.inputs if t not in known]
    values = {t: known[t] for t in seg.inputs if t in known}
    tflite = segment_tflite(part.model, part.subgraph, seg.ops, inputs, seg.outputs, values)
    return CpuSegment(seg.ops, inputs, seg.outputs, seg.to_gpu, tflite)


def _kernel_refusals(part: Partition, seg: CpuSegment) -> str:
    """`` (their GPU kernels refused them: PAD (operator 0): ...)`` for the ops of ``seg`` that fall back because
    their kernel refused them, "" where none does: what to fix when LiteRT refuses them too."""
    names = part.model.op_names(part.subgraph)
    found = [f"{names[oi]} (operator {oi}): {part.kernel_refused[oi]}" for oi in seg.ops if oi in part.kernel_refused]
    return f" (their GPU kernels refused them: {'; '.join(found)})" if found else ""


def _refusal(part: Partition, seg: CpuSegment, what: str, doing: str, error: Exception) -> KernelError:
    """The error for LiteRT failing ``seg`` (``doing``: ``"refuses them"``...), on one line. Where ops of the
    segment fall back because their GPU kernel refused them, the kernel's own message comes first (the op, its
    index, what is wrong: a file neither runtime runs), LiteRT's after it."""
    detail = " ".join(str(error).split())
    names = part.model.op_names(part.subgraph)
    first = [f"{names[oi]} (operator {oi} of subgraph {part.subgraph}): {part.kernel_refused[oi]}"
             for oi in seg.ops if oi in part.kernel_refused]
    if first:
        return KernelError(f"{'; '.join(first)}; LiteRT's CPU interpreter, where it would run instead, "
                           f"{doing} too: {detail}")
    return KernelError(f"{what}: LiteRT's CPU interpreter {doing}: {detail}")


def _dry_run(part: Partition, seg: CpuSegment, lite, what: str) -> None:
    """Invokes a segment holding ops that fall back because their GPU kernel refused them once, on zeros (and on
    ones where zeros fail), when it is made: LiteRT checks some of what the kernels refused (a constant index out
    of range) only when it runs, and a file that neither runtime runs is refused when the plan is made, as
    without the fallback.

    Raises:
      KernelError: LiteRT fails (:func:`_refusal`).
    """
    ops = part.model.subgraphs[part.subgraph].operators
    if not any(oi in part.kernel_refused for oi in seg.ops) or any(called_subgraphs(ops[oi]) for oi in seg.ops):
        return   # (a loop's trip count on zeros is anyone's guess)
    details = lite.get_input_details()
    if any(np.dtype(d["dtype"]).kind not in "biuf" for d in details):
        return
    failed = None
    for fill in (0, 1):   # zeros, then ones (an integer FLOOR_DIV fails on zeros, a valid file not on both)
        try:
            for d in details:
                lite.set_tensor(d["index"], np.full(d["shape"], fill, d["dtype"]))
            lite.invoke()
            return
        except (ValueError, RuntimeError) as e:
            failed = failed or e
    raise _refusal(part, seg, what, "fails on them", failed) from failed


def lower_split(part: Partition, input_shapes: Mapping[int, Sequence[int]] | None, target: str,
                keep_all: bool = False, known: Mapping[int, np.ndarray] | None = None,
                probe: Probe | None = None, out_shapes: Mapping[int, Sequence[int]] | None = None,
                num_threads: int | None = None) -> tuple[LoweredGraph, "SegmentRunner"]:
    """Lowers the GPU ops of a partition (:func:`tflfuse.runtime.plan.lower` with the CPU segments skipped)
    and makes each CPU segment's LiteRT interpreter, resized to the shapes the ops before it give.

    ``known`` and ``probe`` are :func:`~tflfuse.runtime.lower.lower`'s; a segment reading a tensor the probe
    marks uncertain is not made (its outputs take the file's declared shapes and are uncertain too): such a
    split is for deciding, not for running. ``out_shapes``: shapes CPU segments' outputs had when run (where
    they depend on values: :class:`ShapeChanged`), planned for instead of LiteRT's before it runs.
    ``num_threads``: LiteRT's, for each segment's interpreter (None: LiteRT's default).

    Returns:
      the :class:`LoweredGraph` of the GPU ops (its ``crossing`` lists the tensors moved between segments)
      and a :class:`SegmentRunner` without a GPU plan yet (:meth:`SegmentRunner.attach`).
    Raises:
      KernelError: as ``lower``; LiteRT refusing a segment (the message names its ops).
    """
    model, si = part.model, part.subgraph
    if keep_all not in part._segments:   # the segment files do not depend on the shapes: made once
        part._segments[keep_all] = segments(part, keep_all)
    segs = part._segments[keep_all]
    if known:   # run-time shape values a segment reads become its constants: LiteRT then plans static shapes
        segs = [_with_values(part, seg, known) if any(t in known for t in seg.inputs) else seg for seg in segs]
    shapes: dict[int, tuple[int, ...]] = {}    # host tensors: their shapes
    for t in model.subgraphs[si].inputs:
        t = int(t)
        shapes[t] = tuple(int(d) for d in (input_shapes or {}).get(t, model.tensor_shape(si, t)))
    interps = []
    hooks = {}

    segs = list(segs)

    def make_hook(k: int):
        seg = segs[k]
        what = _where(part, seg)

        def hook(specs, consts):   # at the segment's first op: its inputs' shapes are known, LiteRT gives the rest
            nonlocal seg
            if probe is not None and any(t in probe.uncertain for t in seg.inputs):
                probe.uncertain.update(seg.outputs)
                return {t: TensorSpec(model.tensor_shape(si, t), _DTYPE_NAMES[model.tensor_dtype(si, t)])
                        for t in seg.to_gpu}
            folded = {t: consts[t] for t in seg.inputs if t in consts and t < len(model.subgraphs[si].tensors)}
            if folded:   # values folded at load (a FILL's dims from SHAPE): constants of the segment, so that
                seg = segs[k] = _with_values(part, seg, folded)   # LiteRT plans the shapes they decide
            for t in seg.inputs:
                if t not in specs and t not in consts and t not in shapes:
                    raise KernelError(f"{what}: tensor {t} ({model.tensor_name(si, t)!r}) is read before any op "
                                      f"writes it")
            with info_lines_to_log():   # LiteRT's "INFO: Created ... XNNPACK delegate" line, to absl's log
                lite = _litert(part, seg, what, num_threads)
                try:
                    for d, t in zip(lite.get_input_details(), seg.inputs):
                        shape = specs[t].shape if t in specs else consts[t].shape if t in consts else shapes[t]
                        if tuple(int(v) for v in d["shape"]) != tuple(shape):
                            lite.resize_tensor_input(d["index"], list(shape))
                    lite.allocate_tensors()
                    outputs = lite.get_output_details()
                except UnicodeDecodeError as e:   # LiteRT decodes tensor names as UTF-8
                    raise ModelError(f"{what}: a tensor name is not UTF-8 ({e}), which LiteRT's CPU interpreter "
                                     f"cannot read: a malformed file; re-convert the model") from e
                except (ValueError, RuntimeError) as e:
                    raise _refusal(part, seg, what, "refuses them", e) from e
                _dry_run(part, seg, lite, what)
            interps.append(lite)
            out = {}
            for d, t in zip(outputs, seg.outputs):   # LiteRT's, or the shapes a run gave where they vary
                shapes[t] = tuple((out_shapes or {}).get(t, tuple(int(v) for v in d["shape"])))
                if t in seg.to_gpu:
                    out[t] = TensorSpec(shapes[t], _DTYPE_NAMES[model.tensor_dtype(si, t)])
            return out
        return hook

    for k, seg in enumerate(segs):
        hooks[seg.ops[0]] = make_hook(k)
        for oi in seg.ops[1:]:
            hooks[oi] = lambda specs, consts: {}
    graph = lower(model, si, input_shapes, target=target, host_ops=hooks, known=known, probe=probe)
    from_gpu = [t for seg in segs for t in seg.inputs if t in graph.specs]
    graph.crossing = list(dict.fromkeys(from_gpu + [t for seg in segs for t in seg.to_gpu]))
    graph.segments = segs
    return graph, SegmentRunner(part, segs, interps, graph, shapes)


def _output(lite, detail: dict, part: Partition, seg: CpuSegment, t: int) -> np.ndarray:
    """Output ``t`` of a segment's LiteRT interpreter after its invoke. LiteRT's ``get_tensor`` fails on a tensor
    of no elements ("Invalid tensor size": it holds no data); such an output is an empty array of the shape
    LiteRT gives it now and its dtype.

    Raises:
      RuntimeError: LiteRT cannot give a non-empty output (naming the segment's ops and the tensor).
    """
    try:
        return lite.get_tensor(detail["index"])
    except ValueError as e:
        shape = [int(d) for d in lite._get_tensor_details(detail["index"], 0)["shape"]]
        if 0 in shape:
            return np.zeros(shape, detail["dtype"])
        raise RuntimeError(f"{_where(part, seg)}: LiteRT's CPU interpreter gives no value for its output tensor {t} "
                           f"({part.model.tensor_name(part.subgraph, t)!r}) of shape {shape}: {e}") from e


class ShapeChanged(RuntimeError):
    """A CPU segment's outputs came out of other shapes than planned; ``shapes``: tensor id -> the shape each
    output of that segment had."""

    def __init__(self, message: str, shapes: Mapping[int, tuple[int, ...]]):
        super().__init__(message)
        self.shapes = {int(t): tuple(int(d) for d in s) for t, s in shapes.items()}


class SegmentRunner:
    """Runs a subgraph split into GPU and CPU segments: the GPU plan's dispatches in runs between the CPU
    segments, each CPU segment on its LiteRT interpreter, moving only the tensors that cross.

    Host-side values (CPU segments' outputs, inputs CPU segments read, inputs of types the GPU does not hold)
    live in ``host``; every other tensor is the GPU plan's.
    """

    def __init__(self, part: Partition, segs: list[CpuSegment], interps: list, graph: LoweredGraph,
                 shapes: dict[int, tuple[int, ...]]):
        self.partition, self.segments, self.graph = part, segs, graph
        self._interps, self.shapes = interps, shapes
        self.host: dict[int, np.ndarray] = {}
        self._cpu_read = {t for seg in segs for t in seg.inputs}
        self._cpu_written = {t for seg in segs for t in seg.outputs}
        sg = part.model.subgraphs[part.subgraph]
        self._cpu_all = {int(t) for seg in segs for oi in seg.ops for t in sg.operators[oi].outputs if t >= 0}
        gpu_read = {int(t) for op in graph.ops for t in op.inputs} | set(graph.outputs) | set(graph.aliases.values())
        self._host_only = {t for t in graph.inputs if t in graph.specs and t not in gpu_read}   # only CPU ops read
        self.plan: ExecutionPlan | None = None
        self._details = [(lite.get_input_details(), lite.get_output_details()) for lite in interps]

    def attach(self, plan: ExecutionPlan) -> None:
        """Takes the GPU plan of :attr:`graph` and groups its dispatches into the runs between CPU segments."""
        self.plan = plan
        self._order: list[tuple[str, object]] = []
        step = 0
        for k, seg in enumerate(self.segments):
            stop = step
            while stop < len(plan.steps) and plan.step_ops[stop].index < seg.ops[0]:
                stop += 1
            if stop > step:
                self._order.append(("gpu", _pass_recorder(plan.steps[step:stop])))
            self._order.append(("cpu", k))
            step = stop
        if step < len(plan.steps):
            self._order.append(("gpu", _pass_recorder(plan.steps[step:])))

    # ---- tensors -------------------------------------------------------------------------------------
    def holds(self, t: int) -> bool:
        """Whether tensor ``t`` is read from the host (computed by a CPU segment, or a host-only input)."""
        return t in self._cpu_written or t in self._host_only or (t in self.graph.inputs and t not in self.graph.specs)

    def dtype(self, t: int) -> np.dtype:
        return self.partition.model.tensor_dtype(self.partition.subgraph, t)

    def write(self, t: int, value: np.ndarray) -> None:
        """Sets input ``t``: on the GPU where it lives there, on the host where a CPU segment reads it."""
        if t in self.graph.specs and t not in self._host_only:   # (int64 past int32 is fine where only CPU ops read it)
            self.plan.write(t, value)
        if t in self._cpu_read or t not in self.graph.specs or t in self._host_only:
            self.host[t] = np.array(value, copy=True)

    def computes(self, t: int) -> bool:
        """Whether an op of a CPU segment writes tensor ``t`` (readable when it is one of a segment's outputs)."""
        return t in self._cpu_all

    def read(self, t: int) -> np.ndarray:
        """A copy of tensor ``t`` after :meth:`run`.

        Raises:
          RuntimeError: a tensor computed on the CPU before :meth:`run`, or a host-only input never set.
        """
        if self.holds(t):
            if t not in self.host:
                raise RuntimeError(f"tensor {t} is computed on the CPU; call invoke() first" if t in self._cpu_written
                                   else f"input tensor {t} was never set; call set_tensor() first")
            return self.host[t].copy()
        return self.plan.read(t)

    # ---- running -------------------------------------------------------------------------------------
    def run(self) -> None:
        """One invoke: each GPU run as one submit, each CPU segment on LiteRT with its inputs moved in.

        Raises:
          ShapeChanged: a CPU segment's output came out of another shape than planned (an op whose output
            shape depends on values), naming the ops (:mod:`tflfuse.runtime.specialise` plans again for it).
          RuntimeError: LiteRT failed; DeviceLostError as the GPU plan.
        """
        plan, dev = self.plan, self.plan.device
        plan._staged = set()   # outputs are read from their own buffers, not the whole-run read-back copies
        for kind, what in self._order:
            if kind == "gpu":
                with dev.guard("invoke()"):
                    encoder = dev.device.create_command_encoder()
                    cpass = encoder.begin_compute_pass()
                    what(cpass)
                    cpass.end()
                    dev.device.queue.submit([encoder.finish()])
                continue
            seg, lite = self.segments[what], self._interps[what]
            ins, outs = self._details[what]
            for d, t in zip(ins, seg.inputs):
                if t in self._cpu_written or t in self.graph.inputs:
                    value = self.host[t]
                else:   # a value folded at load, or a GPU op's output read back
                    value = self.graph.consts[t] if t in self.graph.consts else plan.read(t)
                lite.set_tensor(d["index"], np.asarray(value, dtype=d["dtype"], order="C"))   # 0-d stays 0-d
            try:
                lite.invoke()
            except (ValueError, RuntimeError) as e:
                raise RuntimeError(f"{_where(self.partition, seg)}: LiteRT's CPU interpreter failed: {e}"
                                   f"{_kernel_refusals(self.partition, seg)}") from e
            got = {t: _output(lite, d, self.partition, seg, t) for d, t in zip(outs, seg.outputs)}
            changed = [t for t, value in got.items() if value.shape != self.shapes[t]]
            if changed:
                t = changed[0]
                raise ShapeChanged(f"{_where(self.partition, seg)}: output tensor {t} came out "
                                   f"{list(got[t].shape)}, planned as {list(self.shapes[t])} (its shape depends on "
                                   f"the values; the GPU ops after it are planned for static shapes)",
                                   {t: value.shape for t, value in got.items()})
            for t, value in got.items():
                self.host[t] = value
                if t in seg.to_gpu:
                    plan.write(t, value, source=_where(self.partition, seg))

    def time_run(self, repeats: int = 10) -> float:
        """Median wall-clock seconds of :meth:`run` plus a read of the first output (after one warm-up)."""
        first = int(self.partition.model.subgraphs[self.partition.subgraph].outputs[0])
        return wall_seconds(self.run, self.read, first, repeats)

"""Planning one subgraph: ops whose GPU kernel refuses them, and plans specialised on run-time shape values.

:class:`SubgraphPlanner` decides once, at ``allocate_tensors``, without a GPU, by one probing lowering
(:class:`tflfuse.runtime.lower.Probe`) of the graph as the CPU fallback splits it:

- an op whose kernel refuses it (its dtype, attributes or shapes; ``KernelError``) on inputs of known shapes runs
  on LiteRT's CPU interpreter with the others of the fallback (:func:`tflfuse.runtime.fallback.partition`'s
  ``kernel_refused``), the kernel's message as the reason, and the graph is split again, once (again only where
  the new split lets a refusal further on show; ``cpu_fallback=False`` raises the kernel's error), unless the
  shape values it reads are invalid (:mod:`tflfuse.runtime.validate`: no runtime runs it; a KernelError naming
  the op, its index and the value);
- an op whose shape input (SLICE's begin and size, RESHAPE's shape, MEAN's axis, PAD's paddings, TRANSPOSE's
  perm, TOPK_V2's k, TRANSPOSE_CONV's output_shape: a kernel's ``static_inputs``) is computed at run time,
  instead of folding at load from constants and from the inputs' shapes (SHAPE -> STRIDED_SLICE -> PACK ->
  RESHAPE folds), makes the plan *specialised*, as LiteRT resizes dynamic tensors: each invoke first computes
  those values (the ops they come from, as a small model of their own on a nested
  :class:`tflfuse.Interpreter` on the same device, or the input itself where the value is one), reads them back
  (a few bytes), and runs the plan lowered with them as constants, made at the first invoke that sees them and
  kept for the next (up to :data:`MAX_SPECIALISED_PLANS`, the least recently used dropped first);
- an op on the CPU whose output shape follows from the values it reads (RANGE's limit, a FILL's run-time dims)
  is planned for the shape LiteRT gives before it runs; where a run gives another, the invoke runs again on the
  plan for the shapes it gave, made then and kept as the specialised ones are.

GPU work happens only in :meth:`SubgraphPlanner.allocate` (a plan without run-time shape values) and
:meth:`SubgraphPlanner.run`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
from absl import logging

from ..kernels.base import KernelError
from ..model import Model
from ..passes.portable import inline_composites
from .fallback import FallbackOp, Partition, SegmentRunner, ShapeChanged, litert_runs, lower_split, partition
from .lower import LoweredGraph, Probe, _has_fused_kernel, lower
from .plan import ExecutionPlan
from .segment import segment_tflite
from .validate import invalid_values

__all__ = ["MAX_SPECIALISED_PLANS", "SubgraphPlanner"]

#: Plans kept per subgraph for distinct run-time shape values (each holds its own GPU buffers).
MAX_SPECIALISED_PLANS = 8


@dataclasses.dataclass
class Built:
    """One runnable plan of a subgraph: the lowered graph, its GPU plan, the CPU fallback's runner (None where
    every op runs on the GPU), the partition it was split by, and which version of each input it holds."""

    graph: LoweredGraph
    plan: ExecutionPlan
    runner: SegmentRunner | None
    part: Partition | None
    uploaded: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def executor(self):
        return self.runner or self.plan


class SubgraphPlanner:
    """Plans and runs one subgraph of a model for :class:`tflfuse.Interpreter` (see the module's docstring).

    Args:
      model: the file's model.
      subgraph: the subgraph's index.
      base: the CPU fallback's split of the subgraph (:func:`tflfuse.runtime.fallback.partition`), None where
        every op has a kernel or ``fallback`` is off.
      fallback: whether ops may run on LiteRT's CPU interpreter (``Interpreter(cpu_fallback=...)``).
      input_shapes: inputs resized with ``resize_tensor_input`` (tensor id -> shape).
      preserve, precision: the Interpreter's ``experimental_preserve_all_tensors`` and ``precision``.
      num_threads: the Interpreter's ``num_threads``: the threads of the CPU fallback's LiteRT interpreters
        (None: LiteRT's default).
      device: returns the :class:`~tflfuse.runtime.device.Device` (made on first use).
    """

    def __init__(self, model: Model, subgraph: int, base: Partition | None, *, fallback: bool,
                 input_shapes: Mapping[int, Sequence[int]] | None, preserve: bool, precision: str,
                 device: Callable[[], object], num_threads: int | None = None):
        self.model, self.subgraph, self.fallback = model, subgraph, fallback
        self.shapes = {int(t): tuple(s) for t, s in (input_shapes or {}).items()}
        self.preserve, self.precision, self._device = preserve, precision, device
        self.num_threads = num_threads
        self._base = base
        self._parts: dict[frozenset, Partition | None] = {frozenset(): base}
        self.planned = base.model if base is not None else inline_composites(model, subgraph, keep=_has_fused_kernel)
        sg = self.planned.subgraphs[subgraph]
        self.inputs = [int(t) for t in (sg.inputs if sg.inputs is not None else [])]
        self.refused: dict[int, str] = {}     # operator -> its kernel's refusal, for ops that fall back for it
        self.runtime: list[int] = []          # run-time shape inputs the plan is specialised on
        self.current: Built | None = None     # the plan of the last invoke (or the only one)
        self._target: str | None = None
        self._probe_graph: LoweredGraph | None = None
        self._uncertain: set[int] = set()
        self._static: tuple | None = None     # (graph, runner, part) of a plan needing no run-time value
        self._cache: collections.OrderedDict[tuple, Built] = collections.OrderedDict()
        self._host: dict[int, np.ndarray] = {}
        self._version: dict[int, int] = {}
        self._hosted = False    # inputs kept on the host (specialised, or a CPU output's shape has varied)
        self._out_shapes: dict[int, tuple[int, ...]] = {}   # CPU segments' outputs whose shapes runs gave
        self._base: Built | None = None   # the plan made by allocate, where no run-time value is needed
        self._values = None
        self._logged: set[int] = set(base.indices) if base is not None else set()
        self._checked_for: LoweredGraph | None = None   # the graph _checks was made for (check_values)
        self._checks: dict[int, list] = {}

    # ---- deciding (no GPU) ---------------------------------------------------------------------------
    def _part(self, refused: Mapping[int, str]) -> Partition | None:
        key = frozenset(refused.items())
        if key not in self._parts:
            part = partition(self.model, self.subgraph, dict(refused))
            self._parts[key] = part if part.cpu else None
        return self._parts[key]

    def _lower(self, refused: Mapping[int, str], target: str, known: Mapping[int, np.ndarray] | None,
               probe: Probe) -> tuple[LoweredGraph, SegmentRunner | None, Partition | None]:
        part = self._part(refused) if self.fallback else None
        if part is None:
            graph = lower(self.model, self.subgraph, self.shapes, target=target, known=known, probe=probe)
            return graph, None, None
        graph, runner = lower_split(part, self.shapes, target, self.preserve, known=known, probe=probe,
                                    out_shapes=self._out_shapes, num_threads=self.num_threads)
        return graph, runner, part

    def _settle(self, target: str, known: Mapping[int, np.ndarray] | None):
        """Lowers with the ops whose kernels refuse them (on inputs of known shapes) moved to the CPU, splitting
        again until no such refusal is left. Returns ``(graph, runner, part, probe)``.

        Starts from the refusals :meth:`decide` found at the file's shapes (``{}`` for :meth:`decide` itself); those
        found with run-time values (``known``) hold for that plan alone (its :class:`Built`'s ``part``), so that
        each plan's refusals, and the reasons :attr:`fallback_ops` gives, are those of its own values and shapes.

        Raises:
          KernelError: a refusal with ``fallback`` off (the kernel's own error), an op refused for invalid shape
            values (:meth:`_check_values`), or LiteRT refusing the ops that fall back.
        """
        refused = dict(self.refused) if known is not None else {}
        for _ in range(len(self.planned.subgraphs[self.subgraph].operators or []) + 1):
            probe = Probe()
            graph, runner, part = self._lower(refused, target, known, probe)
            certain = probe.certain()
            if not certain:
                if known is None:
                    self.refused = refused
                return graph, runner, part, probe
            if not self.fallback:
                raise certain[0].error
            for r in certain:   # invalid values: no runtime runs the op (and LiteRT's CPU kernels may not say so)
                self._check_values(r, graph, known)
            custom = [r for r in certain if not litert_runs(r.name)]
            if custom:   # a custom op or a fused composite: LiteRT has no kernel for it either
                raise custom[0].error
            refused.update((r.index, r.reason) for r in certain)
        raise KernelError(f"subgraph {self.subgraph}: the ops whose GPU kernels refuse them do not settle")

    def _check_values(self, refusal, graph: LoweredGraph, known: Mapping[int, np.ndarray] | None) -> None:
        """Raises where the op its GPU kernel refused reads invalid shape values (:mod:`tflfuse.runtime.validate`):
        such an op must not fall back to LiteRT's CPU interpreter, which clamps some of them (XNNPACK's SLICE) or
        computes something for others (TRANSPOSE with a repeated axis).

        Raises:
          KernelError: the GPU kernel's refusal (naming the op and its index), then what is wrong with the value.
        """
        model, si, oi = self.planned, self.subgraph, refusal.index
        shapes, values = {}, {}
        for pos, t in enumerate(model.op_inputs(si, oi)):
            if t < 0:
                continue
            if t in graph.specs:
                shapes[pos] = graph.specs[t].shape
            value = (known or {}).get(t)
            value = graph.consts.get(t) if value is None else value
            value = model.tensor_data(si, t) if value is None and t < len(model.subgraphs[si].tensors) else value
            if value is not None:
                values[pos] = np.asarray(value)
                shapes.setdefault(pos, np.shape(value))
        bad = invalid_values(model, si, oi, shapes, values)
        if bad is not None:
            raise KernelError(f"{refusal.error}; an invalid input, which no runtime runs (TensorFlow refuses it "
                              f"too, and it does not fall back to LiteRT's CPU interpreter): {bad}; fix the value")

    def decide(self, target: str) -> None:
        """The probing lowering (once per target; no GPU): which ops fall back because their kernel refuses
        them, and whether the plan is specialised on run-time values (:attr:`runtime`).

        Raises:
          KernelError, UnsupportedOpError, ModelError: as :func:`tflfuse.runtime.lower.lower`.
        """
        if self._target == target:
            return
        graph, runner, part, probe = self._settle(target, None)
        self._target, self._probe_graph, self._uncertain = target, graph, set(probe.uncertain)
        self.runtime = probe.runtime
        self._static = None if probe.refusals else (graph, runner, part)
        self._log(part)

    def _log(self, part: Partition | None) -> None:
        """Logs, once per op, the ops that fall back beyond the base split (their kernels refused them)."""
        if part is None:
            return
        new = [f.index for f in part.cpu if f.index not in self._logged]
        if new:
            from .fallback import log_fallback

            log_fallback(part, only=new)
            self._logged.update(new)

    @property
    def fallback_ops(self) -> list[FallbackOp]:
        """The ops that run on LiteRT's CPU interpreter as decided so far (those of the last invoke's plan where
        the plan is specialised), in op order."""
        part = self.current.part if self.current is not None else self._part(self.refused) if self.fallback else None
        return list(part.cpu) if part is not None else []

    # ---- inputs ----------------------------------------------------------------------------------------
    def input_shape(self, t: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.shapes.get(t, self.model.tensor_shape(self.subgraph, t)))

    def input_dtype(self, t: int) -> np.dtype:
        """The dtype users set input ``t`` in: the file's (bool, int64, uint8... as the file gives them)."""
        return self.model.tensor_dtype(self.subgraph, t)

    @property
    def specialised(self) -> bool:
        return bool(self.runtime)

    # ---- building and running --------------------------------------------------------------------------
    def allocate(self, target: str) -> None:
        """Decides (:meth:`decide`) and, where no run-time shape value is needed, builds the GPU plan."""
        self.decide(target)
        if self._static is not None and self.current is None:
            graph, runner, part = self._static
            self.current = self._base = self._build(graph, runner, part)

    def _build(self, graph: LoweredGraph, runner: SegmentRunner | None, part: Partition | None) -> Built:
        plan = ExecutionPlan(graph, self._device(), self.preserve, self.precision)
        if runner is not None:
            runner.attach(plan)
        return Built(graph, plan, runner, part)

    def check_values(self, t: int, value: np.ndarray, graph: LoweredGraph | None = None) -> None:
        """Checks input ``t``'s ``value`` where an op of the plan reads it (or a view of it) as an input whose values
        its kernel checks when they are constants (:attr:`~tflfuse.kernels.base.Kernel.constant_attrs`: GATHER's,
        GATHER_ND's and SCATTER_ND's indices, an int32 divisor): TFLite's invoke stops on such values ("index out of
        bounds"), while a shader cannot stop. ``graph``: the plan an invoke picked; None: the plan that every invoke
        runs, where there is one (:meth:`set_tensor`'s check, before the value is written); a plan picked per invoke
        (specialised on run-time values) checks at :meth:`run` instead. Ops whose indices other ops compute are not
        checked (they give zeros; the kernels' docstrings).

        Raises:
          ValueError: naming the op, its index and the first value out of range (the kernel's KernelError).
        """
        if graph is None:
            if self.specialised or self._hosted or self.current is None:
                return
            graph = self.current.graph
        if self._checked_for is not graph:   # per input tensor: (op, input position) whose values the kernel checks
            self._checked_for, self._checks = graph, collections.defaultdict(list)
            for op in graph.ops:
                for pos in (op.kernel.constant_attrs if op.kernel is not None else {}):
                    if pos < len(op.inputs) and op.inputs[pos] >= 0:
                        self._checks[graph.storage_root(op.inputs[pos])].append((op, pos))
        for op, pos in self._checks.get(t, ()):
            try:
                op.kernel.check_values(pos, np.reshape(value, op.kernel.inputs[pos].shape))
            except KernelError as e:
                raise ValueError(f"{graph.describe(t)}: operator {op.index} ({op.name}) reads it as input {pos}, and "
                                 f"{str(e).split(': ', 1)[-1]}") from None

    def write(self, t: int, value: np.ndarray) -> None:
        """Sets input ``t`` (checked by the caller): into the plan, or kept on the host for the plan an invoke
        picks (specialised plans, or plans whose CPU segments' output shapes have varied)."""
        if not self.specialised and not self._hosted:
            self.current.executor.write(t, value)
            return
        self._host[t] = np.array(value, copy=True)
        self._version[t] = self._version.get(t, 0) + 1

    def host_input(self, t: int) -> np.ndarray | None:
        """The value last set for input ``t`` of a specialised plan (None if never set, or not specialised)."""
        return self._host.get(t)

    def run(self) -> None:
        """One invoke. A specialised plan first computes its run-time shape values and picks (or makes) the plan
        for them, uploading the inputs set since that plan last ran. Where a CPU segment's output comes out of
        another shape than planned (RANGE, or any op whose output shape follows from values it reads), the invoke
        is run again on the plan for the shapes it gave (made once, and kept as the specialised ones are).

        Raises:
          KernelError: the plan for these values cannot be made (an op refused with ``fallback`` off...).
          ValueError: in a plan picked per invoke, an input's value that an op checks (:meth:`check_values`).
          RuntimeError, DeviceLostError: as the plan's and the CPU fallback's ``run``.
        """
        if not self.specialised and not self._hosted:
            try:
                self.current.executor.run()
                return
            except ShapeChanged as e:
                self._host_inputs()
                self._out_shapes.update(e.shapes)
        for _ in range(len(self.planned.subgraphs[self.subgraph].tensors) + 1):
            entry = self._entry()
            if entry is None:   # new run-time shape inputs came to light: compute them too
                continue
            for t in entry.graph.inputs:
                if t in self._host and entry.uploaded.get(t) != self._version[t]:
                    self.check_values(t, self._host[t], entry.graph)   # the plan this invoke picked
                    entry.executor.write(t, self._host[t])
                    entry.uploaded[t] = self._version[t]
            self.current = entry
            try:
                entry.executor.run()
                return
            except ShapeChanged as e:
                if all(self._out_shapes.get(t) == shape for t, shape in e.shapes.items()):
                    raise   # planned for these shapes already: another op's shape varies within the invoke
                self._out_shapes.update(e.shapes)
        raise RuntimeError(f"subgraph {self.subgraph}: no plan settles for the shapes this invoke gives")

    def _host_inputs(self) -> None:
        """From now on inputs are kept on the host (plans may change between invokes): those set so far are read
        back from the current plan."""
        entry = self.current
        for t in self.inputs:
            try:
                self._host[t] = entry.executor.read(t)
            except (RuntimeError, KeyError):
                continue   # never set (invoke() refuses that before running)
            self._version[t] = self._version.get(t, 0) + 1
            entry.uploaded[t] = self._version[t]
        self._hosted = True

    def _entry(self) -> Built | None:
        """The plan for this invoke's run-time shape values and the CPU output shapes seen (made on first use)."""
        values = self._runtime_values() if self.specialised else {}
        key = (tuple((t, v.dtype.str, v.shape, v.tobytes()) for t, v in values.items()),
               tuple(sorted(self._out_shapes.items())))
        if not values and not self._out_shapes and self._base is not None:
            return self._base
        entry = self._cache.get(key)
        if entry is None:
            entry = self._specialise(values)
            if entry is None:
                return None
            self._cache[key] = entry
            while len(self._cache) > MAX_SPECIALISED_PLANS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return entry

    def _specialise(self, values: dict[int, np.ndarray]) -> Built | None:
        """The plan lowered with ``values`` as the run-time shape inputs' values (and the CPU output shapes seen);
        None where that lowering finds further run-time shape inputs (added to :attr:`runtime`)."""
        graph, runner, part, probe = self._settle(self._target, values)
        more = [t for t in probe.runtime if t not in values]
        if more:
            self.runtime += more
            self._values = None
            return None
        if probe.refusals:   # only refusals downstream of others remain: cannot happen once those settle
            raise next(iter(probe.refusals.values())).error
        self._log(part)
        logging.info("tflfuse: subgraph %d planned for the run-time shape values %s and CPU output shapes %s",
                     self.subgraph, {t: v.tolist() for t, v in values.items()}, self._out_shapes)
        return self._build(graph, runner, part)

    def _runtime_values(self) -> dict[int, np.ndarray]:
        if self._values is None:
            self._values = _RuntimeValues(self)
        return self._values(self._host)


class _RuntimeValues:
    """Computes a subgraph's run-time shape inputs at invoke: an input's value as set, or the ops computing
    them (back to inputs, file constants and values folded at load) as a small model on a nested
    :class:`tflfuse.Interpreter` (same device, float32, same ``cpu_fallback``), whose outputs are read back."""

    def __init__(self, planner: SubgraphPlanner):
        model, si = planner.planned, planner.subgraph
        sg = model.subgraphs[si]
        producer = {int(t): oi for oi, op in enumerate(sg.operators or []) for t in op.outputs if t >= 0}
        inputs = set(planner.inputs)
        folded = planner._probe_graph.consts if planner._probe_graph is not None else {}
        self.leaves: list[int] = []
        self.folded: dict[int, np.ndarray] = {}
        ops: set[int] = set()
        todo, seen = list(planner.runtime), set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in inputs:
                self.leaves.append(t)
            elif model.tensor_data(si, t) is not None:
                continue   # a constant of the file: inside the small model too
            elif t in folded and t not in planner._uncertain and t < len(sg.tensors):
                self.folded[t] = np.asarray(folded[t])   # folded at load (a SHAPE's value): a constant there
            elif t in producer:
                ops.add(producer[t])
                todo += [int(u) for u in sg.operators[producer[t]].inputs if u >= 0]
            else:
                raise KernelError(f"subgraph {si}: the run-time shape input {t} ({model.tensor_name(si, t)!r}) "
                                  f"comes from no op, input or constant")
        self.leaves.sort()
        self.runtime = list(planner.runtime)
        self.computed = [t for t in self.runtime if t not in self.leaves]
        self.interp = None
        if self.computed:
            from .interpreter import Interpreter

            tflite = segment_tflite(model, si, sorted(ops), self.leaves, self.computed, self.folded)
            self.interp = Interpreter(model_content=tflite, device=planner._device(), cpu_fallback=planner.fallback,
                                      num_threads=planner.num_threads)
            details = self.interp.get_input_details()
            for d, t in zip(details, self.leaves):
                shape = planner.input_shape(t)
                if tuple(d["shape"]) != tuple(shape):
                    self.interp.resize_tensor_input(d["index"], list(shape))
            self.interp.allocate_tensors()
            self._in = [d["index"] for d in details]
            self._out = [d["index"] for d in self.interp.get_output_details()]
        logging.info("tflfuse: subgraph %d: shape inputs %s computed at run time%s", si, self.runtime,
                     f" by {len(ops)} op(s)" if ops else "")

    def __call__(self, host: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        values: dict[int, np.ndarray] = {}
        if self.interp is not None:
            for index, t in zip(self._in, self.leaves):
                self.interp.set_tensor(index, host[t])
            self.interp.invoke()
            values.update((t, self.interp.get_tensor(index)) for index, t in zip(self._out, self.computed))
        for t in self.runtime:
            if t not in values:
                values[t] = np.array(host[t], copy=True)
        return {t: values[t] for t in self.runtime}

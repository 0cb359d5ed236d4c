"""Ops that fusion carries through unchanged: those tflfuse cannot plan (no kernel, or an input of a type the
runtime does not hold), and the :class:`~tflfuse.passes.graph.Graph` of a subgraph that holds them, for
:mod:`tflfuse.passes.fuse`."""

from __future__ import annotations

import collections
import copy

from ai_edge_litert import schema_py_generated as schema

from ..model import Model, is_builtin_name
from .graph import Graph

__all__ = ["CarryingGraph", "carried_ops", "lower_known", "without_kernel"]

#: What the runtime's tensors hold (bool as int32 0/1, int64 narrowed to int32: tflfuse.runtime.plan).
_HELD_TYPES = (schema.TensorType.FLOAT32, schema.TensorType.INT32, schema.TensorType.BOOL, schema.TensorType.INT64)


def without_kernel(model: Model, si: int) -> set[int]:
    """The ops of subgraph ``si`` that fusion leaves as they are because tflfuse cannot plan them: those
    without a kernel (a custom op such as MediaPipe's ``TransformLandmarks``, a builtin tflfuse lacks, a
    composite whose decomposition holds one) and, transitively, those reading a tensor of a type the runtime
    does not hold (int8, uint8, float16...) that such an op or the subgraph's input gives, or that an op
    with a kernel writes from a runtime input (a CAST to uint8), and int64 arithmetic on runtime values
    (:func:`tflfuse.runtime.int64.int64_arithmetic`: the runtime holds int64 as int32). Every other op is
    planned, and checked, as before (:func:`carried_ops` adds those planned on run-time values)."""
    from ..kernels import UnsupportedOpError, supported_ops
    from ..runtime.plan import check_supported

    try:
        check_supported(model, si)
        missing = ()
    except UnsupportedOpError as e:
        missing = e.ops
    ops = {oi for _, s, oi in missing if s == si}
    known = set(supported_ops())
    sg = model.subgraphs[si]
    for oi in range(len(sg.operators) if missing else 0):   # a composite run through a decomposition lacking one
        comp = model.composite(si, oi)
        if comp is not None and oi not in ops and (is_builtin_name(comp.name) or comp.name not in known):
            try:
                check_supported(model, comp.decomposition)
            except UnsupportedOpError:
                ops.add(oi)
    unheld = {int(t) for t in sg.inputs if sg.tensors[t].type not in _HELD_TYPES}
    for oi, op in enumerate(sg.operators):   # a runtime value into a type the runtime does not hold
        if oi not in ops and any(t >= 0 and sg.tensors[t].type not in _HELD_TYPES for t in op.outputs) and \
                any(t >= 0 and not _constant(model, si, int(t)) for t in op.inputs):
            ops.add(oi)
    from ..runtime.int64 import int64_arithmetic   # what would wrap at int32 on the GPU
    ops |= set(int64_arithmetic(model, si))
    while True:
        unheld |= {int(t) for oi in ops for t in sg.operators[oi].outputs
                   if t >= 0 and sg.tensors[t].type not in _HELD_TYPES}
        more = {oi for oi, op in enumerate(sg.operators) if oi not in ops and unheld & {int(t) for t in op.inputs}}
        if not more:
            return ops
        ops |= more


def carried_ops(model: Model, si: int) -> set[int]:
    """The ops of subgraph ``si`` that fusion carries through unchanged: :func:`without_kernel`'s and,
    transitively, the ops that plan only on run-time values (a STRIDED_SLICE whose ``begin`` is an input of the
    graph, a RESHAPE to a computed shape: tflfuse's Interpreter plans them on the values each invoke gives) or
    only on the shapes of such ops' outputs, which fusion cannot plan statically. An op that refuses for another
    reason (shapes that disagree) is not added: planning the rest raises for it, naming it, as before."""
    return _with_runtime_values(model, si, without_kernel(model, si))


def _with_runtime_values(model: Model, si: int, ops: set[int]) -> set[int]:
    """``ops`` and the ops :func:`carried_ops` adds for run-time values."""
    from ..runtime.lower import Probe
    from ..runtime.plan import lower

    count = len(model.subgraphs[si].operators or [])
    while True:
        kept = [oi for oi in range(count) if oi not in ops]   # the view's operator j is the file's kept[j]
        probe = Probe()
        lower(_skipping(model, si, ops), si, relayout=False, probe=probe)
        lifted = {kept[j] for j, r in probe.refusals.items() if r.runtime or r.uncertain}
        if not lifted:
            return ops
        ops = ops | lifted


def _constant(model: Model, si: int, t: int) -> bool:
    try:
        return model.tensor_data(si, t) is not None
    except ValueError:   # a type tflfuse does not read (string): not a constant it could fold
        return False


def _skipping(model: Model, si: int, skip: set[int]) -> Model:
    """A view of ``model`` whose subgraph ``si`` lacks the ops ``skip`` (:func:`without_kernel`): the tensors
    they write are inputs, of their declared shapes, but for those of types the runtime does not hold, which
    (as such inputs of the subgraph) only skipped ops read. ``model`` itself when there is nothing to drop."""
    sg = model.subgraphs[si]
    written = [int(t) for oi in sorted(skip) for t in sg.operators[oi].outputs if t >= 0]
    unheld = {int(t) for t in [*sg.inputs, *written] if sg.tensors[t].type not in _HELD_TYPES}
    if not skip and not unheld:
        return model
    tree = copy.copy(model.m)
    tree.subgraphs = list(tree.subgraphs)
    view = tree.subgraphs[si] = copy.copy(sg)
    view.operators = [op for oi, op in enumerate(sg.operators) if oi not in skip]
    view.inputs = [t for t in [*sg.inputs, *written] if t not in unheld]
    view.outputs = [t for t in sg.outputs if t not in unheld]
    return model.derived(tree)


def lower_known(model: Model, si: int, target: str, skip: set[int], relayout: bool = False):
    """:func:`tflfuse.runtime.plan.lower` of subgraph ``si`` without the ops ``skip`` (:func:`_skipping`)."""
    from ..runtime.plan import lower

    return lower(_skipping(model, si, skip), si, target=target, relayout=relayout)


class CarryingGraph(Graph):
    """A :class:`Graph` of a subgraph that may hold ops tflfuse cannot plan (``without_kernel``, from
    :func:`without_kernel`) or plans only on run-time values (together ``opaque``, :func:`carried_ops`): shapes
    and constants come from planning the other ops, and no pattern starts at or takes in an opaque op, so each
    stays in the file as it was (options and custom options included)."""

    def __init__(self, model: Model, subgraph: int, target: str):
        self.without_kernel = without_kernel(model, subgraph)
        self.opaque = _with_runtime_values(model, subgraph, self.without_kernel)
        view = _skipping(model, subgraph, self.opaque)
        super().__init__(view, subgraph, target)   # plans the ops tflfuse can plan
        if view is model:
            return
        self.model, self.sg = model, model.m.subgraphs[subgraph]   # ...and edits the file's own subgraph
        self.producer, self.consumers = {}, collections.defaultdict(list)
        for oi, op in enumerate(self.sg.operators):
            self.producer.update((int(t), oi) for t in op.outputs if t >= 0)
            for t in op.inputs:
                if t >= 0:
                    self.consumers[int(t)].append(oi)
        self.outputs = {int(t) for t in self.sg.outputs}

    def free(self, *ops: int) -> bool:
        return super().free(*ops) and not set(ops) & self.opaque


# ---- the patterns ------------------------------------------------------------------------------------

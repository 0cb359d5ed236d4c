"""How tflfuse runs each op of a .tflite: the runtime's own rule (:func:`tflfuse.runtime.plan.check_supported`,
what :class:`tflfuse.Interpreter` refuses), in a table that ``tflfuse ops`` prints and ``tflfuse check``'s
``kernels`` check reads. No GPU is touched.
"""

from __future__ import annotations

import dataclasses

from ..model import Model

__all__ = ["OpSupport", "op_support"]


@dataclasses.dataclass(frozen=True)
class OpSupport:
    """How tflfuse runs one op of a .tflite (a row of :func:`op_support`).

    Attributes:
      subgraph, index: where the op is.
      name: the op's name in the file (``STABLEHLO_COMPOSITE`` for a composite, which ``composite`` names).
      composite: a ``STABLEHLO_COMPOSITE``'s name (``fused_lstm``), "" for other ops.
      runs: ``"kernel"`` (the op has a kernel), ``"fused kernel"`` (a composite that runs as one kernel, looked
        up by its name), ``"decomposition"`` (a composite whose decomposition subgraph runs inlined, op by op),
        ``"cpu fallback"`` (runs on LiteRT's CPU interpreter: a builtin without a kernel, an op whose kernel
        refuses its dtype, attributes or shapes, or an op reading a tensor of a type the GPU runtime does not
        hold; :mod:`tflfuse.runtime.fallback`), ``"missing"`` (a
        custom op without a kernel, which neither runs, and running the model needs it) or ``"not needed"``
        (no kernel, in a decomposition subgraph that no composite runs: its composites run fused kernels).
      decomposition: a composite's decomposition subgraph, -1 for other ops.
      in_decomposition: the op is in some composite's decomposition subgraph.
      reason: why a ``"cpu fallback"`` op runs on the CPU (``"no GPU kernel"``...), "" for other ops.
      via: ``(subgraph, index)`` of the control-flow op on the CPU (a WHILE) whose subgraph holds this op, which
        LiteRT therefore runs whatever kernels it has; None for other ops.
    """

    subgraph: int
    index: int
    name: str
    composite: str
    runs: str
    decomposition: int = -1
    in_decomposition: bool = False
    reason: str = ""
    via: tuple[int, int] | None = None

    @property
    def display_name(self) -> str:
        """The op's name, a composite's by its own name: ``STABLEHLO_COMPOSITE fused_lstm``."""
        return f"{self.name} {self.composite}" if self.composite else self.name


def _kernel_refusals(model: Model, si: int, part) -> list:
    """The ops of subgraph ``si`` whose GPU kernel refuses them (their dtype, attributes or shapes), which the
    interpreter runs on LiteRT's CPU interpreter: the interpreter's own probing lowering
    (:meth:`tflfuse.runtime.specialise.SubgraphPlanner.decide`, no GPU) at the file's input shapes. [] where
    the lowering itself fails (the interpreter then says why, when it plans)."""
    from ..kernels import KernelError, UnsupportedOpError
    from ..model import ModelError
    from .specialise import SubgraphPlanner

    planner = SubgraphPlanner(model, si, part if part.cpu else None, fallback=True, input_shapes=None,
                              preserve=False, precision="float32", device=lambda: None)
    try:
        planner.decide("gpu")
    except (KernelError, UnsupportedOpError, ModelError):
        return []
    return planner.fallback_ops


def op_support(model: Model) -> list[OpSupport]:
    """Every op of ``model`` (each subgraph, in file order) and how tflfuse runs it: the runtime's own answer
    (:func:`tflfuse.runtime.plan.check_supported`, what :class:`tflfuse.Interpreter` refuses), so that ``tflfuse
    ops``, check's ``kernels`` check and the interpreter agree. No GPU is touched.

    Returns:
      One :class:`OpSupport` per op; the model runs when none has ``runs == "missing"`` (on the GPU alone
      when none has ``"cpu fallback"`` either, or with ``Interpreter(..., cpu_fallback=False)``).
    Raises:
      KernelError: a composite whose decomposition subgraph contains itself.
    """
    from ..kernels import UnsupportedOpError, supported_ops
    from ..model import ModelError
    from .fallback import called_subgraphs, litert_runs, partition
    from .plan import _has_fused_kernel, check_supported

    try:
        check_supported(model)
        missing: set[tuple[int, int]] = set()
    except UnsupportedOpError as e:
        missing = {(sg, oi) for _, sg, oi in e.ops}
    known, decompositions = set(supported_ops()), model.decompositions()
    reasons: dict[tuple[int, int], str] = {}   # (subgraph, op) -> why it runs on the CPU
    for si in range(len(model.subgraphs)):
        if si in decompositions:
            continue
        try:
            part = partition(model, si)
        except ModelError:   # a decomposition that cannot be inlined: the interpreter refuses it when planning
            continue
        if part.model is model:   # op indices are the file's (no composite inlined)
            reasons.update(((si, f.index), f.reason) for f in part.cpu)
            reasons.update(((si, f.index), f.reason) for f in _kernel_refusals(model, si, part))
    via: dict[tuple[int, int], tuple[int, int]] = {}
    todo = list(reasons)
    while todo:   # the subgraphs that a control-flow op on the CPU runs (WHILE's body) run on LiteRT too
        si, oi = todo.pop()
        for k in called_subgraphs(model.subgraphs[si].operators[oi]):
            for j in range(len(model.subgraphs[k].operators) if 0 <= k < len(model.subgraphs) else 0):
                if (k, j) not in via:
                    reasons[(k, j)] = (f"in subgraph {k}, which {model.op_name(si, oi)} (operator {oi} of subgraph "
                                       f"{si}) runs on the CPU")
                    via[(k, j)] = via.get((si, oi), (si, oi))
                    todo.append((k, j))
    rows = []
    for si in range(len(model.subgraphs)):
        for oi, name in enumerate(model.op_names(si)):
            comp = model.composite(si, oi)
            reason = ""
            if (si, oi) in missing and litert_runs(name):
                runs, reason = "cpu fallback", reasons.get((si, oi), "no GPU kernel")
            elif (si, oi) in missing:
                runs = "missing"
            elif (si, oi) in reasons:
                runs, reason = "cpu fallback", reasons[(si, oi)]
            elif comp is not None:
                runs = "fused kernel" if _has_fused_kernel(comp.name) else "decomposition"
            else:
                runs = "kernel" if name in known else "not needed"
            rows.append(OpSupport(si, oi, name, comp.name if comp else "", runs,
                                  comp.decomposition if comp else -1, si in decompositions, reason,
                                  via.get((si, oi)) if runs == "cpu fallback" else None))
    return rows

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
        ``"missing"`` (no kernel, and running the model needs one) or ``"not needed"`` (no kernel, in a
        decomposition subgraph that no composite runs: its composites run fused kernels).
      decomposition: a composite's decomposition subgraph, -1 for other ops.
      in_decomposition: the op is in some composite's decomposition subgraph.
    """

    subgraph: int
    index: int
    name: str
    composite: str
    runs: str
    decomposition: int = -1
    in_decomposition: bool = False

    @property
    def display_name(self) -> str:
        """The op's name, a composite's by its own name: ``STABLEHLO_COMPOSITE fused_lstm``."""
        return f"{self.name} {self.composite}" if self.composite else self.name


def op_support(model: Model) -> list[OpSupport]:
    """Every op of ``model`` (each subgraph, in file order) and how tflfuse runs it: the runtime's own answer
    (:func:`tflfuse.runtime.plan.check_supported`, what :class:`tflfuse.Interpreter` refuses), so that ``tflfuse
    ops``, check's ``kernels`` check and the interpreter agree. No GPU is touched.

    Returns:
      One :class:`OpSupport` per op; the model runs when none has ``runs == "missing"``.
    Raises:
      KernelError: a composite whose decomposition subgraph contains itself.
    """
    from ..kernels import UnsupportedOpError, supported_ops
    from .plan import _has_fused_kernel, check_supported

    try:
        check_supported(model)
        missing: set[tuple[int, int]] = set()
    except UnsupportedOpError as e:
        missing = {(sg, oi) for _, sg, oi in e.ops}
    known, decompositions = set(supported_ops()), model.decompositions()
    rows = []
    for si in range(len(model.subgraphs)):
        for oi, name in enumerate(model.op_names(si)):
            comp = model.composite(si, oi)
            if (si, oi) in missing:
                runs = "missing"
            elif comp is not None:
                runs = "fused kernel" if _has_fused_kernel(comp.name) else "decomposition"
            else:
                runs = "kernel" if name in known else "not needed"
            rows.append(OpSupport(si, oi, name, comp.name if comp else "", runs,
                                  comp.decomposition if comp else -1, si in decompositions))
    return rows

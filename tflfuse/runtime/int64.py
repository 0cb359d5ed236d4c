"""Which ops compute int64 values the GPU cannot: the runtime holds int64 tensors as int32
(:data:`tflfuse.runtime.plan._DTYPE_NAMES`), which is exact for ops that only move values (their inputs are
checked to fit when set or uploaded) but wraps silently for arithmetic (a CUMSUM, a SUM, a NEG of -2**31).
Such an op runs on LiteRT's CPU interpreter (:func:`tflfuse.runtime.fallback.partition`), is carried through
fusion as it is (:func:`tflfuse.passes.carry.without_kernel`), and is refused by :func:`tflfuse.runtime.plan.lower`
(``cpu_fallback=False``). An op whose inputs are all constants folds at load in NumPy (int64 exact) and stays.

GPU-free; imports no kernel module at import time."""

from __future__ import annotations

import numpy as np

from ..model import Model

__all__ = ["INT64_EXACT", "INT64_REASON", "int64_arithmetic"]

#: Ops whose int64 outputs are exact under int32 narrowing: they move, select or index values (or give shapes,
#: indices) and compute none. CAST only from int32, bool or int64 (a float past int32 would wrap).
INT64_EXACT = frozenset({
    "RESHAPE", "TRANSPOSE", "CONCATENATION", "GATHER", "GATHER_ND", "SLICE", "STRIDED_SLICE", "PACK", "UNPACK",
    "TILE", "SPLIT", "SPLIT_V", "SQUEEZE", "EXPAND_DIMS", "BROADCAST_TO", "BROADCAST_ARGS", "PAD", "PADV2",
    "MIRROR_PAD", "SELECT",
    "SELECT_V2", "CAST", "ARG_MAX", "ARG_MIN", "TOPK_V2", "MAXIMUM", "MINIMUM", "REDUCE_MAX", "REDUCE_MIN", "SHAPE",
    "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND", "SIGN"})

#: The reason given where such an op falls back or is refused.
INT64_REASON = "int64 arithmetic (the GPU holds int64 as int32)"

_INT64 = np.dtype(np.int64)
_INT64_TYPE = 4   # TensorType.INT64
_CAST_EXACT = (np.dtype(np.int32), np.dtype(np.bool_), _INT64)


def _dtype(model: Model, sg: int, t: int):
    try:
        return model.tensor_dtype(sg, t)
    except Exception:   # a type tflfuse does not read (string): other checks name it
        return None


def _constant(model: Model, sg: int, t: int) -> bool:
    """Whether tensor ``t`` has data in the file (cheap: no decoding)."""
    b = model.tensor(sg, t).buffer
    buf = model.m.buffers[b] if 0 <= b < len(model.m.buffers or []) else None
    return buf is not None and ((buf.offset is not None and buf.offset > 1 and buf.size)
                                or (buf.data is not None and len(buf.data) > 0))


def _folds(name: str) -> tuple[bool, bool]:
    """(has a load-time fold, folds from its input's shape alone) of the kernel for ``name``."""
    from ..kernels import kernel_class

    try:
        cls = kernel_class(name)
    except Exception:
        return False, False
    return hasattr(cls, "fold"), bool(getattr(cls, "folds_from_shape", False))


def int64_arithmetic(model: Model, sg: int) -> dict[int, str]:
    """Operator index -> :data:`INT64_REASON` for each op of subgraph ``sg`` that writes an int64 tensor, is not
    in :data:`INT64_EXACT`, and reads a runtime value (inputs that are file constants, or outputs of ops that
    fold at load, do not count). Composites are left to their own checks."""
    g = model.subgraphs[sg]
    if not any(t.type == _INT64_TYPE for t in g.tensors or []):
        return {}
    const: set[int] = set()
    found: dict[int, str] = {}
    names = model.op_names(sg)
    for oi, op in enumerate(g.operators or []):
        ins = [int(t) for t in op.inputs if t >= 0]
        for t in ins:
            if t not in const and _constant(model, sg, t):
                const.add(t)
        name = names[oi]
        if model.composite(sg, oi) is not None:
            continue
        has_fold, from_shape = _folds(name)
        if has_fold and (from_shape or all(t in const for t in ins)):
            const.update(int(t) for t in op.outputs if t >= 0)
            continue
        if not any(_dtype(model, sg, int(t)) == _INT64 for t in op.outputs if t >= 0):
            continue
        exact = name in INT64_EXACT and not (name == "CAST" and ins and _dtype(model, sg, ins[0]) not in _CAST_EXACT)
        if not exact:
            found[oi] = INT64_REASON
    return found

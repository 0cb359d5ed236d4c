"""Graph rewrites on a :class:`tflfuse.model.Model` (no TensorFlow needed): :mod:`.fuse` (pattern fusion of
any .tflite), :mod:`.unfuse` (fused ops back into builtins), :mod:`.portable` (fused ops as
STABLEHLO_COMPOSITE), :mod:`.prune` (unused outputs of fused ops), on the editing helpers of :mod:`.graph`; and
the lowerings below.

Lowerings: a composite whose fused custom op has an equivalent TFLite builtin (``fused_lstm`` ->
UNIDIRECTIONAL_SEQUENCE_LSTM) registers a function that rewrites one such op in place, so stock LiteRT
runs the file too. :func:`tflfuse.convert` applies them after the converter, and counts a lowered op as
its composite fused.
"""

from __future__ import annotations

import collections
import importlib
import pkgutil
from typing import Callable

__all__ = ["apply_lowerings", "lowering"]

#: composite name -> rewrite(model, subgraph, op_index) -> bool (True: the op was rewritten)
_LOWERINGS: dict[str, Callable] = {}


def lowering(name: str):
    """Decorator registering ``fn(model: Model, subgraph: int, index: int) -> bool`` for custom op ``name``.

    The function edits ``model.m`` (the LiteRT schema object tree) in place, replacing op ``index`` of
    ``subgraph`` by builtins, and returns False (editing nothing) where the op is not expressible.
    """

    def wrap(fn):
        if name in _LOWERINGS and _LOWERINGS[name] is not fn:
            raise ValueError(f"a lowering for {name!r} is already registered")
        _LOWERINGS[name] = fn
        return fn

    return wrap


def apply_lowerings(tflite: bytes) -> tuple[bytes, collections.Counter]:
    """Applies every registered lowering to every matching op.

    Returns:
      ``(tflite, lowered)``: the (re-serialized, where anything changed) file and, per composite name,
      the number of its ops lowered to builtins.
    """
    from ..model import Model

    _load()
    lowered: collections.Counter = collections.Counter()
    if not _LOWERINGS:
        return tflite, lowered
    model = Model(tflite)
    for sg in range(len(model.subgraphs)):
        for index in range(len(model.m.subgraphs[sg].operators or [])):
            name = model.op_name(sg, index)
            fn = _LOWERINGS.get(name)
            if fn is not None and fn(model, sg, index):
                lowered[name] += 1
    return (model.to_bytes() if lowered else tflite), lowered


def _load() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")

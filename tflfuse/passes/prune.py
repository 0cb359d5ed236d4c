"""Pruning the outputs of fused ops that nothing reads.

A composite returns all its outputs, and the TFLite converter keeps every output of the fused op even where
the model reads only some of them (an LSTM with ``return_state=True`` whose states are unused; a user's
two-output composite with one output used). :func:`prune_unused_outputs` (run by :func:`tflfuse.convert`
right after the converter, before the lowerings) removes them, per fused op, in one of two ways:

* **attributes**, where the composite says which outputs it makes: ``fused_lstm`` and ``fused_gru`` get
  ``return_sequences`` / ``return_state`` off when the sequence / the states are unused, so the op no longer
  computes them (the kernel writes no [N, T, U] sequence then), and an LSTM left with ``return_sequences``
  alone becomes the builtin ``UNIDIRECTIONAL_SEQUENCE_LSTM`` (:mod:`tflfuse.passes.lstm`). Register more
  with :func:`output_pruning`.
* **absent outputs** (``absent=True``): an unused output that the attributes cannot drop (an LSTM's ``h``
  when only ``c`` is used; any output of a composite without a rule) becomes tensor index -1, the schema's
  "omitted optional tensor". tflfuse's runtime computes such an output into a buffer of its own that it
  reuses at once (:func:`tflfuse.runtime.plan.lower`).

Absent outputs are for the custom-op form only. LiteRT (2.3) dereferences every output of a
``STABLEHLO_COMPOSITE`` when it binds the decomposition's outputs, and crashes on -1, so for
``fused_op_format="composite"`` :func:`tflfuse.convert` prunes by attributes alone and keeps the other
unused outputs as tensors nothing reads.

An op none of whose outputs is read is left as it is (the converter drops such calls itself). No TensorFlow
needed.
"""

from __future__ import annotations

import collections
from typing import Callable, Collection, Sequence

from absl import logging
from flatbuffers import flexbuffers

__all__ = ["output_pruning", "prune_unused_outputs"]

#: composite name -> rule(attrs, used) -> (new attrs, the old output position of each new output) or None
_RULES: dict[str, Callable] = {}


def output_pruning(name: str):
    """Decorator registering ``rule(attrs: dict, used: list[bool])`` for the fused op ``name``.

    ``attrs`` are the op's decoded attributes (:func:`tflfuse.annotate.decode_attrs`), ``used[k]`` whether
    output ``k`` is read. The rule returns ``(new_attrs, positions)``: the attributes of an op that makes
    fewer outputs, and for each of its outputs the position of that output in the old op (every used output
    must be among them; an unused one may stay, it then becomes absent where that is allowed); or None to
    leave the attributes as they are.
    """

    def wrap(fn):
        if name in _RULES and _RULES[name] is not fn:
            raise ValueError(f"an output pruning rule for {name!r} is already registered")
        _RULES[name] = fn
        return fn

    return wrap


def _recurrent_roles(cell: str, sequences: bool, state: bool) -> list[str]:
    """The outputs of ``fused_lstm`` / ``fused_gru`` for these attributes (composites.recurrent's doc)."""
    roles = ["seq" if sequences else "h"]
    if state and sequences:
        roles.append("h")
    if state and cell == "lstm":
        roles.append("c")
    return roles


def _recurrent_rule(cell: str):
    def rule(attrs: dict, used: Sequence[bool]):
        roles = _recurrent_roles(cell, bool(attrs.get("return_sequences")), bool(attrs.get("return_state")))
        if len(roles) != len(used):
            return None   # not the op the composite makes: leave it to the absent-output rule
        wanted = {r for r, u in zip(roles, used) if u}
        sequences = "seq" in wanted
        state = "c" in wanted or (sequences and "h" in wanted)
        new = _recurrent_roles(cell, sequences, state)
        return {**attrs, "return_sequences": sequences, "return_state": state}, [roles.index(r) for r in new]

    return rule


output_pruning("fused_lstm")(_recurrent_rule("lstm"))
output_pruning("fused_gru")(_recurrent_rule("gru"))


def prune_unused_outputs(tflite: bytes, names: Collection[str] | None = None, *,
                         absent: bool = True) -> tuple[bytes, collections.Counter]:
    """Removes the outputs of fused custom ops that no op and no subgraph output reads (module doc).

    Args:
      tflite: a .tflite whose fused ops are custom ops named after composites.
      names: the custom op names to prune (default: every registered composite,
        :func:`tflfuse.annotate.registry`). Other ops, STABLEHLO_COMPOSITE ones included, are left alone.
      absent: whether an unused output that no attribute rule drops becomes -1 (False keeps it as a tensor
        nothing reads: the form LiteRT's STABLEHLO_COMPOSITE kernel needs).

    Returns:
      ``(tflite, pruned)``: the file (re-serialized where anything changed) and, per op name, the number of
      ops whose outputs were pruned.
    """
    from ..annotate import decode_attrs, encode_attrs, registry
    from ..model import Model

    names = set(registry()) if names is None else set(names)
    model = Model(tflite)
    pruned: collections.Counter = collections.Counter()
    for sg_index, sg in enumerate(model.m.subgraphs):
        read = {int(t) for op in sg.operators for t in op.inputs if t >= 0} | {int(t) for t in sg.outputs}
        for oi, op in enumerate(sg.operators):
            name = model.op_name(sg_index, oi)
            if name not in names or op.customOptions is None:
                continue
            outs = model.op_outputs(sg_index, oi)
            used = [t >= 0 and t in read for t in outs]
            if all(used) or not any(used):
                continue
            attrs, positions = None, list(range(len(outs)))
            rule = _RULES.get(name)
            if rule is not None:
                try:
                    old = decode_attrs(model.op_attrs(sg_index, oi))
                except ValueError as e:
                    logging.warning("%s (operator %d of subgraph %d): outputs not pruned by attributes: %s",
                                    name, oi, sg_index, e)
                else:
                    found = rule(dict(old), list(used))
                    if found is not None and found[0] != old:
                        attrs, positions = found
            new_outs = [outs[p] if used[p] or not absent else -1 for p in positions]
            if any(u and t not in new_outs for t, u in zip(outs, used)):
                raise ValueError(f"the output pruning rule of {name!r} drops a used output of operator {oi} "
                                 f"of subgraph {sg_index}")
            if attrs is None and new_outs == outs:
                continue
            if attrs is not None:
                op.customOptions = list(flexbuffers.Dumps(encode_attrs(attrs)))
            op.outputs = new_outs
            pruned[name] += 1
            logging.info("%s (operator %d of subgraph %d): outputs %s -> %s%s", name, oi, sg_index, outs, new_outs,
                         f" ({', '.join(f'{k}={v}' for k, v in attrs.items() if v != old[k])})" if attrs else "")
    return (model.to_bytes() if pruned else tflite), pruned

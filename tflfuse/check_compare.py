"""The numbers of ``tflfuse check``: element-wise comparison, TensorFlow's references, and the per-op
comparison of tflfuse against LiteRT (every tensor of one run kept on both sides).

An element passes when ``|got - want| <= atol + rtol * |want|`` (``numpy.allclose``'s rule, NaN equal to
NaN); ``max rel`` is the largest |error| relative to the largest |want| of the output.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from .check_config import CheckOptions, Source, _make_feeds, _signatures
from .check_litert import run_signature
from .model import Model

__all__ = ["compare"]


def compare(got, want, atol: float, rtol: float) -> dict:
    """Element-wise agreement of two arrays under ``|got - want| <= atol + rtol * |want|`` (NaN == NaN).

    Returns:
      dict: ``max_abs``, ``max_rel`` (``max_abs`` relative to the reference's scale, the largest finite |want|:
      an element whose reference is 0 does not make it infinite; 0 when nothing differs, inf only when the
      reference is all zeros and something differs), ``tolerance_used`` (the largest |error| / (atol + rtol
      |want|); > 1 fails), ``violations``, ``elements``, ``shape_mismatch`` (str or "").
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf"), "tolerance_used": float("inf"), "violations":
                int(max(got.size, want.size)), "elements": int(want.size),
                "shape_mismatch": f"shape {list(got.shape)} against {list(want.shape)}"}
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(all="ignore"):
        both_nan = np.isnan(g) & np.isnan(w)
        diff = np.where(both_nan, 0.0, np.abs(g - w))
        diff = np.where(np.isnan(diff), np.inf, diff)
        tol = atol + rtol * np.abs(w)
        used = np.where(diff == 0, 0.0, diff / np.where(tol > 0, tol, np.finfo(np.float64).tiny))
    max_abs = float(diff.max()) if diff.size else 0.0
    finite = np.abs(w[np.isfinite(w)])
    scale = float(finite.max()) if finite.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return {"max_abs": max_abs, "max_rel": max_rel, "tolerance_used": float(used.max()) if used.size else 0.0,
            "violations": int((diff > tol).sum()), "elements": int(w.size), "shape_mismatch": ""}


def _merge(a: dict | None, b: dict) -> dict:
    if a is None:
        return dict(b)
    return {"max_abs": max(a["max_abs"], b["max_abs"]), "max_rel": max(a["max_rel"], b["max_rel"]),
            "tolerance_used": max(a["tolerance_used"], b["tolerance_used"]),
            "violations": a["violations"] + b["violations"], "elements": a["elements"] + b["elements"],
            "shape_mismatch": a["shape_mismatch"] or b["shape_mismatch"]}


def _tf_references(src: Source, keys) -> dict[Any, Callable[[dict], dict]]:
    """Per signature key, a function: (sample index, {input name: array}) -> {output name: array} computed by
    TensorFlow."""
    import tensorflow as tf

    if src.kind == "keras":
        from .conversion import _keras_function

        fns = {"serving_default": _keras_function(src.obj, None)}
    elif src.kind == "saved_model":
        loaded = tf.saved_model.load(src.obj)
        fns = {k: loaded.signatures[k] for k in loaded.signatures.keys()}
        fns["_loaded"] = loaded  # keeps the variables alive
    else:
        fns = dict(zip(["serving_default"] if len(src.obj) == 1 else [f.graph.name for f in src.obj], src.obj))

    def caller(fn):
        def call(_sample: int, feeds: dict) -> dict:
            args, kwargs = fn.structured_input_signature
            if kwargs:
                out = fn(**{k: tf.constant(feeds[k]) for k in kwargs})
            else:
                specs = tf.nest.flatten(args)
                names = [s.name for s in specs]
                values = [feeds[n] for n in names] if set(names) <= set(feeds) else list(feeds.values())
                out = fn(*[tf.constant(v) for v in values])
            if isinstance(out, Mapping):
                return {k: np.asarray(v) for k, v in out.items()}
            return {f"output_{i}": np.asarray(v) for i, v in enumerate(tf.nest.flatten(out))}
        return call

    refs = {}
    for key in keys:
        fn = fns.get(key if key is not None else "serving_default")
        if fn is None and len([k for k in fns if k != "_loaded"]) == 1:
            fn = next(v for k, v in fns.items() if k != "_loaded")
        if fn is None:
            raise RuntimeError(f"no TensorFlow function for signature {key!r}; TensorFlow has {sorted(fns)}")
        refs[key] = caller(fn)
    refs["_keep"] = fns
    return refs


def _pair_outputs(got: dict, want: dict) -> list[tuple[str, np.ndarray, np.ndarray]]:
    if set(got) == set(want):
        return [(k, got[k], want[k]) for k in want]
    if len(got) == len(want):  # names differ (e.g. output_0 against a function's own): the order is the match
        return [(f"{g} ~ {w}", got[g], want[w]) for g, w in zip(got, want)]
    raise RuntimeError(f"outputs {sorted(got)} cannot be paired with TensorFlow's {sorted(want)}")


def _per_op_input(m: Model, opts: CheckOptions) -> tuple[Any, dict]:
    """The signature key (subgraph 0's where one runs it) and the first seeded or given sample of the per-op
    comparison."""
    sig = _signatures(m)
    key = next((k for k, s in sig.items() if s["subgraph"] == 0), next(iter(sig)))
    return key, _make_feeds(m, dataclasses.replace(opts, samples=1))[0][key]


def _per_op_tensors(m: Model) -> list[tuple[int, str, int]]:
    """``(op index, op name, output tensor)`` of subgraph 0's ops that compute from the inputs (a composite is
    named by its composite's name), in op order."""
    out = []
    constant = {t for t in range(len(m.subgraphs[0].tensors or [])) if m.tensor_data(0, t) is not None}
    for i, op in enumerate(m.op_names(0)):
        if all(t < 0 or t in constant for t in m.op_inputs(0, i)):
            # computed from constants alone (DEQUANTIZE of weights): tflfuse folds it at load, and LiteRT
            # need not keep it (XNNPACK reads the packed weights), so there is nothing runtime to compare
            constant.update(m.op_outputs(0, i))
            continue
        comp = m.composite(0, i)
        out += [(i, comp.name if comp else op, t) for t in m.op_outputs(0, i) if t >= 0]
    return out


def _per_op_rows(data: bytes, device, opts: CheckOptions, reference: Mapping[int, Any]) -> list[dict]:
    """Runs ``data`` on tflfuse with every tensor preserved (:func:`_per_op_input`'s sample) and compares each
    op's outputs with ``reference`` (LiteRT's tensors of the same run, :mod:`tflfuse.check_litert`; the error
    text for a tensor it does not keep): one row per op output tensor of subgraph 0, in op order."""
    from .runtime import Interpreter

    m = Model(data)
    key, sample = _per_op_input(m, opts)
    ours = Interpreter(model_content=data, device=device, experimental_preserve_all_tensors=True)
    ours.allocate_tensors()
    run_signature(ours, _signatures(m), key, sample)
    rows = []
    for i, op, t in _per_op_tensors(m):
        row = {"op_index": i, "op": op, "tensor": t, "name": m.tensor_name(0, t)[:80],
               "shape": list(m.tensor_shape(0, t))}
        try:
            want = reference[t]
            if isinstance(want, str):
                raise ValueError(want)
            row.update(compare(ours.get_tensor(t), want, opts.atol, opts.rtol))
        except ValueError as e:  # a tensor one runtime does not keep (e.g. folded at load)
            row.update(max_abs=0.0, max_rel=0.0, tolerance_used=0.0, violations=0, elements=0,
                       shape_mismatch="", note=str(e)[:120])
        row["ok"] = not row["violations"] and not row["shape_mismatch"]
        rows.append(row)
    return rows

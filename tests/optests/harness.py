"""Expand the grids into cases, convert each with the stock converter, run it on tflfuse and LiteRT, classify.

A case's status is one of :data:`STATUSES`:

* ``pass`` / ``wrong``: tflfuse (strict, ``cpu_fallback=False``: every op on its WebGPU kernel) matched LiteRT's
  CPU interpreter within the family's tolerance, or did not (``max_err``, ``tol`` and the first mismatch given);
* ``refused``: tflfuse strict raised (the message is kept, and grouped by :func:`refusal_cause`); the case is then
  run again with the default CPU fallback, whose outcome is ``fallback`` (``pass``/``wrong``/``refused``);
* ``tf_invalid``: TF itself cannot build the case (TF's own ``expected_tf_failures``);
* ``converter_failed`` / ``litert_failed``: the stock converter, or LiteRT CPU, failed on it;
* ``out_of_scope``: a data dtype outside :data:`grids.DTYPES` (int64, int16, uint8, string...);
* ``harness_error``: a builder raised a Python error (``AttributeError``...), a fault of this harness.

Converted files are cached in ``CACHE_DIR`` (git-ignored) by a key of the case, TF's version and the builders'
source, so a rerun converts nothing it converted before.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from pathlib import Path

import numpy as np

from . import grids

STATUSES = ("pass", "wrong", "refused", "tf_invalid", "converter_failed", "litert_failed", "out_of_scope",
            "harness_error")

#: Exceptions that mean a builder is wrong, not that TF rejects the case: reported as ``harness_error``.
_HARNESS_BUGS = (AttributeError, NameError, KeyError, ImportError, AssertionError, IndexError)

#: Converted .tflite files (and conversion failures) by case key.
CACHE_DIR = Path(__file__).resolve().parents[2] / ".optests"

#: (atol, rtol) per tolerance class, for float outputs: |ours - litert| <= atol + rtol * |litert| elementwise, with
#: two additions: "accumulation" scales atol by max(1, max|litert|) (a sum's rounding error is relative to its
#: partial sums, not to its possibly cancelled result), and every class but "exact" adds float32's smallest normal
#: (2**-126): WGSL lets a GPU flush subnormal results to zero. Integer and bool outputs must be equal, NaN where
#: LiteRT has NaN and infinities of the same sign.
TOLERANCES = {
    # data movement, selection, clamping, sign and rounding: nothing that rounds, so bit-identical.
    "exact": (0.0, 0.0),
    # one or two correctly rounded f32 operations, or WGSL's division (2.5 ULP): 2**-20 relative is 8 ULP.
    "elementwise": (1e-6, 2.0 ** -20),
    # exp/log/tanh/sin-based: WGSL allows 3 + 2|x| ULP for exp (and derives tanh, pow from it): ~80 ULP.
    "transcendental": (1e-5, 1e-5),
    # sums of up to ~1000 terms in another order than LiteRT's: ~sqrt(K) ULP of the partial sums; 1e-5 of
    # the output's magnitude leaves margin.
    "accumulation": (1e-5, 1e-5),
}


def _canon(value):
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


class Case:
    """One point of a family's grid."""

    def __init__(self, family: str, index: int, params: dict):
        self.family, self.index, self.params = family, index, params
        self.spec = grids.FAMILIES[family]
        text = json.dumps([family, _canon(params)], sort_keys=True)
        self.key = hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"{self.family}/{self.index}"

    def in_scope(self, dtypes=grids.DTYPES) -> bool:
        """Whether every data dtype of the case is one of ``dtypes`` (logical ops and REDUCE_ANY: bool)."""
        if self.spec["builder"] == "logical" or self.spec.get("op") == "any":
            return "bool" in dtypes
        values = [self.params[k] for k in _data_keys(self.params)]
        return all(v in dtypes for v in values if v in _DTYPE_NAMES)

    def seed(self) -> int:
        return int(self.key, 16) % (2 ** 32)


_DTYPE_NAMES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "bool", "string"}


def _data_keys(params: dict):
    from .builders import DATA_DTYPE_KEYS
    return [k for k in DATA_DTYPE_KEYS if k in params]


def expand(family: str) -> list[Case]:
    """The cases of one family, in TF's order: per set, the cartesian product of its lists."""
    cases = []
    for grid in grids.FAMILIES[family]["sets"]:
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            cases.append(Case(family, len(cases), dict(zip(keys, values))))
    return cases


def all_cases(families=None) -> list[Case]:
    return [c for f in (families or grids.FAMILIES) for c in expand(f)]


# ---- conversion ----------------------------------------------------------------------------------------------
_VERSION_KEY = None


def _version_key() -> str:
    global _VERSION_KEY
    if _VERSION_KEY is None:
        import tensorflow as tf
        src = (Path(__file__).parent / "builders.py").read_bytes()
        _VERSION_KEY = hashlib.sha1(tf.__version__.encode() + src).hexdigest()[:8]
    return _VERSION_KEY


def convert(case: Case, graph, cache: bool = True) -> tuple[bytes | None, str | None, str | None]:
    """``(tflite bytes, None, None)`` or ``(None, status, error)`` with status tf_invalid / converter_failed."""
    import tensorflow as tf
    path = CACHE_DIR / f"{case.key}-{_version_key()}"
    if cache and path.with_suffix(".tflite").exists():
        return path.with_suffix(".tflite").read_bytes(), None, None
    if cache and path.with_suffix(".json").exists():
        failure = json.loads(path.with_suffix(".json").read_text())
        return None, failure["status"], failure["error"]
    status = "tf_invalid"
    try:
        sig = [tf.TensorSpec(i.shape, tf.as_dtype(i.dtype), name=f"a{n}") for n, i in enumerate(graph.inputs)]
        fn = tf.function(graph.body, input_signature=sig, autograph=False)
        concrete = fn.get_concrete_function()
        status = "converter_failed"
        model = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn).convert()
    except Exception as e:   # noqa: BLE001  (TF's and the converter's errors are many; each is a result here)
        error = _first_line(e)
        if isinstance(e, _HARNESS_BUGS):
            return None, "harness_error", error   # not cached: the builder is to be fixed
        if cache:
            CACHE_DIR.mkdir(exist_ok=True)
            path.with_suffix(".json").write_text(json.dumps({"status": status, "error": error}))
        return None, status, error
    if cache:
        CACHE_DIR.mkdir(exist_ok=True)
        path.with_suffix(".tflite").write_bytes(model)
    return model, None, None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    # The converter's messages start with a traceback of locations; the failure follows the first "error: ".
    m = re.search(r"error: ([^\n]+)", text)
    if m:
        text = m.group(1)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0].strip() if lines else ''}"[:400]


# ---- running ---------------------------------------------------------------------------------------------------
def run_interpreter(interp, graph) -> list[np.ndarray]:
    """Feeds the case's inputs (by their ``a<i>`` names; resizing to run-time shapes), invokes, reads outputs."""
    details = interp.get_input_details()
    by_name = {}
    for d in details:
        m = re.search(r"a(\d+)(?::\d+)?$", d["name"])
        by_name[int(m.group(1)) if m else len(by_name)] = d
    for n, d in by_name.items():
        value = graph.inputs[n].value
        if tuple(d["shape"]) != value.shape:
            interp.resize_tensor_input(d["index"], list(value.shape))
    interp.allocate_tensors()
    for n, d in by_name.items():
        interp.set_tensor(d["index"], graph.inputs[n].value)
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def litert_ops(model: bytes) -> list[str]:
    from ai_edge_litert.interpreter import Interpreter
    return [d["op_name"] for d in Interpreter(model_content=model)._get_ops_details()]


def run_litert(model: bytes, graph) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    interp = Interpreter(model_content=model,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    return run_interpreter(interp, graph)


def compare(ours: list[np.ndarray], ref: list[np.ndarray], tol: str) -> tuple[bool, float, str]:
    """``(ok, max_err, message)``: shape, then dtype, then values (see :data:`TOLERANCES`)."""
    if len(ours) != len(ref):
        return False, float("inf"), f"{len(ours)} outputs, LiteRT has {len(ref)}"
    atol, rtol = TOLERANCES[tol]
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a.shape != b.shape:
            return False, float("inf"), f"output {i}: shape {list(a.shape)}, LiteRT {list(b.shape)}"
        if a.dtype != b.dtype:
            return False, float("inf"), f"output {i}: dtype {a.dtype}, LiteRT {b.dtype}"
        if a.size == 0:
            continue
        if a.dtype.kind != "f":
            bad = a != b
            if bad.any():
                j = np.argwhere(bad)[0]
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).max()
                return False, float(diff), f"output {i} at {j.tolist()}: {a[tuple(j)]}, LiteRT {b[tuple(j)]}"
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        same_inf = np.isinf(b64) & (a64 == b64)
        finite = np.isfinite(b64)
        scale = max(1.0, float(np.abs(b64[finite]).max()) if finite.any() else 1.0) if tol == "accumulation" else 1.0
        floor = float(np.finfo(np.float32).tiny) if tol != "exact" else 0.0
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(nan_b & nan_a | same_inf, 0.0, np.abs(a64 - b64))
        err = np.where(np.isnan(err), np.inf, err)
        bound = atol * scale + floor + rtol * np.where(finite, np.abs(b64), 0.0)
        worst = max(worst, float(err.max()))
        bad = err > bound
        if bad.any():
            j = tuple(np.argwhere(bad)[0])
            return False, float(err.max()), f"output {i} at {list(map(int, j))}: {a[j]!r}, LiteRT {b[j]!r}"
    return True, worst, ""


def run_case(case: Case, device, cache: bool = True, dtypes=grids.DTYPES) -> dict:
    """Builds, converts and runs one case (``out_of_scope`` where a data dtype is not in ``dtypes``); its result
    record (JSON-serialisable)."""
    from . import builders
    import tflfuse
    start = time.perf_counter()
    rec = {"case": case.name, "family": case.family, "params": _canon(case.params), "status": None}
    if not case.in_scope(dtypes):
        rec["status"] = "out_of_scope"
        return rec
    try:
        graph = builders.build(case.spec, case.params, np.random.default_rng(case.seed()))
    except Exception as e:   # noqa: BLE001
        rec.update(status="harness_error" if isinstance(e, _HARNESS_BUGS) else "tf_invalid", error=_first_line(e))
        return rec
    model, status, error = convert(case, graph, cache)
    if status == "tf_invalid" and error.split(":")[0] in {t.__name__ for t in _HARNESS_BUGS}:
        status = "harness_error"
    if model is None:
        rec.update(status=status, error=error)
        return rec
    litert_error = None
    try:
        rec["ops"] = sorted(set(litert_ops(model)))
        ref = run_litert(model, graph)
    except Exception as e:   # noqa: BLE001
        litert_error = _first_line(e)
        try:   # TF's own result of the case stands in, so that tflfuse is still judged (status stays litert_failed)
            ref = tf_reference(graph)
        except Exception:   # noqa: BLE001
            rec.update(status="litert_failed", error=litert_error)
            return rec
    tol = case.spec["tol"]
    rec["tol"] = tol
    for mode, fallback in (("status", False), ("fallback", True)):
        try:
            interp = tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=fallback)
            ours = run_interpreter(interp, graph)
        except Exception as e:   # noqa: BLE001  (a refusal: kept, grouped in the report)
            rec[mode] = "refused"
            rec["error" if mode == "status" else "fallback_error"] = _first_line(e)
            continue
        ok, err, msg = compare(ours, ref, tol)
        rec[mode] = "pass" if ok else "wrong"
        if not ok:
            rec["max_err"] = err
            rec["mismatch"] = msg
        if mode == "status":
            break   # strict ran every op on the GPU: the default (fallback) mode runs the same plan
    if litert_error is not None:
        rec["vs_tf"], rec["status"] = rec["status"], "litert_failed"
        rec["vs_tf_error"] = rec.pop("error", None)
        rec["error"] = litert_error
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec


def tf_reference(graph) -> list[np.ndarray]:
    """TF's own (eager) result of a case: the reference where LiteRT fails on the converted file."""
    import tensorflow as tf
    out = graph.body(*[tf.constant(i.value) for i in graph.inputs])
    return [np.asarray(t) for t in (out if isinstance(out, (list, tuple)) else [out])]


# ---- grouping refusals ------------------------------------------------------------------------------------------
_RUNTIME_SHAPE = re.compile(r"run[- ]time|not a constant|computed at run|constant input|must be (a )?constant", re.I)


def refusal_cause(message: str) -> str:
    """A refusal message with its case-specific details (numbers, shapes, tensor names) taken out."""
    text = message.split("\n")[0].split(". An op of your own")[0]
    text = re.sub(r" \(input shapes .*$", "", text)
    text = re.sub(r"operators \d+(, \d+)*", "operator N", text)
    text = re.sub(r"'(?![A-Z0-9_]+')[^']*'", "'…'", text)    # op names ('BROADCAST_ARGS') stay
    text = re.sub(r"\[[^\]]*\]", "[…]", text)
    text = re.sub(r"\(\s*[-\d, ]*\)", "(…)", text)
    text = re.sub(r"(?<![A-Za-z_\d])-?\d+(\.\d+)?(e-?\d+)?", "N", text)    # float32, PADV2 keep theirs
    return text[:220]


def is_runtime_shape(message: str) -> bool:
    """Whether a refusal names a shape/begin/axis/perm... input computed at run time."""
    return bool(_RUNTIME_SHAPE.search(message or ""))


#: Parameters whose False makes TF's builder feed an attribute (axis, shape, paddings...) as a placeholder.
_CONST_KEYS = ("const_axis", "constant_shape", "constant_paddings", "constant_indices", "constant_perm",
               "constant_axis", "constant_block_shape", "constant_crops")


def runtime_kind(case_or_params) -> str:
    """``"attribute"`` where the case feeds a shape/axis/begin/paddings/perm/k input at run time (TF's
    placeholder), ``"dynamic"`` where an input has a dimension unknown until run time, else ``""``."""
    p = case_or_params.params if isinstance(case_or_params, Case) else case_or_params
    if any(p.get(k) is False for k in _CONST_KEYS) or p.get("type") == "placeholder" \
            or p.get("input_k") is not None or "shape_value" in p or "new_shape" in p:
        return "attribute"
    if "dynamic_size_value" in p or any(None in s for s in (p.get("shapes") or ()) if isinstance(s, (list, tuple))):
        return "dynamic"
    return ""

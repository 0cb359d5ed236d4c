"""The fully-quantized op tests (``quant_grids``): build, convert as TF's op tests do, run, compare in steps.

A case is one point of a family's quantized grid in one of TF's two I/O forms (:data:`quant_grids.IO_TYPES`):
float32 inputs and outputs around the int8 graph (TF's default), or uint8 ones (TF's ``make_edgetpu_tests``). It is
converted by the stock converter with TF's ``mlir_convert`` settings (``optimizations=[DEFAULT]``,
``supported_ops=[TFLITE_BUILTINS_INT8]``, 100 representative draws uniform in the case's ``input_range``, default
``(-1, 1)``; ``inference_input_type``/``inference_output_type`` uint8 for the uint8 form), run on tflfuse with
``cpu_fallback=False`` and on LiteRT's CPU interpreter (builtin kernels, no delegate), and judged per output
element in quantization steps of the output:

* ``bit_exact``: every output equal to LiteRT's, bit for bit;
* ``one_step``: some differ, none by more than one step (the scale of the int8 tensor that the final DEQUANTIZE
  reads, for float32 outputs; 1 for uint8 outputs);
* ``wrong``: some element is more than one step away (or a shape or dtype differs);
* ``refused``: tflfuse's strict interpreter refuses the file (its error is kept);
* ``tf_invalid`` / ``converter_failed`` / ``litert_failed`` / ``out_of_scope`` / ``harness_error``: as in
  :mod:`harness` (out of scope: a data dtype other than float32, such as pad.py's bool sets).

Inputs: the float32 form takes the builder's inputs (TF's ``build_inputs`` draws); the uint8 form takes uint8
values uniform in [0, 255] (TF's ``generate_inputs_outputs`` for edge TPU files). Converted files are cached in
``harness.CACHE_DIR`` like the float ones.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time

import numpy as np

from . import harness, quant_grids
from .builders import Graph, Input

STATUSES = ("bit_exact", "one_step", "wrong", "refused", "tf_invalid", "converter_failed", "litert_failed",
            "out_of_scope", "harness_error")

#: A float32 difference counts as one step when it is at most this much over the output's scale: DEQUANTIZE's
#: (q - zero_point) * scale rounds once in float32, on both sides, so two outputs one step apart differ by the
#: scale within float32's rounding of the values themselves.
_STEP_SLACK = 1e-4


class QuantCase:
    """One point of a quantized family's grid, in one I/O form (``io``: ``"float32"`` or ``"uint8"``)."""

    def __init__(self, family: str, index: int, params: dict, io: str):
        self.family, self.index, self.params, self.io = family, index, params, io
        self.spec = quant_grids.QUANT_FAMILIES[family]
        text = json.dumps(["int8", family, harness._canon(params), io], sort_keys=True)
        self.key = hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"{self.family}/{self.index}/{self.io}"

    def in_scope(self) -> bool:
        from .builders import DATA_DTYPE_KEYS
        return all(self.params[k] == "float32" for k in DATA_DTYPE_KEYS if k in self.params)

    def seed(self) -> int:
        return int(self.key, 16) % (2 ** 32)


def expand(family: str) -> list[QuantCase]:
    """The cases of one family: TF's order within its grid, each point in both I/O forms."""
    cases, index = [], 0
    for grid in quant_grids.QUANT_FAMILIES[family]["sets"]:
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            params = dict(zip(keys, values))
            cases += [QuantCase(family, index, params, io) for io in quant_grids.IO_TYPES]
            index += 1
    return cases


def all_cases(families=None) -> list[QuantCase]:
    return [c for f in (families or quant_grids.QUANT_FAMILIES) for c in expand(f)]


def find(name: str) -> QuantCase:
    """The case named ``family/index/io``."""
    family, index, io = name.split("/")
    return next(c for c in expand(family) if c.index == int(index) and c.io == io)


# ---- conversion -------------------------------------------------------------------------------------------------
def convert(case: QuantCase, graph: Graph, cache: bool = True) -> tuple[bytes | None, str | None, str | None]:
    """``(tflite bytes, None, None)`` or ``(None, status, error)``: the case converted as TF's ``mlir_convert``
    converts a ``fully_quantize`` case (see the module's docstring)."""
    import tensorflow as tf
    path = harness.CACHE_DIR / f"q{case.key}-{harness._version_key()}"
    if cache and path.with_suffix(".tflite").exists():
        return path.with_suffix(".tflite").read_bytes(), None, None
    if cache and path.with_suffix(".json").exists():
        failure = json.loads(path.with_suffix(".json").read_text())
        return None, failure["status"], failure["error"]
    lo, hi = case.params.get("input_range", (-1, 1))
    rng = np.random.default_rng(case.seed() ^ 0x5EED)

    def representative():
        for _ in range(100):
            yield [rng.uniform(lo, hi, [1 if d is None else d for d in i.shape]).astype(i.dtype)
                   if i.dtype.startswith("float") else i.value for i in graph.inputs]

    status = "tf_invalid"
    try:
        sig = [tf.TensorSpec(i.shape, tf.as_dtype(i.dtype), name=f"a{n}") for n, i in enumerate(graph.inputs)]
        fn = tf.function(graph.body, input_signature=sig, autograph=False)
        concrete = fn.get_concrete_function()
        status = "converter_failed"
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if case.io == "uint8":
            converter.inference_input_type = converter.inference_output_type = tf.uint8
        model = converter.convert()
    except Exception as e:   # noqa: BLE001  (each failure of TF or the converter is a result here)
        error = harness._first_line(e)
        if isinstance(e, harness._HARNESS_BUGS):
            return None, "harness_error", error
        if cache:
            harness.CACHE_DIR.mkdir(exist_ok=True)
            path.with_suffix(".json").write_text(json.dumps({"status": status, "error": error}))
        return None, status, error
    if cache:
        harness.CACHE_DIR.mkdir(exist_ok=True)
        path.with_suffix(".tflite").write_bytes(model)
    return model, None, None


# ---- running and judging ----------------------------------------------------------------------------------------
def fed_graph(case: QuantCase, graph: Graph, model: bytes) -> Graph:
    """The graph with the inputs the case feeds: the builder's float32 draws, or for the uint8 form uint8 ones
    from [0, 255] to every input the converter made uint8 (a file without a quantized op keeps float32 inputs)."""
    if case.io == "float32":
        return graph
    import re
    from ai_edge_litert.interpreter import Interpreter
    kinds = {}
    for d in Interpreter(model_content=model).get_input_details():
        m = re.search(r"a(\d+)(?::\d+)?$", d["name"])
        kinds[int(m.group(1)) if m else len(kinds)] = np.dtype(d["dtype"])
    rng = np.random.default_rng(case.seed() ^ 0xED6E)
    inputs = [Input(i.shape, "uint8", rng.integers(0, 256, size=i.value.shape).astype(np.uint8))
              if kinds.get(n) == np.uint8 else i for n, i in enumerate(graph.inputs)]
    return Graph(inputs, graph.body)


def output_steps(model: bytes) -> list[float | None]:
    """Per model output, one quantization step in its own units: 1 for an integer output, the scale of the int8
    tensor the final DEQUANTIZE reads for a float32 one (None where no DEQUANTIZE makes it)."""
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_content=model)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    producer = {o: op for op in interp._get_ops_details() for o in op["outputs"]}
    steps = []
    for d in interp.get_output_details():
        if np.dtype(d["dtype"]).kind in "iu":
            steps.append(1.0)
            continue
        op = producer.get(d["index"])
        if op is None or op["op_name"] != "DEQUANTIZE":
            steps.append(None)
            continue
        scales = tensors[op["inputs"][0]]["quantization_parameters"]["scales"]
        steps.append(float(scales[0]) if len(scales) == 1 else None)
    return steps


def compare_steps(ours: list[np.ndarray], ref: list[np.ndarray], steps: list[float | None]) -> tuple[str, float, str]:
    """``(verdict, max difference in steps, first mismatch)``; verdict ``bit_exact``, ``one_step`` or ``wrong``."""
    if len(ours) != len(ref):
        return "wrong", float("inf"), f"{len(ours)} outputs, LiteRT has {len(ref)}"
    worst, first = 0.0, ""
    for i, (a, b, step) in enumerate(zip(ours, ref, steps)):
        if a.shape != b.shape:
            return "wrong", float("inf"), f"output {i}: shape {list(a.shape)}, LiteRT {list(b.shape)}"
        if a.dtype != b.dtype:
            return "wrong", float("inf"), f"output {i}: dtype {a.dtype}, LiteRT {b.dtype}"
        if a.size == 0 or np.array_equal(a, b):
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        units = diff / step if step else np.where(diff > 0, np.inf, 0.0)
        if a.dtype.kind == "f" and step:
            units = np.where(units <= 1 + _STEP_SLACK, np.minimum(units, 1.0), units)
        j = tuple(int(v) for v in np.unravel_index(int(np.argmax(units)), a.shape))
        if float(units[j]) > worst:
            worst = float(units[j])
            first = (f"output {i} at {list(j)}: {a[j]!r}, LiteRT {b[j]!r} ({int((units > 0).sum())} of {a.size} "
                     f"differ; step {step:.6g})" if step else f"output {i} at {list(j)}: {a[j]!r}, LiteRT {b[j]!r}")
    verdict = "bit_exact" if worst == 0 else "one_step" if worst <= 1.0 else "wrong"
    return verdict, worst, first


def run_case(case: QuantCase, device, cache: bool = True) -> dict:
    """Builds, converts and runs one quantized case; its result record (JSON-serialisable)."""
    from . import builders
    import tflfuse
    start = time.perf_counter()
    rec = {"case": case.name, "family": case.family, "io": case.io, "params": harness._canon(case.params),
           "status": None}
    if not case.in_scope():
        rec["status"] = "out_of_scope"
        return rec
    try:
        graph = builders.build(case.spec, case.params, np.random.default_rng(case.seed()))
    except Exception as e:   # noqa: BLE001
        rec.update(status="harness_error" if isinstance(e, harness._HARNESS_BUGS) else "tf_invalid",
                   error=harness._first_line(e))
        return rec
    model, status, error = convert(case, graph, cache)
    if model is None:
        rec.update(status=status, error=error)
        return rec
    try:
        fed = fed_graph(case, graph, model)
        rec["ops"] = sorted(set(harness.litert_ops(model)))
        ref = harness.run_litert(model, fed)
        steps = output_steps(model)
    except Exception as e:   # noqa: BLE001
        rec.update(status="litert_failed", error=harness._first_line(e))
        return rec
    try:
        interp = tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False)
        ours = harness.run_interpreter(interp, fed)
    except Exception as e:   # noqa: BLE001  (a refusal: kept, grouped in the report)
        rec.update(status="refused", error=harness._first_line(e))
        return rec
    verdict, worst, msg = compare_steps(ours, ref, steps)
    rec.update(status=verdict, max_steps=worst)
    if msg:
        rec["mismatch"] = msg
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec

"""The report of ``python benchmarks/op_tests.py --quantized``: TFLite's fully-quantized op tests on tflfuse
(``tests/optests/quant_grids.py``, run by ``tests/optests/harness_int8.py``), written to
``benchmarks/OP_TESTS_INT8.md``."""

from __future__ import annotations

import collections
import datetime
import json
import platform
import re
import sys

from optests import harness, harness_int8, quant_grids

_COLUMNS = harness_int8.STATUSES + ("crashed",)

#: (pattern over a wrong or one-step case's family and ops, why): none is known today; a family listed without
#: an entry is unexplained.
ONE_STEP_WHY: list[tuple[str, str]] = []

#: (pattern over a refusal's cause, why refusing it is correct, or which kernel is missing): none is refused today.
REFUSAL_WHY: list[tuple[str, str]] = []

#: (pattern over a crashed case's family and parameters, why), measured where the case ends past the time limit:
#: none is known today (DEPTHWISE_CONV_2D over 3000 channels compiled for minutes while its per-channel
#: multipliers were private arrays of literals; they are uniforms now, see ``tflfuse.kernels.quant.ops.Tables``).
CRASH_WHY: list[tuple[str, str]] = []


def _why(text: str, table) -> str:
    return next((why for pattern, why in table if re.search(pattern, text)), "")


def _params(rec: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in rec["params"].items())


def report(records: list[dict], device: str, out_of_range: str = "") -> str:
    """The Markdown report of ``records`` (``harness_int8.run_case``'s, in the grid's order)."""
    import tensorflow as tf
    from importlib.metadata import version
    total = collections.Counter(r["status"] for r in records)
    ran = sum(total[s] for s in ("bit_exact", "one_step", "wrong", "refused"))
    lines = [
        "# TFLite's fully-quantized op tests on tflfuse",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {device}; TensorFlow "
        f"{tf.__version__}, ai-edge-litert {version('ai-edge-litert')}, Python {platform.python_version()}. Made by "
        f"`python benchmarks/op_tests.py{''.join(' ' + a for a in sys.argv[1:])}` from the grids of "
        "`tests/optests/quant_grids.py`: the sets of TF's `tensorflow/lite/testing/op_tests/*.py` with "
        "`fully_quantize=True` (and `quant_16x8=False`), each converted as TF's `mlir_convert` converts them "
        "(`optimizations=[DEFAULT]`, `supported_ops=[TFLITE_BUILTINS_INT8]`, 100 representative draws uniform in the "
        "case's `input_range`, default (-1, 1)) in TF's two forms: float32 inputs and outputs around the int8 graph "
        "(`/float32`, TF's default) and uint8 ones (`/uint8`, TF's `make_edgetpu_tests`: "
        "`inference_input_type = inference_output_type = uint8`, inputs uniform in [0, 255]).",
        "",
        "Every case runs on tflfuse with `cpu_fallback=False` (every op on its WebGPU kernel) and on LiteRT's CPU "
        "interpreter (builtin kernels, no delegate). *bit_exact*: every output element equal. *one_step*: some "
        "differ, none by more than one quantization step of the output (the scale the final DEQUANTIZE reads; 1 "
        "for uint8 outputs). *wrong*: more than one step (or a shape/dtype differs). *refused*: the strict "
        "interpreter refuses an op. *out_of_scope*: a bool set of TF's grid.",
        "",
        f"**{len(records)} cases: {ran} run on tflfuse: {total['bit_exact']} bit-exact, {total['one_step']} within "
        f"one step, {total['wrong']} wrong, {total['refused']} refused; {total['tf_invalid']} tf_invalid, "
        f"{total['converter_failed']} converter_failed, {total['litert_failed']} litert_failed, "
        f"{total['crashed']} crashed, {total['out_of_scope']} out_of_scope, {total['harness_error']} "
        f"harness_error.**",
        "",
        "## Per op family",
        "",
        "| family | TF file | cases | " + " | ".join(_COLUMNS) + " | max steps |",
        "|---|---|---|" + "---|" * (len(_COLUMNS) + 1),
    ]
    by_family = collections.defaultdict(list)
    for r in records:
        by_family[r["family"]].append(r)
    for family, spec in quant_grids.QUANT_FAMILIES.items():
        rs = by_family.get(family)
        if not rs:
            continue
        c = collections.Counter(r["status"] for r in rs)
        worst = max((r.get("max_steps", 0.0) for r in rs), default=0.0)
        lines.append(f"| {family} | {spec['source']} | {len(rs)} | " + " | ".join(str(c[k]) for k in _COLUMNS)
                     + f" | {worst:.3g} |")
    for title, status in (("Wrong results (more than one step)", "wrong"), ("Within one step", "one_step")):
        rs = [r for r in records if r["status"] == status]
        lines += ["", f"## {title}", ""]
        if not rs:
            lines.append("None.")
            continue
        lines += ["| case | ops | parameters | max steps | first mismatch |", "|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {' '.join(r.get('ops', []))} | {_params(r)} | {r.get('max_steps', 0):.3g} | "
                  f"{r.get('mismatch', '')} |" for r in rs[:60]]
        if len(rs) > 60:
            lines.append(f"\n({len(rs) - 60} more in `--results`.)")
        fams = collections.Counter(r["family"] for r in rs)
        lines += ["", "Why:", ""]
        for family, n in fams.most_common():
            ops = " ".join(sorted({o for r in rs if r["family"] == family for o in r.get("ops", [])}))
            why = _why(f"{family}: {ops}", ONE_STEP_WHY)
            lines.append(f"- {family} ({n} cases; ops {ops}): {why or '**unexplained**'}")
    lines += ["", "## Refusals by cause", "", "| cause | cases | families | why |", "|---|---|---|---|"]
    causes = collections.defaultdict(list)
    for r in records:
        if r["status"] == "refused":
            causes[harness.refusal_cause(r.get("error", ""))].append(r)
    for cause, rs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        fams = collections.Counter(r["family"] for r in rs)
        lines.append(f"| {cause.replace('|', '/')} | {len(rs)} | "
                     f"{', '.join(f'{f} {n}' for f, n in fams.most_common())} | "
                     f"{_why(cause, REFUSAL_WHY) or '**unexplained**'} |")
    if not causes:
        lines.append("| none | 0 | | |")
    lines += ["", "## Converter, LiteRT and TF failures by cause", "", "| status | cause | cases | families |",
              "|---|---|---|---|"]
    for status in ("harness_error", "converter_failed", "litert_failed", "crashed", "tf_invalid"):
        causes = collections.defaultdict(list)
        for r in records:
            if r["status"] == status:
                causes[harness.refusal_cause(r.get("error", ""))].append(r)
        for cause, rs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            fams = collections.Counter(r["family"] for r in rs)
            lines.append(f"| {status} | {cause.replace('|', '/')} | {len(rs)} | "
                         f"{', '.join(f'{f} {n}' for f, n in fams.most_common(6))} |")
    crashed = [r for r in records if r["status"] == "crashed"]
    if crashed:
        lines += ["", "Crashed cases:", ""]
        for r in crashed:
            why = _why(f"{r['family']}: {_params(r)}", CRASH_WHY)
            lines.append(f"- {r['case']} ({_params(r)}): {why or '**unexplained**'}")
    notes = [f"- `{f}`: {s['note']}" for f, s in quant_grids.QUANT_FAMILIES.items() if s.get("note")]
    if notes:
        lines += ["", "## Where the grids depart from TF's files", ""] + notes
    return "\n".join(lines) + "\n"

"""TFLite's generated op tests on tflfuse: every float32 case of the grids in ``tests/optests/grids.py``, converted
by the stock converter, run on tflfuse (strict, then with the CPU fallback where strict refuses) and compared with
LiteRT's CPU interpreter; the counts, refusal causes and wrong cases go to ``benchmarks/OP_TESTS.md``.

    python benchmarks/op_tests.py              # all families: 7 minutes on 2 cores, 1 minute with .optests/ filled
    python benchmarks/op_tests.py --ops=conv,mean --limit_per_op=20 --out=/tmp/OP_TESTS.md
    python benchmarks/op_tests.py --quantized   # the fully-quantized sets (int8, uint8 I/O): OP_TESTS_INT8.md

The cases run in a child process that appends one JSON line per case to ``--results``: should LiteRT or the
adapter crash on a case, the case is recorded as ``crashed`` and a new child goes on after it. Converted files are
cached in ``.optests/`` (git-ignored), so a rerun converts nothing it converted before (``--nocache`` reconverts).
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import tflfuse  # noqa: E402,I001  (before TensorFlow: see tflfuse/_tfload.py)
from absl import app, flags  # noqa: E402

from optests import grids, harness, harness_int8, quant_grids  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("ops", [], "families of tests/optests/grids.py to run (default: all)")
flags.DEFINE_integer("limit_per_op", 0, "run at most this many cases of each family (0: all)")
flags.DEFINE_bool("cache", True, "reuse converted files from .optests/")
flags.DEFINE_string("out", str(ROOT / "benchmarks" / "OP_TESTS.md"), "the report (Markdown)")
flags.DEFINE_string("results", str(harness.CACHE_DIR / "results.jsonl"), "one JSON line per case")
flags.DEFINE_list("dtypes", list(grids.DTYPES), "data dtypes to run (others count as out_of_scope); int64 too "
                  "measures the int64 narrowing")
flags.DEFINE_bool("quantized", False, "run the fully-quantized sets of tests/optests/quant_grids.py instead "
                  "(report: benchmarks/OP_TESTS_INT8.md unless --out is given)")
flags.DEFINE_integer("case_timeout", 120, "seconds a case may run before its worker is ended and the case is "
                     "recorded as crashed (timed out)")
flags.DEFINE_string("worker", None, "internal: run the cases named in this file, appending to --results")


def _selected() -> list[harness.Case]:
    known = quant_grids.QUANT_FAMILIES if FLAGS.quantized else grids.FAMILIES
    families = FLAGS.ops or list(known)
    unknown = sorted(set(families) - set(known))
    if unknown:
        raise app.UsageError(f"unknown --ops {unknown}; the families are {sorted(known)}")
    cases = []
    for f in families:
        fc = harness_int8.expand(f) if FLAGS.quantized else harness.expand(f)
        cases += fc[:FLAGS.limit_per_op] if FLAGS.limit_per_op > 0 else fc
    return cases


def _read(path: Path) -> dict[str, dict]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["case"]] = rec
    return done


def _worker(names_file: str) -> None:
    from absl import logging
    from tqdm import tqdm
    logging.set_verbosity(logging.WARNING)   # the converter logs a line per conversion
    names = Path(names_file).read_text().split()
    families = {n.split("/")[0] for n in names}
    by_name = {c.name: c for c in (harness_int8 if FLAGS.quantized else harness).all_cases(families)}
    device = tflfuse.Device()
    results = Path(FLAGS.results)
    with results.open("a") as out, tqdm(names, desc="op tests", unit="case", mininterval=5) as bar:
        for name in bar:
            bar.set_postfix_str(name, refresh=False)
            if FLAGS.quantized:
                rec = harness_int8.run_case(by_name[name], device, cache=FLAGS.cache)
            else:
                rec = harness.run_case(by_name[name], device, cache=FLAGS.cache, dtypes=tuple(FLAGS.dtypes))
            out.write(json.dumps(rec) + "\n")
            out.flush()


def _supervise(cmd: list[str], results: Path) -> tuple[int, bool]:
    """Runs one worker; ends it when no case finishes within --case_timeout seconds. ``(status, timed out)``."""
    import time
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    size, since = results.stat().st_size, time.monotonic()
    while child.poll() is None:
        time.sleep(2)
        if results.stat().st_size != size:
            size, since = results.stat().st_size, time.monotonic()
        elif time.monotonic() - since > FLAGS.case_timeout:
            child.kill()
            child.wait()
            return child.returncode, True
    return child.returncode, False


def _run_all(cases: list[harness.Case]) -> dict[str, dict]:
    """Runs ``cases`` in child processes (restarted after a crash); their records by case name."""
    results = Path(FLAGS.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("")
    names_file = results.with_suffix(".todo")
    pending = [c.name for c in cases]
    while pending:
        names_file.write_text("\n".join(pending))
        cmd = [sys.executable, __file__, f"--worker={names_file}", f"--results={results}",
               f"--cache={FLAGS.cache}", f"--dtypes={','.join(FLAGS.dtypes)}", f"--quantized={FLAGS.quantized}"]
        rc, timed_out = _supervise(cmd, results)
        done = _read(results)
        pending = [n for n in pending if n not in done]
        if pending and rc != 0:
            crashed = pending.pop(0)   # the case the child was running when it ended
            family = crashed.split("/")[0]
            case = next(c for c in cases if c.name == crashed)
            with results.open("a") as out:
                out.write(json.dumps({"case": crashed, "family": family, "params": harness._canon(case.params),
                                      "status": "crashed", "error": f"no result within {FLAGS.case_timeout} s: "
                                      "the process was ended" if timed_out else
                                      f"the process ended with status {rc}"}) + "\n")
        elif pending:
            raise RuntimeError(f"the worker ended without running {len(pending)} cases")
    names_file.unlink(missing_ok=True)
    return _read(results)


# ---- the report ------------------------------------------------------------------------------------------------
#: (pattern over a refusal's cause, why refusing it is correct). A refusal whose cause matches none is listed as
#: unexplained: a kernel or a justification is then missing.
JUSTIFIED = [
    (r"RESHAPE.*(cannot fill the|cannot reshape N elements to)",
     "a RESHAPE of 0 elements to a shape with a 0 and a -1 (reshape.py's `[2, 0, -1]` of a `[1, 4, 0]` input) "
     "leaves the -1 undefined: any size fits. TF refuses the case (its eager Reshape cannot infer the missing size "
     "of an empty tensor); LiteRT divides 0 by 0 elements and makes up a size (`[2, 0, 2]`). tflfuse refuses it "
     "with an error naming the op and the value."),
]
#: (pattern over LiteRT's error, why neither LiteRT nor TF judges tflfuse there) for litert_failed cases that TF
#: cannot run either: inputs that no runtime accepts, so no reference exists.
NO_REFERENCE = [
    (r"SPACE_TO_BATCH_ND", "the padded dimension is not a multiple of the block (TF's own kernel refuses it too)"),
    (r"Invalid begin and size", "a run-time begin + size past the input's end (TF's Slice refuses it too)"),
    (r"POW does not support negative",
     "a negative int32 exponent (TF refuses it too: integers to negative integer powers are not allowed)"),
    (r"arg_min_max.*NumDimensions", "ARG_MAX/ARG_MIN of a scalar, which has no axis to reduce (TF refuses it too)"),
]


def _why(cause: str, table) -> str:
    import re
    return next((why for pattern, why in table if re.search(pattern, cause)), "")

_COLUMNS = ("pass", "wrong", "refused", "tf_invalid", "converter_failed", "litert_failed", "crashed", "out_of_scope",
            "harness_error")


def _params(rec: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in rec["params"].items())


def report(records: list[dict], device: str) -> str:
    import tensorflow as tf
    from importlib.metadata import version
    by_family = collections.defaultdict(list)
    for r in records:
        by_family[r["family"]].append(r)
    total = collections.Counter(r["status"] for r in records)
    ran = sum(total[s] for s in ("pass", "wrong", "refused"))
    fb = collections.Counter(r.get("fallback") for r in records if r["status"] == "refused")
    lines = [
        "# TFLite's generated op tests on tflfuse",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {device}; TensorFlow "
        f"{tf.__version__} (stock converter, float32, default options), ai-edge-litert {version('ai-edge-litert')}, "
        f"Python {platform.python_version()}. Made by `python benchmarks/op_tests.py"
        f"{''.join(' ' + a for a in sys.argv[1:])}` from the grids of "
        "`tests/optests/grids.py` (TF's `tensorflow/lite/testing/op_tests/*.py` parameter sets, float32 with int32 "
        "and bool where an op has them); every case is compared with LiteRT's CPU interpreter (builtin kernels, no "
        "delegate) on seeded inputs drawn as TF's `create_tensor_data` draws them.",
        "",
        "*strict* is `Interpreter(..., cpu_fallback=False)`: every op on its WebGPU kernel, refusals counted. A case "
        "strict refuses runs again with the default fallback (ops without a GPU kernel on LiteRT's CPU interpreter); "
        "*fallback* gives that outcome. *tf_invalid*: TF cannot build the case (TF's own `expected_tf_failures`); "
        f"*out_of_scope*: a data dtype other than {', '.join(FLAGS.dtypes)}.",
        "",
        f"**{len(records)} cases: {ran} run on tflfuse: {total['pass']} pass, {total['wrong']} wrong, "
        f"{total['refused']} refused by strict ({fb['pass']} of those pass with the fallback, {fb['wrong']} wrong, "
        f"{fb['refused']} refused); {total['tf_invalid']} tf_invalid, {total['converter_failed']} converter_failed, "
        f"{total['litert_failed']} litert_failed, {total['crashed']} crashed, {total['out_of_scope']} out_of_scope, "
        f"{total['harness_error']} harness_error.**",
        "",
        "The fully-quantized sets of the same files (int8 inside, float32 or uint8 at the ends), judged bit for bit "
        "against LiteRT: [OP_TESTS_INT8.md](OP_TESTS_INT8.md) (`python benchmarks/op_tests.py --quantized`).",
        "",
    ]
    if ran:
        lines += [f"Of the cases tflfuse ran, strict passes {100 * total['pass'] / ran:.2f}% and refuses "
                  f"{100 * total['refused'] / ran:.2f}%; with the fallback "
                  f"{100 * (total['pass'] + fb['pass']) / ran:.2f}% pass.", ""]
    lines += ["## Wrong results", ""]
    wrong = [r for r in records if r["status"] == "wrong" or r.get("fallback") == "wrong"]
    if not wrong:
        lines += ["None.", ""]
    else:
        lines += ["| case | mode | ops | parameters | max error | tolerance | first mismatch |",
                  "|---|---|---|---|---|---|---|"]
        for r in wrong:
            mode = "strict" if r["status"] == "wrong" else "fallback"
            lines.append(f"| {r['case']} | {mode} | {' '.join(r.get('ops', []))} | {_params(r)} | "
                         f"{r.get('max_err', float('nan')):.3g} | {r.get('tol')} | {r.get('mismatch', '')} |")
        lines.append("")
    lines += ["## Refusals by cause (strict)", "",
              "Causes with the case's numbers taken out. *run-time input*: of the cases, how many feed an attribute "
              "(shape/axis/begin/paddings/perm/k) as a graph input (TF's placeholder) or have a dimension unknown "
              "until run time, which the plan's run-time shape specialisation accepts.", "",
              "| cause | cases | run-time input (attribute / dynamic dim) | fallback pass / refused | families |",
              "|---|---|---|---|---|"]
    causes = collections.defaultdict(list)
    for r in records:
        if r["status"] == "refused":
            causes[harness.refusal_cause(r.get("error", ""))].append(r)
    for cause, rs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        fams = collections.Counter(r["family"] for r in rs)
        fbc = collections.Counter(r.get("fallback") for r in rs)
        kinds = collections.Counter(harness.runtime_kind(r["params"]) for r in rs)
        lines.append(f"| {cause.replace('|', '/')} | {len(rs)} | {kinds['attribute']} / {kinds['dynamic']} | "
                     f"{fbc['pass']} / {fbc['refused']} | "
                     f"{', '.join(f'{f} {n}' for f, n in fams.most_common())} |")
    lines += ["", "## Refusals left with the fallback", "", "| cause | cases | families |", "|---|---|---|"]
    causes = collections.defaultdict(list)
    for r in records:
        if r.get("fallback") == "refused":
            causes[harness.refusal_cause(r.get("fallback_error", ""))].append(r)
    for cause, rs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        fams = collections.Counter(r["family"] for r in rs)
        lines.append(f"| {cause.replace('|', '/')} | {len(rs)} | "
                     f"{', '.join(f'{f} {n}' for f, n in fams.most_common())} |")
    left = collections.Counter(harness.refusal_cause(r.get("fallback_error") or r.get("error", ""))
                               for r in records if r["status"] == "refused")
    lines += ["", "## Why the refusals left are correct", ""]
    if not left:
        lines.append("No case is refused.")
    for cause, n in left.most_common():
        why = _why(cause, JUSTIFIED)
        lines.append(f"- {cause.replace('|', '/')} ({n} cases): {why or '**unexplained**: a kernel is missing'}")
    lf = [r for r in records if r["status"] == "litert_failed"]
    no_ref = collections.Counter(harness.refusal_cause(r.get("error", "")) for r in lf if "vs_tf" not in r)
    if no_ref:
        lines += ["", "Cases that neither LiteRT nor TF runs (so nothing judges tflfuse there; counted as "
                  "litert_failed):", ""]
        for cause, n in no_ref.most_common():
            lines.append(f"- {cause.replace('|', '/')} ({n} cases): "
                         f"{_why(cause, NO_REFERENCE) or '**unexplained**'}")
    if lf:
        lines += ["", "## Where LiteRT fails: tflfuse against TF's own result", "",
                  "LiteRT's CPU interpreter fails on these converted files; TF's eager result of the same function "
                  "stands in as the reference (same tolerance).", "",
                  "| LiteRT's error | cases | tflfuse strict vs TF: pass / wrong / refused | families |",
                  "|---|---|---|---|"]
        causes = collections.defaultdict(list)
        for r in lf:
            causes[harness.refusal_cause(r.get("error", ""))].append(r)
        for cause, rs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            v = collections.Counter(r.get("vs_tf") for r in rs)
            fams = collections.Counter(r["family"] for r in rs)
            lines.append(f"| {cause.replace('|', '/')} | {len(rs)} | {v['pass']} / {v['wrong']} / {v['refused']} | "
                         f"{', '.join(f'{f} {n}' for f, n in fams.most_common())} |")
        bad = [r for r in lf if r.get("vs_tf") == "wrong"]
        for r in bad:
            lines.append(f"\n- {r['case']} ({_params(r)}): tflfuse differs from TF: {r.get('mismatch')}")
    lines += ["", "## Per op family", "",
              "| family | TF file | cases | " + " | ".join(_COLUMNS) + " | fallback pass | fallback refused |",
              "|---|---|---|" + "---|" * (len(_COLUMNS) + 2)]
    for family in grids.FAMILIES:
        rs = by_family.get(family)
        if not rs:
            continue
        c = collections.Counter(r["status"] for r in rs)
        f = collections.Counter(r.get("fallback") for r in rs if r["status"] == "refused")
        lines.append(f"| {family} | {grids.FAMILIES[family]['source']} | {len(rs)} | "
                     + " | ".join(str(c[k]) for k in _COLUMNS) + f" | {f['pass']} | {f['refused']} |")
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
    notes = [f"- `{f}`: {s['note']}" for f, s in grids.FAMILIES.items() if s.get("note")]
    if notes:
        lines += ["", "## Where the grids depart from TF's files", ""] + notes
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if FLAGS.worker:
        _worker(FLAGS.worker)
        return
    if FLAGS.quantized and not FLAGS["results"].present:
        FLAGS.results = str(harness.CACHE_DIR / "results_int8.jsonl")
    cases = _selected()
    records = _run_all(cases)
    order = {c.name: i for i, c in enumerate(cases)}
    ordered = sorted(records.values(), key=lambda r: order.get(r["case"], len(order)))
    device = tflfuse.Device().describe()
    if FLAGS.quantized:
        import op_tests_int8
        out = FLAGS.out if FLAGS["out"].present else str(ROOT / "benchmarks" / "OP_TESTS_INT8.md")
        Path(out).write_text(op_tests_int8.report(ordered, device))
    else:
        out = FLAGS.out
        Path(out).write_text(report(ordered, device))
    total = collections.Counter(r["status"] for r in ordered)
    print(f"{len(ordered)} cases: " + ", ".join(f"{k} {v}" for k, v in total.most_common()) + f"; wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    app.run(main)

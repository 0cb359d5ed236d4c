"""Reports of ``tflfuse check``: JSON, JUnit XML, Markdown and the console text, from :class:`ModelReport`s.

* JSON (``report.json``): ``{"format": "tflfuse-check/1", "ok", "exit_status", "totals", "models": [...]}``,
  each model with its checks (name, status, message, numbers), composites, op counts, parity rows and
  per-op rows.
* JUnit XML (``junit.xml``): the Jenkins/Ant form CI test tabs read: ``<testsuites>``, one ``<testsuite>``
  per model, one ``<testcase>`` per check with ``<failure>``, ``<error>`` or ``<skipped>``.
* Markdown (``summary.md``): a verdict, the checks, a table per composite and the per-op error table, for a
  CI job summary (GitHub's ``$GITHUB_STEP_SUMMARY``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

from .check import ERROR, FAILED, NO_NUMERICS, PASSED, SKIPPED, ModelReport

__all__ = ["exit_status", "text_lines", "to_json", "to_junit", "to_markdown", "verdict_lines", "write_reports"]

_MARK = {PASSED: "PASS", FAILED: "FAIL", SKIPPED: "SKIP", ERROR: "ERROR"}
_ICON = {PASSED: "✅", FAILED: "❌", SKIPPED: "⏭️", ERROR: "⚠️"}


def exit_status(reports: Sequence[ModelReport]) -> int:
    """2 when a model's source or inputs could not be used; else 1 when a check failed or errored; else 0."""
    if any(r.input_error for r in reports):
        return 2
    return 0 if all(r.ok for r in reports) else 1


def _totals(reports: Sequence[ModelReport]) -> dict:
    return {s: sum(r.count(s) for r in reports) for s in (PASSED, FAILED, SKIPPED, ERROR)} | {
        "checks": sum(len(r.checks) for r in reports), "models": len(reports),
        "models_failed": sum(not r.ok for r in reports)}


def _clean(value):
    """JSON-safe: inf/nan as strings, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(reports: Sequence[ModelReport]) -> dict:
    """The JSON report as a dict (``json.dumps`` it)."""
    models = []
    for r in reports:
        d = dataclasses.asdict(r)
        d["ok"] = r.ok
        models.append(d)
    return _clean({"format": "tflfuse-check/1", "ok": all(r.ok for r in reports),
                   "exit_status": exit_status(reports), "totals": _totals(reports),
                   "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "models": models})


def to_junit(reports: Sequence[ModelReport]) -> str:
    """JUnit XML: ``<testsuites>`` with one ``<testsuite>`` per model and one ``<testcase>`` per check."""
    t = _totals(reports)
    root = ET.Element("testsuites", name="tflfuse check", tests=str(t["checks"]), failures=str(t[FAILED]),
                      errors=str(t[ERROR]), time=f"{sum(r.seconds for r in reports):.3f}")
    stamp = datetime.datetime.now().replace(microsecond=0).isoformat()
    for i, r in enumerate(reports):
        suite = ET.SubElement(root, "testsuite", name=r.name, tests=str(len(r.checks)), failures=str(r.count(FAILED)),
                              errors=str(r.count(ERROR)), skipped=str(r.count(SKIPPED)), time=f"{r.seconds:.3f}",
                              timestamp=stamp, hostname=socket.gethostname() or "localhost", id=str(i),
                              package="tflfuse.check")
        props = ET.SubElement(suite, "properties")
        for k, v in (("source", r.source), ("kind", r.kind), ("adapter", r.adapter), ("atol", r.atol),
                     ("rtol", r.rtol), ("samples", r.samples), ("python", platform.python_version())):
            ET.SubElement(props, "property", name=k, value=str(v))
        for c in r.checks:
            case = ET.SubElement(suite, "testcase", name=c.name, classname=f"tflfuse.check.{_ident(r.name)}",
                                 time=f"{c.seconds:.3f}")
            if c.status == FAILED:
                ET.SubElement(case, "failure", message=c.message[:500], type="CheckFailed").text = _numbers(c)
            elif c.status == ERROR:
                ET.SubElement(case, "error", message=c.message[:500], type="CheckError").text = c.message
            elif c.status == SKIPPED:
                ET.SubElement(case, "skipped", message=c.message[:500])
        ET.SubElement(suite, "system-out").text = "\n".join(text_lines([r]))
        ET.SubElement(suite, "system-err").text = r.input_error
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _numbers(c) -> str:
    lines = [c.message]
    for k, v in c.details.items():
        if k != "outputs":
            lines.append(f"{k}: {v}")
    for out, r in c.details.get("outputs", {}).items():
        lines.append(f"output {out}: max_abs {r['max_abs']:.4g}, max_rel {r['max_rel']:.4g}, "
                     f"violations {r['violations']} of {r['elements']}")
    return "\n".join(lines)


def _g(v) -> str:
    return "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(reports: Sequence[ModelReport]) -> str:
    """The Markdown summary: verdict, a checks table per model, a table per composite, the per-op errors."""
    t = _totals(reports)
    ok = all(r.ok for r in reports)
    out = [f"# tflfuse check: {'passed' if ok else 'FAILED'}", "",
           f"{t['models']} model(s), {t['checks']} checks: {t[PASSED]} passed, {t[FAILED]} failed, "
           f"{t[ERROR]} errors, {t[SKIPPED]} skipped. Exit status {exit_status(reports)}.", ""]
    if len(reports) > 1:
        out += ["| model | result | failed checks |", "| --- | --- | --- |"]
        for r in reports:
            bad = ", ".join(c.name for c in r.checks if c.status in (FAILED, ERROR)) or "-"
            out.append(f"| {_md_escape(r.name)} | {_ICON[PASSED if r.ok else FAILED]} | {_md_escape(bad)} |")
        out.append("")
    for r in reports:
        out += _model_markdown(r)
    out += ["### How the numbers are measured", "",
            "An element agrees when `|got - want| <= atol + rtol * |want|` (NaN equals NaN); *tolerance used* is "
            "the largest `|got - want| / (atol + rtol * |want|)`, so above 1 fails. "
            "**tflfuse vs TensorFlow** runs the fused .tflite on WebGPU against the TensorFlow model itself. "
            "**LiteRT vs TensorFlow** runs the portable .tflite (the fused one when it has no custom op, else the "
            "same Keras model converted without annotations) on LiteRT's CPU interpreter: it separates converter "
            "problems from tflfuse's. The **per-op table** runs that portable file on tflfuse and on LiteRT with "
            "every tensor kept and compares each op's output in the same file, so the first op where they part "
            "is the one to look at. A fused custom op runs on no other runtime, and its tensors do not exist in "
            "the unfused file: its error is bounded only by the end-to-end comparison with TensorFlow.", ""]
    return "\n".join(out)


def _model_markdown(r: ModelReport) -> list[str]:
    out = [f"## {_md_escape(r.name)} {_ICON[PASSED if r.ok else FAILED]}", "",
           f"`{_md_escape(r.source)}` ({r.kind or 'not loaded'}); adapter: {r.adapter or '-'}; atol {r.atol:g}, "
           f"rtol {r.rtol:g}, {r.samples} sample(s); {r.seconds:.1f} s.", "",
           "| check | result | details |", "| --- | --- | --- |"]
    out += [f"| {_md_escape(c.name)} | {_ICON[c.status]} {c.status} | {_md_escape(c.message)} |" for c in r.checks]
    out.append("")
    for comp in r.composites:
        status = next((c.status for c in r.checks if c.name == f"expect {comp['name']}"), None)
        out += [f"### Composite `{comp['name']}`", "",
                "| expected | traced | fused | result |", "| --- | --- | --- | --- |",
                f"| {comp['expected'] or '-'} | {_g(comp['traced'])} | {comp['fused']} | "
                f"{_ICON[status] + ' ' + status if status else '-'} |", ""]
        if comp["instances"]:
            out += ["<details><summary>fused ops in the .tflite</summary>", "",
                    "| op | input | output | attributes |", "| --- | --- | --- | --- |"]
            out += [f"| {i['op']} | {i['input']} | {i['output']} | "
                    f"{_md_escape(', '.join(f'{k}={v}' for k, v in i['attrs'].items() if k != 'tflfuse_schema'))} |"
                    for i in comp["instances"]]
            out += ["", "</details>", ""]
    if r.parity:
        out += ["### Outputs", "", "| comparison | output | max abs error | max rel error | tolerance used | "
                "out of tolerance |", "| --- | --- | --- | --- | --- | --- |"]
        out += [f"| {p['comparison']} | {_md_escape(p['output'])} | {_g(p['max_abs'])} | {_g(p['max_rel'])} | "
                f"{_g(p['tolerance_used'])} | {p['violations']} of {p['elements']} |" for p in r.parity]
        out += ["", "max rel error: the max abs error over the largest reference value (in magnitude) of the "
                "output; tolerance used: the largest error over its tolerance, atol + rtol × reference.", ""]
    if r.per_op:
        bad = sum(not row["ok"] for row in r.per_op)
        out += [f"### Per-op errors: {r.per_op_file}, tflfuse vs LiteRT ({bad} of {len(r.per_op)} out of tolerance)",
                "", "<details><summary>every op</summary>", "",
                "| op | name | output shape | max abs error | max rel error | tolerance used | |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| {row['op_index']} | {row['op']} | {row['shape']} | {_g(row['max_abs'])} | {_g(row['max_rel'])} | "
                f"{_g(row['tolerance_used'])} | {_ICON[PASSED if row['ok'] else FAILED]} |" for row in r.per_op]
        out += ["", "</details>", ""]
    return out


def text_lines(reports: Sequence[ModelReport]) -> list[str]:
    """Console lines: per model, a header and one line per check."""
    lines = []
    for r in reports:
        lines.append(f"== {r.name}: {r.source} ({r.kind or 'not loaded'})" + (f", adapter {r.adapter}" if r.adapter else ""))
        width = max((len(c.name) for c in r.checks), default=0)
        lines += [f"  {_MARK[c.status]:<5} {c.name:<{width}}  {c.message}" for c in r.checks]
    return lines


def verdict_lines(reports: Sequence[ModelReport]) -> list[str]:
    """The last lines of the output: every failing check with its numbers (and a model on which no numeric
    check ran, even where allowed), then the verdict and exit status."""
    lines = [f"{_MARK[c.status]} {r.name}: {c.name}: {c.message}" for r in reports for c in r.checks
             if c.status in (FAILED, ERROR) or c.name == NO_NUMERICS]
    t = _totals(reports)
    status = exit_status(reports)
    word = {0: "passed", 1: "FAILED", 2: "BAD INPUT"}[status]
    lines.append(f"tflfuse check {word}: {t['models']} model(s), {t['checks']} checks, {t[PASSED]} passed, "
                 f"{t[FAILED]} failed, {t[ERROR]} errors, {t[SKIPPED]} skipped (exit {status})")
    return lines


def write_reports(reports: Sequence[ModelReport], out_dir: str | Path, per_model: bool = False) -> list[Path]:
    """Writes ``report.json``, ``junit.xml`` and ``summary.md`` to ``out_dir`` for all the reports, and with
    ``per_model`` the same three for each model in ``out_dir/<name>/``. Returns the paths written.

    Raises:
      OSError: the folder cannot be made or written.
    """
    out_dir = Path(out_dir)
    written = []
    groups = [(out_dir, list(reports))] + ([(out_dir / r.name, [r]) for r in reports] if per_model else [])
    for folder, group in groups:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in (("report.json", json.dumps(to_json(group), indent=1)), ("junit.xml", to_junit(group)),
                           ("summary.md", to_markdown(group))):
            (folder / name).write_text(text, encoding="utf-8")
            written.append(folder / name)
    return written

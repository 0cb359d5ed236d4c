"""``tflfuse check``: proves in CI that a model's composites were fused and that its numerics hold.

One model source (a SavedModel directory, a ``.keras``/``.h5`` file, a Python entry point
``module:function`` or ``path/file.py:function`` that returns a Keras model or concrete functions, or an
existing ``.tflite``) is converted when needed (:func:`tflfuse.convert`) and checked:

* ``convert``: the conversion ran (a .tflite keeping resource variables fails it);
* ``fusion``: every annotated call traced became exactly one fused op (the converter's own bookkeeping);
* ``expect NAME``: per composite, an exact count or a minimum of fused ops in the file;
* ``kernels``: every op the file runs has a tflfuse kernel (unless allowed), by the interpreter's own rule
  (:func:`op_support`): a ``STABLEHLO_COMPOSITE`` runs its fused kernel by name or its decomposition inlined,
  so a decomposition's ops count only where it runs;
* ``parity tflfuse vs tensorflow``: the fused file on WebGPU against TensorFlow on seeded (or given) inputs;
* ``parity litert vs tensorflow``: the portable file (the fused one when LiteRT runs it, else the unfused
  conversion of a Keras model) on LiteRT's CPU interpreter against TensorFlow;
* ``per-op tflfuse vs litert``: the portable file run by both interpreters, every op's output compared
  (the first op where the two runtimes part is the one to look at);
* ``perf`` (optional): the fused file's median latency no worse than the unfused file's (times ``1 + slack``);
* ``numerics``: added (failed) only when none of the parity and per-op checks could run, so that a model
  whose numbers nothing compared does not pass; with ``allow_no_numerics`` it is skipped instead.

A ``.tflite`` source with tflfuse's fused ops (which LiteRT cannot run) is compared against LiteRT on the
file :func:`tflfuse.unfuse` expands into builtins; one with custom ops of the user's own that unfuse cannot
expand has no reference to compare with.

LiteRT runs in a child process (:mod:`tflfuse.check_litert`): a malformed .tflite that crashes it is reported as
bad input (exit status 2), with what tflfuse's own lowering finds wrong, instead of ending the checker; so is
one that LiteRT refuses where tflfuse's lowering names a fault too.

An element passes when ``|got - want| <= atol + rtol * |want|`` (``numpy.allclose``'s rule, NaN equal to
NaN); ``max rel`` is the largest |error| relative to the largest |want| of the output.
:func:`run_check` returns a :class:`ModelReport`; :func:`check_many` checks several models in parallel
processes (the ``spawn`` start method; each worker imports tflfuse before TensorFlow).
:mod:`tflfuse.check_report` writes the JSON, JUnit XML and Markdown reports; :mod:`tflfuse.check_config`
reads the settings (flags, expectations files, manifests), loads model sources and makes the inputs.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import time
import traceback
from typing import Callable, Sequence

from absl import logging

from .check_config import CheckInputError, CheckOptions, Source, _make_feeds, _signatures, load_source
from .check_compare import (_merge, _pair_outputs, _per_op_input, _per_op_rows, _per_op_tensors, _tf_references,
                            compare)
from .check_litert import LiteRTCrash, LiteRTError, run_litert, run_signature
from .model import Model, ModelError
from .runtime.support import OpSupport, op_support

__all__ = ["Check", "ModelReport", "OpSupport", "check_many", "compare", "op_support", "run_check"]

PASSED, FAILED, SKIPPED, ERROR = "passed", "failed", "skipped", "error"
#: The check added when no numeric check (a name starting with one of ``_NUMERIC_PREFIXES``) ran.
NO_NUMERICS = "numerics"
_NUMERIC_PREFIXES = ("parity ", "per-op ")


@dataclasses.dataclass
class Check:
    """One check's outcome: ``status`` is passed, failed, skipped or error (it could not run)."""

    name: str
    status: str
    message: str
    details: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


@dataclasses.dataclass
class ModelReport:
    """Everything checked for one model.

    Attributes:
      name, source: the model's name and source as given.
      kind: ``tflite``, ``keras``, ``saved_model`` or ``functions`` (empty when the source did not load).
      checks: the :class:`Check` results, in order.
      composites: one dict per composite (expected or present): ``name``, ``expected``, ``traced`` (None for
        a .tflite source), ``fused``, ``instances`` (op index, input and output shapes, attributes).
      op_counts: op name -> count in the fused file, of the ops outside decomposition subgraphs (a
        ``STABLEHLO_COMPOSITE`` under its composite's name).
      per_op: rows of the per-op error table (see :func:`_per_op_rows`); ``per_op_file`` names the file.
      parity: rows per comparison and output: ``comparison``, ``output``, ``max_abs``, ``max_rel`` (``max_abs``
        over the largest |want|, see :func:`compare`), ``tolerance_used`` (max of |error| / (atol + rtol
        |want|)), ``violations``, ``elements``.
      input_error: why the model could not be checked at all (bad source or inputs: exit status 2).
    """

    name: str
    source: str
    kind: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    samples: int = 0
    adapter: str = ""
    checks: list = dataclasses.field(default_factory=list)
    composites: list = dataclasses.field(default_factory=list)
    op_counts: dict = dataclasses.field(default_factory=dict)
    per_op: list = dataclasses.field(default_factory=list)
    per_op_file: str = ""
    parity: list = dataclasses.field(default_factory=list)
    input_error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.input_error and all(c.status in (PASSED, SKIPPED) for c in self.checks)

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks)


# ---- the checker ---------------------------------------------------------------------------------------
class _Checker:
    def __init__(self, opts: CheckOptions, device=None):
        self.opts, self.device = opts, device
        self.litert_data, self.litert_jobs, self.litert_results = None, {}, None   # see numerics() and litert()
        self.report = ModelReport(opts.name, opts.source, atol=opts.atol, rtol=opts.rtol)
        self.fused: bytes | None = None
        self.unfused: bytes | None = None
        self.conversion = None  # FusionReport of the fused conversion

    def add(self, name, status, message, start=None, **details) -> Check:
        check = Check(name, status, message, details, time.perf_counter() - start if start else 0.0)
        self.report.checks.append(check)
        logging.info("%s: %s %s: %s", self.opts.name, status, name, message)  # the reports carry them
        return check

    def get_device(self):
        if self.device is None:
            from .runtime import Device

            self.device = Device(self.opts.adapter)
        self.report.adapter = self.device.describe()
        return self.device

    def run(self) -> ModelReport:
        from .runtime import NoAdapterError

        start = time.perf_counter()
        try:
            src = load_source(self.opts.source, self.opts.import_modules)
            self.report.kind = src.kind
            if self.convert(src):
                self.model = Model(self.fused)
                _require_outputs(self.model)
                self.structure(src)
                self.numerics(src)
                self.require_numerics()
        except (CheckInputError, ModelError, NoAdapterError) as e:
            self.report.input_error = str(e)
            self.add("load", ERROR, str(e))
        except Exception as e:  # a crash of a step is that check's error, not the tool's
            logging.warning("%s", traceback.format_exc())
            self.add("internal", ERROR, f"{type(e).__name__}: {e}")
        self.report.seconds = time.perf_counter() - start
        return self.report

    # -- conversion and structure --
    def convert(self, src: Source) -> bool:
        if src.kind == "tflite":
            self.fused = src.obj
            return True
        from .conversion import ConversionError, convert

        t0 = time.perf_counter()
        try:
            result = convert(src.obj, check=False)
        except ConversionError as e:
            self.add("convert", FAILED, str(e), t0)
            return False
        except (TypeError, ValueError, FileNotFoundError) as e:
            raise CheckInputError(f"cannot convert {self.opts.source!r}: {e}") from None
        except Exception as e:
            self.add("convert", ERROR, f"the TFLite converter failed: {type(e).__name__}: {e}", t0)
            return False
        self.fused, self.conversion = result.tflite, result.report
        ops = sum(result.report.op_counts.values())
        kind = {"keras": "Keras model", "saved_model": "SavedModel", "functions": "concrete functions"}[src.kind]
        self.add("convert", PASSED, f"{kind} converted to {ops} ops ({len(result.tflite)} bytes) "
                 f"in {result.report.seconds:.1f} s", t0, ops=ops, bytes=len(result.tflite))
        if src.kind == "keras":
            try:
                self.unfused = convert(src.obj, annotations=False, check=False).tflite
            except Exception as e:  # the unfused baseline is optional: the checks that need it say why
                logging.warning("unfused conversion failed: %s: %s", type(e).__name__, e)
        return True

    def structure(self, src: Source) -> None:
        from .annotate import decode_attrs
        from .kernels import KernelError

        m, opts, rep = self.model, self.opts, self.report
        try:
            support = op_support(m)
        except KernelError as e:   # a composite whose decomposition contains itself: a malformed file
            raise CheckInputError(f"the .tflite cannot run: {e}") from None
        # the ops that run in their own right: a composite counts once, by its name; its decomposition's ops not
        names = [(r.subgraph, r.index, r.composite or r.name) for r in support if not r.in_decomposition]
        rep.op_counts = dict(sorted({n: sum(1 for *_, k in names if k == n) for *_, n in names}.items()))
        composites = set(self.conversion.composites) if self.conversion else \
            set(_custom_ops(m)) | {r.composite for r in support if r.composite and not r.in_decomposition}
        composites |= {e.composite for e in opts.expectations}
        expected = {e.composite: e for e in opts.expectations}
        for name in sorted(composites):
            instances = []
            for sg, i, n in names:
                if n != name:
                    continue
                try:
                    attrs = decode_attrs(m.op_attrs(sg, i))
                except (ValueError, TypeError):
                    attrs = {k: v for k, v in m.op_attrs(sg, i).items() if k != "_raw"}
                instances.append({"subgraph": sg, "op": i, "input": list(m.tensor_shape(sg, m.op_inputs(sg, i)[0])),
                                  "output": list(m.tensor_shape(sg, m.op_outputs(sg, i)[0])), "attrs": attrs})
            cc = self.conversion.composites.get(name) if self.conversion else None
            rep.composites.append({"name": name, "expected": str(expected[name]) if name in expected else None,
                                   "traced": cc.traced if cc else None,
                                   "fused": self.conversion.fused(name) if self.conversion else rep.op_counts.get(name, 0),
                                   "instances": instances})
        if self.conversion is None:
            self.add("fusion", SKIPPED, "a .tflite holds no record of the annotated calls; --expect checks its ops")
        elif self.conversion.ok:
            fused = ", ".join(f"{c.name} {c.fused}" for c in self.conversion.composites.values()) or "none traced"
            self.add("fusion", PASSED, f"every annotated call became one fused op ({fused})")
        else:
            lost = "; ".join(f"{c.name}: {c.traced} annotated call(s) traced, {c.fused} fused op(s) in the .tflite"
                             for c in self.conversion.mismatches)
            self.add("fusion", FAILED, f"annotated calls did not each become one fused op: {lost} (the converter "
                     f"drops a call whose result is unused and inlines calls it cannot keep)",
                     mismatches=[dataclasses.asdict(c) for c in self.conversion.mismatches])
        by_name = {c["name"]: c for c in rep.composites}
        for e in opts.expectations:
            row = by_name[e.composite]
            found, traced = row["fused"], row["traced"]
            numbers = dict(composite=e.composite, expected=str(e), found=found, traced=traced)
            if e.holds(found):
                self.add(f"expect {e.composite}", PASSED, f"{found} {e.composite} op(s), expected {e}", **numbers)
                continue
            why = ""
            if traced is not None and traced == found:
                why = (f"; only {traced} annotated call(s) were traced: a call ran without its annotation (inside "
                       f"annotations_disabled, a layer that no longer calls the composite) or is gone")
            elif traced is not None:
                why = f"; {traced} annotated call(s) were traced: the converter did not fuse {traced - found}"
            self.add(f"expect {e.composite}", FAILED, f"{found} {e.composite} op(s) in the .tflite, expected {e}{why}",
                     **numbers)
        self.kernels_check(support)

    def kernels_check(self, support: list[OpSupport]) -> None:
        """The ``kernels`` check: every op the model needs has a kernel (:func:`op_support`), or is allowed."""
        where: dict[str, dict[int, list[int]]] = {}   # op name -> subgraph -> operator indices, of the missing
        for r in support:
            if r.runs == "missing" or (r.runs == "cpu fallback" and r.via is None):   # LiteRT CPU would run it
                where.setdefault(r.name, {}).setdefault(r.subgraph, []).append(r.index)
        missing = {n: sum(map(len, sgs.values())) for n, sgs in where.items()}
        refused = {n: c for n, c in missing.items() if n not in self.opts.allow_ops}
        self.runnable = not missing
        if refused:
            def at(idx: list[int]) -> str:   # operators 3, 7, 9 (the first 8 of them)
                return f"operator{'s' if len(idx) > 1 else ''} {', '.join(map(str, idx[:8]))}" + \
                    (", ..." if len(idx) > 8 else "")

            listing = "; ".join(f"{n} x{missing[n]} (" + ", ".join(f"{at(idx)} of subgraph {sg}"
                                                                    for sg, idx in where[n].items()) + ")"
                                for n in refused)
            self.add("kernels", FAILED, f"op(s) without a tflfuse kernel: {listing}. Register a kernel for an op of "
                     f"your own (docs/custom_kernels.md; --import_modules=MODULE), or allow it with "
                     f"--allow_op=NAME", missing=refused)
            return
        top = [r for r in support if not r.in_decomposition]
        by_decomposition = sum(r.runs == "decomposition" for r in top)
        notes = [f"{by_decomposition} composite(s) run their decomposition op by op"] if by_decomposition else []
        notes += [f"{', '.join(missing)} allowed"] if missing else []
        note = f" ({'; '.join(notes)})" if notes else ""
        self.add("kernels", PASSED, f"all {len(top)} ops have a tflfuse kernel{note}", allowed=missing)

    # -- numerics --
    def numerics(self, src: Source) -> None:
        opts, m = self.opts, self.model
        feeds = _make_feeds(m, opts)
        self.report.samples = len(feeds)
        litert_runs_fused = not _custom_ops(m)
        portable = self.fused if litert_runs_fused else self.unfused
        portable_name = ("the .tflite" if src.kind == "tflite" else "the fused .tflite") if litert_runs_fused \
            else "the unfused conversion"
        no_portable = "no file that both LiteRT and tflfuse run"
        if portable is None and src.kind == "tflite":
            portable, no_portable = self.unfuse_tflite()
            portable_name = "the .tflite" if portable is self.fused else "the .tflite unfused by tflfuse.unfuse"
        pm = Model(portable) if portable is not None else None
        per_op = pm is not None and (self.runnable if portable is self.fused else _runnable(portable))
        # LiteRT's runs, all in one child process (check_litert: a crash on a malformed file cannot end this one)
        jobs = {}
        if pm is not None and (src.kind != "tflite" or self.runnable):
            jobs["outputs"] = {"kind": "signatures", "signatures": _signatures(pm),
                               "feeds": _make_feeds(pm, opts) if portable is self.unfused else feeds}
        if per_op:
            key, sample = _per_op_input(pm, opts)
            jobs["tensors"] = {"kind": "tensors", "signatures": _signatures(pm), "key": key, "feed": sample,
                               "tensors": [t for _, _, t in _per_op_tensors(pm)]}
        self.litert_data, self.litert_jobs, self.litert_results = portable, jobs, None
        if src.kind == "tflite" and jobs:   # the user's file: bad input (exit 2) when LiteRT crashes on it, or
            try:                             # refuses it and tflfuse's own checks name a fault too
                self.litert("outputs" if "outputs" in jobs else "tensors")
            except (LiteRTCrash, LiteRTError) as e:
                found = _diagnose(portable)
                if isinstance(e, LiteRTCrash) or found:
                    litert = str(e) if isinstance(e, LiteRTCrash) else f"LiteRT refuses it too ({e})"
                    why = f"{found}; {litert}" if found else f"{litert} (tflfuse's own checks name no fault)"
                    raise CheckInputError(f"{portable_name} looks malformed: {why}. Fix or re-export the file "
                                          f"(tflfuse check on the model's source converts it afresh)") from None
        tflfuse_run = self.tflfuse_runner(self.fused, m)
        if src.kind != "tflite":
            tf_refs = self.step("parity tflfuse vs tensorflow", lambda: _tf_references(src, _signatures(m).keys()))
            if tf_refs is None:
                return
            if self.runnable:
                self.parity("tflfuse vs tensorflow", tflfuse_run, feeds, tf_refs)
            else:
                self.add("parity tflfuse vs tensorflow", SKIPPED, "the .tflite has ops without a tflfuse kernel")
            if pm is not None:
                self.parity("litert vs tensorflow", lambda: lambda i, key, f: self.litert("outputs")[i][key],
                            jobs["outputs"]["feeds"], tf_refs)
            else:
                self.add("parity litert vs tensorflow", SKIPPED, f"LiteRT cannot run custom op(s) "
                         f"{', '.join(_custom_ops(m))}, and a {src.kind} cannot be converted unfused")
        elif pm is not None and self.runnable:
            refs = {k: (lambda i, f, k=k: self.litert("outputs")[i][k]) for k in _signatures(m)}
            self.parity("tflfuse vs litert", tflfuse_run, feeds, refs,
                        note="" if portable is self.fused else f" (LiteRT on {portable_name})")
        else:
            self.add("parity tflfuse vs litert", SKIPPED, "ops without a tflfuse kernel" if not self.runnable
                     else no_portable)
        if per_op:
            self.per_op(portable, portable_name)
        else:
            self.add("per-op tflfuse vs litert", SKIPPED, no_portable if pm is None
                     else f"{portable_name} has ops without a tflfuse kernel")
        if opts.perf:
            self.perf(feeds)

    def tflfuse_runner(self, data: bytes, model: Model):
        """A function making (on first use) a runner of ``data`` on tflfuse: ``(sample, key, feeds) -> outputs``."""
        def make():
            from .runtime import Interpreter

            interp = Interpreter(model_content=data, device=self.get_device())
            interp.allocate_tensors()
            sigs = _signatures(model)
            return lambda i, key, f: run_signature(interp, sigs, key, f)
        return make

    def litert(self, job: str):
        """The result of LiteRT's job ``job`` (of ``self.litert_jobs``, all run in one child process the first
        time one is asked for).

        Raises:
          LiteRTCrash: LiteRT's process crashed; LiteRTError: LiteRT raised on this job.
        """
        if self.litert_results is None:
            names = list(self.litert_jobs)
            try:
                done = run_litert(self.litert_data, [self.litert_jobs[n] for n in names])
                self.litert_results = dict(zip(names, done))
            except LiteRTCrash as e:
                self.litert_results = e
        if isinstance(self.litert_results, LiteRTCrash):
            raise self.litert_results
        got = self.litert_results[job]
        if "error" in got:
            raise LiteRTError(got["error"])
        return got["result"]

    def unfuse_tflite(self) -> tuple[bytes | None, str]:
        """A .tflite source with custom ops: the file :func:`tflfuse.unfuse` expands into builtins (LiteRT's
        reference), or None and why there is none."""
        from .passes.unfuse import UnfuseError, unfuse

        custom = ", ".join(_custom_ops(self.model))
        if not self.runnable:
            return None, f"LiteRT cannot run the file's custom op(s) {custom}, and tflfuse has no kernel for some ops"
        try:
            plain, _ = unfuse(self.fused)
        except UnfuseError as e:
            stuck = ", ".join(sorted({name for name, _, _ in e.ops})) or custom
            return None, (f"LiteRT cannot run the file's custom op(s) {custom}, and tflfuse.unfuse cannot expand "
                          f"{stuck} into builtins (a composite of your own)")
        except Exception as e:   # the unfused reference is optional: the checks that need it say why
            logging.warning("%s", traceback.format_exc())
            return None, (f"LiteRT cannot run the file's custom op(s) {custom}, and tflfuse.unfuse failed: "
                          f"{type(e).__name__}: {e}")
        return plain, ""

    def require_numerics(self) -> None:
        """Adds the ``numerics`` check when no parity or per-op check ran (all skipped): failed, or skipped
        with ``allow_no_numerics``, naming why each was skipped."""
        numeric = [c for c in self.report.checks if c.name.startswith(_NUMERIC_PREFIXES)]
        if any(c.status != SKIPPED for c in numeric):
            return
        by_reason: dict[str, list[str]] = {}   # checks skipped for the same reason are named together
        for c in numeric:
            by_reason.setdefault(c.message, []).append(c.name)
        why = "; ".join(f"{' and '.join(names)}: {reason}" for reason, names in by_reason.items()) \
            or "no comparison applies"
        if self.opts.allow_no_numerics:
            self.add(NO_NUMERICS, SKIPPED, f"no numeric check ran (allowed by allow_no_numerics): {why}")
        else:
            self.add(NO_NUMERICS, FAILED, f"no numeric check ran, so nothing compared the model's numbers: {why}. "
                     f"Check the model's source (SavedModel, Keras file or module:function) to compare with "
                     f"TensorFlow, or pass --allow_no_numerics (allow_no_numerics = true) to pass on the other "
                     f"checks alone")

    def step(self, name: str, fn):
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as e:
            logging.warning("%s", traceback.format_exc())
            self.add(name, ERROR, f"{type(e).__name__}: {e}", t0)
            return None

    def parity(self, label: str, make: Callable, feeds: list[dict], refs: dict, note: str = "") -> None:
        """One ``parity`` check: ``make()`` gives a runner ``(sample index, key, feeds) -> outputs``; ``refs[key]``
        is ``(sample index, feeds) -> outputs`` of the reference."""
        name, t0 = f"parity {label}", time.perf_counter()

        def run():
            runner = make()
            per_output: dict[str, dict] = {}
            for i, sample in enumerate(feeds):
                for key, f in sample.items():
                    got = runner(i, key, f)
                    for out, g, w in _pair_outputs(got, refs[key](i, f)):
                        label_out = out if len(sample) == 1 else f"{key}/{out}"
                        per_output[label_out] = _merge(per_output.get(label_out), compare(g, w, self.opts.atol,
                                                                                           self.opts.rtol))
            return per_output

        per_output = self.step(name, run)
        if per_output is None:
            return
        for out, r in per_output.items():
            self.report.parity.append({"comparison": label, "output": out, **r})
        worst_out, worst = max(per_output.items(), key=lambda kv: kv[1]["tolerance_used"])
        numbers = (f"max |error| {worst['max_abs']:.3g}, max rel {worst['max_rel']:.3g}, {worst['tolerance_used']:.3g} "
                   f"of the tolerance (atol {self.opts.atol:g}, rtol {self.opts.rtol:g}), {len(feeds)} sample(s)")
        bad = {o: r for o, r in per_output.items() if r["violations"] or r["shape_mismatch"]}
        if bad:
            o, r = next(iter(bad.items()))
            what = r["shape_mismatch"] or f"{r['violations']} of {r['elements']} elements out of tolerance"
            self.add(name, FAILED, f"output {o!r}: {what}; {numbers}{note}", t0, outputs=per_output)
        else:
            self.add(name, PASSED, f"{len(per_output)} output(s) within tolerance; worst {worst_out!r}: "
                     f"{numbers}{note}", t0, outputs=per_output)

    def per_op(self, portable: bytes, portable_name: str) -> None:
        name, t0 = "per-op tflfuse vs litert", time.perf_counter()
        rows = self.step(name, lambda: _per_op_rows(portable, self.get_device(), self.opts, self.litert("tensors")))
        if rows is None:
            return
        if not rows:
            self.add(name, SKIPPED, f"no op of {portable_name} computes from its inputs", t0)
            return
        self.report.per_op, self.report.per_op_file = rows, portable_name
        bad = [r for r in rows if not r["ok"]]
        worst = max(rows, key=lambda r: r["tolerance_used"]) if rows else None
        if bad:
            r = bad[0]
            self.add(name, FAILED, f"{len(bad)} of {len(rows)} op outputs of {portable_name} differ; first: op "
                     f"{r['op_index']} {r['op']} ({r['tensor']}): max |error| {r['max_abs']:.3g}, max rel "
                     f"{r['max_rel']:.3g} (atol {self.opts.atol:g}, rtol {self.opts.rtol:g})", t0)
        elif worst:
            self.add(name, PASSED, f"all {len(rows)} op outputs of {portable_name} agree; worst op {worst['op_index']} "
                     f"{worst['op']}: max |error| {worst['max_abs']:.3g}, {worst['tolerance_used']:.3g} of the "
                     f"tolerance", t0)

    def perf(self, feeds: list[dict]) -> None:
        from .runtime import Interpreter

        name, t0 = "perf", time.perf_counter()
        if self.unfused is None or not self.runnable:
            self.add(name, SKIPPED, "needs a Keras model (converted unfused as the baseline) whose ops all have "
                     "tflfuse kernels")
            return

        def measure():
            interps = []
            for data in (self.fused, self.unfused):
                interp = Interpreter(model_content=data, device=self.get_device())
                interp.allocate_tensors()
                mm = Model(data)
                key = next(iter(_signatures(mm)))
                sig = _signatures(mm)[key]
                for n, t in sig["inputs"].items():
                    interp.set_tensor(t, feeds[0][next(iter(feeds[0]))][n])
                interps.append(interp)
            times = [[], []]
            for _ in range(2):  # alternate, so that a drift of the machine's load affects both alike
                for i, interp in enumerate(interps):
                    times[i].append(interp.time_invoke(self.opts.repeats))
            return min(times[0]), min(times[1]), interps[0].dispatch_count, interps[1].dispatch_count

        got = self.step(name, measure)
        if got is None:
            return
        fused_s, unfused_s, fd, ud = got
        limit = unfused_s * (1 + self.opts.perf_slack)
        numbers = dict(fused_ms=fused_s * 1e3, unfused_ms=unfused_s * 1e3, dispatches_fused=fd,
                       dispatches_unfused=ud, slack=self.opts.perf_slack, adapter=self.get_device().describe())
        text = (f"fused {fused_s * 1e3:.2f} ms ({fd} dispatches) against unfused {unfused_s * 1e3:.2f} ms ({ud}); "
                f"limit {limit * 1e3:.2f} ms (slack {self.opts.perf_slack:.0%}) on {self.get_device().name}")
        self.add(name, PASSED if fused_s <= limit else FAILED, text, t0, **numbers)


def _runnable(data: bytes) -> bool:
    """Whether tflfuse runs every op that the .tflite ``data`` needs (:func:`op_support`)."""
    from .kernels import KernelError

    try:
        return all(r.runs not in ("missing", "cpu fallback") for r in op_support(Model(data)))
    except (KernelError, ModelError):   # a file tflfuse cannot plan is not runnable
        return False


def _require_outputs(model: Model) -> None:
    """Raises :class:`CheckInputError` when a signature (or subgraph 0, without signatures) has no output."""
    for key, sig in _signatures(model).items():
        if not sig["outputs"]:
            where = f"signature {key!r} (subgraph {sig['subgraph']})" if key is not None else "subgraph 0"
            raise CheckInputError(f"the .tflite's {where} has no outputs, so there is nothing to run or compare; "
                                  f"export the model with its outputs")


def _custom_ops(model: Model) -> list[str]:
    from ai_edge_litert import schema_py_generated as schema

    out = []
    for sg in range(len(model.subgraphs)):
        for op in model.subgraphs[sg].operators or []:
            code = model.m.operatorCodes[op.opcodeIndex]
            if max(int(code.builtinCode), int(code.deprecatedBuiltinCode)) == schema.BuiltinOperator.CUSTOM:
                name = code.customCode.decode() if isinstance(code.customCode, bytes) else str(code.customCode)
                if name not in out:
                    out.append(name)
    return out


def _diagnose(data: bytes) -> str:
    """What tflfuse's own checks (:func:`tflfuse.runtime.plan.lower` of each signature's subgraph, no GPU) find
    wrong with ``data``; "" when they find nothing (or only ops without a kernel)."""
    from .kernels import KernelError, UnsupportedOpError
    from .runtime.plan import lower

    try:
        m = Model(data)
        for sg in sorted({s["subgraph"] for s in _signatures(m).values()}):
            lower(m, sg, relayout=False)
    except UnsupportedOpError:
        return ""
    except (KernelError, ModelError) as e:
        return str(e)
    except Exception as e:   # noqa: BLE001  (a diagnosis only: a fault tflfuse trips on is one too)
        return f"{type(e).__name__}: {e}"
    return ""


def run_check(opts: CheckOptions, device=None) -> ModelReport:
    """Checks one model (see the module docstring); never raises for a model's fault.

    Args:
      opts: :class:`~tflfuse.check_config.CheckOptions`.
      device: a :class:`tflfuse.Device` to use (default: one on ``opts.adapter``, made when first needed).

    Returns:
      :class:`ModelReport`; ``report.input_error`` is set when the source or inputs could not be used.
    """
    return _Checker(opts, device).run()


def _worker(item: tuple[int, CheckOptions]) -> tuple[int, ModelReport]:
    index, opts = item
    return index, run_check(opts)


def check_many(options: Sequence[CheckOptions], jobs: int | None = None, progress: bool = True,
               on_done: Callable[[ModelReport], None] | None = None) -> list[ModelReport]:
    """Checks several models, in ``jobs`` spawned processes (default: one per model up to the CPU count).

    Each worker imports tflfuse (this module) before TensorFlow. A tqdm bar on stderr shows progress when there
    is more than one model.

    Returns:
      The :class:`ModelReport` of each option, in the order given.
    """
    from tqdm import tqdm

    if jobs is not None and (type(jobs) is not int or jobs < 1):
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    jobs = jobs or min(len(options), os.cpu_count() or 1)
    results: list[ModelReport | None] = [None] * len(options)
    with tqdm(total=len(options), desc="tflfuse check", unit="model", file=sys.stderr,
              disable=not progress or len(options) <= 1) as bar:
        def done(i: int, r: ModelReport) -> None:
            results[i] = r
            bar.set_postfix_str(f"{r.name}: {'ok' if r.ok else 'FAILED'}")
            bar.update(1)
            if on_done:
                on_done(r)

        if jobs <= 1 or len(options) <= 1:
            for i, o in enumerate(options):
                done(i, run_check(o))
        else:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the spawned workers inherit it
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(min(jobs, len(options))) as pool:
                for i, r in pool.imap_unordered(_worker, list(enumerate(options))):
                    done(i, r)
    return results

"""The ``tflfuse`` command (an absl app).

    tflfuse demo [--adapter=NAME] [--size=224] [--repeats=5]
    tflfuse convert SAVED_MODEL_DIR --output=model.tflite [--fused_op_format=composite]
        [--import_modules=composites]
    tflfuse run MODEL.tflite --input=x.npy [--input=y.npy ...] [--output=out.npz] [--adapter=NAME]
    tflfuse ops MODEL.tflite   (each op and where tflfuse runs it: a GPU kernel or the CPU fallback)
    tflfuse shader KEY --shapes="[[1,224,224,3],[32,3,3,3]]" [--attrs="stride_h=2,padding=SAME"] [--json]
    tflfuse shader --list [--json]
    tflfuse shader --model=MODEL.tflite --out=DIR [--target=gpu|cpu]
    tflfuse fuse IN.tflite --output=OUT.tflite [--patterns=bottleneck,separable_conv,...] [--target=gpu|cpu]
    tflfuse export MODEL.tflite --web DIR [--precision=float32|float16] [--target=gpu|cpu] [--adapter=NAME]
        (a folder a browser runs with tflfuse.js: plan.json, weights.bin, shaders/, index.html; serve it with
        python -m http.server -d DIR)
    tflfuse unfuse IN.tflite --output=OUT.tflite [--keep_custom_ops]
    tflfuse adapters   (wgpu-native's; then Dawn's, where wgpudawn is installed)
    tflfuse check SOURCE [--expect=NAME=COUNT|NAME>=COUNT ...] [--expectations=FILE.toml] [--allow_op=OP ...]
        [--samples=3] [--seed=0] [--input=x.npy ...] [--atol=1e-4] [--rtol=1e-3] [--perf] [--perf_slack=0.1]
        [--report_dir=DIR] [--allow_no_numerics]   SOURCE: MODEL.tflite, SAVED_MODEL_DIR, MODEL.keras,
        module:function or file.py:function (returns a Keras model or concrete functions)
    tflfuse check --manifest=MODELS.toml [--shard=I/N] [--jobs=N] [--report_dir=DIR]
    convert, run, ops, shader, fuse, unfuse, export, check: [--import_modules=MOD,...] imports the modules that register
        your kernels (docs/custom_kernels.md), composites or Keras layers first.
    tflfuse --help: each command's flags; tflfuse COMMAND --help: that command's; --helpfull: absl's too;
        --helpxml: every flag as XML.

Exit status: 0 on success; 1 when the work failed (a fusion mismatch, unfrozen weights in convert, an op the
model needs without a kernel in ops, custom ops that unfuse cannot expand); 2 for bad usage or input (an unknown
command, a missing or malformed file, a model that cannot run, inputs of the wrong shape or dtype, a module of
--import_modules that cannot be imported, no WebGPU adapter).
check: 0 every check holds; 1 a check failed, or no numeric check could run (the failing checks and their
numbers are the last lines); 2 bad usage or input (a flag, an expectations file or manifest, a model source
that cannot be loaded, a .tflite that LiteRT crashes on or that has no outputs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging

FLAGS = flags.FLAGS

#: flag name -> (the commands it applies to, its help): ``tflfuse --help`` groups the flags by command from this.
_FLAG_COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {}


def _flag(define, name: str, default, help_text: str, commands: str, **kwargs) -> None:
    """Defines an absl flag (``define``: ``flags.DEFINE_string``...) and records the commands it applies to."""
    _FLAG_COMMANDS[name] = (tuple(commands.split()), help_text)
    define(name, default, help=help_text, **kwargs)


_flag(flags.DEFINE_string, "output", None, "convert, fuse, unfuse: the .tflite to write; run: an .npz for the "
      "outputs.", "convert fuse unfuse run")
_flag(flags.DEFINE_multi_string, "input", [], "run, check: an .npy file per model input, in input order.",
      "run check")
_flag(flags.DEFINE_string, "adapter", None, "Substring of the WebGPU adapter's name to use (default: the best one).",
      "demo run check export")
_flag(flags.DEFINE_enum, "fused_op_format", "custom", "convert: fused ops as custom ops (tflfuse only) or "
      "STABLEHLO_COMPOSITE with a decomposition (stock LiteRT runs it too).", "convert",
      enum_values=["custom", "composite"])
_flag(flags.DEFINE_string, "shapes", None, "shader: JSON list of input shapes, e.g. [[1,8,8,3],[4,3,3,3]].", "shader")
_flag(flags.DEFINE_string, "attrs", "", "shader: comma-separated key=value attributes, e.g. padding=SAME,stride_h=2.",
      "shader")
_flag(flags.DEFINE_bool, "json", False, "shader: print the whole ShaderInfo as JSON.", "shader")
_flag(flags.DEFINE_bool, "list", False, "shader: list every kernel key with its inputs and attributes.", "shader")
_flag(flags.DEFINE_string, "model", None, "shader: write every distinct shader of this .tflite (with --out).",
      "shader")
_flag(flags.DEFINE_string, "out", None, "shader --model: folder for the .wgsl files and manifest.json.", "shader")
_flag(flags.DEFINE_enum, "target", "gpu", "shader, fuse, export: schedules (and dispatch counts) for a GPU or the "
      "software adapter (export's default: the adapter's).", "shader fuse export", enum_values=["gpu", "cpu"])
_flag(flags.DEFINE_enum, "precision", "float32", "run, shader, export: float16 stores every float tensor as float16 "
      "on the GPU (arithmetic in float32 except the tiled products' f16 multiply-adds; needs the adapter's "
      "shader-f16), as LiteRT's GPU delegate allows with precision_loss_allowed.", "run shader export",
      enum_values=["float32", "float16"])
_flag(flags.DEFINE_list, "patterns", [], "fuse: the patterns to apply (default: all of tflfuse.passes.fuse.PATTERNS).",
      "fuse")
_flag(flags.DEFINE_bool, "keep_custom_ops", False, "unfuse: keep custom ops that have no expansion into builtins "
      "(a composite of your own) instead of failing, for a runtime that has their kernels.", "unfuse")
_flag(flags.DEFINE_integer, "size", 224, "demo: MobileNetV2 input side in pixels.", "demo")
_flag(flags.DEFINE_integer, "repeats", 5, "demo, check --perf: timed invokes per model.", "demo check")
_flag(flags.DEFINE_multi_string, "expect", [], "check: NAME=COUNT (exactly) or NAME>=COUNT (at least) fused ops.",
      "check")
_flag(flags.DEFINE_string, "expectations", None, "check: a TOML file of expectations and settings for the model.",
      "check")
_flag(flags.DEFINE_multi_string, "allow_op", [], "check: an op allowed to stay without a tflfuse kernel.", "check")
_flag(flags.DEFINE_integer, "samples", 3, "check: seeded random inputs to compare on.", "check", lower_bound=1)
_flag(flags.DEFINE_integer, "seed", 0, "check: seed of the random inputs.", "check", lower_bound=0)
_flag(flags.DEFINE_float, "atol", 1e-4, "check: absolute tolerance, |got - want| <= atol + rtol * |want|.", "check",
      lower_bound=0)
_flag(flags.DEFINE_float, "rtol", 1e-3, "check: relative tolerance.", "check", lower_bound=0)
_flag(flags.DEFINE_bool, "perf", False, "check: also require fused latency no worse than unfused (Keras sources).",
      "check")
_flag(flags.DEFINE_float, "perf_slack", 0.1, "check --perf: fused may take up to (1 + slack) x unfused.", "check",
      lower_bound=0)
_flag(flags.DEFINE_bool, "allow_no_numerics", False, "check: pass a model on which no numeric check can run (a "
      ".tflite with custom ops that LiteRT cannot run and unfuse cannot expand) on its other checks alone.", "check")
_flag(flags.DEFINE_string, "report_dir", None, "check: folder for report.json, junit.xml and summary.md.", "check")
_flag(flags.DEFINE_string, "manifest", None, "check: a TOML manifest of models to check in parallel processes.",
      "check")
_flag(flags.DEFINE_string, "shard", None, "check --manifest: I/N, check only shard I (1-based) of N.", "check")
_flag(flags.DEFINE_integer, "jobs", None, "check --manifest: parallel processes (default: models, up to the CPUs).",
      "check", lower_bound=1)
_flag(flags.DEFINE_list, "import_modules", [], "Modules to import first, for what they register: your kernels "
      "(docs/custom_kernels.md), composites, a Keras file's custom layers (module names such as composites,"
      "my_pkg.kernels, not file paths; the current folder is searched).",
      "convert run ops shader fuse unfuse export check")
_flag(flags.DEFINE_string, "web", None, "export: the folder to write (plan.json, weights.bin, shaders/, tflfuse.js, "
      "index.html, demo/).", "export")

_USAGE = __doc__.split("\n\n")[1]


class UsageError(Exception):
    """Bad command-line usage: exit status 2."""


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--attrs: {text!r} is not a JSON list: {e}") from None
    return text


def _split_top_level(text: str) -> list[str]:
    """Splits ``text`` at the commas outside brackets: ``"a=[1,2],b=3"`` -> ``["a=[1,2]", "b=3"]``."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _parse_attrs(text: str) -> dict:
    attrs = {}
    for item in filter(None, (s.strip() for s in _split_top_level(text))):
        if "=" not in item:
            raise UsageError(f"--attrs: {item!r} is not key=value")
        k, v = item.split("=", 1)
        attrs[k.strip()] = _parse_value(v.strip())
    return attrs


def cmd_demo(args):
    from .demo import run_demo

    run_demo(adapter=FLAGS.adapter, size=FLAGS.size, repeats=FLAGS.repeats)


def _import_modules() -> None:
    """Imports the modules of ``--import_modules`` (what registers the user's kernels, composites, layers).

    Raises:
      UsageError: a module cannot be imported (the message names it and the error).
    """
    from .kernels.registry import import_modules

    try:
        import_modules(FLAGS.import_modules)
    except ImportError as e:
        raise UsageError(f"--import_modules: {e}") from None


def cmd_convert(args):
    if len(args) != 1 or not FLAGS.output:
        raise UsageError("usage: tflfuse convert SAVED_MODEL_DIR --output=model.tflite")
    from .conversion import ConversionError, FusionError, convert

    try:
        result = convert(args[0], fused_op_format=FLAGS.fused_op_format)
    except FusionError as e:
        print(e.report)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (TypeError, ValueError) as e:  # e.g. a directory that is not a SavedModel
        raise UsageError(str(e)) from None
    with open(FLAGS.output, "wb") as f:
        f.write(result.tflite)
    print(result.report)
    print(f"wrote {FLAGS.output} ({len(result.tflite)} bytes)")


def _read_tflite(args, usage: str) -> bytes:
    if len(args) != 1 or not FLAGS.output:
        raise UsageError(usage)
    with open(args[0], "rb") as f:
        return f.read()


def cmd_fuse(args):
    """Rewrites the patterns :mod:`tflfuse.passes.fuse` knows; every other op, builtin or custom, with or without
    a tflfuse kernel, is written back as it was (the report's last line names those without one). A malformed
    op (shapes or attributes its kernel refuses) is an error naming it: exit 2, nothing written."""
    from .passes.fuse import fuse

    data = _read_tflite(args, "usage: tflfuse fuse IN.tflite --output=OUT.tflite [--patterns=a,b]")
    if FLAGS["patterns"].present and not FLAGS.patterns:
        raise UsageError("--patterns= names no pattern: give names (tflfuse.passes.fuse.PATTERNS), or leave the flag "
                         "out for all of them")
    try:
        fused, report = fuse(data, patterns=FLAGS.patterns or None, target=FLAGS.target)
    except ValueError as e:   # an unknown pattern name
        if "pattern" in str(e):
            raise UsageError(str(e)) from None
        raise
    with open(FLAGS.output, "wb") as f:
        f.write(fused)
    print(report)
    print(f"wrote {FLAGS.output} ({len(fused)} bytes)")


def cmd_export(args):
    """Writes a folder that runs the model in a browser (:func:`tflfuse.web.export_web`); a model with ops that would
    run on LiteRT's CPU interpreter is refused, naming them (exit 2, nothing written)."""
    if len(args) != 1 or not FLAGS.web:
        raise UsageError("usage: tflfuse export MODEL.tflite --web DIR [--precision=float32|float16]")
    from .runtime import Device
    from .web import ExportError, export_web

    try:
        data = export_web(_read_input_file(args[0]), FLAGS.web, precision=FLAGS.precision,
                          target=FLAGS.target if FLAGS["target"].present else None, device=Device(FLAGS.adapter))
    except ExportError as e:   # ops without a GPU kernel, run-time shapes: the model cannot run in a browser
        raise UsageError(str(e)) from None
    plan = data.plan
    print(f"wrote {len(plan['dispatches'])} dispatches, {len(data.shaders)} distinct shaders and "
          f"{len(data.weights)} bytes of weights ({plan['precision']}) to {FLAGS.web}; serve it with "
          f"`python -m http.server -d {FLAGS.web}` and open http://localhost:8000/")


def _read_input_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def cmd_unfuse(args):
    from .kernels import KernelError
    from .model import ModelError
    from .passes.unfuse import unexpandable_ops, unfuse

    data = _read_tflite(args, "usage: tflfuse unfuse IN.tflite --output=OUT.tflite [--keep_custom_ops]")
    try:
        plain, counts = unfuse(data, keep_custom_ops=FLAGS.keep_custom_ops)
    except (KernelError, ModelError):   # a malformed file, or one that does not plan on tflfuse: exit 2
        raise
    except ValueError as e:   # ops with no builtin expansion: the work failed, the file is fine; nothing written
        print(f"error: {e}", file=sys.stderr)
        return 1
    with open(FLAGS.output, "wb") as f:
        f.write(plain)
    for name, count in sorted(counts.items()):
        print(f"{name}: {count} expanded into builtins")
    for name, sg, oi in unexpandable_ops(plain):   # only with --keep_custom_ops
        print(f"{name} (operator {oi} of subgraph {sg}): kept as a custom op; LiteRT needs its kernel")
    if not counts:
        print("no tflfuse fused op: the file is unchanged")
    print(f"wrote {FLAGS.output} ({len(plain)} bytes)")


def _load_model(path: str):
    from .model import Model

    return Model.from_path(path)


def cmd_ops(args):
    """Lists every op and where tflfuse runs it (:func:`tflfuse.runtime.support.op_support`, the interpreter's own
    rule): a GPU kernel, or LiteRT's CPU interpreter (the CPU fallback, with the reason); exit status 1 when an op
    that the model needs runs nowhere (a custom op without a kernel)."""
    if len(args) != 1:
        raise UsageError("usage: tflfuse ops MODEL.tflite")
    from .runtime.support import op_support
    from .kernels.registry import CUSTOM_KERNELS_DOC

    rows = op_support(_load_model(args[0]))
    how = {"kernel": lambda r: "supported",
           "fused kernel": lambda r: "supported: its fused kernel",
           "decomposition": lambda r: f"supported: its decomposition (subgraph {r.decomposition}) op by op",
           "cpu fallback": lambda r: f"CPU fallback (LiteRT's CPU interpreter): {r.reason}",
           "missing": lambda r: "NO KERNEL",
           "not needed": lambda r: "no kernel, not needed: this decomposition's composites run their fused kernels"}
    for r in rows:
        print(f"subgraph {r.subgraph} op {r.index:4d}  {r.display_name:<28} {how[r.runs](r)}")
    missing = sum(r.runs == "missing" for r in rows)
    unneeded = sum(r.runs == "not needed" for r in rows)
    fallback = sum(r.runs == "cpu fallback" for r in rows)
    if fallback:
        print(f"{fallback} op(s) run on LiteRT's CPU interpreter within the same invoke (the CPU fallback; "
              f"Interpreter(..., cpu_fallback=False) refuses them instead)")
    if missing:
        print(f"{missing} op(s) without a kernel: register one for an op of your own ({CUSTOM_KERNELS_DOC}) and "
              f"import its module with --import_modules=MODULE")
    elif unneeded and not fallback:
        print(f"every op that runs has a kernel ({unneeded} op(s) of decompositions that no composite runs have "
              f"none)")
    elif not fallback:
        print("every op has a kernel")
    return 1 if missing else 0


def cmd_run(args):
    if len(args) != 1:
        raise UsageError("usage: tflfuse run MODEL.tflite --input=x.npy [--output=out.npz]")
    if FLAGS.output and (FLAGS.output.endswith(("/", os.sep)) or os.path.isdir(FLAGS.output)):
        raise UsageError(f"--output={FLAGS.output}: a folder; give a file name such as out.npz")
    import numpy as np

    from .check_config import CheckInputError, load_input
    from .runtime import Interpreter

    interp = Interpreter(model_path=args[0], adapter=FLAGS.adapter, precision=FLAGS.precision)
    interp.allocate_tensors()
    details = interp.get_input_details()
    if len(FLAGS.input) != len(details):
        raise UsageError(f"the model has {len(details)} input(s) "
                         f"({', '.join(d['name'] + str([int(v) for v in d['shape']]) for d in details)}); "
                         f"got {len(FLAGS.input)} --input")
    arrays = []
    for d, path in zip(details, FLAGS.input):
        try:
            x = load_input(path)
        except CheckInputError as e:
            raise UsageError(str(e)) from None
        shape, signature = [int(v) for v in d["shape"]], [int(v) for v in d["shape_signature"]]
        if list(x.shape) != shape:   # resized where the model leaves the dimension open (-1), as LiteRT's API does
            if len(x.shape) != len(signature) or any(s not in (-1, v) for s, v in zip(signature, x.shape)):
                open_dims = f" (its shape signature {signature}: a -1 may take any size)" if -1 in signature else ""
                raise UsageError(f"--input={path}: has shape {list(x.shape)}; the model's input {d['name']!r} "
                                 f"takes {shape}{open_dims}")
            interp.resize_tensor_input(d["index"], list(x.shape))
        arrays.append((d, path, x))
    interp.allocate_tensors()
    for d, path, x in arrays:
        try:
            interp.set_tensor(d["index"], x)
        except (TypeError, ValueError) as e:
            raise UsageError(f"--input={path}: {e}") from None
    interp.invoke()
    outputs = {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}
    print(f"adapter: {interp.device.describe()}")
    for name, value in outputs.items():
        stats = f", min {value.min():.6g}, max {value.max():.6g}" if value.size else ", empty"
        print(f"{name}: shape {list(value.shape)} {value.dtype}{stats}")
    if FLAGS.output:
        path = FLAGS.output if FLAGS.output.endswith(".npz") else FLAGS.output + ".npz"   # as numpy.savez names it
        np.savez(path, **outputs)
        print(f"wrote {path}")
    else:
        np.set_printoptions(threshold=50, edgeitems=3)
        for name, value in outputs.items():
            print(f"{name} =\n{value}")


def _shader_list():
    from .shader import catalog

    entries = catalog()
    if FLAGS.json:
        print(json.dumps(entries, indent=2, default=str))
        return
    for e in entries:
        ins = [f"{n}{'?' if i in e['optional_inputs'] else ''}{' (attribute)' if i in e['static_inputs'] else ''}"
               for i, n in enumerate(e["inputs"])]
        attrs = ", ".join(f"{k}={v!r}" if v is not None else k for k, v in e["attributes"].items())
        print(f"{e['key']:<28} inputs: {', '.join(ins) or '-'}; attributes: {attrs or '-'}")


def _shader_model():
    if not FLAGS.out:
        raise UsageError("usage: tflfuse shader --model=MODEL.tflite --out=DIR")
    from pathlib import Path

    from .shader import model_shaders

    files, manifest = model_shaders(FLAGS.model, target=FLAGS.target, precision=FLAGS.precision)
    out = Path(FLAGS.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    except OSError as e:
        raise UsageError(f"--out={FLAGS.out}: {e}") from None
    n_dispatch = sum(len(op["dispatches"]) for op in manifest["ops"])
    print(f"wrote {len(files)} distinct shaders for {len(manifest['ops'])} ops ({n_dispatch} dispatches) and "
          f"manifest.json to {out}")


def cmd_shader(args):
    if FLAGS.list:
        return _shader_list()
    if FLAGS.model:
        return _shader_model()
    if len(args) != 1 or FLAGS.shapes is None:
        raise UsageError('usage: tflfuse shader KEY --shapes="[[1,8,8,3],[4,3,3,3]]" [--attrs=k=v,...] [--json]'
                         ' | tflfuse shader --list | tflfuse shader --model=MODEL.tflite --out=DIR')
    from .shader import get_shader

    try:
        shapes = json.loads(FLAGS.shapes)
    except json.JSONDecodeError as e:
        raise UsageError(f"--shapes is not a JSON list of shapes: {e}") from None
    try:
        info = get_shader(args[0], shapes, _parse_attrs(FLAGS.attrs), precision=FLAGS.precision)
    except TypeError as e:  # --shapes parsed as JSON but is not a list of lists of ints
        raise UsageError(f"--shapes: {e}") from None
    if FLAGS.json:
        print(json.dumps(info.to_dict(), indent=2))
    else:
        for p in info.programs:
            print(p.wgsl)


def cmd_adapters(args):
    """Lists wgpu-native's adapters (tflfuse's default WebGPU implementation), then, where the package wgpudawn is
    installed, Dawn's (``Device(backend="dawn")``), each with its type and backend; a Dawn adapter also says whether
    it offers subgroup matrices (the feature the float16 plan's products use)."""
    from .runtime import device as device_module

    device_module.prepare_wgpu()
    import wgpu

    for a in wgpu.gpu.enumerate_adapters_sync():
        i = a.info
        print(f"{i['device']}  [{i['adapter_type']}, {i['backend_type']}]")
    try:
        dawn = device_module._dawn()
    except device_module.NoAdapterError:   # wgpudawn is not installed: wgpu-native is the only implementation
        return
    why = ""
    try:
        adapters = device_module.adapters_of(dawn, "dawn")
    except Exception as e:   # as wgpu-native, Dawn raises plain Exceptions ("No supported adapters")
        adapters, why = [], f" ({e})"
    if not adapters:
        print(f"Dawn (backend='dawn'): no adapter here{why}. {device_module._install_hint('dawn')}")
    for a in adapters:
        i = a.info
        matrices = ", subgroup matrices" if device_module.SUBGROUP_MATRIX_FEATURE in a.features else ""
        print(f"{i['device']}  [{i['adapter_type']}, {i['backend_type']}, Dawn{matrices}]")


#: check's flags that, when given, override an expectations file's or manifest's values.
_CHECK_OVERRIDES = ("allow_op", "samples", "seed", "input", "atol", "rtol", "perf", "perf_slack", "repeats",
                    "import_modules", "adapter", "allow_no_numerics")


def cmd_check(args):
    from . import check, check_config, check_report

    usage = ("usage: tflfuse check SOURCE [--expect=NAME=COUNT ...] [--expectations=FILE.toml] [--report_dir=DIR]"
             " | tflfuse check --manifest=MODELS.toml [--shard=I/N] [--jobs=N] [--report_dir=DIR]")
    if bool(FLAGS.manifest) == bool(args) or len(args) > 1:
        raise UsageError(usage)
    if FLAGS.shard and not FLAGS.manifest:
        raise UsageError("--shard applies to --manifest")
    names = {"allow_op": "allow_ops", "input": "inputs"}
    overrides = {names.get(k, k): (tuple(FLAGS[k].value) if isinstance(FLAGS[k].value, list) else FLAGS[k].value)
                 for k in _CHECK_OVERRIDES if FLAGS[k].present}
    try:
        if FLAGS.expect:
            overrides["expect"] = [check_config.parse_expectation(e) for e in FLAGS.expect]
        if FLAGS.manifest:
            if FLAGS.expectations:
                raise check_config.CheckInputError("--expectations applies to one SOURCE; a manifest names its own")
            shard = check_config.parse_shard(FLAGS.shard) if FLAGS.shard else None
            options = check_config.load_manifest(FLAGS.manifest, overrides)
            if shard:
                options = check_config.select_shard(options, shard)
                print(f"shard {shard[0]}/{shard[1]}: {len(options)} model(s): {', '.join(o.name for o in options)}")
        else:
            settings = check_config.load_expectations(FLAGS.expectations) if FLAGS.expectations else {}
            options = [check_config.make_options({**settings, "source": args[0]}, overrides)]
    except check_config.CheckInputError as e:
        raise UsageError(str(e)) from None
    if FLAGS.report_dir:   # made before the checks run, so that a path that cannot be a folder loses no report
        try:
            Path(FLAGS.report_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--report_dir={FLAGS.report_dir}: cannot be made a folder for the reports: "
                             f"{e.strerror or e}") from None
    reports = check.check_many(options, jobs=FLAGS.jobs)
    for line in check_report.text_lines(reports):
        print(line)
    if FLAGS.report_dir:
        written = check_report.write_reports(reports, FLAGS.report_dir, per_model=bool(FLAGS.manifest))
        print(f"wrote {len(written)} report files to {FLAGS.report_dir} (report.json, junit.xml, summary.md)")
    for line in check_report.verdict_lines(reports):
        print(line)
    return check_report.exit_status(reports)


_COMMANDS = {"demo": cmd_demo, "convert": cmd_convert, "run": cmd_run, "ops": cmd_ops, "check": cmd_check,
             "fuse": cmd_fuse, "unfuse": cmd_unfuse, "export": cmd_export, "shader": cmd_shader,
             "adapters": cmd_adapters}


def _quiet_tensorflow() -> None:
    """Sets ``TF_CPP_MIN_LOG_LEVEL`` (unless the user set it) before anything loads TensorFlow: its C++ logs
    (the CPU-feature banner, the converter's and the SavedModel loader's INFO and WARNING lines) follow
    ``--verbosity`` (absl's levels: 0 INFO, -1 WARNING, -2 ERROR), and are errors only by default.

    Where INFO lines are hidden this way, ``TF_ENABLE_ONEDNN_OPTS=0`` is set too (unless the user set it):
    TensorFlow 2.21 turns its oneDNN kernels on by itself on CPUs with AVX512_VNNI, AVX_VNNI or AMX and then
    logs a banner saying so, whatever ``TF_CPP_MIN_LOG_LEVEL`` says. With it off, TensorFlow computes with
    the same kernels on every x86 CPU, so a conversion does not depend on the CPU's instruction set either."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    level = FLAGS["verbosity"].value if FLAGS["verbosity"].present else -2
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = str(min(3, max(0, -level)))
    if level < 0:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _stdout_closed() -> int:
    """The reader of stdout went away (``tflfuse ops MODEL | head``): no traceback, no error line, and the
    exit status of a process that SIGPIPE ends (128 + 13), as other Unix tools give."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # Python's final flush of stdout then goes nowhere
    except (OSError, ValueError):
        pass
    return 141


def main(argv):
    if not FLAGS["verbosity"].present:  # absl logs INFO by default; the commands print what matters
        absl_logging.set_verbosity(absl_logging.WARNING)
    _quiet_tensorflow()
    if len(argv) < 2 or argv[1] not in _COMMANDS:
        if len(argv) >= 2:
            print(f"error: unknown command {argv[1]!r}; the commands are {', '.join(_COMMANDS)}", file=sys.stderr)
        print(_USAGE, file=sys.stderr)
        return 2
    from .kernels import KernelError
    from .model import ModelError
    from .runtime import NoAdapterError

    try:
        # check imports them in each model's process (with a manifest's own), where its report records a failure
        if argv[1] in _FLAG_COMMANDS["import_modules"][0] and argv[1] != "check":
            _import_modules()
        status = _COMMANDS[argv[1]](argv[2:]) or 0
        sys.stdout.flush()   # a reader gone shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:   # before OSError, of which it is one: the reader stopped reading, nothing failed
        return _stdout_closed()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ModelError, KernelError, OSError, NoAdapterError) as e:  # OSError: a missing file, a directory...
        print(f"error: {e}", file=sys.stderr)
        return 2


_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")
_FULL_HELP_FLAGS = ("--helpfull", "-helpfull")
_XML_HELP_FLAGS = ("--helpxml", "-helpxml")


def _command_of(args: list[str]) -> str | None:
    """The first positional argument (the command) of ``args``, skipping flags and the values of flags given as
    ``--flag VALUE``; None when there is none."""
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-") and len(a) > 1:
            name = a.lstrip("-")
            skip = "=" not in name and name in FLAGS and not FLAGS[name].boolean
        else:
            return a
    return None


def _synopsis(command: str | None) -> str:
    """The usage block of the module docstring, or only ``command``'s lines of it (with their continuations)."""
    if command is None:
        return _USAGE
    lines, keep = [], False
    for line in _USAGE.splitlines():
        if not line.startswith("        "):   # a new entry: keep it if it is this command's
            keep = line.strip().startswith(f"tflfuse {command} ") or line.strip() == f"tflfuse {command}"
        if keep:
            lines.append(line)
    return "\n".join(lines)


def help_text(command: str | None = None) -> str:
    """The text of ``tflfuse --help`` or ``tflfuse COMMAND --help``. absl's own flags stay behind ``--helpfull``.

    Args:
      command: None for the whole usage and every command's flags, grouped per command; a command name for its
        synopsis and flags only.
    Returns:
      The text, ending with the exit statuses.
    """
    import textwrap

    out = ["usage:", _synopsis(command), ""]
    for cmd in [command] if command else list(_COMMANDS):
        names = [n for n, (cmds, _) in _FLAG_COMMANDS.items() if cmd in cmds]
        out.append(f"tflfuse {cmd} flags:" if names else f"tflfuse {cmd}: no flags")
        for name in names:
            flag, text = FLAGS[name], _FLAG_COMMANDS[name][1]
            notes = []
            if isinstance(flag, flags.MultiFlag):
                notes.append("repeatable")
            if getattr(flag.parser, "enum_values", None):
                notes.append("one of " + "|".join(flag.parser.enum_values))
            default = flag.default
            if isinstance(default, list):
                default = ",".join(map(str, default))
            if default not in (None, "") and default is not False:
                notes.append(f"default {default}")
            out += textwrap.wrap(f"--{name}: {text}" + (f" ({'; '.join(notes)})" if notes else ""), 112,
                                 initial_indent="  ", subsequent_indent="      ")
        out.append("")
    out.append(__doc__.split("\n\n")[2].strip())
    return "\n".join(out)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a bad flag reported in one line and exit status 2 (absl's own: 1).

    ``--help`` (``-h``) prints :func:`help_text` to stdout, ``--helpfull`` that and every flag absl knows
    (its own included), ``--helpxml`` absl's XML listing; each exits 0. An unknown command with any of them is
    an error naming it (exit 2).
    """
    args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    asked = [a for a in args if a in _HELP_FLAGS + _FULL_HELP_FLAGS + _XML_HELP_FLAGS]
    if asked:
        command = _command_of(args)
        if command is not None and command not in _COMMANDS:
            print(f"error: unknown command {command!r}; the commands are {', '.join(_COMMANDS)} (see tflfuse "
                  f"--help)", file=sys.stderr)
            sys.exit(2)
        if asked[0] in _XML_HELP_FLAGS:
            FLAGS.write_help_in_xml_format(sys.stdout)
        else:
            print(help_text(command))
            if asked[0] in _FULL_HELP_FLAGS:
                print(f"\nEvery flag, absl's own included:\n{FLAGS.get_help()}")
        sys.exit(0)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}; see --help", file=sys.stderr)
        sys.exit(2)


def run_main():
    """Console-script entry point."""
    sys.modules["__main__"].__doc__ = __doc__  # absl's --help prints the main module's docstring
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run_main()

"""``convert()``: TensorFlow model -> .tflite bytes, with a fusion report that is checked, not assumed.

The TFLite converter (``tf.lite.TFLiteConverter``, ``allow_custom_ops=True``, float32, no
optimizations, so weights stay float32) turns each call of a :func:`tflfuse.composite`
function into one custom op. :func:`convert` counts the annotated call sites in the traced graph(s)
(``tf.function``s whose ``_implements`` attribute carries ``tfl_fusable_op``, found by walking the
graph and its function library) and the custom ops of each name in the resulting file
(:class:`tflfuse.model.Model`), and raises :class:`FusionError` when the two disagree.

Two forms of fused op (``fused_op_format``):

* ``"custom"`` (default): a custom op whose custom code is the composite's name and whose custom options
  are its attributes (a flexbuffer map). Only tflfuse runs it.
* ``"composite"``: a ``STABLEHLO_COMPOSITE`` op named after the composite, with the same attributes and a
  decomposition subgraph of builtins (the composite's body converted alone,
  :func:`tflfuse.passes.portable.to_composite_format`). Stock LiteRT runs the decomposition; tflfuse runs
  its fused kernel.

Outputs of a fused op that no op and no signature output reads are pruned after the converter
(:mod:`tflfuse.passes.prune`): ``fused_lstm`` / ``fused_gru`` get ``return_sequences`` / ``return_state``
off where the sequence / the states are unused (so an LSTM whose states are unused can become the builtin
UNIDIRECTIONAL_SEQUENCE_LSTM); any other unused output becomes tensor index -1 (the schema's omitted
optional tensor) in the custom form, which tflfuse computes into a buffer of its own. The composite form
keeps those (an LSTM's ``h`` when only ``c`` is read; a user composite's unused output) as tensors nothing
reads: LiteRT 2.3's STABLEHLO_COMPOSITE kernel binds every op output to the decomposition's, and crashes on
an absent one.

Quantization (``quantization``), as TensorFlow 2.21's converter does it for a model with composites:

* ``"float16"``: weights stored as float16, each followed by a DEQUANTIZE to float32, the fused op's
  weights included; every op, the fused one too, computes in float32 (tflfuse folds the DEQUANTIZEs at
  load, LiteRT once at its first invoke).
* ``"dynamic"`` (``optimizations=[DEFAULT]`` alone): refused for a model with composites. The converter
  makes CONV_2D and FULLY_CONNECTED hybrid ops (int8 weights, activations quantized at run time) but leaves
  each fused op float32 with float32 weights: a half-quantized file.
* ``"int8"`` (full-integer with a representative dataset): for a Keras model with composites, the converter
  calibrates through the composites' bodies (the model is traced again inside
  :func:`tflfuse.annotate.annotations_disabled`, so the bodies convert as int8 builtins; the TFLite interpreter
  that calibrates has no kernel for a fused custom op), and then each int8 builtin chain of a ``fused_bottleneck``
  becomes one int8 fused op (:mod:`tflfuse.passes.fuse_int8`): it reads the chain's int8 tensors (filters
  per-channel, biases int32, in the builtins' layouts) and carries the intermediate tensors' scales and zero
  points as attributes; in the ``"composite"`` format its decomposition is the int8 builtin chain itself, which
  stock LiteRT runs. The annotated calls traced are counted as for float, and every one must become an int8
  fused op, whatever ``check``: a composite without an int8 form (:data:`INT8_COMPOSITES` lists those with one;
  a squeeze-excite or hard_swish bottleneck) raises :class:`ConversionError` naming it rather than staying
  builtins. A SavedModel or concrete functions with composites cannot be traced again and are refused.

This module imports TensorFlow (the converter side); ``import tflfuse`` does not load it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
import types
from pathlib import Path
from typing import Any, Mapping, Sequence

from absl import logging

from .annotate import FUSABLE_KEY, annotations_disabled, registry
from .conversion_quant import (INT8_COMPOSITES, QUANTIZATIONS, check_fused_float, check_int8_fused,
                               check_quantization, quantize, refuse_quantization)
from .model import Model
from .passes import apply_lowerings
from .passes.prune import prune_unused_outputs

__all__ = ["CompositeCount", "ConversionError", "ConversionResult", "FUSED_OP_FORMATS", "FusionError",
           "FusionReport", "INT8_COMPOSITES", "QUANTIZATIONS", "convert"]

#: The forms a fused op can take in the file (module docstring).
FUSED_OP_FORMATS = ("custom", "composite")

#: Ops that hold weights in resource variables instead of constants.
_VARIABLE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


class ConversionError(RuntimeError):
    """The converter produced a .tflite that cannot be used as a model (e.g. unfrozen weights)."""


class FusionError(RuntimeError):
    """An annotated composite call did not become exactly one fused op of the .tflite.

    Attributes:
      report: the :class:`FusionReport` of the conversion.
      tflite: the converted bytes, for inspection.
    """

    def __init__(self, message: str, report: "FusionReport", tflite: bytes):
        super().__init__(message)
        self.report = report
        self.tflite = tflite


@dataclasses.dataclass(frozen=True)
class CompositeCount:
    """One composite's counts: annotated call sites traced, and custom ops of its name in the file."""

    name: str
    traced: int
    fused: int

    @property
    def ok(self) -> bool:
        return self.traced == self.fused


@dataclasses.dataclass(frozen=True)
class FusionReport:
    """What a conversion fused.

    Attributes:
      composites: composite name -> :class:`CompositeCount`, for every composite traced or found in the file.
      op_counts: op name (``CONV_2D``, or a custom op's code) -> number of such ops in the file, over all
        subgraphs, fused composites included.
      annotations: whether the model was traced with annotations.
      seconds: wall time of tracing and conversion.
      fused_op_format: ``"custom"`` or ``"composite"`` (a STABLEHLO_COMPOSITE counts under its composite's
        name, and the ops of decomposition subgraphs are not counted).
      quantization: the ``quantization`` of the conversion (None: float32).
    """

    composites: Mapping[str, CompositeCount]
    op_counts: Mapping[str, int]
    annotations: bool
    seconds: float
    fused_op_format: str = "custom"
    quantization: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every annotated call became exactly one fused op."""
        return all(c.ok for c in self.composites.values())

    @property
    def mismatches(self) -> list[CompositeCount]:
        return [c for c in self.composites.values() if not c.ok]

    def fused(self, name: str) -> int:
        """Number of ``name`` ops in the file (0 if none), counting those lowered to a TFLite builtin."""
        if name in self.composites:
            return self.composites[name].fused
        return self.op_counts.get(name, 0)

    @property
    def other_ops(self) -> dict[str, int]:
        """Op counts of everything that is not a composite."""
        return {k: v for k, v in self.op_counts.items() if k not in self.composites}

    def __str__(self) -> str:
        rows = [("composite", "traced", "fused")]
        rows += [(c.name, str(c.traced), str(c.fused) + ("" if c.ok else "  <-- mismatch"))
                 for c in sorted(self.composites.values(), key=lambda c: c.name)]
        if len(rows) == 1:
            rows.append(("(none)", "0", "0"))
        rows.append(("", "", ""))
        rows.append(("other op", "", "count"))
        rows += [(k, "", str(v)) for k, v in sorted(self.other_ops.items(), key=lambda kv: (-kv[1], kv[0]))]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows]
        total = sum(self.op_counts.values())
        quantized = f", {self.quantization} quantization" if self.quantization else ""
        lines.append(f"{total} ops, annotations {'on' if self.annotations else 'off'}, fused ops as "
                     f"{self.fused_op_format}{quantized}, converted in {self.seconds:.2f} s")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ConversionResult:
    """The converted model and its report."""

    tflite: bytes
    report: FusionReport

    def model(self) -> Model:
        """The .tflite parsed by :class:`tflfuse.model.Model`."""
        return Model(self.tflite)

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the .tflite to ``path`` and returns it as a Path."""
        path = Path(path)
        path.write_bytes(self.tflite)
        return path


# ---- counting annotated calls in a traced graph ------------------------------------------------------
def fold_stems(tflite: bytes) -> bytes:
    """A network's stem folded into the ``fused_bottleneck`` after it (:func:`tflfuse.passes.fuse.fuse`'s
    ``stem_block`` pattern: a CONV_2D 3x3 of stride 2 over an image's channels whose output only an expansion-free
    block reads, as ``composites``' MobileNetV2 converts), the custom form only: the composite form's
    decompositions are the composites' own bodies. A file the pass cannot plan is returned as it is (the pass is
    tuning only; the report's counts of annotated calls and fused ops do not change)."""
    from .kernels import KernelError
    from .passes.fuse import fuse

    if b"fused_bottleneck" not in tflite:
        return tflite
    try:
        folded, _ = fuse(tflite, patterns=["stem_block"])
    except (KernelError, ValueError) as e:   # ModelError is a ValueError
        logging.debug("stems left unfolded: %s", e)
        return tflite
    return folded


def _fusable_name(fdef) -> str | None:
    """The composite name of a FunctionDef annotated for fusion, else None."""
    attr = fdef.attr.get("_implements")
    if attr is None:
        return None
    if attr.HasField("func"):
        nal = attr.func
    elif attr.s:
        from google.protobuf import text_format
        from tensorflow.core.framework import attr_value_pb2

        nal = attr_value_pb2.NameAttrList()
        try:
            text_format.Parse(attr.s.decode("utf-8"), nal)
        except text_format.ParseError:
            return None
    else:
        return None
    fusable = nal.attr.get(FUSABLE_KEY)
    return nal.name if fusable is not None and fusable.b else None


def annotated_calls(graph_def) -> collections.Counter:
    """Counts the annotated call sites reachable from a GraphDef's nodes, through its function library.

    A call of a function annotated with ``tfl_fusable_op`` counts once under its composite name and is
    not looked into; calls of other functions (``PartitionedCall``, control-flow branches and bodies,
    any function-valued attribute) count what those functions contain.

    Args:
      graph_def: a ``tf.compat.v1.GraphDef`` with its library (``ConcreteFunction.graph.as_graph_def()``).

    Returns:
      ``collections.Counter`` {composite name: call sites}.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    memo: dict[str, collections.Counter] = {}

    def of_function(fname: str) -> collections.Counter:
        fdef = library.get(fname)
        if fdef is None:
            return collections.Counter()
        name = _fusable_name(fdef)
        if name is not None:
            return collections.Counter({name: 1})
        if fname not in memo:
            memo[fname] = collections.Counter()  # guards against recursion
            memo[fname] = of_nodes(fdef.node_def)
        return memo[fname]

    def of_nodes(nodes) -> collections.Counter:
        total: collections.Counter = collections.Counter()
        for node in nodes:
            if node.op in library:
                total.update(of_function(node.op))
            for value in node.attr.values():
                if value.HasField("func"):
                    total.update(of_function(value.func.name))
                for f in value.list.func:
                    total.update(of_function(f.name))
        return total

    return of_nodes(graph_def.node)


# ---- model kinds -------------------------------------------------------------------------------------
def _keras_function(model, batch_size: int | None):
    """A concrete function of ``model(x, training=False)`` with static shapes and named inputs/outputs."""
    import tensorflow as tf

    try:
        structure = model.input
    except (AttributeError, ValueError) as e:
        raise ValueError(f"model {model.name!r} has no symbolic inputs to take a signature from (a "
                         f"subclassed model?): build it functionally from keras.Input, or pass a concrete "
                         f"function ({type(e).__name__}: {e})") from e
    specs = []
    for t in tf.nest.flatten(structure):
        shape = list(t.shape)
        name = t.name
        if shape and shape[0] is not None and batch_size is not None and shape[0] != batch_size:
            raise ValueError(f"batch_size={batch_size}, but model input {name!r} has a fixed batch size "
                             f"{shape[0]}")
        if shape:
            shape[0] = shape[0] if shape[0] is not None else (batch_size or 1)
        unknown = [i for i, d in enumerate(shape) if d is None]
        if unknown:
            raise ValueError(f"model input {name!r} has shape {tuple(t.shape)}, unknown at axis "
                             f"{unknown[0]}; build the model with a static input shape "
                             f"(keras.Input(shape=...))")
        specs.append(tf.TensorSpec(shape, t.dtype, name=name))
    output_names = _unique(list(getattr(model, "output_names", None) or []))

    def serve(*xs):
        y = model(tf.nest.pack_sequence_as(structure, list(xs)), training=False)
        if isinstance(y, Mapping):
            return dict(y)
        ys = tf.nest.flatten(y)
        names = output_names if len(output_names) == len(ys) else [f"output_{i}" for i in range(len(ys))]
        return dict(zip(names, ys))

    serve.__name__ = "serving_default"
    return tf.function(serve, input_signature=specs, autograph=False).get_concrete_function()


def _unique(names: list[str]) -> list[str]:
    """Keras names every output of one layer after the layer (an LSTM's sequence and states are all
    ``"lstm"``): repeats get ``_1``, ``_2``... so that no output is lost in the signature's dict."""
    seen: collections.Counter = collections.Counter(names)
    count: collections.Counter = collections.Counter()
    out = []
    for name in names:
        if seen[name] > 1:
            while True:
                count[name] += 1
                candidate = name if count[name] == 1 else f"{name}_{count[name] - 1}"
                if candidate not in seen or candidate == name:
                    break
            out.append(candidate)
        else:
            out.append(name)
    return out


def _from_functions(funcs: Sequence[Any]):
    import tensorflow as tf

    holder = tf.Module()  # the converter saves the functions: their variables must be tracked
    seen: dict[int, Any] = {}
    for f in funcs:
        for v in f.variables:
            seen.setdefault(id(v), v)
    holder.captured_variables = list(seen.values())
    return tf.lite.TFLiteConverter.from_concrete_functions(list(funcs), holder)


def _saved_model_counts(path: str, signature_keys: Sequence[str] | None) -> dict[str, collections.Counter]:
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    keys = list(signature_keys) if signature_keys else list(loaded.signatures.keys())
    counts = {}
    for key in keys:
        if key not in loaded.signatures:
            raise ValueError(f"signature_keys: {key!r} is not a signature of {path!r}; it has "
                             f"{sorted(loaded.signatures.keys())}")
        counts[key] = annotated_calls(loaded.signatures[key].graph.as_graph_def())
    return counts


def _traced_in_file(traced: dict[str, collections.Counter], model: Model) -> collections.Counter:
    """Sums the counts of the signatures the converter kept (one of several that share a function)."""
    present = [k for k in model.signature_defs() if k in traced]
    total: collections.Counter = collections.Counter()
    for key in present or list(traced):
        total.update(traced[key])
    return total


def _op_counts(m: Model) -> collections.Counter:
    """Op name -> count over the subgraphs that are not decompositions; a STABLEHLO_COMPOSITE counts under
    its composite's name."""
    skip = m.decompositions()
    counts: collections.Counter = collections.Counter()
    for sg in range(len(m.subgraphs)):
        if sg not in skip:
            for i, name in enumerate(m.op_names(sg)):
                comp = m.composite(sg, i)
                counts[comp.name if comp is not None else name] += 1
    return counts


def _is_keras_model(model) -> bool:
    try:
        import keras
    except ImportError:
        return False
    return isinstance(model, keras.Model)


def convert(model: Any, *, annotations: bool = True, signature_keys: Sequence[str] | None = None,
            batch_size: int | None = None, check: bool = True, fused_op_format: str = "custom",
            quantization: str | None = None, representative_dataset=None) -> ConversionResult:
    """Converts a TensorFlow model to .tflite, fusing each annotated composite call into one fused op.

    Args:
      model: a Keras 3 ``keras.Model`` (traced here as ``model(x, training=False)`` with static input shapes;
        the file's ``serving_default`` signature names its inputs after the model's inputs and its outputs
        after ``model.output_names``), a SavedModel directory (str or PathLike), or a list of
        ``tf.function`` concrete functions.
      annotations: False traces a Keras model inside :func:`tflfuse.annotate.annotations_disabled`, so
        composite bodies convert as plain builtins (the unfused baseline). Only a Keras model can be
        retraced: for the others this must stay True (trace or save them inside
        ``annotations_disabled()`` instead).
      signature_keys: the SavedModel signatures to convert (default: all). Only for a SavedModel.
      batch_size: the batch dimension of a Keras model whose batch is unknown (default 1).
      check: raise :class:`FusionError` when an annotated call did not become exactly one fused op.
      fused_op_format: ``"custom"`` (a custom op named after the composite: tflfuse runs it) or
        ``"composite"`` (a STABLEHLO_COMPOSITE with a decomposition subgraph: stock LiteRT runs it too);
        see the module docstring.
      quantization: None (float32), ``"float16"`` (float16 weights dequantized to float32 before each op,
        fused ops included), ``"dynamic"`` (TFLite's dynamic-range quantization; refused for a model with
        composites) or ``"int8"`` (full-integer post-training quantization: int8 tensors throughout, float32
        input and output behind QUANTIZE/DEQUANTIZE; each ``fused_bottleneck`` call becomes one int8 fused op,
        calibrated through its body; see the module docstring).
      representative_dataset: for ``"int8"``: a callable returning an iterable of input lists.

    Returns:
      :class:`ConversionResult` with ``.tflite`` (bytes) and ``.report`` (:class:`FusionReport`).

    Raises:
      TypeError: ``model`` is none of the kinds above (e.g. a ``tf.function`` not made concrete).
      ValueError: ``annotations=False`` or ``batch_size`` for a model that is not Keras; ``signature_keys``
        not in the SavedModel or given for another kind; a Keras input of unknown shape; a bad ``batch_size``.
      FileNotFoundError: a SavedModel path without ``saved_model.pb``.
      ConversionError: the .tflite keeps weights in resource variables (VAR_HANDLE/READ_VARIABLE ops);
        ``quantization="dynamic"`` for a model with composites; ``"int8"`` for a SavedModel or concrete
        functions with composites, for a composite without an int8 form (named), or where an annotated call did
        not become one int8 fused op (named, with both counts); a float fused op reading or writing anything but
        float32; with ``fused_op_format="composite"``, a composite whose body cannot be a
        decomposition (a method needing ``self``, a body that does not trace alone at the op's shapes or
        does not convert to builtins).
      FusionError: with ``check``, the traced annotated calls and the fused ops in the file differ for
        some composite (its message names each such composite and both counts).
    """
    import tensorflow as tf

    if not isinstance(annotations, bool):
        raise TypeError(f"annotations must be a bool, got {annotations!r}")
    if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if fused_op_format not in FUSED_OP_FORMATS:
        raise ValueError(f"fused_op_format must be one of {FUSED_OP_FORMATS}, got {fused_op_format!r}")
    check_quantization(quantization, representative_dataset)
    start = time.perf_counter()
    if _is_keras_model(model):
        if signature_keys is not None:
            raise ValueError("signature_keys applies to a SavedModel; a Keras model converts one "
                             "'serving_default' signature")
        with annotations_disabled() if not annotations else contextlib.nullcontext():
            funcs = [_keras_function(model, batch_size)]
        kind = "Keras model"
    elif isinstance(model, (str, os.PathLike)):
        kind = "SavedModel"
        path = os.fspath(model)
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise FileNotFoundError(f"model {path!r} is not a SavedModel directory (no saved_model.pb)")
        funcs = None
    elif isinstance(model, tf.types.experimental.ConcreteFunction) or (
            isinstance(model, (list, tuple)) and model
            and all(isinstance(f, tf.types.experimental.ConcreteFunction) for f in model)):
        if signature_keys is not None:
            raise ValueError("signature_keys applies to a SavedModel, not to concrete functions")
        funcs = list(model) if isinstance(model, (list, tuple)) else [model]
        kind = "concrete functions"
        names = [f.graph.name for f in funcs]
        if len(funcs) > 1 and len(set(names)) < len(names):  # the converter would keep one per name
            raise ValueError(f"the concrete functions' names {names} repeat; the converter names a signature "
                             f"after its function, so give each tf.function its own name")
    else:
        hint = (" call .get_concrete_function(...) on it first" if hasattr(model, "get_concrete_function")
                else "")
        raise TypeError(f"model must be a keras.Model, a SavedModel directory or a list of concrete "
                        f"functions, got {type(model).__name__}{hint}")
    if kind != "Keras model" and not annotations:
        raise ValueError(f"annotations=False needs a Keras model, which convert() can trace again; "
                         f"the {kind} given here is already traced. Trace (or save) it inside "
                         f"tflfuse.annotate.annotations_disabled() instead")
    if kind != "Keras model" and batch_size is not None:
        raise ValueError(f"batch_size applies to a Keras model, not to a {kind}")

    if funcs is None:
        traced_by_key = _saved_model_counts(path, signature_keys)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            path, signature_keys=list(signature_keys) if signature_keys else None)
    else:  # the converter's signature keys for concrete functions
        keys = ["serving_default"] if len(funcs) == 1 else [f.graph.name for f in funcs]
        traced_by_key = {k: annotated_calls(f.graph.as_graph_def()) for k, f in zip(keys, funcs)}
        converter = _from_functions(funcs)
    every: collections.Counter = collections.Counter()
    for counts in traced_by_key.values():
        every.update(counts)
    if quantization in ("dynamic", "int8"):
        refuse_quantization(quantization, kind, every)
    int8_fused = quantization == "int8" and any(every.values())
    if int8_fused:   # calibrate through the bodies: the converter runs them as builtins, fused after it
        with annotations_disabled():
            converter = _from_functions([_keras_function(model, batch_size)])
    converter.allow_custom_ops = True
    quantize(converter, quantization, representative_dataset)
    try:
        tflite = bytes(converter.convert())
    except Exception as e:
        if quantization != "int8":
            raise
        raise ConversionError(f"quantization='int8': the converter could not quantize every op to int8 "
                              f"({type(e).__name__}: {str(e)[:600]})") from e
    lowered: collections.Counter = collections.Counter()
    if int8_fused:
        from .passes.fuse_int8 import fuse_int8_bottlenecks

        tflite, _ = fuse_int8_bottlenecks(tflite, fused_op_format)
    else:
        # Outputs of fused ops that nothing reads: dropped through the attributes (an LSTM's unused states), else
        # made absent (-1) in the custom form; LiteRT's STABLEHLO_COMPOSITE kernel needs every output (module doc).
        tflite, _ = prune_unused_outputs(tflite, set(registry()) | {n for c in traced_by_key.values() for n in c},
                                         absent=fused_op_format == "custom")
        tflite, lowered = apply_lowerings(tflite)  # fused ops that have a TFLite builtin become that builtin
        if fused_op_format == "custom":
            tflite = fold_stems(tflite)
    if fused_op_format == "composite" and not int8_fused:
        from .passes.portable import to_composite_format

        tflite, _ = to_composite_format(tflite)
    seconds = time.perf_counter() - start

    m = Model(tflite)
    traced = _traced_in_file(traced_by_key, m)
    op_counts = _op_counts(m)
    if fused_op_format == "composite":
        left = sorted({n for sg in range(len(m.subgraphs)) for n in m.op_names(sg)} & set(traced))
        if left:
            raise ConversionError(
                f"fused_op_format='composite': composite(s) {left} are not defined in this process "
                f"(tflfuse.annotate.registry() lacks them), so their bodies cannot be converted into "
                f"decompositions; import the module(s) that define them before converting (the CLI: "
                f"--import_modules=MODULE)")
    names = set(traced) | (set(op_counts) & set(registry())) | set(lowered)
    composites = {n: CompositeCount(n, traced.get(n, 0), op_counts.get(n, 0) + lowered.get(n, 0))
                  for n in sorted(names)}
    report = FusionReport(composites=types.MappingProxyType(composites),
                          op_counts=types.MappingProxyType(dict(op_counts)), annotations=annotations,
                          seconds=seconds, fused_op_format=fused_op_format, quantization=quantization)
    logging.info("converted %s:\n%s", kind, report)
    unfrozen = sorted(set(op_counts) & _VARIABLE_OPS)
    if unfrozen:
        raise ConversionError(
            f"the converted {kind} keeps its weights in resource variables ({', '.join(unfrozen)} ops): the "
            f"converter did not freeze them, and such a .tflite runs nowhere without them. A Keras 3 model "
            f"saved with tf.saved_model.save() does this; save it with model.export(DIR) instead, or pass the "
            f"Keras model itself to convert().")
    if quantization is not None:
        check_fused_float(m, INT8_COMPOSITES if int8_fused else frozenset())
    if int8_fused:
        check_int8_fused(report)
    if check and not report.ok:
        lines = [f"composite {c.name!r}: {c.traced} annotated call(s) traced, {c.fused} {c.name!r} op(s) in "
                 f"the .tflite" for c in report.mismatches]
        raise FusionError(
            "annotated calls did not each become one fused op:\n  " + "\n  ".join(lines) +
            "\nThe converter drops a call whose result is unused, and inlines every call when it cannot save "
            "the model's functions (e.g. untracked variables). The error's .report and .tflite hold the "
            "conversion.", report, tflite)
    return ConversionResult(tflite=tflite, report=report)

"""The portable form of fused ops: each composite's custom op becomes a ``STABLEHLO_COMPOSITE``.

A ``STABLEHLO_COMPOSITE`` op carries a name, attributes (a flexbuffer map) and the index of a
*decomposition* subgraph that computes the op from builtins. A runtime that knows the name may run its own
kernel; any other (stock LiteRT) runs the decomposition. :func:`to_composite_format` rewrites every custom op
of a file whose name is a registered :func:`tflfuse.composite` this way:

* the decomposition is the composite's body alone (``registry()[name].function`` with the op's attributes),
  traced inside :func:`tflfuse.annotate.annotations_disabled` with every op input (the weights included) as
  an input of its own, at the op's input shapes and dtypes, and converted by the TFLite converter (builtins
  only); its subgraph, tensors, buffers and operator codes are spliced into the file; an output of it that is
  not a tensor of its own written by one of its ops (a tensor returned twice, an input returned as it is, a
  constant) gets a copy through a RESHAPE to its own shape, which LiteRT and tflfuse run exactly;
* the op keeps its inputs (the weights stay constants of the calling subgraph) and outputs;
  ``StableHLOCompositeOptions`` hold ``name`` (the composite's name), ``decomposition_subgraph_index``,
  ``composite_attributes`` (the custom op's flexbuffer map unchanged, :func:`tflfuse.annotate.decode_attrs`
  reads it) with ``composite_attributes_format`` FLEXBUFFERS, and ``version`` 0 (StableHLO's default);
* ops of one name with the same attributes and input shapes share one decomposition subgraph.

:func:`inline_composites` is the runtime's side: a ``STABLEHLO_COMPOSITE`` without a tflfuse kernel is replaced
by the ops of its decomposition subgraph.

This module is not a lowering: :func:`tflfuse.convert` calls :func:`to_composite_format` for
``fused_op_format="composite"``. It imports TensorFlow only inside :func:`to_composite_format`.
"""

from __future__ import annotations

import collections
import copy
import inspect
import itertools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import logging
from ai_edge_litert import schema_py_generated as schema

__all__ = ["COMPOSITE_VERSION", "inline_composites", "to_composite_format"]

#: ``StableHLOCompositeOptions.version`` written (StableHLO's default composite version).
COMPOSITE_VERSION = 0
#: The most ways of placing ``None`` arguments tried when an op has fewer inputs than the body parameters.
_MAX_PLACEMENTS = 256
_NP_TO_TF = {"float32": "float32", "float16": "float16", "int32": "int32", "int64": "int64", "int8": "int8",
             "uint8": "uint8", "int16": "int16", "bool": "bool", "float64": "float64"}


def _error(message: str) -> Exception:
    from ..conversion import ConversionError   # conversion imports this package: import when raising

    return ConversionError(message)


# ---- the body as a TensorFlow function ------------------------------------------------------------------
def _where(spec) -> str:
    fn = spec.function
    return f"composite {spec.name!r} ({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)})"


def _placements(spec, n_inputs: int) -> list[list[tuple[int, ...] | None]]:
    """Ways to call the body with ``n_inputs`` tensors, in levels tried in turn: ``None`` (the tensors as the
    leading arguments, the rest defaulted) and tuples of the parameter positions that were ``None`` at the
    call. Level ``c`` sets ``c`` parameters to None that do not default to None (a caller omits those that
    do), so the first level with a placement that traces is the likeliest call."""
    params = [p for p in inspect.signature(spec.function).parameters.values() if p.name not in spec.call_attrs]
    if params and params[0].name in ("self", "cls"):
        raise _error(f"{_where(spec)} is a method: its body needs {params[0].name!r}, which the .tflite does not "
                     f"record, so no decomposition can be traced. Make the composite a module-level function "
                     f"taking its weights as arguments (the Keras layer calls it with self.kernel, ...), or "
                     f"convert with fused_op_format='custom'")
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return [[None]]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    missing = len(positional) - n_inputs
    if missing < 0:
        raise _error(f"{_where(spec)}: the op has {n_inputs} inputs but the body takes {len(positional)} "
                     f"positional arguments; was the file made with another version of the composite?")
    optional = [i for i, p in enumerate(positional) if p.default is None]
    required = [i for i, p in enumerate(positional) if p.default is not None]
    levels: list[list[tuple[int, ...] | None]] = []
    if missing and all(p.default is not p.empty for p in positional[n_inputs:]):
        levels.append([None])
    for cost in range(missing + 1):
        if missing - cost <= len(optional) and cost <= len(required):
            levels.append([tuple(sorted(a + b)) for a in itertools.combinations(required, cost)
                           for b in itertools.combinations(optional, missing - cost)])
    return levels


def _presence_flags(spec, attrs: Mapping[str, Any]) -> dict[int, bool]:
    """Positional parameter index -> whether it was given, where a boolean attribute ``has_<name>`` (or
    ``has_<first word of name>``: ``has_prelu`` for ``prelu_alpha``) records it, as the fused conv
    composites do."""
    params = [p for p in inspect.signature(spec.function).parameters.values() if p.name not in spec.call_attrs
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    flags = {}
    for i, p in enumerate(params):
        for key in (f"has_{p.name}", f"has_{p.name.split('_')[0]}"):
            if isinstance(attrs.get(key), bool):
                flags[i] = attrs[key]
                break
    return flags


def _body_function(function, nones: tuple[int, ...] | None, kwargs: Mapping[str, Any]):
    """``f(*tensors) -> {"output_i": tensor}`` calling ``function`` with ``None`` at positions ``nones``."""
    import tensorflow as tf

    def body(*xs):
        args = list(xs)
        for i in nones or ():
            args.insert(i, None)
        return {f"output_{i}": y for i, y in enumerate(tf.nest.flatten(function(*args, **kwargs)))}

    return body


def _trace_one(spec, nones, kwargs, specs, outputs):
    """``(concrete function, None)`` where the body traces with ``nones`` and gives the op's outputs, else
    ``(None, why)``."""
    import tensorflow as tf

    from ..annotate import annotations_disabled

    body = _body_function(spec.function, nones, kwargs)
    body.__name__ = f"{spec.name}_decomposition"
    with annotations_disabled():
        try:
            cf = tf.function(body, input_signature=specs, autograph=False).get_concrete_function()
        except Exception as e:  # the body refusing this placement (or any input): the caller tries the next
            return None, f"{type(e).__name__}: {e}"
    outs = cf.structured_outputs
    got = [(tuple(outs[f"output_{i}"].shape), outs[f"output_{i}"].dtype) for i in range(len(outs))]
    want = [(tuple(s), tf.as_dtype(np.dtype(d))) for s, d in outputs]
    return (cf, None) if got == want else (None, f"outputs {got} instead of the op's {want}")


def _trace_body(spec, attrs: Mapping[str, Any], inputs: Sequence[tuple], outputs: Sequence[tuple]):
    """The concrete function of the body for the op's input specs whose outputs match the op's outputs.

    Args:
      inputs, outputs: ``(shape, numpy dtype)`` of each op input / output, from the file.
    """
    import tensorflow as tf

    kwargs = {k: attrs[k] for k in spec.call_attrs if k in attrs}
    specs = [tf.TensorSpec(shape, tf.as_dtype(np.dtype(dtype)), name=f"input_{i}")
             for i, (shape, dtype) in enumerate(inputs)]
    found, errors, tried = [], [], 0
    flags = _presence_flags(spec, attrs)
    for level in _placements(spec, len(inputs)):
        for nones in level:
            absent = set(range(len(inputs), len(inputs) + 64)) if nones is None else set(nones)
            if any((i in absent) == present for i, present in flags.items()):
                continue   # a has_<param> attribute says otherwise
            tried += 1
            if tried > _MAX_PLACEMENTS:
                raise _error(f"{_where(spec)}: more than {_MAX_PLACEMENTS} ways to fit the op's {len(inputs)} "
                             f"inputs to the body's parameters; give the optional ones a None default")
            cf, error = _trace_one(spec, nones, kwargs, specs, outputs)
            if cf is None:
                errors.append(error)
            else:
                found.append((nones, cf))
        if found:
            break
    if not found:
        raise _error(f"{_where(spec)} cannot be traced standalone with the op's {len(inputs)} inputs "
                     f"{[list(s) for s, _ in inputs]} and attributes {dict(attrs)}: "
                     + (errors[0] if errors else "no way to call it"))
    if len(found) > 1:
        raise _error(f"{_where(spec)}: the op's {len(inputs)} inputs fit the body's parameters in "
                     f"{len(found)} ways (the .tflite does not record which arguments were None); give the "
                     f"composite a function whose optional arguments can be told apart by the attributes")
    return found[0][1]


def _convert_body(spec, attrs: Mapping[str, Any], inputs, outputs) -> bytes:
    import tensorflow as tf

    cf = _trace_body(spec, attrs, inputs, outputs)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([cf], tf.Module())
    converter.optimizations = []
    converter.allow_custom_ops = False
    try:
        return bytes(converter.convert())
    except Exception as e:
        raise _error(f"{_where(spec)}: its body does not convert to TFLite builtins alone, so it cannot be a "
                     f"decomposition subgraph ({type(e).__name__}: {str(e)[:500]})") from e


# ---- splicing a converted body into the file -----------------------------------------------------------
def _code_key(code) -> tuple:
    cc = code.customCode
    return (int(code.deprecatedBuiltinCode), int(code.builtinCode),
            cc.decode() if isinstance(cc, bytes) else cc, int(code.version))


def _opcode_index(m, code) -> int:
    key = _code_key(code)
    for i, c in enumerate(m.operatorCodes):
        if _code_key(c) == key:
            return i
    m.operatorCodes.append(code)
    return len(m.operatorCodes) - 1


def _offset_subgraph_refs(options, offset: int) -> None:
    """Shifts the subgraph indices an op's options refer to (WHILE, IF, CALL_ONCE, StableHLO regions)."""
    if options is None:
        return
    for key, value in vars(options).items():
        if key.endswith("SubgraphIndex"):
            setattr(options, key, int(value) + offset)
        elif key.endswith("SubgraphIndices") and value is not None:
            setattr(options, key, [int(v) + offset for v in value])


def _splice(model, body_bytes: bytes, name: str, n_inputs: int, n_outputs: int) -> int:
    """Appends the body file's subgraphs, buffers and operator codes to ``model``; returns the index of its
    main subgraph, whose inputs and outputs are put in the op's order."""
    from ..model import Model

    body = Model(body_bytes)
    sig = body.signature_defs()
    main = next(iter(sig.values()))
    if main["subgraph"] != 0 or len(main["inputs"]) != n_inputs or len(main["outputs"]) != n_outputs:
        raise _error(f"composite {name!r}: the converted body has signature {main}, expected subgraph 0 with "
                     f"{n_inputs} inputs and {n_outputs} outputs")
    m, b = model.m, body.m
    buffer_map = {0: 0}   # buffer 0 is the empty sentinel of every file
    for i, buf in enumerate(b.buffers or []):
        if i:
            if buf.offset is not None and buf.offset > 1:   # data after the flatbuffer: bring it inline
                buf.data = np.frombuffer(body_bytes, np.uint8, count=buf.size, offset=buf.offset).copy()
                buf.offset, buf.size = 0, 0
            buffer_map[i] = len(m.buffers)
            m.buffers.append(buf)
    code_map = {i: _opcode_index(m, c) for i, c in enumerate(b.operatorCodes or [])}
    first = len(m.subgraphs)
    for si, sg in enumerate(b.subgraphs):
        for t in sg.tensors:
            t.buffer = buffer_map[int(t.buffer)]
        for op in sg.operators:
            op.opcodeIndex = code_map[int(op.opcodeIndex)]
            _offset_subgraph_refs(op.builtinOptions, first)
            _offset_subgraph_refs(op.builtinOptions2, first)
        sg.name = f"{name}_decomposition_{first}" if si == 0 else f"{name}_decomposition_{first}_{si}"
        m.subgraphs.append(sg)
    sg = m.subgraphs[first]
    sg.inputs = [main["inputs"][f"input_{i}"] for i in range(n_inputs)]
    sg.outputs = [main["outputs"][f"output_{i}"] for i in range(n_outputs)]
    _distinct_outputs(m, sg, name)
    return first


def _distinct_outputs(m, sg, name: str) -> None:
    """Gives each output of decomposition ``sg`` a tensor of its own that one of its ops writes.

    The converter makes a body's ``return a, a`` one tensor listed twice, an input returned as it is the input
    tensor, and a constant result a constant tensor. LiteRT 2.3's STABLEHLO_COMPOSITE gives wrong and
    run-to-run varying values for an output listed twice, and tflfuse inlines only outputs that an op writes,
    so each such output becomes a RESHAPE of the tensor to its own shape: a copy, exact for every dtype on
    both runtimes. The first listing of a tensor that an op writes stays as it is.

    Raises:
      ConversionError: such an output has more than one unknown dimension (-1 in its shape signature), which
        no RESHAPE can restate.
    """
    written = {int(t) for op in sg.operators or [] for t in (op.outputs if op.outputs is not None else [])}
    inputs = {int(t) for t in sg.inputs}
    kept: set[int] = set()
    outputs = []
    for j, t in enumerate(int(t) for t in sg.outputs):
        if t in written and t not in inputs and t not in kept:
            kept.add(t)
            outputs.append(t)
            continue
        source = sg.tensors[t]
        shape = [int(d) for d in (source.shape if source.shape is not None else [])]
        signature = [int(d) for d in source.shapeSignature] if source.shapeSignature is not None else shape
        if signature.count(-1) > 1:
            raise _error(f"composite {name!r}: decomposition output {j} (tensor {t}) needs a copy of its own (it is "
                         f"{'an input' if t in inputs else 'another output' if t in kept else 'a constant'}), "
                         f"but its shape {signature} has more than one unknown dimension, which a RESHAPE cannot "
                         f"restate; return a computed tensor from the composite's body instead")
        buf = schema.BufferT()
        buf.data = np.frombuffer(np.asarray(signature, np.int32).tobytes(), np.uint8).copy()
        m.buffers.append(buf)
        target = schema.TensorT()
        target.shape, target.type, target.buffer = np.asarray([len(signature)], np.int32), schema.TensorType.INT32, \
            len(m.buffers) - 1
        target.name = f"{name}_decomposition/output_{j}/shape".encode()
        copy_t = copy.copy(source)
        copy_t.buffer, copy_t.isVariable, copy_t.sparsity = 0, False, None
        copy_t.name = f"{name}_decomposition/output_{j}".encode()
        sg.tensors += [target, copy_t]
        code = schema.OperatorCodeT()
        code.deprecatedBuiltinCode = code.builtinCode = schema.BuiltinOperator.RESHAPE
        code.version = 1
        op = schema.OperatorT()
        op.opcodeIndex = _opcode_index(m, code)
        op.inputs, op.outputs = [t, len(sg.tensors) - 2], [len(sg.tensors) - 1]
        op.builtinOptionsType = schema.BuiltinOptions.ReshapeOptions
        op.builtinOptions = schema.ReshapeOptionsT()
        op.builtinOptions.newShape = list(signature)
        sg.operators = list(sg.operators or []) + [op]
        outputs.append(len(sg.tensors) - 1)
    sg.outputs = outputs


def _composite_code():
    code = schema.OperatorCodeT()
    code.deprecatedBuiltinCode = schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES
    code.builtinCode = schema.BuiltinOperator.STABLEHLO_COMPOSITE
    code.version = 1
    return code


def _make_composite(model, sg: int, index: int, name: str, decomposition: int, code_index: int) -> None:
    op = model.m.subgraphs[sg].operators[index]
    opts = schema.StableHLOCompositeOptionsT()
    opts.name = name
    opts.decompositionSubgraphIndex = decomposition
    opts.compositeAttributes = [int(v) for v in (op.customOptions if op.customOptions is not None else [])]
    opts.compositeAttributesFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    opts.version = COMPOSITE_VERSION
    op.opcodeIndex = code_index
    op.customOptions = None
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.NONE, None
    op.builtinOptions2Type = schema.BuiltinOptions2.StableHLOCompositeOptions
    op.builtinOptions2 = opts


def to_composite_format(tflite: bytes) -> tuple[bytes, collections.Counter]:
    """Rewrites every tflfuse composite custom op of a .tflite as a ``STABLEHLO_COMPOSITE`` (module doc).

    Args:
      tflite: a file from the TFLite converter whose fused ops are custom ops named after registered
        composites (:func:`tflfuse.annotate.registry`; other custom ops are left as they are).

    Returns:
      ``(tflite, rewritten)``: the new file and, per composite name, the number of ops rewritten.

    Raises:
      ConversionError: a composite's function is a method (needs ``self``), cannot be traced standalone at the
        op's input shapes, fits the op's inputs in more than one way, or does not convert to builtins alone;
        an op with an absent input or output (-1); a decomposition output that needs a copy but has more than
        one unknown dimension.
    """
    from ..annotate import decode_attrs, registry
    from ..model import Model

    model = Model(tflite)
    specs = registry()
    original = len(model.m.subgraphs)
    todo = [(sg, i, model.op_name(sg, i)) for sg in range(original)
            for i in range(len(model.m.subgraphs[sg].operators)) if model.op_name(sg, i) in specs]
    rewritten: collections.Counter = collections.Counter()
    if not todo:
        return tflite, rewritten
    code_index = _opcode_index(model.m, _composite_code())
    shared: dict[tuple, int] = {}
    for sg, i, name in todo:
        op = model.m.subgraphs[sg].operators[i]
        ins = [(model.tensor_shape(sg, t), model.tensor_dtype(sg, t)) for t in model.op_inputs(sg, i)]
        outs = [(model.tensor_shape(sg, t), model.tensor_dtype(sg, t)) for t in model.op_outputs(sg, i)]
        if any(t < 0 for t in model.op_inputs(sg, i)):
            raise _error(f"composite {name!r} (operator {i} of subgraph {sg}) has an absent input")
        if any(t < 0 for t in model.op_outputs(sg, i)):   # LiteRT 2.3 crashes binding it to the decomposition's
            raise _error(f"composite {name!r} (operator {i} of subgraph {sg}) has an absent output (-1), which "
                         f"a STABLEHLO_COMPOSITE cannot have: LiteRT binds every output of the op to one of its "
                         f"decomposition; tflfuse.convert(..., fused_op_format='composite') keeps such outputs as "
                         f"tensors")
        raw = bytes(bytearray(op.customOptions)) if op.customOptions is not None else b""
        key = (name, raw, tuple((s, d.str) for s, d in ins), tuple((s, d.str) for s, d in outs))
        if key not in shared:
            try:
                attrs = decode_attrs(model.op_attrs(sg, i))
            except ValueError as e:
                raise _error(f"composite {name!r} (operator {i} of subgraph {sg}): {e}") from e
            body = _convert_body(specs[name], attrs, ins, outs)
            shared[key] = _splice(model, body, name, len(ins), len(outs))
            logging.info("composite %r: decomposition subgraph %d (%d ops)", name, shared[key],
                         len(model.m.subgraphs[shared[key]].operators))
        _make_composite(model, sg, i, name, shared[key], code_index)
        rewritten[name] += 1
    return model.to_bytes(), rewritten


# ---- the runtime's side: inlining decompositions -------------------------------------------------------
#: Nesting depth of decompositions inlined (a composite whose decomposition holds composites, ...).
MAX_INLINE_DEPTH = 16


def inline_composites(model, subgraph: int, keep: Callable[[str], bool]):
    """Replaces each ``STABLEHLO_COMPOSITE`` of ``subgraph`` whose name ``keep`` refuses by its decomposition.

    The decomposition's inputs and outputs become the op's; its other tensors are appended to the subgraph
    (their constants keep their buffers), so tensor indices of the file stay valid; ops after an inlined op
    move. Decompositions that hold composites are inlined in turn.

    Args:
      model: a :class:`tflfuse.model.Model` (not changed).
      subgraph: the subgraph to rewrite.
      keep: ``keep(name)`` True for a composite name that stays one op (it has a kernel).

    Returns:
      ``model`` itself where nothing is inlined, else a new :class:`~tflfuse.model.Model` sharing its buffers.

    Raises:
      ModelError: a decomposition nested deeper than :data:`MAX_INLINE_DEPTH` (or recursive), with a number of
        inputs or outputs other than the op's, whose output is not computed by one of its ops, or that lists
        one tensor as several outputs (files :func:`to_composite_format` writes have neither).
    """
    from ..model import ModelError

    def pending(sg) -> bool:
        return any(isinstance(op.builtinOptions2, schema.StableHLOCompositeOptionsT)
                   and not keep(_name(op.builtinOptions2)) for op in sg.operators)

    if not pending(model.m.subgraphs[subgraph]):
        return model
    tree = copy.copy(model.m)
    tree.subgraphs = list(tree.subgraphs)
    sg = tree.subgraphs[subgraph] = copy.copy(tree.subgraphs[subgraph])
    sg.tensors, sg.operators = list(sg.tensors), list(sg.operators)
    for _ in range(MAX_INLINE_DEPTH):
        ops = []
        for op in sg.operators:
            opts = op.builtinOptions2
            if isinstance(opts, schema.StableHLOCompositeOptionsT) and not keep(_name(opts)):
                ops += _inline_one(tree, sg, op, opts, ModelError)
            else:
                ops.append(op)
        sg.operators = ops
        if not pending(sg):
            return model.derived(tree)
    raise ModelError(f"subgraph {subgraph}: STABLEHLO_COMPOSITE decompositions nest deeper than "
                     f"{MAX_INLINE_DEPTH} levels (a composite whose decomposition calls itself?)")


def _name(opts) -> str:
    name = opts.name
    return name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else str(name or "")


def _inline_one(tree, sg, op, opts, error) -> list:
    """The ops of ``op``'s decomposition with their tensors mapped into ``sg`` (new ones appended)."""
    dec = tree.subgraphs[int(opts.decompositionSubgraphIndex)]
    d_in = [int(t) for t in (dec.inputs if dec.inputs is not None else [])]
    d_out = [int(t) for t in (dec.outputs if dec.outputs is not None else [])]
    op_in = [int(t) for t in (op.inputs if op.inputs is not None else [])]
    op_out = [int(t) for t in (op.outputs if op.outputs is not None else [])]
    where = f"STABLEHLO_COMPOSITE {_name(opts)!r} (decomposition subgraph {int(opts.decompositionSubgraphIndex)})"
    if len(d_in) != len(op_in) or len(d_out) != len(op_out):
        raise error(f"{where}: the op has {len(op_in)} inputs and {len(op_out)} outputs, its decomposition "
                    f"{len(d_in)} and {len(d_out)}")
    written = {int(t) for o in (dec.operators or []) for t in (o.outputs if o.outputs is not None else [])}
    if any(t not in written or t in d_in for t in d_out):
        raise error(f"{where}: a decomposition output is not computed by its ops (an input or a constant); "
                    f"tflfuse cannot inline it")
    if len(set(d_out)) != len(d_out):
        raise error(f"{where}: its decomposition lists tensor(s) "
                    f"{sorted({t for t in d_out if d_out.count(t) > 1})} as more than one output, so tflfuse "
                    f"cannot inline it (nor does LiteRT run it right); tflfuse.convert gives each output a tensor "
                    f"of its own: convert the model again")
    mapping = dict(zip(d_in, op_in))
    mapping.update((d, o) for d, o in zip(d_out, op_out) if o >= 0)   # an absent output: a tensor of its own

    def tensor(t: int) -> int:
        if t < 0:
            return t
        if t not in mapping:
            mapping[t] = len(sg.tensors)
            sg.tensors.append(copy.copy(dec.tensors[t]))
        return mapping[t]

    out = []
    for inner in dec.operators or []:
        new = copy.copy(inner)
        new.inputs = [tensor(int(t)) for t in (inner.inputs if inner.inputs is not None else [])]
        new.outputs = [tensor(int(t)) for t in (inner.outputs if inner.outputs is not None else [])]
        out.append(new)
    return out

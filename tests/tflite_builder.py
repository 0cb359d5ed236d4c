"""Builds small .tflite files directly on LiteRT's schema (ops and options the converter never writes, and
hostile files), for the tests."""

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema


# ---- building .tflite files on LiteRT's schema ------------------------------------------------------------


def build(tensors, ops, inputs, outputs, *, signatures=None, edit=None) -> bytes:
    """A one-subgraph .tflite. ``tensors``: dicts of ``shape``, ``type`` (a TensorType name, default FLOAT32),
    optional ``data`` (a constant), ``name``, ``buffer`` (an explicit buffer index). ``ops``: dicts of ``op``
    (a builtin name, or a custom op's code), ``inputs``, ``outputs``, optional ``options`` ((name, dict) of the
    builtin options table) and ``custom`` (custom options bytes). ``edit(model_t)`` may change the object tree
    before it is written."""
    m = schema.ModelT()
    m.version = 3
    m.buffers = [schema.BufferT()]
    m.operatorCodes, codes = [], {}
    sg = schema.SubGraphT()
    sg.tensors, sg.operators = [], []
    for i, t in enumerate(tensors):
        tt = schema.TensorT()
        tt.shape = list(t["shape"])
        tt.type = getattr(schema.TensorType, t.get("type", "FLOAT32"))
        name = t.get("name", f"t{i}")
        tt.name = name if isinstance(name, bytes) else name.encode()
        tt.buffer = 0
        if t.get("data") is not None:
            b = schema.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(t["data"]).tobytes(), np.uint8).copy()
            m.buffers.append(b)
            tt.buffer = len(m.buffers) - 1
        if "buffer" in t:
            tt.buffer = t["buffer"]
        sg.tensors.append(tt)
    for o in ops:
        code = o["op"]
        if code not in codes:
            c = schema.OperatorCodeT()
            if isinstance(code, str) and hasattr(schema.BuiltinOperator, code):
                c.builtinCode = getattr(schema.BuiltinOperator, code)
                c.deprecatedBuiltinCode = min(c.builtinCode, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            else:
                c.builtinCode = c.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
                c.customCode = code if isinstance(code, bytes) else code.encode()
            codes[code] = len(m.operatorCodes)
            m.operatorCodes.append(c)
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = codes[code], list(o["inputs"]), list(o["outputs"])
        if "options" in o:
            kind, values = o["options"]
            options = getattr(schema, kind + "T")()
            for k, v in values.items():
                setattr(options, k, v)
            op.builtinOptionsType, op.builtinOptions = getattr(schema.BuiltinOptions, kind), options
        if "custom" in o:
            op.customOptions = list(o["custom"])
        sg.operators.append(op)
    sg.inputs, sg.outputs = list(inputs), list(outputs)
    m.subgraphs = [sg]
    if signatures:
        m.signatureDefs = signatures
    if edit:
        edit(m)
    return pack(m)


def pack(m) -> bytes:
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def t(shape, **kw) -> dict:
    return dict(shape=shape, **kw)


def unary(op, shape=(2, 3), options=None) -> bytes:
    o = dict(op=op, inputs=[0], outputs=[1])
    if options:
        o["options"] = options
    return build([t(shape), t(shape)], [o], [0], [1])


def binary(op, shape=(2, 3)) -> bytes:
    return build([t(shape)] * 3, [dict(op=op, inputs=[0, 1], outputs=[2])], [0, 1], [2])

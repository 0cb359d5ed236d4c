"""int8 bottleneck fusion: TFLite's full-integer chains of an inverted-residual bottleneck rewritten into one
int8 ``fused_bottleneck`` op (:class:`tflfuse.kernels.quant.bottleneck.QuantizedFusedBottleneck`).

The chain (what the TFLite converter makes of ``composites.bottleneck`` and of Keras' MobileNetV2 blocks with
full-integer quantization): CONV_2D 1x1 stride 1 (fused RELU6 or RELU) -> DEPTHWISE_CONV_2D KxK (K 3 or 5,
stride 1 or 2, SAME, depth multiplier 1, the same activation) -> CONV_2D 1x1 (no activation) [-> ADD of the
block's input, no activation, stride 1]; or without the first conv (expansion 1). Every activation tensor is
int8 with per-tensor parameters; filters are int8 constants, biases int32 constants. As in
:mod:`tflfuse.passes.fuse`, a chain is rewritten only where each intermediate tensor is read by the next op
alone and is not a subgraph output, and where the int8 kernel, built on the chain's shapes and quantization,
accepts it and gives the chain's output shape.

The fused op reads the chain's own tensors (its input, filters and biases, in the builtins' layouts) and writes
the chain's output tensor; the quantization of the intermediates goes into its attributes
(``expand_scale``... see :mod:`tflfuse.kernels.quant.bottleneck`). Two forms:

* ``"custom"``: a custom op ``fused_bottleneck`` whose custom options are the attributes
  (:func:`tflfuse.annotate.encode_attrs`). Only tflfuse runs it.
* ``"composite"``: a ``STABLEHLO_COMPOSITE`` named ``fused_bottleneck`` with the same attributes whose
  decomposition subgraph is the int8 builtin chain itself (its ops unchanged, the weights as subgraph inputs with
  their quantization), so stock LiteRT runs exactly the ops the converter made; tflfuse runs the fused kernel.
"""

from __future__ import annotations

import copy

from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from ..model import Model

__all__ = ["FORMATS", "expand_int8_bottleneck", "fuse_int8_bottlenecks"]

FORMATS = ("custom", "composite")
_ACT = {"RELU6": "relu6", "RELU": "relu"}


class _Sub:
    """One subgraph of ``model``: readers of each tensor, constants, types."""

    def __init__(self, model: Model, si: int):
        self.model, self.si = model, si
        self.sg = model.m.subgraphs[si]
        self.readers: dict[int, list[int]] = {}
        for oi, op in enumerate(self.sg.operators or []):
            for t in op.inputs if op.inputs is not None else []:
                if t >= 0:
                    self.readers.setdefault(int(t), []).append(oi)
        self.outputs = {int(t) for t in (self.sg.outputs if self.sg.outputs is not None else [])}

    def name(self, oi: int) -> str:
        return self.model.op_name(self.si, oi)

    def attrs(self, oi: int) -> dict:
        return self.model.op_attrs(self.si, oi)

    def ins(self, oi: int) -> list[int]:
        return self.model.op_inputs(self.si, oi)

    def out(self, oi: int) -> int:
        outs = self.model.op_outputs(self.si, oi)
        return outs[0] if len(outs) == 1 else -1

    def type(self, t: int) -> str:
        return self.model.tensor_type_name(self.si, t) if t >= 0 else ""

    def shape(self, t: int) -> tuple[int, ...]:
        return self.model.tensor_shape(self.si, t)

    def const(self, t: int) -> bool:
        if t < 0:
            return False
        buf = self.model.m.buffers[int(self.sg.tensors[t].buffer)]
        return bool((buf.data is not None and len(buf.data)) or (buf.offset is not None and buf.offset > 1))

    def sole_reader(self, t: int) -> int | None:
        r = self.readers.get(t, [])
        return r[0] if len(r) == 1 and t not in self.outputs and t >= 0 else None

    def q(self, t: int):
        return self.model.tensor_quantization(self.si, t)


def _conv_1x1(s: _Sub, oi: int, acts) -> bool:
    if s.name(oi) != "CONV_2D" or len(s.ins(oi)) != 3:
        return False
    a = s.attrs(oi)
    x, w, b = s.ins(oi)
    return (s.const(w) and s.const(b) and s.type(w) == "INT8" and s.type(b) == "INT32" and s.type(x) == "INT8"
            and len(s.shape(w)) == 4 and s.shape(w)[1:3] == (1, 1) and a.get("stride_h", 1) == 1
            and a.get("stride_w", 1) == 1 and a.get("dilation_h_factor", 1) == 1
            and a.get("dilation_w_factor", 1) == 1 and a.get("fused_activation_function", "NONE") in acts
            and not s.const(x) and s.type(s.out(oi)) == "INT8")


def _match(s: _Sub, oi: int):
    """``(chain ops, inputs, output, attrs)`` of an int8 bottleneck starting at op ``oi``, else None."""
    chain: list[int] = []
    if _conv_1x1(s, oi, ("RELU6", "RELU")):
        chain.append(oi)
        x = s.ins(oi)[0]
        dw = s.sole_reader(s.out(oi))
        act = s.attrs(oi).get("fused_activation_function")
    elif s.name(oi) == "DEPTHWISE_CONV_2D":
        x, dw, act = s.ins(oi)[0], oi, None
    else:
        return None
    if dw is None or s.name(dw) != "DEPTHWISE_CONV_2D" or len(s.ins(dw)) != 3 or s.type(x) != "INT8" or s.const(x):
        return None
    a = s.attrs(dw)
    _, k, kb = s.ins(dw)
    kshape = s.shape(k)
    stride = a.get("stride_h", 1)
    act = act or a.get("fused_activation_function")
    if not (s.const(k) and s.const(kb) and s.type(k) == "INT8" and s.type(kb) == "INT32" and len(kshape) == 4
            and kshape[0] == 1 and kshape[1] == kshape[2] and kshape[1] in (3, 5) and a.get("padding") == "SAME"
            and stride in (1, 2) and a.get("stride_w", 1) == stride and a.get("dilation_h_factor", 1) == 1
            and a.get("dilation_w_factor", 1) == 1 and a.get("fused_activation_function") == act
            and act in _ACT and s.type(s.out(dw)) == "INT8"):
        return None
    cin = s.shape(s.ins(dw)[0])[-1] if s.shape(s.ins(dw)[0]) else 0
    if kshape[3] != cin:   # depth multiplier 1
        return None
    chain.append(dw)
    proj = s.sole_reader(s.out(dw))
    if proj is None or not _conv_1x1(s, proj, ("NONE",)):
        return None
    chain.append(proj)
    out, residual = s.out(proj), False
    add = s.sole_reader(out)
    if add is not None and s.name(add) == "ADD" and sorted(s.ins(add)) == sorted([out, x]) and \
            s.attrs(add).get("fused_activation_function", "NONE") == "NONE" and stride == 1 and \
            s.shape(x) == s.shape(out) and s.type(s.out(add)) == "INT8":
        chain.append(add)
        residual = True
    if not all(s.sole_reader(s.out(c)) == r for c, r in zip(chain, chain[1:])):
        return None
    inputs = [x] + [t for c in chain[:-1 if residual else None] for t in s.ins(c)[1:]]
    expand = len(chain) - residual == 3
    attrs = {"expansion": max(1, s.shape(s.out(chain[0]))[-1] // s.shape(x)[-1]) if expand else 1,
             "stride": int(stride), "residual": residual, "activation": _ACT[act], "kernel_size": int(kshape[1]),
             "squeeze_excite": False}
    for name, op in (("expand", chain[0] if expand else None), ("dw", dw), ("project", proj if residual else None)):
        if op is None:
            continue
        q = s.q(s.out(op))
        if q is None or q.per_channel:
            return None
        attrs[f"{name}_scale"], attrs[f"{name}_zero_point"] = float(q.scale[0]), int(q.zero_point[0])
    return chain, inputs, s.out(chain[-1]), attrs


def _accepted(s: _Sub, inputs: list[int], out: int, attrs: dict) -> bool:
    """Whether the int8 kernel takes the chain (shapes, quantization) and gives its output shape."""
    from ..kernels import KernelError
    from ..kernels.base import TensorSpec
    from ..kernels.quant import quantized_kernel

    specs = [TensorSpec(s.shape(t), str(s.model.tensor_dtype(s.si, t))) for t in inputs]
    try:
        kernel = quantized_kernel("fused_bottleneck", None)(specs, {
            **attrs, "input_quantization": [s.q(t) for t in inputs], "output_quantization": [s.q(out)],
            "output_dtype": "int8"})
        return kernel.output_specs()[0].shape == s.shape(out)
    except (KernelError, ValueError):
        return False


def _opcode(model: Model, builtin: int, custom: str | None = None) -> int:
    codes = model.m.operatorCodes
    for i, c in enumerate(codes):
        code = max(int(c.builtinCode), int(c.deprecatedBuiltinCode))
        cc = c.customCode.decode() if isinstance(c.customCode, bytes) else c.customCode
        if code == builtin and (custom is None or cc == custom):
            return i
    c = schema.OperatorCodeT()
    c.builtinCode = builtin
    c.deprecatedBuiltinCode = min(builtin, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
    c.customCode = custom.encode() if custom is not None else None
    c.version = 1
    codes.append(c)
    return len(codes) - 1


def _decomposition(model: Model, s: _Sub, chain: list[int], inputs: list[int], out: int) -> int:
    """Appends a subgraph holding copies of the chain's ops (the weights as its inputs); returns its index."""
    dec = schema.SubGraphT()
    dec.tensors, mapping = [], {}

    def tensor(t: int) -> int:
        if t not in mapping:
            copied = copy.copy(s.sg.tensors[t])
            copied.buffer = 0   # an input or an intermediate: no data in the decomposition
            mapping[t] = len(dec.tensors)
            dec.tensors.append(copied)
        return mapping[t]

    dec.inputs = [tensor(t) for t in inputs]
    dec.operators = []
    for oi in chain:
        op = copy.copy(s.sg.operators[oi])
        op.inputs = [tensor(int(t)) for t in op.inputs]
        op.outputs = [tensor(int(t)) for t in op.outputs]
        dec.operators.append(op)
    dec.outputs = [tensor(out)]
    index = len(model.m.subgraphs)
    dec.name = f"fused_bottleneck_decomposition_{index}".encode()
    model.m.subgraphs.append(dec)
    return index


def fuse_int8_bottlenecks(tflite: bytes, fused_op_format: str = "custom") -> tuple[bytes, int]:
    """Rewrites every int8 bottleneck chain of a .tflite into one int8 ``fused_bottleneck`` (module doc).

    Args:
      tflite: a .tflite, typically a full-integer file of the TFLite converter. Subgraphs that are
        decompositions of STABLEHLO_COMPOSITE ops are left alone.
      fused_op_format: ``"custom"`` or ``"composite"`` (module doc).

    Returns:
      ``(tflite, count)``: the rewritten file (the input unchanged where nothing matched) and the number of
      chains fused.

    Raises:
      ValueError: an unknown ``fused_op_format``.
      tflfuse.ModelError: a malformed file.
    """
    from ..annotate import encode_attrs
    from .portable import _composite_code, _make_composite

    if fused_op_format not in FORMATS:
        raise ValueError(f"fused_op_format must be one of {FORMATS}, got {fused_op_format!r}")
    model = Model(tflite)
    skip = model.decompositions() | model.called_subgraphs()   # LiteRT runs those: builtins only
    count = 0
    for si in range(len(model.m.subgraphs)):
        if si in skip:
            continue
        s = _Sub(model, si)
        claimed: set[int] = set()
        at_last: dict[int, object] = {}
        for oi in range(len(s.sg.operators or [])):
            if oi in claimed:
                continue
            found = _match(s, oi)
            if found is None or claimed & set(found[0]) or not _accepted(s, *found[1:]):
                continue
            chain, inputs, out, attrs = found
            op = schema.OperatorT()
            op.opcodeIndex = 0 if fused_op_format == "composite" else \
                _opcode(model, schema.BuiltinOperator.CUSTOM, "fused_bottleneck")
            op.inputs, op.outputs = list(inputs), [out]
            op.customOptions = list(flexbuffers.Dumps(encode_attrs(attrs)))
            op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
            if fused_op_format == "composite":
                s.sg.operators.append(op)   # _make_composite edits an op of the subgraph in place
                dec = _decomposition(model, s, chain, inputs, out)
                _make_composite(model, si, len(s.sg.operators) - 1, "fused_bottleneck", dec,
                                _opcode_composite(model, _composite_code()))
                s.sg.operators.pop()
            claimed.update(chain)
            at_last[chain[-1]] = op
            count += 1
        if at_last:
            s.sg.operators = [at_last.get(oi, op) for oi, op in enumerate(s.sg.operators)
                              if oi in at_last or oi not in claimed]
    return (model.to_bytes(), count) if count else (tflite, 0)


def _opcode_composite(model: Model, code) -> int:
    from .portable import _opcode_index

    return _opcode_index(model.m, code)


def expand_int8_bottleneck(g, oi: int, attrs: dict) -> list:
    """The int8 builtin chain of int8 ``fused_bottleneck`` op ``oi`` (the inverse of the fusion above), for
    :mod:`tflfuse.passes.unfuse`: new int8 tensors for the intermediates, quantized as the op's attributes say.

    Args:
      g: a :class:`~tflfuse.passes.graph.Graph` of the op's subgraph.
      oi: the op's index; ``attrs``: its decoded attributes.

    Returns:
      the new ops (``OperatorT``), in order; the caller replaces the op by them (``g.replace``).

    Raises:
      ValueError: an op whose inputs are not 5 or 7, or whose attributes lack an intermediate's scale.
    """
    ins, (out,) = g.inputs(oi), g.outputs_of(oi)
    if len(ins) not in (5, 7):
        raise ValueError(f"int8 fused_bottleneck (operator {oi}): {len(ins)} inputs, expected 7 or 5")
    sg, x = g.sg, ins[0]
    n, h, w, _ = g.model.tensor_shape(g.index, x)
    stride, act = int(attrs.get("stride", 1)), {"relu6": 3, "relu": 1}[str(attrs.get("activation", "relu6"))]
    oh, ow = -(-h // stride), -(-w // stride)

    def tensor(shape, name: str) -> int:
        scale, zp = attrs.get(f"{name}_scale"), attrs.get(f"{name}_zero_point")
        if scale is None or zp is None:
            raise ValueError(f"int8 fused_bottleneck (operator {oi}): no {name}_scale / {name}_zero_point")
        t = schema.TensorT()
        t.shape, t.type, t.buffer = [int(d) for d in shape], schema.TensorType.INT8, 0
        t.name = f"{g.model.tensor_name(g.index, out)}/unfused_{name}".encode()
        t.quantization = schema.QuantizationParametersT()
        t.quantization.scale, t.quantization.zeroPoint = [float(scale)], [int(zp)]
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    conv = ("Conv2DOptions", {"padding": 1, "strideW": 1, "strideH": 1})
    ops, h_in = [], x
    if len(ins) == 7:
        e = tensor((n, h, w, g.model.tensor_shape(g.index, ins[1])[0]), "expand")
        ops.append(g.builtin_op("CONV_2D", [x, ins[1], ins[2]], [e], (conv[0], {**conv[1],
                                                                                 "fusedActivationFunction": act})))
        h_in = e
    dw_w, dw_b, pw, pb = ins[-4:]
    d = tensor((n, oh, ow, g.model.tensor_shape(g.index, dw_w)[3]), "dw")
    ops.append(g.builtin_op("DEPTHWISE_CONV_2D", [h_in, dw_w, dw_b], [d], ("DepthwiseConv2DOptions", {
        "padding": 0, "strideW": stride, "strideH": stride, "depthMultiplier": 1, "dilationWFactor": 1,
        "dilationHFactor": 1, "fusedActivationFunction": act})))
    if attrs.get("residual"):
        p = tensor((n, oh, ow, g.model.tensor_shape(g.index, pw)[0]), "project")
        ops.append(g.builtin_op("CONV_2D", [d, pw, pb], [p], conv))
        ops.append(g.builtin_op("ADD", [p, x], [out], ("AddOptions", {"fusedActivationFunction": 0})))
    else:
        ops.append(g.builtin_op("CONV_2D", [d, pw, pb], [out], conv))
    return ops

"""Data-movement kernels (SPLIT, SPLIT_V, SLICE, STRIDED_SLICE, TRANSPOSE, GATHER, DEPTH_TO_SPACE,
SPACE_TO_DEPTH, DENSIFY) through :func:`oplib.check_op`: converted by the stock TFLiteConverter (or a model
edited with LiteRT's own schema where the converter never writes the case), run on tflfuse and LiteRT,
compared with LiteRT and TensorFlow. Every op here moves values without arithmetic, so results are exact."""

import flatbuffers
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

import tflfuse
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec

from conftest import ACCUMULATION, EXACT, FP16_WEIGHTS
from oplib import check_op


# ---- model edits with LiteRT's schema ---------------------------------------------------------------
def _editing(change):
    """A ``bytes -> bytes`` edit: ``change(model)`` on LiteRT's object API, then packed again."""

    def edit(data: bytes) -> bytes:
        m = schema.ModelT.InitFromPackedBuf(data, 0)
        change(m)
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    return edit


def _the_op(m, name):
    code = getattr(schema.BuiltinOperator, name)
    ops = [op for op in m.subgraphs[0].operators
           if max(m.operatorCodes[op.opcodeIndex].builtinCode, m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode)
           == code]
    assert len(ops) == 1, f"expected one {name}, the model has {len(ops)}"
    return ops[0]


def _add_tensor(m, shape, ttype, data: bytes | None, name: str, sparsity=None) -> int:
    buf = schema.BufferT()
    if data is not None:
        buf.data = np.frombuffer(data, np.uint8).copy()
    m.buffers.append(buf)
    t = schema.TensorT()
    t.shape = np.array(shape, np.int32)
    t.type = ttype
    t.buffer = len(m.buffers) - 1
    t.name = name.encode()
    t.sparsity = sparsity
    m.subgraphs[0].tensors.append(t)
    return len(m.subgraphs[0].tensors) - 1


def _int32_const(m, values, name):
    a = np.asarray(values, np.int32)
    return _add_tensor(m, a.shape, schema.TensorType.INT32, a.tobytes(), name)


def _strided_slice_edit(begin, end, strides, out_shape, **masks):
    """Gives the model's one STRIDED_SLICE new begin/end/strides constants and masks (``begin_mask=...``,
    ``ellipsis_mask=...``, ``offset=True``) and declares its output ``out_shape``."""

    def change(m):
        op = _the_op(m, "STRIDED_SLICE")
        op.inputs = [op.inputs[0], _int32_const(m, begin, "begin"), _int32_const(m, end, "end"),
                     _int32_const(m, strides, "strides")]
        opts = schema.StridedSliceOptionsT()
        for k, v in masks.items():
            setattr(opts, "".join(w.capitalize() if i else w for i, w in enumerate(k.split("_"))), v)
        op.builtinOptionsType = schema.BuiltinOptions.StridedSliceOptions
        op.builtinOptions = opts
        out = m.subgraphs[0].tensors[op.outputs[0]]
        out.shape, out.shapeSignature = np.array(out_shape, np.int32), None

    return _editing(change)


# ---- SPLIT, SPLIT_V ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis,n", [
    ((6,), 0, 3), ((4, 6), -1, 2), ((3, 4, 9), 2, 3), ((2, 6, 3, 5), 1, 3), ((2, 3, 4, 2, 6), -2, 2),
    ((5, 3), 0, 5), ((2, 3, 2, 1, 3, 4), 5, 4),
], ids=["1d", "2d_neg", "3d", "4d", "5d_neg", "5_parts", "6d"])
def test_split(shape, axis, n, device, rng):
    check_op(lambda x: tf.split(x, n, axis=axis), [shape], device=device, rng=rng, expect_ops=["SPLIT"],
             **EXACT)


@pytest.mark.parametrize("shape,sizes,axis", [
    ((7,), [2, -1, 1], 0), ((3, 8), [3, 5], -1), ((2, 9, 4), [1, 7, 1], 1), ((2, 3, 5, 7), [4, -1], 2),
    ((2, 3, 5, 7, 3), [1, 1, 1], -1), ((4, 5), [2, 0, -1], 1),
], ids=["1d_rest", "2d_neg", "3d", "4d_rest", "5d", "empty_part"])
def test_split_v(shape, sizes, axis, device, rng):
    check_op(lambda x: tf.split(x, sizes, axis=axis), [shape], device=device, rng=rng, expect_ops=["SPLIT_V"],
             **EXACT)


# ---- SLICE -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,begin,size", [
    ((9,), [2], [-1]), ((5, 7), [1, 2], [3, -1]), ((3, 5, 7), [0, 1, 2], [-1, 3, 4]),
    ((2, 5, 6, 7), [1, 0, 3, 1], [1, 5, -1, 5]), ((2, 3, 5, 4, 3), [0, 1, 2, 1, 0], [2, 2, 3, -1, 2]),
], ids=["1d", "2d", "3d", "4d", "5d"])
def test_slice(shape, begin, size, device, rng):
    check_op(lambda x: tf.slice(x, begin, size), [shape], device=device, rng=rng, expect_ops=["SLICE"], **EXACT)


def test_slice_int64_begin(device, rng):
    check_op(lambda x: tf.slice(x, tf.constant([1, 2], tf.int64), tf.constant([2, -1], tf.int64)), [(4, 6)],
             device=device, rng=rng, expect_ops=["SLICE"], **EXACT)


# ---- STRIDED_SLICE ---------------------------------------------------------------------------------
# Python slicing as the converter writes it: begin/end masks, shrink, negative steps, clamping.
STRIDED = {
    "1d_step2": ((9,), lambda x: x[1:7:2]),
    "1d_reverse": ((7,), lambda x: x[::-1]),
    "1d_neg_begin_step-3": ((11,), lambda x: x[-2:1:-3]),
    "1d_shrink_to_scalar": ((5,), lambda x: x[3]),
    "2d_begin_mask_neg_step": ((4, 7), lambda x: x[1:, ::-2]),
    "2d_shrink_neg_index": ((4, 7), lambda x: x[-1, 1:4]),
    "3d_mixed": ((5, 6, 7), lambda x: x[::2, 1:-1, ::-1]),
    "4d_masks": ((2, 7, 6, 5), lambda x: x[:, 1:5:2, ::-1, 2:]),
    "4d_two_shrinks": ((3, 4, 5, 6), lambda x: x[1, :, 2, ::-2]),
    "5d": ((2, 5, 4, 3, 6), lambda x: x[:, ::-1, 1:3, :, ::2]),
    "clamped_out_of_range": ((6, 7), lambda x: tf.strided_slice(x, [-100, 2], [100, -100], [1, -1])),
    "neg_step_past_start": ((8,), lambda x: x[20:-20:-3]),
}


@pytest.mark.parametrize("case", list(STRIDED))
def test_strided_slice(case, device, rng):
    shape, fn = STRIDED[case]
    check_op(fn, [shape], device=device, rng=rng, expect_ops=["STRIDED_SLICE"], **EXACT)


# The converter rewrites ellipsis and new axes into full specs and RESHAPE, never writes ``offset`` and folds
# empty slices:
# these come from an edit of a converted STRIDED_SLICE, run by LiteRT too, checked against TF's slice.
MASKED = {
    # x[..., 1:3]
    "ellipsis_first": ((2, 3, 4, 5), lambda x: x[..., 1:3], ([0, 1], [0, 3], [1, 1]), dict(ellipsis_mask=1)),
    # x[1, ..., ::-1]
    "shrink_ellipsis_reverse": ((3, 4, 5, 6), lambda x: x[1, ..., ::-1], ([1, 0, 0], [2, 0, 0], [1, 1, -1]),
                                dict(ellipsis_mask=2, shrink_axis_mask=1, begin_mask=4, end_mask=4)),
    # x[:, tf.newaxis, 1:3]
    "new_axis": ((4, 5, 6), lambda x: x[:, tf.newaxis, 1:3], ([0, 0, 1], [0, 0, 3], [1, 1, 1]),
                 dict(begin_mask=1, end_mask=1, new_axis_mask=2)),
    # x[tf.newaxis, ..., 2, tf.newaxis]
    "new_axes_ellipsis_shrink": ((3, 4, 5), lambda x: x[tf.newaxis, ..., 2, tf.newaxis],
                                 ([0, 0, 2, 0], [0, 0, 3, 0], [1, 1, 1, 1]),
                                 dict(new_axis_mask=9, ellipsis_mask=2, shrink_axis_mask=4)),
    # x[1:2, ...] with an ellipsis in the middle of a 5-D input: x[1:2, ..., ::2]
    "5d_ellipsis_middle": ((3, 2, 3, 2, 6), lambda x: x[1:2, ..., ::2], ([1, 0, 0], [2, 0, 0], [1, 1, 2]),
                           dict(ellipsis_mask=2, begin_mask=4, end_mask=4)),
    # an empty result (the converter folds it to a constant): x[4:1, :]
    "empty": ((6, 4), lambda x: x[4:1, :], ([4, 0], [1, 0], [1, 1]), dict(begin_mask=2, end_mask=2)),
    # offset: end counts from begin, x[1:3, 2:5]
    "offset": ((5, 7), lambda x: x[1:3, 2:5], ([1, 2], [2, 3], [1, 1]), dict(offset=True)),
}


@pytest.mark.parametrize("case", list(MASKED))
def test_strided_slice_masks_from_an_edit(case, device, rng):
    shape, ref, (begin, end, strides), masks = MASKED[case]
    out_shape = ref(tf.zeros(shape)).shape
    check_op(lambda x: x[:1], [shape], device=device, rng=rng, expect_ops=["STRIDED_SLICE"],
             edit=_strided_slice_edit(begin, end, strides, out_shape, **masks), tf_ref=ref, **EXACT)


# ---- TRANSPOSE -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,perm", [
    ((3, 5), [1, 0]), ((2, 3, 7), [2, 0, 1]), ((2, 5, 3, 4), [0, 3, 1, 2]), ((2, 3, 4, 5, 3), [4, 0, 3, 1, 2]),
    ((2, 3, 2, 3, 2, 4), [5, 1, 4, 0, 2, 3]), ((1, 6, 1, 5), [2, 3, 0, 1]),
], ids=["2d", "3d", "4d_nhwc_to_nchw", "5d", "6d", "unit_dims"])
def test_transpose(shape, perm, device, rng):
    check_op(lambda x: tf.transpose(x, perm), [shape], device=device, rng=rng, expect_ops=["TRANSPOSE"], **EXACT)


# ---- DEPTH_TO_SPACE, SPACE_TO_DEPTH ------------------------------------------------------------------
@pytest.mark.parametrize("shape,block", [((1, 2, 3, 8), 2), ((2, 3, 2, 18), 3), ((1, 1, 1, 4), 2),
                                         ((2, 3, 5, 12), 2)], ids=["b2", "b3_batch2", "1x1", "b2_odd"])
def test_depth_to_space(shape, block, device, rng):
    check_op(lambda x: tf.nn.depth_to_space(x, block), [shape], device=device, rng=rng,
             expect_ops=["DEPTH_TO_SPACE"], **EXACT)


@pytest.mark.parametrize("shape,block", [((1, 4, 6, 3), 2), ((2, 6, 3, 2), 3), ((1, 2, 2, 1), 2),
                                         ((2, 6, 9, 5), 3)], ids=["b2", "b3_batch2", "2x2", "b3_odd"])
def test_space_to_depth(shape, block, device, rng):
    check_op(lambda x: tf.nn.space_to_depth(x, block), [shape], device=device, rng=rng,
             expect_ops=["SPACE_TO_DEPTH"], **EXACT)


# ---- GATHER ----------------------------------------------------------------------------------------
# (params shape, constant indices, axis, batch_dims)
GATHER = {
    "axis0": ((5, 3), [4, 0, 2, 2], 0, 0),
    "axis1_2d_indices": ((2, 6, 3), [[1, 5], [0, 0], [3, 2]], 1, 0),
    "axis2_neg": ((2, 3, 7, 4), [6, 0, 3], -2, 0),
    "axis3_scalar_index": ((2, 3, 4, 5), 4, 3, 0),
    "1d_params": ((9,), [[8, 1, 1], [0, 2, 7]], 0, 0),
    "5d_params": ((2, 3, 2, 4, 3), [1, 0, 2, 2], 4, 0),
    "batch1_axis1": ((3, 5, 4), [[4, 0], [1, 1], [3, 2]], 1, 1),
    "batch1_axis2": ((2, 3, 6, 2), [[5, 0, 1, 1], [2, 3, 4, 0]], 2, 1),
    "batch2_axis3": ((2, 3, 4, 5), [[[0, 4], [1, 1], [2, 3]], [[4, 4], [0, 1], [3, 2]]], 3, 2),
    "batch_neg1_axis1": ((3, 5, 4), [[4, 0], [1, 1], [3, 2]], 1, -1),
}


@pytest.mark.parametrize("case", list(GATHER))
def test_gather_constant_indices(case, device, rng):
    shape, idx, axis, batch_dims = GATHER[case]
    idx = np.asarray(idx, np.int32)
    check_op(lambda x, i: tf.gather(x, i, axis=axis, batch_dims=batch_dims), [shape], const_inputs={1: idx},
             device=device, rng=rng, expect_ops=["GATHER"], **EXACT)


def test_gather_int64_indices(device, rng):
    idx = np.array([[2, 0], [1, 2]], np.int64)
    check_op(lambda x, i: tf.gather(x, i, axis=1), [(2, 3, 4)], const_inputs={1: idx}, device=device, rng=rng,
             expect_ops=["GATHER"], **EXACT)


def test_gather_out_of_range_constant_index_is_refused_at_plan_time(device, rng):
    fn = tf.function(lambda x: tf.gather(x, [0, 5, 1], axis=0), autograph=False,
                     input_signature=[tf.TensorSpec((4, 3), tf.float32)])
    model = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn).convert()
    interp = tflfuse.Interpreter(model_content=model, device=device)
    with pytest.raises(KernelError, match=r"GATHER \(operator 0.*index 5 at indices\[1\] is out of range for "
                                          r"axis 0 of size 4"):
        interp.allocate_tensors()


def _run_both(model: bytes, inputs: list[np.ndarray], device) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Runs a model on tflfuse and on LiteRT with the same inputs (in the model's input order)."""
    outs = []
    for interp in (tflfuse.Interpreter(model_content=model, device=device), LiteRTInterpreter(model_content=model)):
        interp.allocate_tensors()
        for d, x in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        outs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
    return outs[0], outs[1]


def _check_typed(fn, inputs: list[np.ndarray], device, expect_ops):
    """``check_op`` for inputs that are not all float32 (int32 indices or data): exact against LiteRT and TF."""
    sig = [tf.TensorSpec(x.shape, x.dtype, name=f"a{i}") for i, x in enumerate(inputs)]
    f = tf.function(fn, input_signature=sig, autograph=False)
    model = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()
    ops = [d["op_name"] for d in LiteRTInterpreter(model_content=model)._get_ops_details()]
    assert sorted(ops) == sorted(expect_ops), ops
    ours, lite = _run_both(model, inputs, device)
    ref = fn(*[tf.constant(x) for x in inputs])
    ref = [np.asarray(r) for r in (ref if isinstance(ref, (list, tuple)) else [ref])]
    for o, l, r in zip(ours, lite, ref):
        assert o.shape == l.shape == r.shape and o.dtype == l.dtype == r.dtype
        np.testing.assert_array_equal(o, l)
        np.testing.assert_array_equal(o, r)


def test_gather_runtime_indices_embedding(device, rng):
    table = rng.standard_normal((11, 6)).astype(np.float32)
    ids = np.array([[3, 0, 10], [7, 7, 1]], np.int32)
    _check_typed(lambda i: tf.gather(tf.constant(table), i), [ids], device, ["GATHER"])


def test_gather_runtime_params_and_indices_batch_dims(device, rng):
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    ids = np.array([[4, 0, 2, 2], [1, 3, 3, 0]], np.int32)
    _check_typed(lambda x, i: tf.gather(x, i, axis=1, batch_dims=1), [x, ids], device, ["GATHER"])


def test_gather_runtime_out_of_range_index_gives_zero(device, rng):
    # Indices another op computes (here i + d): TFLite stops with an error; a shader cannot, and writes 0 (the
    # documented behaviour). Indices set as the model's input are refused by set_tensor instead
    # (tests/test_bad_runtime_inputs.py).
    fn = tf.function(lambda x, i, d: tf.gather(x, i + d), autograph=False,
                     input_signature=[tf.TensorSpec((4, 2), tf.float32), tf.TensorSpec((3,), tf.int32),
                                      tf.TensorSpec((3,), tf.int32)])
    model = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn).convert()
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    x = rng.standard_normal((4, 2)).astype(np.float32)
    ins = sorted(interp.get_input_details(), key=lambda d: d["name"])   # d, i, x by their names
    for d, value in zip(ins, (np.zeros(3, np.int32), np.array([1, 4, -1], np.int32), x)):
        interp.set_tensor(d["index"], value)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    np.testing.assert_array_equal(got, np.stack([x[1], np.zeros(2, np.float32), np.zeros(2, np.float32)]))


# ---- int32 data on the GPU ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,fn,op", [
    ((3, 4, 8), lambda x: tf.transpose(x, [2, 0, 1]), "TRANSPOSE"),
    ((3, 4, 8), lambda x: tf.split(x, 2, axis=1), "SPLIT"),
    ((3, 4, 8), lambda x: x[::-1, 1:, ::2], "STRIDED_SLICE"),
    ((1, 2, 3, 8), lambda x: tf.nn.depth_to_space(x, 2), "DEPTH_TO_SPACE"),
], ids=["transpose", "split", "strided_slice", "depth_to_space"])
def test_int32_data(shape, fn, op, device, rng):
    x = rng.integers(-2 ** 31, 2 ** 31 - 1, shape, dtype=np.int32)  # every bit pattern: no float reads
    _check_typed(fn, [x], device, [op])


# ---- all-constant inputs: folded at load ---------------------------------------------------------------
def _fold(key, arrays, statics, attrs):
    """The kernel's ``fold`` on constants: ``arrays`` by input position (None for static inputs)."""
    names = {np.dtype(np.float32): "float32", np.dtype(np.int32): "int32"}
    specs = [None if a is None else TensorSpec(a.shape, names.get(a.dtype, str(a.dtype))) for a in arrays]
    kernel = kernel_class(key)(specs, {**statics, **attrs})
    return kernel.fold([a for a in arrays if a is not None])


FOLDS = {
    # key: (TF function of x, dtype, shape, inputs with None for x's slot and statics, attrs)
    "SPLIT": (lambda x: tf.split(x, 3, axis=1), np.int64, (2, 6), lambda x: [None, x], {"axis": 1, "num_splits": 3}),
    "SPLIT_V": (lambda x: tf.split(x, [1, -1], axis=0), np.uint8, (3, 2), lambda x: [x, None, None],
                {"size_splits": [1, -1], "axis": 0, "num_splits": 2}),
    "SLICE": (lambda x: tf.slice(x, [1, 0], [-1, 2]), np.float16, (3, 4), lambda x: [x, None, None],
              {"begin": [1, 0], "size": [-1, 2]}),
    "STRIDED_SLICE": (lambda x: x[::-1, 1], np.bool_, (4, 3), lambda x: [x, None, None, None],
                      {"begin": [0, 1], "end": [0, 2], "strides": [-1, 1], "begin_mask": 1, "end_mask": 1,
                       "shrink_axis_mask": 2}),
    "TRANSPOSE": (lambda x: tf.transpose(x, [1, 2, 0]), np.int32, (2, 3, 4), lambda x: [x, None], {"perm": [1, 2, 0]}),
    "DEPTH_TO_SPACE": (lambda x: tf.nn.depth_to_space(x, 2), np.int8, (1, 2, 3, 8), lambda x: [x], {"block_size": 2}),
    "SPACE_TO_DEPTH": (lambda x: tf.nn.space_to_depth(x, 3), np.float32, (2, 3, 6, 2), lambda x: [x],
                       {"block_size": 3}),
}


@pytest.mark.parametrize("key", list(FOLDS))
def test_fold_of_constant_inputs_matches_tf(key, rng):
    fn, dtype, shape, place, attrs = FOLDS[key]
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    got = _fold(key, place(x), {}, attrs)
    want = fn(tf.constant(x))
    want = [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_gather_fold_matches_tf_and_checks_range(rng):
    x = rng.integers(0, 100, (2, 5, 3)).astype(np.int64)
    idx = np.array([[4, 0], [2, 2]], np.int64)
    (got,) = _fold("GATHER", [x, idx], {}, {"axis": 1, "batch_dims": 1})
    np.testing.assert_array_equal(got, np.asarray(tf.gather(x, idx, axis=1, batch_dims=1)))
    with pytest.raises(KernelError, match="index 5"):
        _fold("GATHER", [x, np.array([[4, 5], [0, 0]], np.int64)], {}, {"axis": 1, "batch_dims": 1})


# ---- DENSIFY -----------------------------------------------------------------------------------------
def _convert_sparse(fn, shape, fp16):
    f = tf.function(fn, input_signature=[tf.TensorSpec(shape, tf.float32)], autograph=False)
    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    conv.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY] + ([tf.lite.Optimize.DEFAULT] if fp16 else [])
    if fp16:
        conv.target_spec.supported_types = [tf.float16]
    return conv.convert()


@pytest.mark.parametrize("layer,fp16", [("fully_connected", False), ("conv_2d", False), ("fully_connected", True)],
                         ids=["fully_connected", "conv_2d", "fully_connected_fp16"])
def test_densify_from_the_converter(layer, fp16, device, rng):
    if layer == "fully_connected":
        w = rng.standard_normal((24, 10)).astype(np.float32) / 5.0
        w[rng.random(w.shape) < 0.8] = 0.0
        fn, shape, op = (lambda x: tf.matmul(x, tf.constant(w))), (3, 24), "FULLY_CONNECTED"
    else:
        w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32) / 6.0
        w[rng.random(w.shape) < 0.85] = 0.0
        fn, shape, op = (lambda x: tf.nn.conv2d(x, tf.constant(w), 1, "SAME")), (1, 6, 5, 4), "CONV_2D"
    model = _convert_sparse(fn, shape, fp16)
    ops = [d["op_name"] for d in LiteRTInterpreter(model_content=model)._get_ops_details()]
    # The weights really are stored sparse (float16 ones then dequantized at load too).
    assert sorted(ops) == sorted(["DENSIFY", op] + (["DEQUANTIZE"] if fp16 else [])), ops
    x = rng.standard_normal(shape).astype(np.float32)
    (ours,), (lite,) = _run_both(model, [x], device)
    np.testing.assert_allclose(ours, lite, **ACCUMULATION)
    np.testing.assert_allclose(ours, np.asarray(fn(tf.constant(x))), **(FP16_WEIGHTS if fp16 else ACCUMULATION))


_INDEX_VECTORS = {"uint8": (schema.SparseIndexVector.Uint8Vector, schema.Uint8VectorT),
                  "uint16": (schema.SparseIndexVector.Uint16Vector, schema.Uint16VectorT),
                  "int32": (schema.SparseIndexVector.Int32Vector, schema.Int32VectorT)}


def _encode_sparse(w: np.ndarray, order, block_map, block_size, formats, index_type):
    """TFLite's sparse format of ``w``, written from the schema's definition: values and
    ``SparsityParametersT``. Levels follow ``order`` over the expanded dimensions (original dimensions, block
    dimensions ``rank + k`` last); a SPARSE_CSR level keeps the children whose sub-block holds a non-zero."""
    rank = w.ndim
    # Expanded tensor: each blocked dimension d becomes (d / block, block), block parts moved to the end.
    split_shape, outer_axes, inner_axes = [], [], {}
    for d, n in enumerate(w.shape):
        if d in block_map:
            k = block_map.index(d)
            split_shape += [n // block_size[k], block_size[k]]
            inner_axes[k] = len(split_shape) - 1
            outer_axes.append(len(split_shape) - 2)
        else:
            split_shape.append(n)
            outer_axes.append(len(split_shape) - 1)
    expanded = w.reshape(split_shape).transpose(outer_axes + [inner_axes[k] for k in range(len(block_map))])
    levels = expanded.transpose(order)
    segments = [[0] for _ in order]
    indices = [[] for _ in order]
    values = []

    def visit(sub, level):
        if level == len(order):
            values.append(sub)
            return
        for i in range(sub.shape[0]):
            if formats[level] == "dense":
                visit(sub[i], level + 1)
            elif np.any(sub[i] != 0):
                indices[level].append(i)
                visit(sub[i], level + 1)
        if formats[level] == "csr":
            segments[level].append(len(indices[level]))

    visit(levels, 0)
    vec_type, vec_cls = _INDEX_VECTORS[index_type]
    meta = []
    for level, fmt in enumerate(formats):
        m = schema.DimensionMetadataT()
        if fmt == "dense":
            m.format, m.denseSize = schema.DimensionType.DENSE, levels.shape[level]
        else:
            m.format = schema.DimensionType.SPARSE_CSR
            m.arraySegmentsType, m.arraySegments = vec_type, vec_cls()
            m.arraySegments.values = list(segments[level])
            m.arrayIndicesType, m.arrayIndices = vec_type, vec_cls()
            m.arrayIndices.values = list(indices[level])
        meta.append(m)
    sp = schema.SparsityParametersT()
    sp.traversalOrder, sp.blockMap, sp.dimMetadata = list(order), list(block_map), meta
    assert rank + len(block_map) == len(order)
    return np.asarray(values, w.dtype), sp


def _sparsify_edit(op_name, pos, order, block_map=(), block_size=(), formats=None, index_type="uint8"):
    """Stores input ``pos`` of the model's one ``op_name`` as a sparse constant behind a DENSIFY op."""

    def change(m):
        op = _the_op(m, op_name)
        sg = m.subgraphs[0]
        t = op.inputs[pos]
        dense = sg.tensors[t]
        w = np.frombuffer(bytes(m.buffers[dense.buffer].data), np.float32).reshape(dense.shape)
        values, sp = _encode_sparse(w, order, list(block_map), list(block_size), formats, index_type)
        sparse = _add_tensor(m, dense.shape, schema.TensorType.FLOAT32, values.tobytes(), "sparse_weights", sp)
        m.buffers.append(schema.BufferT())
        dense.buffer = len(m.buffers) - 1          # the dense tensor is now DENSIFY's output
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.DENSIFY
        code.version = 1
        m.operatorCodes.append(code)
        densify = schema.OperatorT()
        densify.opcodeIndex, densify.inputs, densify.outputs = len(m.operatorCodes) - 1, [sparse], [t]
        densify.builtinOptionsType, densify.builtinOptions = schema.BuiltinOptions.DensifyOptions, \
            schema.DensifyOptionsT()
        sg.operators.insert(0, densify)

    return _editing(change)


def _block_sparse(rng, shape, block_axis, block, keep=0.4):
    """Weights whose blocks of ``block`` along ``block_axis`` are all zero but a fraction ``keep``."""
    w = rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[1])
    blocks = list(shape)
    blocks[block_axis] //= block
    mask = np.repeat(rng.random(blocks) < keep, block, axis=block_axis)
    return np.where(mask, w, 0.0).astype(np.float32)


# FULLY_CONNECTED weights [out=8, in=16] as (traversal order, block_map, block_size, level formats, index type)
DENSIFY_FORMATS = {
    "csr_rows": ([0, 1], [], [], ["dense", "csr"], "uint8"),
    "blocks_of_4_along_in": ([0, 1, 2], [1], [4], ["dense", "csr", "dense"], "uint16"),
    "column_major_csr_csr": ([1, 0], [], [], ["csr", "csr"], "int32"),
    "2x4_blocks_both_sparse": ([0, 1, 2, 3], [0, 1], [2, 4], ["csr", "csr", "dense", "dense"], "uint8"),
}


@pytest.mark.parametrize("case", list(DENSIFY_FORMATS))
def test_densify_formats_from_an_edit(case, device, rng):
    order, block_map, block_size, formats, index_type = DENSIFY_FORMATS[case]
    w = _block_sparse(rng, (8, 16), 1, 4) if block_map else _block_sparse(rng, (8, 16), 1, 1, keep=0.3)
    if len(block_map) == 2:  # whole 2x4 blocks zero
        w = _block_sparse(rng, (4, 16), 1, 4, keep=0.5).repeat(2, axis=0) * rng.random((8, 1)).astype(np.float32)
    check_op(lambda x, wt: tf.matmul(x, wt, transpose_b=True), [(3, 16)], const_inputs={1: w}, device=device,
             rng=rng, expect_ops=["DENSIFY", "FULLY_CONNECTED"],
             edit=_sparsify_edit("FULLY_CONNECTED", 1, order, block_map, block_size, formats, index_type),
             **ACCUMULATION)


def test_densify_of_a_runtime_tensor_is_refused():
    with pytest.raises(KernelError, match="DENSIFY of a runtime tensor"):
        kernel_class("DENSIFY")([TensorSpec((4,))], {}).output_specs()


# ---- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,shapes,attrs,match", [
    ("SPLIT", [None, (2, 5)], {"axis": 1, "num_splits": 2}, "does not divide"),
    ("SPLIT", [None, (2, 5)], {"axis": 2, "num_splits": 5}, "out of range"),
    ("SPLIT_V", [(2, 5), None, None], {"size_splits": [2, 2], "axis": 1}, "sum to 4"),
    ("SPLIT_V", [(2, 5), None, None], {"size_splits": [-1, -1], "axis": 1}, "one -1"),
    ("SLICE", [(4, 5), None, None], {"begin": [1, 3], "size": [2, 3]}, "leave the tensor"),
    ("SLICE", [(4, 5), None, None], {"begin": [1], "size": [2]}, "one per dimension"),
    ("STRIDED_SLICE", [(4,), None, None, None], {"begin": [0], "end": [4], "strides": [0]}, "non-zero"),
    ("STRIDED_SLICE", [(4,), None, None, None], {"begin": [4], "end": [5], "strides": [1],
                                                 "shrink_axis_mask": 1}, "shrink_axis_mask takes index 4"),
    ("TRANSPOSE", [(2, 3), None], {"perm": [0, 0]}, "not a permutation"),
    ("DEPTH_TO_SPACE", [(1, 2, 2, 6)], {"block_size": 2}, "multiple of block_size"),
    ("SPACE_TO_DEPTH", [(1, 3, 4, 2)], {"block_size": 2}, "multiples of block_size"),
    ("GATHER", [(3, 4), (2,)], {"axis": 0}, "indices must be int32 or int64"),
    ("GATHER", [(3, 4), TensorSpec((3, 2), "int32")], {"axis": 0, "batch_dims": 1}, "batch_dims 1 must be"),
    ("GATHER", [(3, 4), TensorSpec((2,), "int32")], {"axis": 0, "indices_value": [2, 3]}, "index 3 at indices"),
])
def test_bad_shapes_and_attributes_raise_kernel_error(key, shapes, attrs, match):
    specs = [s if s is None or isinstance(s, TensorSpec) else TensorSpec(s) for s in shapes]
    with pytest.raises(KernelError, match=match) as err:
        kernel_class(key)(specs, attrs).output_specs()
    assert key in str(err.value)


# ---- CONCATENATION and PACK over several dispatches, SHAPE folded at load ------------------------------
@pytest.mark.parametrize("n", [8, 15, 40])
def test_concatenation_of_more_inputs_than_one_dispatch_binds(n, device, rng):
    # WebGPU's default is 8 storage buffers per shader stage: 7 inputs and the output per dispatch, each
    # dispatch writing its slice of the output, whatever the adapter's own limit (llvmpipe's is 32).
    shapes = [(2, k % 3 + 1, 3) for k in range(n)]
    check_op(lambda *xs: tf.concat(xs, 1), shapes, device=device, rng=rng, expect_ops=["CONCATENATION"], **EXACT)
    info = tflfuse.get_shader("CONCATENATION", shapes, {"axis": 1})
    assert len(info.programs) == -(-n // 7)
    assert all(len(p.bindings) <= 8 for p in info.programs)


@pytest.mark.parametrize("axis,n", [(0, 3), (1, 3), (-1, 2), (3, 9)])
def test_pack(axis, n, device, rng):
    check_op(lambda *xs: tf.stack(xs, axis), [(2, 3, 4)] * n, device=device, rng=rng, expect_ops=["PACK"], **EXACT)


def test_shape_of_a_dynamic_batch_is_folded_at_load(device, rng):
    # tf.shape of a dynamic batch becomes SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE's shape; once the batch is
    # known (resize_tensor_input) they fold into a constant and only the RELU runs.
    def fn(x):
        return tf.reshape(tf.nn.relu(x), tf.stack([tf.shape(x)[0], -1, 2]))

    res = check_op(fn, [(3, 4, 6)], device=device, rng=rng, dynamic_batch=True, **EXACT,
                   expect_ops=["RELU", "SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE"])
    assert res.ours[0].shape == (3, 12, 2)
    interp = tflfuse.Interpreter(model_content=res.model, device=device)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [5, 4, 6])
    interp.allocate_tensors()
    assert interp.dispatch_count == 1
    assert interp.get_output_details()[0]["shape"].tolist() == [5, 12, 2]

"""Malformed and hostile .tflite files, crafted and fuzzed.

The rule checked everywhere: a clean result, or an exception that says what is wrong (``ModelError`` for the
file, ``KernelError`` for an op, both ``ValueError``; ``TypeError`` for an argument of the wrong type), never a
signal, a hang, a ``MemoryError`` or a stray ``IndexError``/``AssertionError``/``GPUValidationError``. Every
.tflite is run by a worker subprocess, so that a crash or a hang fails its case instead of the test run.
Bad runtime input is in test_bad_runtime_inputs.py.
"""

import tflfuse  # noqa: I001  (before anything that can import TensorFlow)

import json
import os
import queue
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from flatbuffers import flexbuffers

from tflfuse import zoo
from tflfuse.annotate import encode_attrs


from tflite_builder import binary, build, t, unary

_RESHAPE_6 = ("ReshapeOptions", {"newShape": [6]})
_RESHAPE_23 = ("ReshapeOptions", {"newShape": [2, 3]})


def _signature(key: str, subgraph: int, tensor: int):
    sd, tm = schema.SignatureDefT(), schema.TensorMapT()
    sd.signatureKey, sd.subgraphIndex = key.encode(), subgraph
    tm.name, tm.tensorIndex = b"x", tensor
    sd.inputs, sd.outputs = [tm], []
    return sd


def _no_vectors(m) -> None:
    m.subgraphs[0] = schema.SubGraphT()   # every vector of the subgraph absent


def _no_inputs_vector(m) -> None:
    m.subgraphs[0].inputs = None


def _quantize(scales, zero_points, dim):
    def edit(m):
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = scales, zero_points, dim
        m.subgraphs[0].tensors[0].quantization = q
    return edit


def _dequantize(scales, zero_points, dim) -> bytes:
    return build([t((2, 3), type="INT8", data=np.ones((2, 3), np.int8)), t((2, 3)), t((2, 3)), t((2, 3))],
                 [dict(op="DEQUANTIZE", inputs=[0], outputs=[1]), dict(op="ADD", inputs=[1, 2], outputs=[3])],
                 [2], [3], edit=_quantize(scales, zero_points, dim))


def _dense_levels(*sizes):
    def edit(m):
        sp = schema.SparsityParametersT()
        sp.traversalOrder, sp.blockMap, sp.dimMetadata = list(range(len(sizes))), [], []
        for n in sizes:
            level = schema.DimensionMetadataT()
            level.format, level.denseSize = schema.DimensionType.DENSE, n
            sp.dimMetadata.append(level)
        m.subgraphs[0].tensors[0].sparsity = sp
    return edit


def _far_buffer(m) -> None:
    m.buffers[1].data, m.buffers[1].offset, m.buffers[1].size = None, 10 ** 9, 24


def _bottleneck(custom: bytes) -> bytes:
    rng = np.random.default_rng(0)
    shapes = [(4, 24), (24,), (3, 3, 24), (24,), (24, 4), (4,)]
    tensors = [t((1, 8, 8, 4))] + [t(s, data=rng.standard_normal(s).astype(np.float32)) for s in shapes]
    return build(tensors + [t((1, 8, 8, 4))],
                 [dict(op="fused_bottleneck", inputs=list(range(7)), outputs=[7], custom=custom)], [0], [7])


_GOOD_BOTTLENECK = encode_attrs({"expansion": 6, "stride": 1, "residual": True, "activation": "relu6"})
# A 1 MiB constant that GATHER, PACK or CONCATENATION (all inputs constant: folded at load) multiply.
_MIB = np.zeros((1, 1 << 18), np.float32)


def crafted_cases() -> dict[str, tuple[bytes, dict]]:
    """name -> (file bytes, expectation). An expectation is ``{"error": (type names), "match": text}`` or
    ``{"ok": True}`` (then ``"outputs"`` may give the expected output arrays)."""
    face = zoo.fetch("face_detection_short_range").read_bytes()
    rng = np.random.default_rng(20240611)
    random_bytes = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    model_error = ("ModelError",)
    kernel_error = ("KernelError", "UnsupportedOpError")
    x23 = [t((2, 3)), t((2, 3)), t((2, 3))]
    add = [dict(op="ADD", inputs=[0, 1], outputs=[2])]
    cases = {
        "empty": (b"", {"error": model_error, "match": "too short"}),
        "three_bytes": (b"TFL", {"error": model_error, "match": "too short"}),
        "random_bytes": (random_bytes, {"error": model_error, "match": "file identifier"}),
        "random_bytes_with_identifier": (random_bytes[:4] + b"TFL3" + random_bytes[8:],
                                         {"error": model_error, "match": "malformed"}),
        "wrong_identifier": (face[:4] + b"XXXX" + face[8:], {"error": model_error, "match": "file identifier"}),
        "op_input_out_of_range": (build(x23, [dict(op="ADD", inputs=[0, 99], outputs=[2])], [0, 1], [2]),
                                  {"error": model_error, "match": "refers to tensor 99"}),
        "op_input_negative": (build(x23, [dict(op="ADD", inputs=[0, -5], outputs=[2])], [0, 1], [2]),
                              {"error": model_error, "match": "refers to tensor -5"}),
        "output_out_of_range": (build(x23, add, [0, 1], [42]), {"error": model_error, "match": "tensor 42"}),
        "buffer_index_out_of_range": (build([t((2, 3), buffer=77), t((2, 3)), t((2, 3))], add, [0, 1], [2]),
                                      {"error": model_error, "match": "refers to buffer 77"}),
        "buffer_offset_past_the_end": (
            build([t((2, 3)), t((2, 3), data=np.ones((2, 3), np.float32)), t((2, 3))], add, [0], [2],
                  edit=_far_buffer), {"error": model_error, "match": "past the end of the file"}),
        "huge_shape": (build([t((1 << 20, 1 << 20, 4)), t((2, 3)), t((2, 3))], add, [0, 1], [2]),
                       {"error": model_error, "match": "implausible shape"}),
        "negative_dimension": (build([t((2, -3)), t((2, 3)), t((2, 3))], add, [0, 1], [2]),
                               {"error": model_error, "match": "negative dimension"}),
        "declared_output_shape_disagrees": (build([t((2, 3)), t((2, 3)), t((3, 2))], add, [0, 1], [2]),
                                            {"error": kernel_error, "match": "is declared [3, 2]"}),
        "builtin_op_without_kernel": (build([t((2, 3)), t((2, 3, 3))],
                                            [dict(op="MATRIX_DIAG", inputs=[0], outputs=[1])], [0], [1]),
                                      {"ok": True}),   # on LiteRT's CPU interpreter (the CPU fallback)
        "custom_op_without_kernel": (build([t((2, 3)), t((2, 3))], [dict(op="my_op", inputs=[0], outputs=[1])],
                                           [0], [1]), {"error": kernel_error, "match": "'my_op' at operator 0"}),
        # Names that are not UTF-8: once a UnicodeDecodeError.
        "custom_code_not_utf8": (build([t((2, 3)), t((2, 3))], [dict(op=b"op\xff\xfe", inputs=[0], outputs=[1])],
                                       [0], [1]), {"error": kernel_error, "match": r"'op\\xff\\xfe' at operator 0"}),
        "tensor_name_not_utf8": (build([t((2, 3), type="STRING", name=b"n\xff"), t((2, 3))],
                                       [dict(op="RELU", inputs=[0], outputs=[1])], [0], [1]),
                                 {"error": model_error, "match": "'n\\\\xff') has type STRING"}),
        # int64 tensors are held (as int32, their values checked when set): the file runs
        "int64_input": (build([t((2, 3), type="INT64"), t((2, 3), type="INT64")],
                              [dict(op="RESHAPE", inputs=[0], outputs=[1], options=_RESHAPE_23)], [0], [1]), {}),
        # Once a GPUValidationError (conflicting buffer usages) at the first invoke().
        "tensor_read_and_written_by_one_op": (build([t((2, 3)), t((2, 3))], [dict(op="ADD", inputs=[0, 1],
                                                                                  outputs=[1])], [0, 1], [1]),
                                              {"error": kernel_error, "match": "both an input and an output"}),
        # Once an endless loop: the second RESHAPE made tensor 0 a view of tensor 1, a view of tensor 0.
        "reshape_cycle": (build([t((2, 3)), t((6,))],
                                [dict(op="RESHAPE", inputs=[0], outputs=[1], options=_RESHAPE_6),
                                 dict(op="RESHAPE", inputs=[1], outputs=[0], options=_RESHAPE_23)], [0], [1]),
                          {"error": kernel_error, "match": "written only once"}),
        "tensor_written_twice": (build(x23 + [t((2, 3))], [dict(op="RELU", inputs=[0], outputs=[2]),
                                                           dict(op="ADD", inputs=[2, 0], outputs=[3]),
                                                           dict(op="TANH", inputs=[0], outputs=[2])], [0], [3]),
                                 {"error": kernel_error, "match": "written by an earlier op"}),
        # Once an AssertionError (from the binding list), and an IndexError for the DEQUANTIZE below.
        "too_many_inputs": (build(x23 + [t((2, 3))], [dict(op="ADD", inputs=[0, 1, 2], outputs=[3])], [0, 1, 2], [3]),
                            {"error": kernel_error, "match": "takes at most 2"}),
        "dequantize_without_inputs": (build([t((2, 3))], [dict(op="DEQUANTIZE", inputs=[], outputs=[0])], [], [0]),
                                      {"error": kernel_error, "match": "has no inputs"}),
        # Once NumPy's broadcast error or an IndexError from the folding.
        "dequantize_scales_off_their_dimension": (_dequantize([0.5, 2.0], [0], 1),
                                                  {"error": kernel_error, "match": "along dimension 1"}),
        "dequantize_dimension_out_of_range": (_dequantize([0.5, 2.0], [0], 5),
                                              {"error": kernel_error, "match": "along dimension 5"}),
        "dequantize_zero_points_mismatch": (_dequantize([0.5, 2.0], [0, 1, 2], 0),
                                            {"error": kernel_error, "match": "3 zero points"}),
        # Once a MemoryError: a fold's output is not bounded by the file's size.
        "gather_folds_to_16_gib": (
            build([t(_MIB.shape, data=_MIB), t((1 << 14,), type="INT32", data=np.zeros(1 << 14, np.int32)),
                   t((1 << 14, 1 << 18)), t((1,)), t((1,))],
                  [dict(op="GATHER", inputs=[0, 1], outputs=[2], options=("GatherOptions", {"axis": 0})),
                   dict(op="ADD", inputs=[3, 3], outputs=[4])], [3], [4]),
            {"error": kernel_error, "match": "folding its constant inputs"}),
        "pack_folds_to_5_gib": (
            build([t(_MIB.shape, data=_MIB), t((1,)), t((1,)), t((1,))],
                  [dict(op="PACK", inputs=[0] * 5000, outputs=[1],
                        options=("PackOptions", {"valuesCount": 5000, "axis": 0})),
                   dict(op="ADD", inputs=[2, 2], outputs=[3])], [2], [3]),
            {"error": kernel_error, "match": "folding its constant inputs"}),
        "concatenation_folds_to_5_gib": (
            build([t(_MIB.shape, data=_MIB), t((1,)), t((1,)), t((1,))],
                  [dict(op="CONCATENATION", inputs=[0] * 5000, outputs=[1],
                        options=("ConcatenationOptions", {"axis": 0})),
                   dict(op="ADD", inputs=[2, 2], outputs=[3])], [2], [3]),
            {"error": kernel_error, "match": "folding its constant inputs"}),
        # Once a MemoryError (8 GiB of indices) before the stored values were counted.
        "densify_levels_past_the_dense_shape": (
            build([t((4, 4), data=np.ones(4, np.float32)), t((4, 4)), t((4, 4)), t((4, 4))],
                  [dict(op="DENSIFY", inputs=[0], outputs=[1]), dict(op="ADD", inputs=[1, 2], outputs=[3])],
                  [2], [3], edit=_dense_levels(1 << 30, 1 << 30)),
            {"error": kernel_error, "match": "describe more elements than the dense shape [4, 4]"}),
        # Absent vectors: once a TypeError ('NoneType' object is not iterable).
        "subgraph_without_vectors": (build([], [], [], [], edit=_no_vectors), {"ok": True, "outputs": []}),
        "subgraph_without_inputs_vector": (build([t((2, 3)), t((2, 3))], [dict(op="RELU", inputs=[0], outputs=[1])],
                                                 [0], [1], edit=_no_inputs_vector),
                                           {"error": kernel_error, "match": "read before any op writes it"}),
        # Once an IndexError from get_signature_runner().
        "signature_to_missing_subgraph": (build(x23, add, [0, 1], [2], signatures=[_signature("s", 5, 0)]),
                                          {"error": model_error, "match": "refers to subgraph 5"}),
        "signature_to_missing_tensor": (build(x23, add, [0, 1], [2], signatures=[_signature("s", 0, 99)]),
                                        {"error": model_error, "match": "to tensor 99"}),
        "bottleneck_options_not_a_flexbuffer": (_bottleneck(b"\x01\x02garbage"),
                                                {"error": kernel_error,
                                                 "match": "fused_bottleneck (operator 0 of subgraph 0)"}),
        "bottleneck_stride_a_string": (
            _bottleneck(flexbuffers.Dumps({**_GOOD_BOTTLENECK, "stride": "two", "tflfuse_schema":
                                           _GOOD_BOTTLENECK["tflfuse_schema"].replace("stride:int", "stride:str")})),
            {"error": kernel_error, "match": "fused_bottleneck (operator 0 of subgraph 0)"}),
        # Once a raw GPUValidationError from wgpu (input and output buffers were not size-checked).
        "tensor_of_4_gi_elements": (binary("ADD", (65536, 65536)),
                                    {"error": kernel_error, "match": "max storage binding"}),
        # 192 MiB: past llvmpipe's 128 MiB storage binding (an adapter with a larger limit runs it).
        "tensor_of_192_mib": (binary("ADD", (48 << 20,)),
                              {"error": kernel_error, "match": "max storage binding", "or_ok": True}),
        # Once SIGABRT: wgpu-native panics on a zero-size binding.
        "empty_tensors": (unary("RELU", (0, 3)), {"ok": True, "outputs": [np.zeros((0, 3), np.float32)]}),
        "empty_tensor_through_conv": (
            build([t((1, 0, 4, 3)), t((2, 1, 1, 3), data=np.ones((2, 1, 1, 3), np.float32)),
                   t((2,), data=np.ones(2, np.float32)), t((1, 0, 4, 2))],
                  [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3],
                        options=("Conv2DOptions", {"padding": 1, "strideH": 1, "strideW": 1}))], [0], [3]),
            {"ok": True, "outputs": [np.zeros((1, 0, 4, 2), np.float32)]}),
        # Once a KernelError ('never written'); LiteRT returns the constant.
        "constant_output": (build([t((2, 3)), t((2, 3), data=np.arange(6, dtype=np.float32).reshape(2, 3))],
                                  [], [0], [1]),
                            {"ok": True, "outputs": [np.arange(6, dtype=np.float32).reshape(2, 3)]}),
        "output_never_written": (build(x23, [], [0, 1], [2]), {"error": kernel_error, "match": "never written"}),
    }
    for cut in (8, 100, 4096, len(face) // 2):
        cases[f"face_model_truncated_to_{cut}"] = (face[:cut], {"error": model_error, "match": ""})
    return cases


# ---- the worker: runs .tflite files in a subprocess, one JSON line per file --------------------------------

_WORKER = r"""
import tflfuse
import json, sys
import numpy as np

device = tflfuse.Device()
for line in sys.stdin:
    path = line.strip()
    print(json.dumps({"begin": path}), flush=True)
    result = {"path": path}
    try:
        interp = tflfuse.Interpreter(model_content=open(path, "rb").read(), device=device)
        interp.allocate_tensors()
        rng = np.random.default_rng(0)
        for d in interp.get_input_details():
            x = rng.standard_normal(d["shape"]) if d["dtype"] == np.float32 else np.zeros(d["shape"])
            interp.set_tensor(d["index"], x.astype(d["dtype"]))
        interp.invoke()
        outs = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
        result.update(kind="ok", outputs=[o.tolist() if o.size <= 10000 else None for o in outs],
                      shapes=[list(o.shape) for o in outs], dtypes=[str(o.dtype) for o in outs])
    except Exception as e:
        result.update(kind="error", type=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__],
                      message=str(e))
    print(json.dumps(result), flush=True)
"""

#: Seconds one file may take in the worker before it counts as a hang (the face model takes ~1 s).
PER_FILE_TIMEOUT = 120


def run_files(paths: list[Path]) -> dict[str, dict]:
    """Runs each file in a worker subprocess (one per batch, restarted after a crash or a hang).

    Returns ``{path: result}``: the worker's JSON (``kind`` ``"ok"`` or ``"error"``), or ``kind`` ``"crash"``
    (the worker died: ``returncode``, ``stderr``) or ``"hang"`` for the file it was running."""
    results: dict[str, dict] = {}
    todo = [str(p) for p in paths]
    while todo:
        stdin = Path(todo[0]).parent / f"todo-{len(results)}.txt"
        stdin.write_text("\n".join(todo) + "\n")
        stderr = stdin.with_suffix(".err")
        with open(stdin) as fin, open(stderr, "w") as ferr:
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=fin, stdout=subprocess.PIPE,
                                    stderr=ferr, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current, before = None, len(results)
        while True:
            try:
                line = lines.get(timeout=PER_FILE_TIMEOUT)
            except queue.Empty:
                proc.kill()
                proc.wait()
                results[current or todo[0]] = {"kind": "hang"}
                break
            if line is None:
                proc.wait()
                if current is not None or proc.returncode != 0:
                    results[current or todo[0]] = {"kind": "crash", "returncode": proc.returncode,
                                                   "stderr": stderr.read_text()[-2000:]}
                break
            msg = json.loads(line)
            if "begin" in msg:
                current = msg["begin"]
            else:
                results[current], current = msg, None
        if len(results) == before:  # the worker ended without a result: blame the file it was given first
            results[todo[0]] = {"kind": "crash", "returncode": proc.returncode, "stderr": stderr.read_text()[-2000:]}
        todo = [p for p in todo if p not in results]
    return results


def _pump(stream, lines: queue.Queue) -> None:
    """Moves a worker's stdout lines into a queue (None at the end), so that reads can time out."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def clean(result: dict) -> bool:
    """A clean outcome: it ran, or it raised a ValueError (ModelError, KernelError...) with a message."""
    if result["kind"] == "ok":
        return True
    return (result["kind"] == "error" and "ValueError" in result["mro"] and "UnicodeError" not in result["mro"]
            and bool(result["message"].strip()))


def describe(result: dict) -> str:
    if result["kind"] == "error":
        return f"{result['type']}: {result['message'][:300]}"
    if result["kind"] == "crash":
        return f"crash (exit status {result['returncode']}): {result['stderr'][-600:]}"
    return result["kind"]


# ---- crafted files ---------------------------------------------------------------------------------------

_CASES = crafted_cases()


@pytest.fixture(scope="module")
def crafted_results(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("crafted")
    paths = {}
    for name, (data, _) in _CASES.items():
        paths[name] = folder / f"{name}.tflite"
        paths[name].write_bytes(data)
    results = run_files(list(paths.values()))
    return {name: results[str(p)] for name, p in paths.items()}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_crafted_file(name, crafted_results):
    expect, got = _CASES[name][1], crafted_results[name]
    assert got["kind"] in ("ok", "error"), f"{name}: {describe(got)}"
    if got["kind"] == "ok" and expect.get("or_ok"):
        return
    if "error" in expect:
        assert got["kind"] == "error", f"{name}: ran, but should raise {expect['error']}"
        assert got["type"] in expect["error"], f"{name}: {describe(got)}"
        assert expect["match"] in got["message"], f"{name}: {describe(got)}"
        assert "\n" not in got["message"].strip(), "an error message is one line"
    else:
        assert got["kind"] == "ok", f"{name}: {describe(got)}"
        want = expect.get("outputs")
        if want is not None:
            assert got["shapes"] == [list(w.shape) for w in want]
            for value, w in zip(got["outputs"], want):
                np.testing.assert_array_equal(np.asarray(value, np.float32).reshape(w.shape), w)  # data movement: exact


def test_crafted_files_litert_refuses_too():
    """The crafted op-level errors are errors for LiteRT as well (so tflfuse is not stricter than the format):
    checked for the cases LiteRT can load without crashing."""
    for name in ("tensor_read_and_written_by_one_op", "too_many_inputs", "dequantize_without_inputs"):
        interp = LiteRTInterpreter(model_content=_CASES[name][0])
        with pytest.raises(RuntimeError):
            interp.allocate_tensors()


# ---- seeded mutation fuzzing ---------------------------------------------------------------------------------

#: Mutants per model; each is run by the worker subprocess (pipelines are cached across mutants, ~0.03 s each).
MUTANTS = 400
_INTERESTING = (0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0xFFFF, 1 << 16, 1 << 20, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def _metadata_positions(data: bytes) -> np.ndarray:
    """Byte offsets outside the constant buffers' contents: the tables, vectors and strings that describe
    the graph (flipping a weight only changes numbers, which tells nothing about robustness)."""
    m = schema.Model.GetRootAs(data, 0)
    weight = np.zeros(len(data), bool)
    for i in range(m.BuffersLength()):
        b = m.Buffers(i)
        o = b._tab.Offset(4)   # Buffer.data
        if o:
            start = b._tab.Vector(o)
            weight[start:start + b.DataLength()] = True
    return np.flatnonzero(~weight)


def mutate(data: bytes, positions: np.ndarray, seed: int) -> bytes:
    """1 to 5 edits at seeded positions (four in five among the metadata bytes, else anywhere): a random
    byte, a flipped bit, a 32-bit word set to an edge value (0, -1, 2**31...), or a truncation."""
    r = random.Random(seed)
    b = bytearray(data)
    if r.random() < 0.05:
        return bytes(b[:r.randrange(len(b))])
    for _ in range(r.choice((1, 1, 2, 3, 5))):
        p = int(positions[r.randrange(len(positions))]) if r.random() < 0.8 else r.randrange(len(b))
        kind = r.random()
        if kind < 0.4:
            b[p] = r.randrange(256)
        elif kind < 0.6:
            b[p] ^= 1 << r.randrange(8)
        elif p - p % 4 + 4 <= len(b):
            p -= p % 4
            b[p:p + 4] = struct.pack("<I", r.choice(_INTERESTING))
    return bytes(b)


@pytest.fixture(scope="module")
def small_converted_model() -> bytes:
    return small_converted_bytes()


def small_converted_bytes() -> bytes:
    """A small model from tflfuse.convert: CONV_2D + fused_bottleneck + MAX_POOL + PAD + MEAN + FC + SOFTMAX +
    RESHAPE, so that mutations also reach custom options."""
    import tensorflow as tf
    from composites.bottleneck import fused_bottleneck

    rng = np.random.default_rng(0)

    def c(*shape):
        return tf.constant((rng.standard_normal(shape) * 0.3).astype(np.float32))

    w = dict(ew=c(4, 24), eb=c(24), dw=c(3, 3, 24), db=c(24), pw=c(24, 4), pb=c(4), conv=c(3, 3, 3, 4), fc=c(4, 5))

    def net(x):
        y = tf.nn.relu6(tf.nn.conv2d(x, w["conv"], 1, "SAME"))
        y = fused_bottleneck(y, w["ew"], w["eb"], w["dw"], w["db"], w["pw"], w["pb"], stride=1, residual=True)
        y = tf.pad(tf.nn.max_pool2d(y, 2, 2, "VALID"), [[0, 0], [1, 1], [1, 1], [0, 0]])
        return tf.nn.softmax(tf.matmul(tf.reduce_mean(y, axis=[1, 2]), w["fc"])), tf.reshape(y, [1, -1])

    fn = tf.function(net, input_signature=[tf.TensorSpec([1, 8, 8, 3], tf.float32)], autograph=False)
    result = tflfuse.convert([fn.get_concrete_function()])
    assert result.report.fused("fused_bottleneck") == 1
    return result.tflite


@pytest.mark.parametrize("which", ["face_detection_short_range", "small_converted"])
def test_mutated_models_fail_cleanly(which, request, tmp_path):
    data = (zoo.fetch(which).read_bytes() if which != "small_converted"
            else request.getfixturevalue("small_converted_model"))
    positions = _metadata_positions(data)
    paths = []
    for seed in range(MUTANTS):
        p = tmp_path / f"{which}.{seed}.tflite"
        p.write_bytes(mutate(data, positions, seed))
        paths.append(p)
    results = run_files(paths)
    bad = {Path(p).name: describe(r) for p, r in results.items() if not clean(r)}
    assert not bad, f"{len(bad)} of {MUTANTS} mutants did not fail cleanly:\n" + "\n".join(
        f"  {k}: {v}" for k, v in sorted(bad.items())[:20])
    kinds = [r["kind"] for r in results.values()]
    # The fuzz reaches past the parser: some mutants still run, and some fail at the plan (ops, shapes).
    assert kinds.count("ok") >= MUTANTS // 20, kinds.count("ok")
    assert sum(r.get("type") in ("KernelError", "UnsupportedOpError") for r in results.values()) >= MUTANTS // 50


def test_standalone_fuzz_run(tmp_path, capsys):
    """``python tests/test_bad_inputs.py --mutants N`` (the longer run the README describes), briefly."""
    assert main(["--mutants", "20", "--first-seed", "0", "--models", "face_detection_short_range",
                 "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    counts = summary["results"]["face_detection_short_range"]
    assert sum(counts.values()) == 20 and counts["bad"] == 0, summary
    assert not list((tmp_path / "face_detection_short_range").iterdir())   # clean mutants are not kept



def _edited(model: bytes, edit) -> bytes:
    """``model`` with ``edit(tree)`` applied to its unpacked flatbuffer, packed again unchecked."""
    import tflite_builder as tb

    tree = schema.ModelT.InitFromPackedBuf(model, 0)
    edit(tree)
    return tb.pack(tree)


@pytest.mark.parametrize("body", [0, 7])
def test_while_running_its_own_subgraph_is_refused(body):
    """A WHILE whose body is subgraph 0, its own (LiteRT recurses until the process crashes), or no subgraph."""
    model = build([t((2,)), t((2,))], [dict(op="WHILE", inputs=[0], outputs=[1],
                                            options=("WhileOptions", {"condSubgraphIndex": 0,
                                                                      "bodySubgraphIndex": body}))], [0], [1])
    want = ("WHILE \\(operator 0 of subgraph 0\\) runs its own subgraph 0 again" if body == 0 else
            "WHILE \\(operator 0 of subgraph 0\\) runs subgraph 7; the model has 1 subgraphs")
    with pytest.raises(tflfuse.model.ModelError, match=want):
        tflfuse.Interpreter(model_content=model)


def test_overflowing_shape_and_non_utf8_names_are_model_errors():
    """A shape whose element count overflows float64 (a ModelError naming the tensor, not OverflowError), and a
    tensor name that is not UTF-8 in a CPU segment (LiteRT cannot decode it: a ModelError naming the op)."""
    model = unary("RELU")

    def huge(tree):
        tree.subgraphs[0].tensors[1].shape = [2 ** 31 - 1] * 40
    with pytest.raises(tflfuse.model.ModelError, match=r"subgraph 0 tensor 1 has an implausible shape "
                                                        r"\[2147483647, .*\] \(rank 40\)"):
        tflfuse.Model(_edited(model, huge))
    lengths = t((2,), type="INT32", data=np.array([3, 3], np.int32))   # REVERSE_SEQUENCE: no GPU kernel
    rev = build([t((2, 3)), lengths, t((2, 3))],
                [dict(op="REVERSE_SEQUENCE", inputs=[0, 1], outputs=[2],
                      options=("ReverseSequenceOptions", {"seqDim": 1, "batchDim": 0}))], [0], [2])

    def rename(tree):
        tree.subgraphs[0].tensors[2].name = b"\xffbad"
    interp = tflfuse.Interpreter(model_content=_edited(rev, rename))
    with pytest.raises(tflfuse.model.ModelError, match=r"CPU fallback of REVERSE_SEQUENCE \(operator 0 of "
                                                        r"subgraph 0\): a tensor name is not UTF-8"):
        interp.allocate_tensors()


# ---- a longer fuzz run, outside pytest ----------------------------------------------------------------------

def fuzz(data: bytes, seeds: range, folder: Path, batch: int = 500) -> dict[str, int]:
    """Runs the mutants of ``data`` for ``seeds`` through :func:`run_files`, in batches (progress is logged).

    Returns counts by outcome (``ok``, ``error`` for clean errors, ``bad`` for anything else). The files of
    mutants that did not fail cleanly stay in ``folder`` (``<seed>.tflite``, with ``<seed>.json`` describing
    the outcome); the others are deleted."""
    from absl import logging

    folder.mkdir(parents=True, exist_ok=True)
    positions = _metadata_positions(data)
    counts = {"ok": 0, "error": 0, "bad": 0}
    for lo in range(seeds.start, seeds.stop, batch):
        paths = []
        for seed in range(lo, min(lo + batch, seeds.stop)):
            paths.append(folder / f"{seed}.tflite")
            paths[-1].write_bytes(mutate(data, positions, seed))
        for p, r in run_files(paths).items():
            if clean(r):
                counts[r["kind"]] += 1
                Path(p).unlink()
            else:
                counts["bad"] += 1
                Path(p).with_suffix(".json").write_text(json.dumps({"seed": int(Path(p).stem), **r}))
                logging.error("mutant %s did not fail cleanly: %s", p, describe(r))
        for extra in folder.glob("todo-*"):
            extra.unlink()
        logging.info("%s: %d mutants run, %s", folder.name, min(lo + batch, seeds.stop) - seeds.start, counts)
    return counts


def main(argv=None) -> int:
    """``python tests/test_bad_inputs.py --mutants 20000``: the seeded mutation fuzz of
    :func:`test_mutated_models_fail_cleanly` for more seeds, one model after the other. Exit status 1 when a
    mutant crashed, hung or raised an unclean error (its file is kept under ``--out``)."""
    import argparse
    import tempfile
    import time

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    ap.add_argument("--mutants", type=int, default=2000, help="mutants per model")
    ap.add_argument("--first-seed", type=int, default=MUTANTS, help="first seed (the test runs 0..MUTANTS-1)")
    ap.add_argument("--models", default="face_detection_short_range,small_converted")
    ap.add_argument("--out", type=Path, default=None, help="folder for the mutants (default: a temp folder)")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tflfuse-fuzz-"))
    total, t0 = {}, time.perf_counter()
    for which in args.models.split(","):
        data = small_converted_bytes() if which == "small_converted" else zoo.fetch(which).read_bytes()
        total[which] = fuzz(data, range(args.first_seed, args.first_seed + args.mutants), out / which)
    print(json.dumps({"seeds": [args.first_seed, args.first_seed + args.mutants], "results": total,
                      "seconds": round(time.perf_counter() - t0, 1), "out": str(out)}))
    return 1 if any(c["bad"] for c in total.values()) else 0


if __name__ == "__main__":
    from absl import logging as _logging

    _logging.set_verbosity(_logging.INFO)   # progress lines
    sys.exit(main())

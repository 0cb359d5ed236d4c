"""The .tflite file format beyond one plain subgraph: several signatures (one subgraph each), control flow
(IF/WHILE, with their branch and body subgraphs), buffers stored after the flatbuffer (``Buffer.offset`` and
``Buffer.size``, counted from the start of the file) and dynamic shapes (``shape_signature`` with -1).

Each model is made by the stock TFLite converter (or rewritten with LiteRT's own schema module) and read by
tflfuse and by LiteRT's CPU interpreter, which is the reference for every detail and value.
"""

import tflfuse  # noqa: I001  (before TensorFlow)

import flatbuffers
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

from conftest import ACCUMULATION, EXACT, SEED
from tflfuse.kernels import UnsupportedOpError

RNG = np.random.default_rng(SEED)
CONV_W = RNG.standard_normal((3, 3, 4, 8)).astype(np.float32) / 6.0
CONV_B = RNG.standard_normal(8).astype(np.float32)
DENSE_W = RNG.standard_normal((8, 5)).astype(np.float32) / 3.0


class TwoSignatures(tf.Module):
    """Two entry points: an image model with a fixed shape and a head with a dynamic batch."""

    def __init__(self):
        super().__init__()
        self.conv_w = tf.Variable(CONV_W)
        self.dense_w = tf.Variable(DENSE_W)

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 4], tf.float32, name="image")])
    def features(self, image):
        return {"features": tf.nn.relu(tf.nn.conv2d(image, self.conv_w, 1, "SAME") + CONV_B)}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x"),
                                  tf.TensorSpec([None, 5], tf.float32, name="bias")])
    def head(self, x, bias):
        logits = tf.matmul(x, self.dense_w) + bias
        return {"logits": logits, "probs": tf.nn.softmax(logits)}


def _convert(functions, trackable) -> bytes:
    return tf.lite.TFLiteConverter.from_concrete_functions(
        [f.get_concrete_function() for f in functions], trackable).convert()


@pytest.fixture(scope="module")
def two_signatures():
    module = TwoSignatures()
    return module, _convert([module.features, module.head], module)


def _same_details(ours: dict, lite: dict) -> None:
    assert ours["name"] == lite["name"]
    assert ours["index"] == lite["index"], ours["name"]
    assert ours["shape"].tolist() == lite["shape"].tolist(), ours["name"]
    assert ours["shape_signature"].tolist() == lite["shape_signature"].tolist(), ours["name"]
    assert ours["dtype"] == lite["dtype"], ours["name"]


# ---- signatures ------------------------------------------------------------------------------------
def test_signature_list_matches_litert(two_signatures):
    _, model = two_signatures
    ours, lite = tflfuse.Interpreter(model_content=model), LiteRTInterpreter(model_content=model)
    assert ours.get_signature_list() == lite.get_signature_list()
    assert set(ours.get_signature_list()) == {"features", "head"}
    raw = schema.ModelT.InitFromPackedBuf(model, 0)
    assert len(raw.subgraphs) == 2 and sorted(s.subgraphIndex for s in raw.signatureDefs) == [0, 1]


@pytest.mark.parametrize("batch", [1, 3])
def test_signature_runners_match_litert_and_tf(two_signatures, device, rng, batch):
    module, model = two_signatures
    ours, lite = tflfuse.Interpreter(model_content=model, device=device), LiteRTInterpreter(model_content=model)
    inputs = {
        "features": {"image": rng.standard_normal((1, 8, 8, 4)).astype(np.float32)},
        "head": {"x": rng.standard_normal((batch, 8)).astype(np.float32),
                 "bias": rng.standard_normal((batch, 5)).astype(np.float32)},
    }
    for key, feed in inputs.items():
        mine, ref = ours.get_signature_runner(key), lite.get_signature_runner(key)
        got, want = mine(**feed), ref(**feed)
        expected = {k: np.asarray(v) for k, v in getattr(module, key)(**feed).items()}
        assert sorted(got) == sorted(want) == sorted(expected)
        for name in want:
            assert got[name].shape == want[name].shape == expected[name].shape, (key, name)
            assert got[name].dtype == want[name].dtype == np.float32, (key, name)
            np.testing.assert_allclose(got[name], want[name], **ACCUMULATION, err_msg=f"{key}/{name} vs LiteRT")
            np.testing.assert_allclose(got[name], expected[name], **ACCUMULATION, err_msg=f"{key}/{name} vs TF")
        for side in ("get_input_details", "get_output_details"):
            o, lt = getattr(mine, side)(), getattr(ref, side)()
            assert sorted(o) == sorted(lt), (key, side)
            for name in lt:
                _same_details(o[name], lt[name])


def test_signature_runner_key_errors_match_litert(two_signatures):
    _, model = two_signatures
    ours, lite = tflfuse.Interpreter(model_content=model), LiteRTInterpreter(model_content=model)
    for interp in (ours, lite):
        with pytest.raises(ValueError):
            interp.get_signature_runner()           # two signatures: the key is required
        with pytest.raises(ValueError):
            interp.get_signature_runner("nope")
    with pytest.raises(ValueError, match="features.*head|head.*features"):
        ours.get_signature_runner("nope")           # ours names the keys there are


# ---- control flow: IF and WHILE have no kernel --------------------------------------------------------
def _if_model() -> bytes:
    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([], tf.bool)])
    def branch(x, flag):
        return tf.cond(flag, lambda: x * 2.0, lambda: x - 1.0)

    return _convert([branch], branch)


def _while_model() -> bytes:
    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    def loop(x):
        return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5), [tf.constant(0), x])[1]

    return _convert([loop], loop)


def _op_names(model: bytes, subgraph: int) -> list[str]:
    """Op names of a subgraph read with LiteRT's schema module (independent of tflfuse's reader)."""
    raw = schema.ModelT.InitFromPackedBuf(model, 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    codes = raw.operatorCodes
    return [names[max(codes[op.opcodeIndex].builtinCode, codes[op.opcodeIndex].deprecatedBuiltinCode)]
            for op in raw.subgraphs[subgraph].operators]


@pytest.mark.parametrize("make,op,feed", [
    (_if_model, "IF", lambda: [np.ones((2, 3), np.float32), np.array(True)]),
    (_while_model, "WHILE", lambda: [np.ones((2, 3), np.float32)]),
])
def test_control_flow_is_refused_at_construction(make, op, feed):
    model = make()
    raw = schema.ModelT.InitFromPackedBuf(model, 0)
    assert len(raw.subgraphs) == 3                  # the main graph, and two branches or cond + body
    index = _op_names(model, 0).index(op)
    # The model is valid: LiteRT runs it.
    lite = LiteRTInterpreter(model_content=model)
    lite.allocate_tensors()
    for d, x in zip(lite.get_input_details(), feed()):
        lite.set_tensor(d["index"], x)
    lite.invoke()
    # Strict (no CPU fallback), tflfuse refuses it when the interpreter is made (no GPU is touched), naming op,
    # index and subgraph. (By default it runs on LiteRT's CPU interpreter: tests/test_cpu_fallback.py.)
    with pytest.raises(UnsupportedOpError, match=rf"'{op}' at operator {index} of subgraph 0"):
        tflfuse.Interpreter(model_content=model, cpu_fallback=False)


def test_unsupported_op_in_a_second_subgraph_names_that_subgraph():
    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def plain(self, x):
            return {"y": tf.nn.relu(x)}

        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32)])
        def running(self, x):
            return {"y": tf.linalg.diag(tf.nn.relu(x))}

    module = Module()
    model = _convert([module.plain, module.running], module)
    raw = schema.ModelT.InitFromPackedBuf(model, 0)
    sub = next(s.subgraphIndex for s in raw.signatureDefs if s.signatureKey in (b"running", "running"))
    index = _op_names(model, sub).index("MATRIX_DIAG")
    with pytest.raises(UnsupportedOpError, match=rf"'MATRIX_DIAG' at operator {index} of subgraph {sub}"):
        tflfuse.Interpreter(model_content=model, cpu_fallback=False)


# ---- buffers after the flatbuffer ---------------------------------------------------------------------
def externalize(model: bytes, align: int = 16) -> tuple[bytes, dict[int, int]]:
    """Rewrites ``model`` (LiteRT's schema module) so that every buffer's bytes lie after the flatbuffer,
    ``align``-aligned, found by ``Buffer.offset``/``Buffer.size`` from the start of the file.

    Returns the new file and ``{buffer index: offset}``.
    """
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    moved = [(i, bytes(bytearray(b.data))) for i, b in enumerate(m.buffers) if b.data is not None and len(b.data)]

    def pack(offsets):
        for (i, data), off in zip(moved, offsets):
            m.buffers[i].data, m.buffers[i].offset, m.buffers[i].size = None, off, len(data)
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    # Offsets are fixed-size fields: pack once with placeholders to learn the flatbuffer's length.
    head = pack([1 << 40] * len(moved))
    offsets, pos = [], -(-len(head) // align) * align
    for _, data in moved:
        offsets.append(pos)
        pos = -(-(pos + len(data)) // align) * align
    final = pack(offsets)
    assert len(final) == len(head)
    out = bytearray(final)
    for (_, data), off in zip(moved, offsets):
        out += b"\0" * (off - len(out)) + data
    return bytes(out), {i: off for (i, _), off in zip(moved, offsets)}


def _run(interp, x):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.parametrize("fp16", [False, True])
def test_buffers_outside_the_flatbuffer(device, rng, fp16):
    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 4], tf.float32)])
    def net(x):
        y = tf.nn.relu(tf.nn.conv2d(x, CONV_W, 1, "SAME") + CONV_B)
        return tf.matmul(tf.reduce_mean(y, axis=[1, 2]), DENSE_W)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([net.get_concrete_function()], net)
    if fp16:  # float16 weights behind DEQUANTIZE: decoded at load from the external bytes
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    inline = converter.convert()
    model, offsets = externalize(inline)
    raw = schema.ModelT.InitFromPackedBuf(model, 0)
    assert all(b.data is None or not len(b.data) for b in raw.buffers)
    assert len(offsets) >= 3 and all(raw.buffers[i].offset == off for i, off in offsets.items())
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)

    ours = _run(tflfuse.Interpreter(model_content=model, device=device), x)
    lite = _run(LiteRTInterpreter(model_content=model), x)
    same_model_inline = _run(tflfuse.Interpreter(model_content=inline, device=device), x)
    np.testing.assert_allclose(ours[0], lite[0], **ACCUMULATION)
    np.testing.assert_allclose(ours[0], same_model_inline[0], **EXACT)   # the same weights, the same shaders

    # The weights really come from the bytes after the flatbuffer: change the conv filter's there and both
    # runtimes see it.
    filt = next(i for i, b in enumerate(raw.buffers) if b.size == CONV_W.size * (2 if fp16 else 4))
    edited = bytearray(model)
    dtype = np.float16 if fp16 else np.float32
    w = np.frombuffer(edited, dtype, count=CONV_W.size, offset=offsets[filt]).copy()
    edited[offsets[filt]:offsets[filt] + w.nbytes] = (-w).tobytes()
    ours2 = _run(tflfuse.Interpreter(model_content=bytes(edited), device=device), x)
    lite2 = _run(LiteRTInterpreter(model_content=bytes(edited)), x)
    np.testing.assert_allclose(ours2[0], lite2[0], **ACCUMULATION)
    assert np.max(np.abs(ours2[0] - ours[0])) > 0.1


def test_model_path_with_external_buffers(tmp_path, device, rng):
    @tf.function(input_signature=[tf.TensorSpec([2, 8], tf.float32)])
    def dense(x):
        return tf.nn.relu(tf.matmul(x, DENSE_W))

    model, _ = externalize(_convert([dense], dense))
    path = tmp_path / "external.tflite"
    path.write_bytes(model)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    ours = _run(tflfuse.Interpreter(model_path=str(path), device=device), x)
    lite = _run(LiteRTInterpreter(model_path=str(path)), x)
    np.testing.assert_allclose(ours[0], lite[0], **ACCUMULATION)


# ---- shape signatures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dynamic_batch_model():
    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 4], tf.float32, name="images")])
    def net(images):
        y = tf.nn.relu(tf.nn.conv2d(images, CONV_W, 1, "SAME") + CONV_B)
        y = tf.nn.max_pool2d(y, 2, 2, "VALID")
        return tf.reshape(y, [-1, 4 * 4 * 8])

    return _convert([net], net)


def _tensor_details_match(ours, lite, model: bytes) -> list[dict]:
    o, lt = ours.get_tensor_details(), lite.get_tensor_details()
    o_by, lt_by = {d["index"]: d for d in o}, {d["index"]: d for d in lt}
    n = len(schema.ModelT.InitFromPackedBuf(model, 0).subgraphs[0].tensors)
    assert set(o_by) == set(range(n)) and set(range(n)) <= set(lt_by)
    for t in range(n):   # LiteRT may add kernel scratch tensors past the file's own
        _same_details(o_by[t], lt_by[t])
    return o


def test_every_tensor_has_its_shape_signature(dynamic_batch_model, device, rng):
    ours = tflfuse.Interpreter(model_content=dynamic_batch_model, device=device)
    # Without XNNPACK: its delegate keeps the tensors inside its partition at their first shapes after a resize.
    lite = LiteRTInterpreter(model_content=dynamic_batch_model,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    details = _tensor_details_match(ours, lite, dynamic_batch_model)
    dynamic = [d for d in details if -1 in d["shape_signature"].tolist()]
    assert {d["name"] for d in dynamic} >= {"images"} and len(dynamic) >= 3   # input, activations, output
    assert all(d["shape_signature"][0] == -1 and d["shape"][0] == 1 for d in dynamic)

    x = rng.standard_normal((3, 8, 8, 4)).astype(np.float32)
    for interp in (ours, lite):
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], list(x.shape))
    mine, ref = _run(ours, x), _run(lite, x)
    np.testing.assert_allclose(mine[0], ref[0], **ACCUMULATION)
    details = _tensor_details_match(ours, lite, dynamic_batch_model)  # shapes now batch 3; signatures unchanged
    assert all(d["shape"][0] == 3 for d in details if -1 in d["shape_signature"].tolist())
    assert ours.get_output_details()[0]["shape_signature"].tolist() == [-1, 128]


def test_tensor_details_refuse_a_bad_subgraph_index(dynamic_batch_model):
    ours = tflfuse.Interpreter(model_content=dynamic_batch_model)
    with pytest.raises(ValueError, match="subgraph_index"):
        ours.get_tensor_details(1)

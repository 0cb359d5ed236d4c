"""The CPU fallback: builtins without a tflfuse kernel (REVERSE_SEQUENCE, ATAN2, WHILE...), ops reading int64
tensors, and ops whose GPU kernel refuses them (a bool PAD, rank-9 comparisons) run on LiteRT's CPU interpreter
within the same invoke, between GPU segments.

Every model here comes from the stock TF converter and every output is compared against LiteRT's CPU
interpreter running the whole file. Tolerances: the CPU segments are LiteRT's own kernels on the same inputs
(bit-identical), so the error is the GPU ops' alone: :data:`conftest.ELEMENTWISE` for RELU/ADD/MUL/SUB (one
rounding each), :data:`conftest.TRANSCENDENTAL` where a TANH or LOGISTIC runs on the GPU (WGSL's exp/tanh
ULP bounds), :data:`conftest.ACCUMULATION` with a convolution (sums in another order); integer outputs exact.
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from conftest import ACCUMULATION, ELEMENTWISE, EXACT, TRANSCENDENTAL

import tflfuse
from tflfuse.kernels import UnsupportedOpError
from tflfuse.model import Model


def _convert(fn, *specs) -> bytes:
    f = tf.function(fn, input_signature=list(specs), autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _x(shape, name="x"):
    return tf.TensorSpec(shape, tf.float32, name=name)


#: The op most tests here need to fall back: a builtin that LiteRT runs and tflfuse has no GPU kernel for
#: (REVERSE_V2 served until it got one; should REVERSE_SEQUENCE get one, another such op goes here).
CPU_OP = "REVERSE_SEQUENCE"


def _reverse(x, axis: int):
    """``x`` (rank >= 2) reversed along ``axis`` by REVERSE_SEQUENCE (:data:`CPU_OP`): every sequence along
    ``axis`` reversed whole, the batch axis being another dimension of static size."""
    batch = next(d for d in range(len(x.shape)) if d != axis and x.shape[d] is not None)
    return tf.reverse_sequence(x, [x.shape[axis]] * x.shape[batch], seq_axis=axis, batch_axis=batch)


def _several(x):   # CPU, GPU, CPU, GPU, CPU, GPU: three CPU segments; ATAN2 reads the input and a GPU result
    a = _reverse(tf.nn.relu(x), 1)
    b = tf.math.atan2(tf.tanh(a), x)
    return _reverse(b * 2.0, 0) - 1.0


def _two_readers(x):   # one CPU result read by two GPU ops, and both GPU results model outputs
    r = _reverse(tf.nn.relu(x), 1)
    return r + 1.0, tf.tanh(r) * 2.0


def _int64(x, idx):   # int64 crossing both ways: CPU REVERSE_SEQUENCE -> GPU GATHER's indices; GPU GATHER -> CPU
    g = tf.gather(tf.nn.relu(x), _reverse(idx, 0))
    return g * 2.0, _reverse(tf.gather(idx, [1, 0, 3, 2]), 0)


def _uint8(q, x):   # uint8, a type the GPU does not hold: the CASTs that read and write it fall back
    b = tf.nn.relu(tf.cast(tf.reverse(q, [1]), tf.float32) + x)   # REVERSE_V2: REVERSE_SEQUENCE takes no uint8
    return b, tf.cast(b, tf.uint8)


def _while(x):   # WHILE (and its cond and body subgraphs) run on the CPU between GPU ops
    y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5), [tf.constant(0), tf.nn.relu(x)])[1]
    return y + 1.0


def _if(x, flag):   # IF reads a bool input; its branches are subgraphs LiteRT runs
    return tf.cond(flag, lambda: tf.nn.relu(x) * 2.0, lambda: x - 1.0) + 0.5


@pytest.fixture(scope="module")
def models() -> dict[str, bytes]:
    f = tf.float32
    return {
        "middle": _convert(lambda x: tf.nn.relu(_reverse(tf.nn.relu(x) * 2.0, 1)) + 1.0, _x([2, 5])),
        "first": _convert(lambda x: tf.tanh(_reverse(x, 0)) + 0.5, _x([3, 4])),
        "last": _convert(lambda x: _reverse(tf.nn.relu(x) - 0.25, 1), _x([2, 6])),
        "several": _convert(_several, _x([3, 4])),
        "two_readers": _convert(_two_readers, _x([2, 3, 4])),
        "int64": _convert(_int64, _x([5, 3]), tf.TensorSpec([4, 1], tf.int64, name="idx")),
        "uint8": _convert(_uint8, tf.TensorSpec([2, 3], tf.uint8, name="q"), _x([2, 3])),
        "batch": _convert(lambda x: _reverse(tf.nn.relu(x), 2) + 1.0, tf.TensorSpec([None, 4, 3], f, name="x")),
        "while": _convert(_while, _x([2, 3])),
        "if": _convert(_if, _x([2, 3]), tf.TensorSpec([], tf.bool, name="flag")),
    }


def _ops(model: bytes) -> list[str]:
    return Model(model).op_names(0)


def _feeds(interp, rng):
    return [rng.integers(0, 5, d["shape"]).astype(d["dtype"])
            if np.issubdtype(d["dtype"], np.integer) else rng.standard_normal(d["shape"]).astype(d["dtype"])
            for d in interp.get_input_details()]


def _compare(model: bytes, rng, tol, resize=None, preserve=False, num_threads=None) -> tflfuse.Interpreter:
    """Runs ``model`` on tflfuse (with the CPU fallback) and on LiteRT's CPU interpreter with the same inputs
    and checks every output: shape, then dtype, then values within ``tol`` (exact for integers)."""
    lite = LiteRTInterpreter(model_content=model, experimental_preserve_all_tensors=preserve)
    ours = tflfuse.Interpreter(model_content=model, experimental_preserve_all_tensors=preserve,
                               num_threads=num_threads)
    for interp in (lite, ours):
        for index, shape in (resize or {}).items():
            interp.resize_tensor_input(interp.get_input_details()[index]["index"], shape)
        interp.allocate_tensors()
    feeds = _feeds(lite, rng)
    for interp in (lite, ours):
        for d, x in zip(interp.get_input_details(), feeds):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    for dl, do in zip(lite.get_output_details(), ours.get_output_details()):
        want, got = lite.get_tensor(dl["index"]), ours.get_tensor(do["index"])
        assert got.shape == want.shape, (do["name"], got.shape, want.shape)
        assert list(do["shape"]) == list(want.shape)
        assert got.dtype == want.dtype, (do["name"], got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, **(EXACT if want.dtype.kind in "iub" else tol))
    ours.lite = lite
    return ours


# ---- placement: where the CPU ops stand in the graph ---------------------------------------------------
def test_num_threads_reaches_the_cpu_segments(models, rng, monkeypatch):
    """``Interpreter(num_threads=3)`` gives LiteRT's interpreters of the CPU segments 3 threads (None, LiteRT's
    default, without it), and the outputs of a model with three CPU segments still match LiteRT's CPU
    interpreter on the whole file, on two invokes (TRANSCENDENTAL: ATAN2 and TANH run on the GPU)."""
    import ai_edge_litert.interpreter as litert

    seen = []

    class Spy(litert.Interpreter):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get("num_threads"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(litert, "Interpreter", Spy)
    model = models["several"]
    ours = _compare(model, rng, TRANSCENDENTAL, num_threads=3)
    assert seen == [3, 3, 3]   # one LiteRT interpreter per CPU segment
    ours.invoke()   # a second invoke with the same inputs gives the same outputs
    for d in ours.get_output_details():
        np.testing.assert_allclose(ours.get_tensor(d["index"]), ours.lite.get_tensor(d["index"]), **TRANSCENDENTAL)
    seen.clear()
    tflfuse.Interpreter(model_content=model).allocate_tensors()
    assert seen == [None, None, None]


@pytest.mark.parametrize("name,ops,fallback,tol", [
    ("middle", ["RELU", "MUL", CPU_OP, "RELU", "ADD"], [(2, CPU_OP)], ELEMENTWISE),
    ("first", [CPU_OP, "TANH", "ADD"], [(0, CPU_OP)], TRANSCENDENTAL),
    ("last", ["RELU", "SUB", CPU_OP], [(2, CPU_OP)], ELEMENTWISE),
    ("several", ["RELU", CPU_OP, "TANH", "ATAN2", "MUL", CPU_OP, "SUB"],
     [(1, CPU_OP), (3, "ATAN2"), (5, CPU_OP)], TRANSCENDENTAL),
    ("two_readers", ["RELU", CPU_OP, "TANH", "MUL", "ADD"], [(1, CPU_OP)], TRANSCENDENTAL),
])
def test_cpu_segments_between_gpu_ops_match_litert(models, rng, name, ops, fallback, tol):
    model = models[name]
    assert _ops(model) == ops   # the converter wrote the graph this test is about
    ours = _compare(model, rng, tol)
    assert ours.fallback_ops == [(i, op, "no GPU kernel") for i, op in fallback]
    assert ours.dispatch_count >= len(ops) - len(fallback)   # the other ops run on the GPU
    ours.invoke()   # a second invoke with the same inputs gives the same outputs
    for d in ours.get_output_details():
        np.testing.assert_allclose(ours.get_tensor(d["index"]), ours.lite.get_tensor(d["index"]), **tol)


def test_int64_tensors_cross_both_ways(models, rng):
    """int64 tensors (held as int32 on the GPU) move from a CPU segment to a GPU GATHER and from a GPU GATHER
    to a CPU segment; the int64 output comes from the CPU."""
    model = models["int64"]
    assert _ops(model) == ["GATHER", CPU_OP, CPU_OP, "RELU", "GATHER", "MUL"]
    ours = _compare(model, rng, ELEMENTWISE)
    assert ours.fallback_ops == [(1, CPU_OP, "no GPU kernel"), (2, CPU_OP, "no GPU kernel")]
    assert [d["dtype"] for d in ours.get_output_details()] == [np.float32, np.int64]


def test_uint8_tensors_run_on_the_gpu(models, rng):
    """uint8 tensors are held one value per i32: REVERSE_V2, which only moves values, and the CASTs from and to
    uint8 (tflfuse.kernels.quant.cast) run on the GPU, nothing on the fallback. The uint8 input is set and the
    uint8 output read in the file's dtype."""
    model = models["uint8"]
    assert _ops(model) == ["REVERSE_V2", "CAST", "ADD", "CAST"]
    ours = _compare(model, rng, ELEMENTWISE)
    assert ours.fallback_ops == []
    out = next(d for d in ours.get_output_details() if d["dtype"] == np.uint8)
    assert ours.get_tensor(out["index"]).dtype == np.uint8
    q = next(d for d in ours.get_input_details() if d["dtype"] == np.uint8)
    with pytest.raises(TypeError, match="expects uint8"):
        ours.set_tensor(q["index"], np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"has shape \[2, 3\]"):
        ours.set_tensor(q["index"], np.zeros((3, 2), np.uint8))


def test_control_flow_runs_on_the_cpu(models, rng):
    model = models["while"]
    assert "WHILE" in _ops(model) and len(Model(model).subgraphs) == 3
    ours = _compare(model, rng, ELEMENTWISE)
    assert any(op == "WHILE" for _, op, _ in ours.fallback_ops)


def test_ops_of_a_while_on_the_cpu_are_shown_there(models):
    """``tflfuse ops``' rows (op_support): WHILE falls back, and so do the ops of its cond and body subgraphs."""
    from tflfuse.runtime.support import op_support

    model = models["while"]
    index = _ops(model).index("WHILE")
    rows = op_support(Model(model))
    assert {(r.runs, r.reason) for r in rows if r.subgraph == 0 and r.index == index} == {
        ("cpu fallback", "no GPU kernel")}
    inner = [r for r in rows if r.subgraph > 0]
    assert inner and all(r.runs == "cpu fallback" and r.via == (0, index) and r.reason ==
                         f"in subgraph {r.subgraph}, which WHILE (operator {index} of subgraph 0) runs on the CPU"
                         for r in inner), inner


@pytest.mark.parametrize("flag", [True, False])
def test_if_with_a_bool_input(models, flag):
    model = models["if"]
    assert "IF" in _ops(model) and len(Model(model).subgraphs) == 3
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    outs = []
    for interp in (tflfuse.Interpreter(model_content=model), LiteRTInterpreter(model_content=model)):
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], x if d["dtype"] == np.float32 else np.array(flag))
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert outs[0].shape == outs[1].shape == (2, 3) and outs[0].dtype == outs[1].dtype
    np.testing.assert_allclose(outs[0], outs[1], **ELEMENTWISE)


def test_fused_op_beside_a_cpu_op(rng):
    """A tflfuse fused op (``tflfuse.fuse``: CONV_2D + residual ADD + TANH into ``fused_conv2d``) before a
    REVERSE_SEQUENCE that falls back; LiteRT runs the unfused file (it has no kernel for the fused op)."""
    w = tf.constant(rng.standard_normal((1, 1, 4, 4)).astype(np.float32) / 2.0)
    plain = _convert(lambda x: _reverse(tf.tanh(tf.nn.conv2d(x, w, 1, "SAME") + x), 2), _x([1, 5, 5, 4]))
    fused, report = tflfuse.fuse(plain)
    assert "fused_conv2d" in _ops(fused) and CPU_OP in _ops(fused), report
    ours = tflfuse.Interpreter(model_content=fused)
    assert [op for _, op, _ in ours.fallback_ops] == [CPU_OP]
    lite = LiteRTInterpreter(model_content=plain)
    x = rng.standard_normal((1, 5, 5, 4)).astype(np.float32)
    for interp in (ours, lite):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
    got = ours.get_tensor(ours.get_output_details()[0]["index"])
    want = lite.get_tensor(lite.get_output_details()[0]["index"])
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, atol=TRANSCENDENTAL["atol"] + ACCUMULATION["atol"],
                               rtol=TRANSCENDENTAL["rtol"] + ACCUMULATION["rtol"])


# ---- shapes ------------------------------------------------------------------------------------------
def test_batch_after_resize_tensor_input(models, rng):
    model = models["batch"]
    ours = _compare(model, rng, ELEMENTWISE, resize={0: [3, 4, 3]})
    assert list(ours.get_output_details()[0]["shape"]) == [3, 4, 3]
    ours = _compare(model, rng, ELEMENTWISE, resize={0: [1, 4, 3]})   # and back down
    assert list(ours.get_output_details()[0]["shape"]) == [1, 4, 3]


def test_resize_again_on_one_interpreter(models, rng):
    model = models["batch"]
    ours = tflfuse.Interpreter(model_content=model)
    lite = LiteRTInterpreter(model_content=model)
    for batch in (2, 5):
        x = rng.standard_normal((batch, 4, 3)).astype(np.float32)
        for interp in (ours, lite):
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, 4, 3])
            interp.allocate_tensors()
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        np.testing.assert_allclose(got, lite.get_tensor(lite.get_output_details()[0]["index"]), **ELEMENTWISE)
        assert got.shape == (batch, 4, 3)


def test_zero_size_tensors_cross(rng):
    """An empty input through GPU RELU, CPU REVERSE_SEQUENCE, GPU ADD (the converter folds such graphs away, so
    this file is built on the schema): nothing to move, and the empty output has its shape."""
    from tflite_builder import build, t

    lengths = t((5,), type="INT32", data=np.zeros(5, np.int32))   # sequences along the empty axis 0
    model = build([t((0, 5)), t((0, 5)), lengths, t((0, 5)), t((), data=np.float32(1.0)), t((0, 5))],
                  [dict(op="RELU", inputs=[0], outputs=[1]),
                   dict(op=CPU_OP, inputs=[1, 2], outputs=[3], options=("ReverseSequenceOptions",
                                                                         {"seqDim": 0, "batchDim": 1})),
                   dict(op="ADD", inputs=[3, 4], outputs=[5])], [0], [5])
    ours = _compare(model, rng, EXACT)
    assert ours.fallback_ops == [(1, CPU_OP, "no GPU kernel")]
    assert ours.get_tensor(ours.get_output_details()[0]["index"]).shape == (0, 5)


# ---- reading tensors ---------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Warning. Enabling .experimental_preserve_all_tensors.:UserWarning")
def test_preserve_all_tensors_reads_cpu_and_gpu_intermediates(models, rng):
    model = models["several"]
    ours = _compare(model, rng, TRANSCENDENTAL, preserve=True)
    lite = ours.lite
    compared = 0
    for d in lite.get_tensor_details():
        if Model(model).tensor_data(0, d["index"]) is not None:
            continue   # constants
        np.testing.assert_allclose(ours.get_tensor(d["index"]), lite.get_tensor(d["index"]), **TRANSCENDENTAL)
        compared += 1
    assert compared == 8   # the input and the seven ops' outputs, CPU-computed ones among them


def test_cpu_computed_output_before_invoke_is_an_error(models):
    ours = tflfuse.Interpreter(model_content=models["last"])
    ours.allocate_tensors()
    with pytest.raises(RuntimeError, match="computed on the CPU; call invoke"):
        ours.get_tensor(ours.get_output_details()[0]["index"])


def test_cpu_intermediate_is_not_readable_without_preserve(rng):
    model = _convert(lambda x: tf.nn.relu(_reverse(_reverse(x, 0), 1) + 1.0), _x([2, 3]))
    names = _ops(model)
    first, second = names.index(CPU_OP), len(names) - 1 - names[::-1].index(CPU_OP)
    assert second == first + 1   # one CPU segment of two ops: the first's output stays inside it
    inner = Model(model).op_outputs(0, first)[0]
    ours = _compare(model, rng, ELEMENTWISE)
    with pytest.raises(ValueError, match=f"tensor {inner} is an intermediate tensor of a CPU fallback segment"):
        ours.get_tensor(inner)


def test_signature_runner_of_a_second_subgraph(rng, tmp_path):
    class Module(tf.Module):
        @tf.function(input_signature=[_x([2, 4])], autograph=False)
        def plain(self, x):
            return {"y": tf.nn.relu(x)}

        @tf.function(input_signature=[_x([2, 4])], autograph=False)
        def reversing(self, x):
            return {"y": _reverse(tf.nn.relu(x), 0) * 3.0}

    module = Module()
    tf.saved_model.save(module, str(tmp_path), signatures={"plain": module.plain, "reversing": module.reversing})
    model = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path)).convert()
    sub = Model(model).signature_defs()["reversing"]["subgraph"]
    assert CPU_OP in Model(model).op_names(sub)
    interp = tflfuse.Interpreter(model_content=model)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for key in ("plain", "reversing"):
        got = interp.get_signature_runner(key)(x=x)
        want = LiteRTInterpreter(model_content=model).get_signature_runner(key)(x=x)
        np.testing.assert_allclose(got["y"], want["y"], **ELEMENTWISE)


# ---- reporting and the strict mode --------------------------------------------------------------------
def test_strict_mode_refuses_with_the_old_message(models, monkeypatch):
    from tflfuse.runtime import device as device_module

    def refuse(*args, **kwargs):
        raise AssertionError("a WebGPU device was requested")

    monkeypatch.setattr(device_module.Device, "__init__", refuse)
    with pytest.raises(UnsupportedOpError) as err:
        tflfuse.Interpreter(model_content=models["several"], cpu_fallback=False)
    assert "3 op(s) of the model have no tflfuse kernel: 'REVERSE_SEQUENCE' at operators 1, 5 of subgraph 0; " \
           "'ATAN2' at operator 3 of subgraph 0" in str(err.value)
    assert err.value.ops == ((CPU_OP, 0, 1), ("ATAN2", 0, 3), (CPU_OP, 0, 5))
    assert tflfuse.Interpreter(model_content=models["several"]).fallback_ops   # the default falls back, GPU-free


def test_custom_op_without_kernel_is_still_refused():
    """LiteRT has no kernel for a custom op either: only it is named (the REVERSE_V2 beside it runs)."""
    from tflite_builder import build, t

    axis = t((1,), type="INT32", data=np.array([0], np.int32))
    model = build([t((2, 3)), axis, t((2, 3)), t((2, 3))],
                  [dict(op="REVERSE_V2", inputs=[0, 1], outputs=[2]), dict(op="my_op", inputs=[2], outputs=[3])],
                  [0], [3])
    with pytest.raises(UnsupportedOpError) as err:
        tflfuse.Interpreter(model_content=model)
    assert "1 op(s) of the model have no tflfuse kernel: 'my_op' at operator 1 of subgraph 0" in str(err.value)
    assert err.value.ops == (("my_op", 0, 1),)


def test_op_litert_refuses_is_named(rng):
    """A REVERSE_SEQUENCE with sequences longer than their axis: LiteRT refuses it at its first invoke; the error
    names it."""
    from tflite_builder import build, t

    lengths = t((2,), type="INT32", data=np.array([7, 7], np.int32))   # axis 1 has 3
    model = build([t((2, 3)), t((2, 3)), lengths, t((2, 3))],
                  [dict(op="RELU", inputs=[0], outputs=[1]),
                   dict(op=CPU_OP, inputs=[1, 2], outputs=[3],
                        options=("ReverseSequenceOptions", {"seqDim": 1, "batchDim": 0}))], [0], [3])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    lite = LiteRTInterpreter(model_content=model)
    lite.allocate_tensors()
    lite.set_tensor(lite.get_input_details()[0]["index"], x)
    with pytest.raises(RuntimeError):   # LiteRT refuses the whole file too
        lite.invoke()
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    ours.set_tensor(ours.get_input_details()[0]["index"], x)
    with pytest.raises(RuntimeError, match=rf"CPU fallback of {CPU_OP} \(operator 1 of subgraph 0\): LiteRT's CPU "
                                           r"interpreter failed"):
        ours.invoke()


def test_fallback_is_logged_once(models, rng, caplog):
    with caplog.at_level("WARNING"):
        ours = _compare(models["middle"], rng, ELEMENTWISE)
        ours.invoke()
    lines = [r.getMessage() for r in caplog.records if "LiteRT's CPU interpreter" in r.getMessage()]
    assert lines == [f"tflfuse: 1 op(s) of subgraph 0 run on LiteRT's CPU interpreter: {CPU_OP} (operator 2): "
                     "no GPU kernel"], lines


def test_ops_command_shows_where_each_op_runs(models, tmp_path):
    """``tflfuse ops`` on a file with a WHILE: the WHILE and the ops of its subgraphs on the CPU fallback, the
    interpreter's own reason on each line, every other op supported."""
    path = tmp_path / "while.tflite"
    path.write_bytes(models["while"])
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "ops", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr   # every op runs somewhere
    ours = tflfuse.Interpreter(model_content=models["while"])
    reasons = {i: reason for i, _, reason in ours.fallback_ops}
    lines = [line for line in r.stdout.splitlines() if line.startswith("subgraph 0 ")]
    ops = _ops(models["while"])
    assert len(lines) == len(ops)
    for i, (op, line) in enumerate(zip(ops, lines)):
        assert line.startswith(f"subgraph 0 op {i:4d}  {op} "), line
        if i in reasons:   # the interpreter's own reason
            assert line.endswith(f"CPU fallback (LiteRT's CPU interpreter): {reasons[i]}"), line
        else:
            assert line.endswith("supported"), line
    assert {op for _, op, _ in ours.fallback_ops} == {"WHILE"}
    fallback = sum("CPU fallback" in line for line in r.stdout.splitlines()[:-1])
    assert r.stdout.splitlines()[-1] == (
        f"{fallback} op(s) run on LiteRT's CPU interpreter within the same invoke (the CPU fallback; "
        f"Interpreter(..., cpu_fallback=False) refuses them instead)")


def _int64_model(op: str, options=None, n: int = 4) -> bytes:
    """One op over an int64 vector (axis 0, a constant, where the op takes one)."""
    from tflite_builder import build, t

    if op == "CUMSUM":
        axis = t((), type="INT32", data=np.array(0, np.int32))
        return build([t((n,), type="INT64"), axis, t((n,), type="INT64")],
                     [dict(op=op, inputs=[0, 1], outputs=[2], options=("CumsumOptions", {}))], [0], [2])
    if op == "SUM":
        axis = t((1,), type="INT32", data=np.array([0], np.int32))
        return build([t((n,), type="INT64"), axis, t((), type="INT64")],
                     [dict(op=op, inputs=[0, 1], outputs=[2], options=("ReducerOptions", {"keepDims": False}))],
                     [0], [2])
    return build([t((n,), type="INT64"), t((n,), type="INT64")], [dict(op=op, inputs=[0], outputs=[1])], [0], [1])


def _run_both(model: bytes, x: np.ndarray, **kw):
    outs = []
    for interp in (LiteRTInterpreter(model_content=model), tflfuse.Interpreter(model_content=model, **kw)):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    return outs


@pytest.mark.parametrize("op", ["CUMSUM", "SUM", "NEG"])
def test_int64_arithmetic_runs_on_the_cpu(op):
    """int64 results past int32 (the GPU holds int64 as int32, where they would wrap) come from LiteRT's CPU."""
    x = np.array([2 ** 30, 2 ** 30, 2 ** 30, 5] if op != "NEG" else [-2 ** 31, -5, 7, 0], np.int64)
    model = _int64_model(op)
    assert tflfuse.Interpreter(model_content=model).fallback_ops == [
        (0, op, "int64 arithmetic (the GPU holds int64 as int32)")]
    want, got = _run_both(model, x)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_int64_arithmetic_is_refused_without_fallback():
    """With cpu_fallback=False the op is refused, named with its index and why, before it could wrap."""
    interp = tflfuse.Interpreter(model_content=_int64_model("CUMSUM"), cpu_fallback=False)
    with pytest.raises(tflfuse.kernels.KernelError,
                       match=r"CUMSUM \(operator 0 of subgraph 0\): int64 arithmetic \(the GPU holds int64 as "
                             r"int32\).*cpu_fallback=True"):
        interp.allocate_tensors()


def test_int64_data_movement_stays_on_the_gpu():
    """Ops that only move int64 values are exact under int32 narrowing: no fallback, and fusion plans them."""
    from tflfuse.passes.carry import without_kernel

    model = _int64_model("SQUEEZE")
    assert tflfuse.Interpreter(model_content=model).fallback_ops == []
    assert without_kernel(Model(model), 0) == set()
    assert without_kernel(Model(_int64_model("CUMSUM")), 0) == {0}   # fuse carries what the runtime sends to the CPU
    x = np.array([2 ** 31 - 1, -2 ** 31, 3, 4], np.int64)
    want, got = _run_both(model, x)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_int64_past_int32_where_only_cpu_ops_read_it():
    """An int64 input that only CPU ops read may hold any int64 (LiteRT's result); one that a CPU op computes
    past int32 for a GPU op is refused naming that op, not a value the user set."""
    from tflite_builder import build, t

    axis = t((1,), type="INT32", data=np.array([0], np.int32))
    model = build([t((3,), type="INT64"), axis, t((3,), type="INT64")],
                  [dict(op="REVERSE_V2", inputs=[0, 1], outputs=[2])], [0], [2])
    x = np.array([2 ** 40, 1, -2 ** 40], np.int64)
    want, got = _run_both(model, x)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    cast = build([t((3,), type="UINT32"), t((3,), type="INT64"), t((3, 1), type="INT64"),
                  t((), type="INT32", data=np.array(1, np.int32))],
                 [dict(op="CAST", inputs=[0], outputs=[1],
                       options=("CastOptions", {"inDataType": 12, "outDataType": 4})),
                  dict(op="EXPAND_DIMS", inputs=[1, 3], outputs=[2])], [0], [2])
    with pytest.raises(tflfuse.kernels.KernelError,
                       match=r"computed by CPU fallback of CAST \(operator 0 of subgraph 0\) and read by a GPU op, "
                             r"holds the int64 value 3000000000"):
        _run_both(cast, np.array([3_000_000_000, 1, 2], np.uint32))


# ---- ops whose GPU kernel refuses them -----------------------------------------------------------------------
def _bool_pad(x):   # PAD's kernel takes float32 and int32: the bool tensor of a comparison falls back
    return tf.cast(tf.pad(x > 0.0, [[1, 0], [0, 2]]), tf.float32) + 1.0


def _rank9(x, y):   # GREATER, SELECT and ADD kernels stop at rank 8
    return tf.where(x > y, x, y) + 1.0


@pytest.mark.parametrize("fn,specs,refused", [
    (_bool_pad, [_x([2, 3])], ["PAD"]),
    (_rank9, [_x([1, 2, 1, 2, 1, 1, 2, 1, 3]), _x([1, 2, 1, 2, 1, 1, 2, 1, 3], "y")], ["GREATER", "SELECT", "ADD"]),
], ids=["bool_pad", "rank9"])
def test_op_its_kernel_refuses_runs_on_the_cpu(rng, caplog, fn, specs, refused):
    """An op with a GPU kernel that refuses its dtype or rank falls back (reported with the kernel's message,
    logged once); with cpu_fallback=False the kernel's own KernelError is raised, naming the op and its index."""
    model = _convert(fn, *specs)
    names = _ops(model)
    with caplog.at_level("WARNING"):
        ours = _compare(model, rng, ELEMENTWISE)
        ours.invoke()
    got = [(i, op) for i, op, _ in ours.fallback_ops]
    assert got == [(names.index(op), op) for op in refused]
    for i, op, reason in ours.fallback_ops:
        assert reason.startswith(f"{op}: ") and "input shapes" in reason, reason   # the kernel's message
    lines = [r.getMessage() for r in caplog.records if "LiteRT's CPU interpreter" in r.getMessage()]
    assert len(lines) == 1 and all(f"{op} (operator {i}): {reason}" in lines[0]
                                   for i, op, reason in ours.fallback_ops), lines
    strict = tflfuse.Interpreter(model_content=model, cpu_fallback=False)
    first, op, reason = ours.fallback_ops[0]
    with pytest.raises(tflfuse.kernels.KernelError) as err:
        strict.allocate_tensors()
    assert str(err.value) == f"{op} (operator {first} of subgraph 0): {reason}"
    from tflfuse.runtime.support import op_support   # `tflfuse ops` shows the same ops and reasons
    rows = [(r.index, r.name, r.reason) for r in op_support(Model(model)) if r.runs == "cpu fallback"]
    assert rows == [tuple(f) for f in ours.fallback_ops]


def test_refused_op_with_a_run_time_shape_input(rng):
    """A bool PAD whose paddings come from an input: the plan is specialised on the paddings and PAD runs on
    LiteRT with them as constants (so that the GPU ops after it get its shape); new paddings, a new plan."""
    model = _convert(lambda x, p: tf.cast(tf.pad(x > 0.0, p), tf.float32) * 2.0, _x([2, 3]),
                     tf.TensorSpec([2, 2], tf.int32, name="p"))
    ours = tflfuse.Interpreter(model_content=model)
    ours.allocate_tensors()
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for pads in ([[1, 0], [0, 2]], [[0, 0], [1, 1]], [[1, 0], [0, 2]]):
        lite = LiteRTInterpreter(model_content=model)
        lite.allocate_tensors()
        for interp in (ours, lite):
            for d in interp.get_input_details():
                interp.set_tensor(d["index"], x if d["dtype"] == np.float32 else np.array(pads, np.int32))
            interp.invoke()
        got = ours.get_tensor(ours.get_output_details()[0]["index"])
        want = lite.get_tensor(lite.get_output_details()[0]["index"])
        assert got.shape == want.shape == (2 + sum(pads[0]), 3 + sum(pads[1])) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)   # a cast of 0/1 doubled: exact
        assert [op for _, op, _ in ours.fallback_ops] == ["PAD"]
    strict = tflfuse.Interpreter(model_content=model, cpu_fallback=False)
    strict.allocate_tensors()
    for d in strict.get_input_details():
        strict.set_tensor(d["index"], x if d["dtype"] == np.float32 else np.array(pads, np.int32))
    with pytest.raises(tflfuse.kernels.KernelError, match=r"PAD \(operator 1 of subgraph 0\): PAD: input 0 must "
                                                          r"be float32 or int32, got bool"):
        strict.invoke()


@pytest.mark.parametrize("op,value,then", [
    ("PAD", np.array([[1, -1], [0, 0]], np.int32), "an invalid input"),   # negative paddings
    ("RESHAPE", np.array([4, 4], np.int32), "an invalid input"),          # 6 elements as [4, 4]
    ("TRANSPOSE", np.array([0, 0], np.int32), "an invalid input"),        # not a permutation
    # index 5 of 2 rows: LiteRT checks at invoke
    ("GATHER", np.array([0, 5], np.int32), "LiteRT's CPU interpreter, where it would run instead, fails on them too"),
])
def test_malformed_op_is_named_whether_or_not_it_falls_back(op, value, then):
    """A file neither runtime can run: the GPU kernel refuses the op; shape values that are invalid
    (tflfuse.runtime.validate: PAD, RESHAPE, TRANSPOSE) are refused without falling back, other ops fall back and
    LiteRT refuses them (when the plan is made: a segment of such ops runs once on zeros then); both modes raise
    a one-line KernelError that starts with the kernel's own message, naming the op and its index."""
    from tflite_builder import build, t

    const = t(value.shape, type="INT32", data=value)
    model = build([t((2, 3)), const, t((2, 2) if op != "GATHER" else (2, 3))],
                  [dict(op=op, inputs=[0, 1], outputs=[2])], [0], [2])
    with pytest.raises(tflfuse.kernels.KernelError) as strict:
        tflfuse.Interpreter(model_content=model, cpu_fallback=False).allocate_tensors()
    assert str(strict.value).startswith(f"{op} (operator 0 of subgraph 0): {op}: ")
    with pytest.raises(tflfuse.kernels.KernelError) as err:
        tflfuse.Interpreter(model_content=model).allocate_tensors()
    assert str(err.value).startswith(f"{strict.value}; {then}"), str(err.value)
    assert "\n" not in str(err.value)

"""tflfuse.Interpreter against LiteRT's Python Interpreter API: details, errors, intermediates, resizing,
signatures, unsupported ops, malformed files, pipelines built once and buffer reuse."""

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

import tflfuse
from tflfuse.kernels import UnsupportedOpError
from tflfuse.runtime import device as device_module

from conftest import ACCUMULATION, SEED, TRANSCENDENTAL

_RNG = np.random.default_rng(SEED)
_W_CONV = (_RNG.standard_normal((3, 3, 3, 8)) / np.sqrt(27)).astype(np.float32)
_B_CONV = _RNG.standard_normal(8).astype(np.float32)
_W_FC = (_RNG.standard_normal((8, 5)) / np.sqrt(8)).astype(np.float32)


def _convert(fn, *specs) -> bytes:
    f = tf.function(fn, input_signature=list(specs), autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _net(x):
    """conv(+bias, relu6) -> mul -> add -> mean -> FC -> softmax, and the conv output as a second output."""
    y = tf.nn.relu6(tf.nn.bias_add(tf.nn.conv2d(x, _W_CONV, 1, "SAME"), _B_CONV))
    z = y * 0.5 + tf.tanh(y)
    m = tf.reduce_mean(z, axis=[1, 2])
    return tf.nn.softmax(tf.matmul(m, _W_FC)), y


@pytest.fixture(scope="module")
def net_model() -> bytes:
    return _convert(_net, tf.TensorSpec([1, 6, 6, 3], tf.float32, name="image"))


@pytest.fixture(scope="module")
def dynamic_net_model() -> bytes:
    return _convert(_net, tf.TensorSpec([None, 6, 6, 3], tf.float32, name="image"))


@pytest.fixture(scope="module")
def chain_model() -> bytes:
    """Eight ops in a chain: seven intermediate tensors, each dead once the next op has read it."""
    def chain(x):
        for k in range(4):
            x = tf.tanh(x) * (1.5 + k)
        return x
    return _convert(chain, tf.TensorSpec([4, 33], tf.float32, name="x"))


@pytest.fixture(scope="module")
def signature_model(tmp_path_factory) -> bytes:
    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")], autograph=False)
        def dense(self, x):
            return {"probs": tf.nn.softmax(tf.matmul(x, _W_FC)), "double": x * 2.0}

        @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32, name="a"),
                                      tf.TensorSpec([2, 3], tf.float32, name="b")], autograph=False)
        def add(self, a, b):
            return {"sum": tf.nn.relu(a + b)}

    m = Module()
    path = str(tmp_path_factory.mktemp("saved"))
    tf.saved_model.save(m, path, signatures={"dense": m.dense, "add": m.add})
    return tf.lite.TFLiteConverter.from_saved_model(path).convert()


def _image(shape=(1, 6, 6, 3), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(interp, x):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _assert_details_match(ours: list[dict], theirs: list[dict]):
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        assert set(o) == set(t)
        assert o["name"] == t["name"] and isinstance(o["name"], str)
        assert o["index"] == t["index"] and type(o["index"]) is type(t["index"])
        for k in ("shape", "shape_signature"):
            assert isinstance(o[k], np.ndarray) and o[k].dtype == t[k].dtype == np.int32, k
            np.testing.assert_array_equal(o[k], t[k], err_msg=k)
        assert o["dtype"] is t["dtype"]
        assert o["quantization"] == t["quantization"]
        assert [type(v) for v in o["quantization"]] == [type(v) for v in t["quantization"]]
        oq, tq = o["quantization_parameters"], t["quantization_parameters"]
        assert set(oq) == set(tq)
        for k in tq:
            if isinstance(tq[k], np.ndarray):
                assert oq[k].dtype == tq[k].dtype, k
                np.testing.assert_array_equal(oq[k], tq[k], err_msg=k)
            else:
                assert oq[k] == tq[k] and type(oq[k]) is type(tq[k]), k
        assert o["sparsity_parameters"] == t["sparsity_parameters"]


# ---- details -----------------------------------------------------------------------------------------
def test_details_match_litert(net_model, device):
    ours = tflfuse.Interpreter(model_content=net_model, device=device)
    lite = LiteRTInterpreter(model_content=net_model)
    _assert_details_match(ours.get_input_details(), lite.get_input_details())
    _assert_details_match(ours.get_output_details(), lite.get_output_details())
    ours.allocate_tensors()
    lite.allocate_tensors()
    _assert_details_match(ours.get_input_details(), lite.get_input_details())
    _assert_details_match(ours.get_output_details(), lite.get_output_details())


def test_results_match_litert(net_model, device):
    x = _image()
    ours = _run(tflfuse.Interpreter(model_content=net_model, device=device), x)
    lite = _run(LiteRTInterpreter(model_content=net_model), x)
    for o, t in zip(ours, lite):
        assert o.shape == t.shape and o.dtype == t.dtype
        np.testing.assert_allclose(o, t, **TRANSCENDENTAL)


def test_model_path(net_model, device, tmp_path):
    path = tmp_path / "net.tflite"
    path.write_bytes(net_model)
    x = _image()
    by_path = _run(tflfuse.Interpreter(model_path=str(path), device=device), x)
    by_bytes = _run(tflfuse.Interpreter(model_content=net_model, device=device), x)
    for a, b in zip(by_path, by_bytes):
        np.testing.assert_array_equal(a, b)


def test_model_path_xor_content(net_model, tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        tflfuse.Interpreter()
    with pytest.raises(ValueError, match="exactly one"):
        tflfuse.Interpreter(model_path=str(tmp_path / "x.tflite"), model_content=net_model)
    with pytest.raises(FileNotFoundError):
        tflfuse.Interpreter(model_path=str(tmp_path / "missing.tflite"))


# ---- errors of the call sequence ----------------------------------------------------------------------
def test_set_tensor_wrong_dtype_is_type_error(net_model, device):
    interp = tflfuse.Interpreter(model_content=net_model, device=device)
    interp.allocate_tensors()
    idx = interp.get_input_details()[0]["index"]
    for bad in (_image().astype(np.float64), _image().astype(np.float16), np.zeros((1, 6, 6, 3), np.int32)):
        with pytest.raises(TypeError, match="float32"):
            interp.set_tensor(idx, bad)


def test_set_tensor_wrong_shape_is_value_error(net_model, device):
    interp = tflfuse.Interpreter(model_content=net_model, device=device)
    interp.allocate_tensors()
    idx = interp.get_input_details()[0]["index"]
    for shape in ((1, 6, 6, 4), (6, 6, 3), (2, 6, 6, 3)):
        with pytest.raises(ValueError, match="resize_tensor_input"):
            interp.set_tensor(idx, _image(shape))


def test_set_tensor_on_a_non_input_is_value_error(net_model, device):
    interp = tflfuse.Interpreter(model_content=net_model, device=device)
    interp.allocate_tensors()
    out = interp.get_output_details()[0]
    with pytest.raises(ValueError, match="not an input"):
        interp.set_tensor(out["index"], np.zeros(out["shape"], np.float32))


def test_invoke_before_allocate_tensors(net_model):
    interp = tflfuse.Interpreter(model_content=net_model)
    with pytest.raises(RuntimeError, match=r"allocate_tensors\(\)"):
        interp.invoke()
    with pytest.raises(RuntimeError, match=r"allocate_tensors\(\)"):
        interp.set_tensor(0, _image())


def test_invoke_before_set_tensor(net_model, device):
    interp = tflfuse.Interpreter(model_content=net_model, device=device)
    interp.allocate_tensors()
    idx = interp.get_input_details()[0]["index"]
    with pytest.raises(RuntimeError, match=rf"inputs \[{idx}\] were never set.*set_tensor\(\)"):
        interp.invoke()


def test_get_tensor_on_an_intermediate_is_value_error(net_model, device):
    interp = tflfuse.Interpreter(model_content=net_model, device=device)
    _run(interp, _image())
    lite = LiteRTInterpreter(model_content=net_model)
    outputs = {d["index"] for d in lite.get_output_details()}
    intermediates = [t for op in lite._get_ops_details() for t in op["outputs"] if t not in outputs]
    assert len(intermediates) >= 4
    for i in intermediates:
        with pytest.raises(ValueError, match="intermediate"):
            interp.get_tensor(i)


# ---- intermediates with experimental_preserve_all_tensors ---------------------------------------------
def test_preserve_all_tensors_matches_litert(net_model, device):
    x = _image()
    ours = tflfuse.Interpreter(model_content=net_model, device=device, experimental_preserve_all_tensors=True)
    lite = LiteRTInterpreter(model_content=net_model, experimental_preserve_all_tensors=True,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    _run(ours, x)
    _run(lite, x)
    model = tflfuse.Model(net_model)
    written = [t for i in range(len(model.op_names())) for t in model.op_outputs(0, i)]
    assert len(written) >= 6
    for t in written:
        o, l = ours.get_tensor(t), lite.get_tensor(t)
        assert o.shape == l.shape and o.dtype == l.dtype, t
        np.testing.assert_allclose(o, l, **TRANSCENDENTAL, err_msg=f"tensor {t} {model.tensor_name(0, t)!r}")


# ---- resizing ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["static", "dynamic"])
def test_resize_to_batch_3(which, net_model, dynamic_net_model, device):
    model = net_model if which == "static" else dynamic_net_model
    x = _image((3, 6, 6, 3), seed=3)
    ours = tflfuse.Interpreter(model_content=model, device=device)
    lite = LiteRTInterpreter(model_content=model)
    for interp in (ours, lite):
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], [3, 6, 6, 3])
    _assert_details_match(ours.get_input_details(), lite.get_input_details())  # before allocate_tensors
    o, l = _run(ours, x), _run(lite, x)
    _assert_details_match(ours.get_input_details(), lite.get_input_details())
    _assert_details_match(ours.get_output_details(), lite.get_output_details())
    for a, b in zip(o, l):
        assert a.shape == b.shape and a.shape[0] == 3
        np.testing.assert_allclose(a, b, **TRANSCENDENTAL)
    # Each image of the batch gives what it gives alone.
    single = tflfuse.Interpreter(model_content=model, device=device)
    for k in range(3):
        np.testing.assert_allclose(_run(single, x[k:k + 1])[0], o[0][k:k + 1], **ACCUMULATION)


def test_resize_errors(dynamic_net_model, net_model, device):
    interp = tflfuse.Interpreter(model_content=dynamic_net_model, device=device)
    idx = interp.get_input_details()[0]["index"]
    with pytest.raises(ValueError, match="not an input"):
        interp.resize_tensor_input(idx + 100, [1, 6, 6, 3])
    with pytest.raises(ValueError, match="must not be negative"):
        interp.resize_tensor_input(idx, [-2, 6, 6, 3])
    interp.resize_tensor_input(idx, [0, 6, 6, 3])   # an empty batch: allowed, as in LiteRT
    interp.resize_tensor_input(idx, [2, 6, 6, 3], strict=True)  # -1 batch: allowed
    with pytest.raises(ValueError, match="strict"):
        interp.resize_tensor_input(idx, [2, 7, 6, 3], strict=True)
    static = tflfuse.Interpreter(model_content=net_model, device=device)
    with pytest.raises(ValueError, match="strict"):
        static.resize_tensor_input(idx, [2, 6, 6, 3], strict=True)


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_resize_to_an_empty_batch_runs_nothing(precision, dynamic_net_model, device):
    # every op's output is empty: no dispatch, and outputs of LiteRT's shapes and dtypes (no values to differ)
    ours = tflfuse.Interpreter(model_content=dynamic_net_model, device=device, precision=precision)
    lite = LiteRTInterpreter(model_content=dynamic_net_model)
    for interp in (ours, lite):
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], [0, 6, 6, 3])
    x = _image((0, 6, 6, 3))
    o, l = _run(ours, x), _run(lite, x)
    _assert_details_match(ours.get_output_details(), lite.get_output_details())
    assert [(a.shape, a.dtype) for a in o] == [(b.shape, b.dtype) for b in l] == [((0, 5), np.float32),
                                                                                   ((0, 6, 6, 8), np.float32)]
    assert ours.dispatch_count == 0 and ours.fallback_ops == []


def test_resize_then_old_shape_is_refused(dynamic_net_model, device):
    interp = tflfuse.Interpreter(model_content=dynamic_net_model, device=device)
    idx = interp.get_input_details()[0]["index"]
    interp.resize_tensor_input(idx, [2, 6, 6, 3])
    interp.allocate_tensors()
    with pytest.raises(ValueError):
        interp.set_tensor(idx, _image((1, 6, 6, 3)))
    interp.set_tensor(idx, _image((2, 6, 6, 3)))


# ---- signatures ----------------------------------------------------------------------------------------
def test_signature_list_matches_litert(signature_model):
    ours = tflfuse.Interpreter(model_content=signature_model)
    lite = LiteRTInterpreter(model_content=signature_model)
    assert ours.get_signature_list() == lite.get_signature_list()
    assert set(ours.get_signature_list()) == {"dense", "add"}


def test_signature_runners_match_litert(signature_model, device):
    ours = tflfuse.Interpreter(model_content=signature_model, device=device)
    lite = LiteRTInterpreter(model_content=signature_model)
    rng = np.random.default_rng(SEED)
    calls = {"dense": [dict(x=rng.standard_normal((1, 8)).astype(np.float32)),
                       dict(x=rng.standard_normal((3, 8)).astype(np.float32))],   # LiteRT's runner resizes
             "add": [dict(a=rng.standard_normal((2, 3)).astype(np.float32),
                          b=rng.standard_normal((2, 3)).astype(np.float32)),
                     dict(a=rng.standard_normal((4, 3)).astype(np.float32),    # both inputs resized
                          b=rng.standard_normal((4, 3)).astype(np.float32))]}
    for key, inputs_list in calls.items():
        o_run, l_run = ours.get_signature_runner(key), lite.get_signature_runner(key)
        for inputs in inputs_list:
            o, l = o_run(**inputs), l_run(**inputs)
            assert set(o) == set(l)
            for name in l:
                assert o[name].shape == l[name].shape and o[name].dtype == l[name].dtype, name
                np.testing.assert_allclose(o[name], l[name], **TRANSCENDENTAL, err_msg=name)
            for od, ld in ((o_run.get_input_details(), l_run.get_input_details()),
                           (o_run.get_output_details(), l_run.get_output_details())):
                assert list(od) == list(ld)
                _assert_details_match(list(od.values()), list(ld.values()))


def test_signature_runner_errors(signature_model, device):
    ours = tflfuse.Interpreter(model_content=signature_model, device=device)
    with pytest.raises(ValueError, match="2 signatures"):
        ours.get_signature_runner()
    with pytest.raises(ValueError, match="'add'.*'dense'"):
        ours.get_signature_runner("nope")
    runner = ours.get_signature_runner("add")
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="missing input 'b'"):
        runner(a=a)
    with pytest.raises(ValueError, match="unknown inputs"):
        runner(a=a, b=a, c=a)


# ---- unsupported ops: refused at construction, before any GPU work --------------------------------------
@pytest.fixture
def no_gpu(monkeypatch):
    """Any attempt to open a WebGPU device fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a WebGPU device was requested")

    monkeypatch.setattr(device_module.Device, "__init__", refuse)


def test_unsupported_op_is_named_at_construction(no_gpu):
    model = _convert(lambda x: tf.linalg.diag(tf.nn.relu(x)), tf.TensorSpec([2, 5], tf.float32, name="x"))
    assert [d["op_name"] for d in LiteRTInterpreter(model_content=model)._get_ops_details()] == ["RELU", "MATRIX_DIAG"]
    with pytest.raises(UnsupportedOpError) as err:   # strict: no CPU fallback
        tflfuse.Interpreter(model_content=model, cpu_fallback=False)  # no device given, none made: refused
    msg = str(err.value)
    assert "'MATRIX_DIAG' at operator 1 of subgraph 0" in msg and "docs/custom_kernels.md" in msg
    assert err.value.ops == (("MATRIX_DIAG", 0, 1),)


def test_unsupported_op_in_second_subgraph(tmp_path, no_gpu):
    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32, name="x")], autograph=False)
        def a_fine(self, x):
            return {"y": tf.nn.relu(x)}

        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32, name="x")], autograph=False)
        def b_diag(self, x):
            return {"y": tf.linalg.diag(x * 2.0)}

    m = Module()
    tf.saved_model.save(m, str(tmp_path), signatures={"a_fine": m.a_fine, "b_diag": m.b_diag})
    model = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path)).convert()
    lite = LiteRTInterpreter(model_content=model)
    sg = lite._interpreter.GetSubgraphIndexFromSignature("b_diag")
    assert sg == 1
    with pytest.raises(UnsupportedOpError, match=rf"'MATRIX_DIAG' at operator \d+ of subgraph {sg}"):
        tflfuse.Interpreter(model_content=model, cpu_fallback=False)


def test_unsupported_op_error_is_a_value_error():
    assert issubclass(UnsupportedOpError, ValueError)


# ---- malformed files ------------------------------------------------------------------------------------
def test_malformed_bytes_raise_model_error(net_model, no_gpu):
    wrong_id = net_model[:4] + b"XYZ3" + net_model[8:]
    cases = {"empty": b"", "3 bytes": b"TFL", "wrong identifier": wrong_id,
             "identifier only": b"\0\0\0\0TFL3"}
    for n in (9, 64, len(net_model) // 4, len(net_model) // 2, len(net_model) - 200):
        cases[f"truncated to {n}"] = net_model[:n]
    rng = np.random.default_rng(SEED)
    for k in range(20):
        cases[f"garbage {k}"] = rng.integers(0, 4, 1).astype("<u4").tobytes() + b"TFL3" + \
            rng.integers(0, 256, int(rng.integers(8, 400)), dtype=np.uint8).tobytes()
    for name, data in cases.items():
        with pytest.raises(tflfuse.ModelError):
            tflfuse.Interpreter(model_content=data)
            pytest.fail(f"{name}: accepted")
    assert issubclass(tflfuse.ModelError, ValueError)


# ---- built once: pipelines, bind groups, buffers -------------------------------------------------------
def test_invoke_builds_nothing(chain_model, device, monkeypatch):
    interp = tflfuse.Interpreter(model_content=chain_model, device=device)
    interp.allocate_tensors()
    pipelines = dict(device._pipelines)
    plan = interp._plan(0)
    assert plan.dispatch_count == 8

    def refuse(*args, **kwargs):
        raise AssertionError("GPU objects were built during invoke()")

    monkeypatch.setattr(device_module.Device, "pipeline", refuse)
    monkeypatch.setattr(device_module.Device, "create_buffer", refuse)
    for name in ("create_compute_pipeline", "create_shader_module", "create_bind_group", "create_buffer"):
        monkeypatch.setattr(type(device.device), name, refuse)
    if plan._native is not None:   # wgpu-native: outputs are read back through its C entry points, in this thread
        monkeypatch.setattr(type(next(iter(plan._staging.values()))), "map_sync", refuse)
    idx = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]
    results = []
    for seed in (1, 2, 1):
        interp.set_tensor(idx, _image((4, 33), seed))
        interp.invoke()
        results.append(interp.get_tensor(out))
    monkeypatch.undo()
    assert device._pipelines == pipelines
    np.testing.assert_array_equal(results[0], results[2])
    assert not np.array_equal(results[0], results[1])


def test_a_plan_run_once_leaves_no_command_buffer_recorded(chain_model, device):
    """The next invoke's command buffer is recorded ahead from the second invoke on: a plan run once (an
    Interpreter invoked once, a shape left again) holds none, since wgpu-native keeps the memory of a command
    buffer dropped unsubmitted."""
    interp = tflfuse.Interpreter(model_content=chain_model, device=device)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], _image((4, 33), 1))
    interp.invoke()
    plan = interp._plan(0)
    assert plan._ahead[0] is None
    interp.invoke()
    assert plan._ahead[0] is not None


def test_a_dropped_plan_submits_its_command_buffer_recorded_ahead(chain_model, device, monkeypatch):
    """A plan dropped after its second invoke submits the command buffer it recorded ahead: wgpu-native keeps
    the memory of one released unsubmitted (an Interpreter on hand_recrop invoked twice and dropped left 2.7 MB
    behind each time). A plan run once has none to submit. (After a device loss nothing is submitted:
    tests/test_device.py, in a subprocess.)"""
    import gc

    from tflfuse.runtime import plan as plan_module

    submitted = []
    submit = plan_module._NativeCommandBuffer.submit
    monkeypatch.setattr(plan_module._NativeCommandBuffer, "submit", lambda cb: submitted.append(cb) or submit(cb))
    gc.collect()   # other tests' dropped plans submit theirs now, not below
    for invokes in (1, 2, 3):
        interp = tflfuse.Interpreter(model_content=chain_model, device=device)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], _image((4, 33), 1))
        for _ in range(invokes):
            interp.invoke()
        ahead = interp._plan(0)._ahead
        pending, before = ahead[0], len(submitted)
        assert (pending is None) == (invokes == 1)
        del interp
        gc.collect()
        assert ahead[0] is None
        if pending is not None:
            assert any(cb is pending for cb in submitted[before:])
            assert pending.handle is None   # released once submitted


def test_buffers_are_reused_along_a_chain(chain_model, device):
    interp = tflfuse.Interpreter(model_content=chain_model, device=device)
    x = _image((4, 33), 5)
    ours = _run(interp, x)
    plan = interp._plan(0)
    model = tflfuse.Model(chain_model)
    intermediates = [t for i in range(len(model.op_names())) for t in model.op_outputs(0, i)
                     if t not in plan.graph.outputs]
    assert len(intermediates) == 7
    assert plan.buffer_count < len(intermediates)
    lite = _run(LiteRTInterpreter(model_content=chain_model), x)
    np.testing.assert_allclose(ours[0], lite[0], **TRANSCENDENTAL)
    # Preserving every tensor gives each its own buffer, and the same result.
    keep = tflfuse.Interpreter(model_content=chain_model, device=device, experimental_preserve_all_tensors=True)
    np.testing.assert_array_equal(_run(keep, x)[0], ours[0])
    assert keep._plan(0).buffer_count == len(intermediates) + 2


def test_interpreters_share_one_device(net_model, chain_model, device):
    a = tflfuse.Interpreter(model_content=net_model, device=device)
    b = tflfuse.Interpreter(model_content=chain_model, device=device)
    assert a.device is b.device is device
    assert a.adapter_info == device.info

"""``tflfuse export --web`` and tflfuse.js: exported models run in a real browser (Chromium on SwiftShader's
WebGPU, driven by Playwright) and give tflfuse's Interpreter's outputs; the data alone (plan.json, weights.bin,
shaders) reproduces the Interpreter bit for bit in Python; bad inputs get errors naming them; the demo page
draws the face box."""

import functools
import http.server
import io
import json
import re
import shutil
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType
from flatbuffers import flexbuffers
from tflite_builder import build, t

import tflfuse
from tflfuse import face_detection as fd
from tflfuse import zoo
from tflfuse.annotate import encode_attrs
from tflfuse.model import Model
from tflfuse.runtime.serialize import load_serialized, serialize_plan
from tflfuse.web import ExportError, export_web
from tflfuse.web.export import plan_for_export
from tflfuse.web.browser import BROWSER_FLAGS, find_browser
from tflfuse.web.executor import PlanDataExecutor

#: The browser against tflfuse's Interpreter: the same WGSL, dispatches and weights, run by another WebGPU
#: implementation (Chromium's Dawn on SwiftShader's Vulkan, against wgpu-native on Mesa's llvmpipe). Here they
#: agree bit for bit (measured: the face detector and the small model, 3 seeded inputs each); another driver may
#: contract a*b+c into an FMA or use its own exp, a few ULP per op, which ~50 ops of the face detector carry
#: to ~1e-6 relative: 1e-5 relative leaves 10x, and 1e-6 absolute (8 ULP of 1.0) covers values near 0, where
#: the rounding of O(1) partial sums, not the value, sets the error.
BROWSER_TOL = dict(rtol=1e-5, atol=1e-6)


# ---- models -------------------------------------------------------------------------------------------------
def small_model() -> bytes:
    """PAD + CONV_2D (+RELU) + DEPTHWISE_CONV_2D + 1x1 CONV_2D on a batch of 2, odd sizes and 5 channels, and an
    int32 ADD on a second input: two inputs, two outputs, one of them int32; a signature names them."""
    rng = np.random.default_rng(7)

    def c(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    pads = np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)
    conv = {"padding": 1, "strideH": 1, "strideW": 1, "fusedActivationFunction": 1}   # VALID, RELU
    dw = {"padding": 0, "strideH": 1, "strideW": 1, "depthMultiplier": 1}              # SAME
    pw = {"padding": 0, "strideH": 1, "strideW": 1}
    tensors = [t((2, 7, 9, 5), name="image"), t((4, 2), type="INT32", data=pads), t((2, 9, 11, 5)),
               t((6, 3, 3, 5), data=c(6, 3, 3, 5)), t((6,), data=c(6)), t((2, 7, 9, 6)),
               t((1, 3, 3, 6), data=c(1, 3, 3, 6)), t((6,), data=c(6)), t((2, 7, 9, 6)),
               t((3, 1, 1, 6), data=c(3, 1, 1, 6)), t((3,), data=c(3)), t((2, 7, 9, 3), name="features"),
               t((3, 5), type="INT32", name="counts"),
               t((3, 5), type="INT32", data=np.arange(-7, 8, dtype=np.int32).reshape(3, 5)),
               t((3, 5), type="INT32", name="shifted")]
    ops = [dict(op="PAD", inputs=[0, 1], outputs=[2]),
           dict(op="CONV_2D", inputs=[2, 3, 4], outputs=[5], options=("Conv2DOptions", conv)),
           dict(op="DEPTHWISE_CONV_2D", inputs=[5, 6, 7], outputs=[8], options=("DepthwiseConv2DOptions", dw)),
           dict(op="CONV_2D", inputs=[8, 9, 10], outputs=[11], options=("Conv2DOptions", pw)),
           dict(op="ADD", inputs=[12, 13], outputs=[14], options=("AddOptions", {}))]
    sig = schema.SignatureDefT()
    sig.signatureKey = b"serving_default"
    sig.subgraphIndex = 0
    sig.inputs = [_tensor_map(b"x", 0), _tensor_map(b"n", 12)]
    sig.outputs = [_tensor_map(b"y", 11), _tensor_map(b"m", 14)]
    return build(tensors, ops, [0, 12], [11, 14], signatures=[sig])


def math_model() -> bytes:
    """TANH, REDUCE_MAX over the last axis, LOG_SOFTMAX and MAX_POOL_2D of one ``[2, 3, 8, 5]`` input: ops whose
    shaders make infinities (REDUCE_MAX and MAX_POOL_2D start from -inf, LOG_SOFTMAX's max too) or call tanh,
    which SwiftShader computes as NaN past |x| ~ 44."""
    shape = (2, 3, 8, 5)
    pool = {"padding": 0, "strideH": 2, "strideW": 2, "filterHeight": 2, "filterWidth": 3}   # SAME
    tensors = [t(shape, name="x"), t(shape), t((1,), type="INT32", data=np.asarray([3], np.int32)), t((2, 3, 8)),
               t(shape), t((2, 2, 4, 5))]
    ops = [dict(op="TANH", inputs=[0], outputs=[1]),
           dict(op="REDUCE_MAX", inputs=[0, 2], outputs=[3], options=("ReducerOptions", {"keepDims": False})),
           dict(op="LOG_SOFTMAX", inputs=[0], outputs=[4]),
           dict(op="MAX_POOL_2D", inputs=[0], outputs=[5], options=("Pool2DOptions", pool))]
    return build(tensors, ops, [0], [1, 3, 4, 5])


#: special_math_model's ops, in the order of its outputs
SPECIAL_OPS = ("SIN", "COS", "EXP", "LOG", "LOGISTIC", "SOFTMAX", "LOG_SOFTMAX")


def special_math_model() -> bytes:
    """:data:`SPECIAL_OPS` of one ``[4, 16]`` input: C's functions on special values (NaN, infinities, signed
    zeros, negatives for LOG) and sin and cos of large arguments, which WGSL leaves to the adapter; SOFTMAX and
    LOG_SOFTMAX over rows holding -inf, +inf or NaN."""
    shape = (4, 16)
    tensors = [t(shape, name="x")] + [t(shape) for _ in SPECIAL_OPS]
    ops = [dict(op=op, inputs=[0], outputs=[i + 1],
                **({"options": ("SoftmaxOptions", {"beta": 1.0})} if op == "SOFTMAX" else {}))
           for i, op in enumerate(SPECIAL_OPS)]
    return build(tensors, ops, [0], list(range(1, len(SPECIAL_OPS) + 1)))


def _tensor_map(name: bytes, index: int):
    m = schema.TensorMapT()
    m.name, m.tensorIndex = name, index
    return m


@pytest.fixture(scope="module")
def small_fused():
    fused, report = tflfuse.fuse(small_model())
    assert report.patterns["pad_conv"] == 1 and report.patterns["separable_conv"] == 1, str(report)
    return fused


@pytest.fixture(scope="module")
def face_fused():
    fused, report = tflfuse.fuse(zoo.fetch("face_detection_short_range").read_bytes())
    assert report.patterns["separable_conv"] > 0, str(report)
    return fused


def _interpreter(tflite: bytes, inputs, device, precision="float32") -> tflfuse.Interpreter:
    it = tflfuse.Interpreter(model_content=tflite, device=device, precision=precision)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it


def _interpreter_outputs(tflite: bytes, inputs, device, precision="float32"):
    it = _interpreter(tflite, inputs, device, precision)
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _small_inputs(rng):
    return [rng.uniform(-1, 1, (2, 7, 9, 5)).astype(np.float32), rng.integers(-50, 50, (3, 5)).astype(np.int32)]


# ---- the site and the browser ------------------------------------------------------------------------------
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):   # one line per request on stderr otherwise
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory, device, small_fused, face_fused):
    """A local http server over a folder of exports: ``small/``, ``face/``, ``math/`` (float32), ``face16/``
    (float16); yields ``(root folder, base url)``."""
    root = tmp_path_factory.mktemp("site")
    export_web(small_fused, root / "small", device=device)
    export_web(face_fused, root / "face", device=device)
    export_web(face_fused, root / "face16", device=device, precision="float16", demo=False)
    export_web(math_model(), root / "math", device=device, demo=False)
    export_web(special_math_model(), root / "special", device=device, demo=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    """Chromium with WebGPU on SwiftShader. Where Playwright or the browser is missing the tests fail, naming the
    fix: ./bootstrap.sh test installs both, so a missing one is a broken set-up, not a reason to skip."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[test]' (or ./bootstrap.sh test)")
    path = find_browser()
    if path is None:
        pytest.fail("chromium-headless-shell is missing: apt-get install -y chromium-headless-shell "
                    "(./bootstrap.sh test does it as root)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, args=list(BROWSER_FLAGS))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def page(browser, site):
    """A page on the site (http on localhost: a secure context, which WebGPU needs)."""
    pg = browser.new_page()
    pg.goto(f"{site[1]}/small/plan.json")
    yield pg
    pg.close()


def _run_in_browser(page, folder: str, inputs, by_name=False):
    """Loads ``folder`` with tflfuse.js and runs it once on ``inputs`` (NumPy arrays); returns the outputs as
    arrays, or raises RuntimeError with the browser's error message."""
    payload = [{"dtype": str(x.dtype), "data": x.ravel().tolist()} for x in inputs]
    result = page.evaluate("""async ([folder, inputs, byName]) => {
      const {load} = await import("/small/tflfuse.js");
      try {
        const model = await load(`/${folder}/`);
        const arrays = inputs.map(x => x.dtype === "float32" ? Float32Array.from(x.data) : Int32Array.from(x.data));
        const args = byName ? Object.fromEntries(model.inputs.map((s, i) => [s.name, arrays[i]])) : arrays;
        const outs = await model.run(args);
        return {outputs: outs.map(o => ({type: o.constructor.name, data: Array.from(o)})),
                specs: model.outputs};
      } catch (e) { return {error: `${e.name}: ${e.message}`}; }
    }""", [folder, payload, by_name])
    if "error" in result:
        raise RuntimeError(result["error"])
    dtypes = {"Float32Array": np.float32, "Int32Array": np.int32}
    return [np.asarray(o["data"], dtypes[o["type"]]).reshape(s["shape"])
            for o, s in zip(result["outputs"], result["specs"])]


def _browser_error(page, script: str) -> str:
    """The message a script (given ``model``, the small model loaded) throws."""
    return page.evaluate("""async (script) => {
      const {load} = await import("/small/tflfuse.js");
      const model = await load("/small/");
      try { await (new Function("model", `return (async () => { ${script} })()`))(model); return "no error"; }
      catch (e) { return `${e.name}: ${e.message}`; }
    }""", script)


# ---- the data ------------------------------------------------------------------------------------------------
def test_plan_data_reproduces_the_interpreter_bit_for_bit(site, device, small_fused, face_fused, rng):
    root, _ = site
    for folder, tflite, xs in [("small", small_fused, _small_inputs(rng)),
                               ("face", face_fused, [rng.uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)]),
                               ("face16", face_fused, [rng.uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)])]:
        data = load_serialized(root / folder)
        got = PlanDataExecutor(data, device).run(xs)
        it = _interpreter(tflite, xs, device, data.plan["precision"])
        want = [it.get_tensor(d["index"]) for d in it.get_output_details()]
        assert len(data.plan["dispatches"]) == it.dispatch_count, folder
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, folder
            np.testing.assert_array_equal(g, w, err_msg=folder)   # the same WGSL and data on the same adapter


def test_plan_json_describes_the_model(site):
    root, _ = site
    plan = json.loads((root / "small" / "plan.json").read_text())
    assert [(s["name"], s["shape"], s["dtype"]) for s in plan["inputs"]] == [
        ("image", [2, 7, 9, 5], "float32"), ("counts", [3, 5], "int32")]
    assert [(s["name"], s["shape"], s["dtype"]) for s in plan["outputs"]] == [
        ("features", [2, 7, 9, 3], "float32"), ("shifted", [3, 5], "int32")]
    assert plan["signatures"] == {"serving_default": {"inputs": {"x": "image", "n": "counts"},
                                                      "outputs": {"y": "features", "m": "shifted"}}}
    assert plan["requires"]["features"] == []
    assert {d["op"] for d in plan["dispatches"]} >= {"fused_separable_conv2d", "ADD"}
    # shaders are stored once each, and every dispatch names one; every binding lies inside its buffer
    files = sorted(p.name for p in (root / "small" / "shaders").iterdir())
    assert files == sorted(plan["shaders"]) and len(set(plan["shaders"])) == len(plan["shaders"])
    sizes = [b["size"] for b in plan["buffers"]]
    for d in plan["dispatches"]:
        assert 0 <= d["shader"] < len(plan["shaders"])
        assert all(b["offset"] + b["size"] <= sizes[b["buffer"]] for b in d["bindings"])
    face16 = json.loads((root / "face16" / "plan.json").read_text())
    assert face16["precision"] == "float16" and face16["requires"]["features"] == ["shader-f16"]
    # its float input is written as float32 into a buffer of its own, which the first dispatch rounds into the
    # float16 buffer the kernels read
    (image,) = face16["inputs"]
    held = next(t for t in face16["tensors"] if t["index"] == image["index"])
    assert (image["storage"], held["storage"]) == ("f32", "f16") and image["buffer"] != held["buffer"]
    first = face16["dispatches"][0]
    assert (first["op"], first["operator"]) == ("FLOAT16_INPUT", -1)
    assert [b["buffer"] for b in first["bindings"]] == [image["buffer"], held["buffer"]]
    # weights: float16 ones take half the bytes of float32 ones (each constant padded to 16 bytes)
    face = json.loads((root / "face" / "plan.json").read_text())
    assert face16["weights_size"] < 0.6 * face["weights_size"]
    # intermediates share buffers: fewer work buffers than intermediate tensors
    work = {b["id"] for b in face["buffers"] if b["kind"] == "work"}
    assert len(work) < sum(t["buffer"] in work for t in face["tensors"])


def test_export_refuses_cpu_fallback_naming_the_ops(tmp_path, device):
    # MATRIX_DIAG has no tflfuse kernel: the Interpreter would run it on LiteRT's CPU, which a browser lacks.
    model = build([t((2, 3)), t((2, 3, 3)), t((2, 3, 3))],
                  [dict(op="MATRIX_DIAG", inputs=[0], outputs=[1]), dict(op="RELU", inputs=[1], outputs=[2])],
                  [0], [2])
    with pytest.raises(ExportError, match=r"MATRIX_DIAG \(operator 0, no GPU kernel\).*browser"):
        export_web(model, tmp_path / "out", device=device)


# ---- in the browser ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("by_name", [False, True], ids=["in_order", "by_name"])
def test_small_model_in_the_browser_matches_the_interpreter(page, device, small_fused, rng, by_name):
    xs = _small_inputs(rng)
    got = _run_in_browser(page, "small", xs, by_name=by_name)
    want = _interpreter_outputs(small_fused, xs, device)
    assert [(g.shape, g.dtype) for g in got] == [(w.shape, w.dtype) for w in want]
    np.testing.assert_allclose(got[0], want[0], **BROWSER_TOL)
    np.testing.assert_array_equal(got[1], want[1])   # int32 ADD: exact


def test_face_detector_in_the_browser_matches_the_interpreter(page, device, face_fused, rng):
    xs = [rng.uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)]
    got = _run_in_browser(page, "face", xs)
    want = _interpreter_outputs(face_fused, xs, device)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **BROWSER_TOL)


def test_infinities_and_tanh_in_the_browser_match_litert(page, rng):
    # Chrome's WGSL compiler (Tint) refuses a non-finite constant such as bitcast<f32>(0xff800000u), and
    # SwiftShader's tanh gives NaN for large arguments: these shaders must compile and hold there too. Against
    # LiteRT's CPU interpreter. The browser's exp, log and tanh are SwiftShader's, a few ULP from LiteRT's
    # (WGSL allows exp 3 + 2|x| ULP, log 3 ULP); log-softmax values reach -200, where one ULP is 1.5e-5: 1e-5
    # relative (2e-3 there) and 2e-5 absolute (for values near 0, set by the rounding of the row's log-sum).
    x = rng.uniform(-60.0, 60.0, (2, 3, 8, 5)).astype(np.float32)
    x.reshape(-1)[:6] = [100.0, -100.0, 0.0, -0.0, 1e-4, 44.5]
    litert = LiteRTInterpreter(model_content=math_model())
    litert.allocate_tensors()
    litert.set_tensor(litert.get_input_details()[0]["index"], x)
    litert.invoke()
    want = [litert.get_tensor(d["index"]) for d in litert.get_output_details()]
    got = _run_in_browser(page, "math", [x])
    assert [g.shape for g in got] == [w.shape for w in want]
    for name, g, w in zip(["TANH", "REDUCE_MAX", "LOG_SOFTMAX", "MAX_POOL_2D"], got, want):
        assert not np.isnan(g).any(), name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5, err_msg=name)


def test_special_values_and_large_sin_arguments_in_the_browser_match_litert(page, rng):
    # WGSL lets an implementation assume that no value is NaN or infinite and bounds sin and cos inside [-pi, pi]
    # only; SwiftShader's log of a negative is log|x|, its exp(NaN) +inf, its sin(3) 9e-5 off. tflfuse decides
    # special values on the bits and reduces sin's argument itself (wgsl.HELPERS). Against LiteRT's builtin
    # kernels (C's functions): NaN, infinities and zeros with their signs bit for bit; sin and cos within
    # 3e-7 absolute (tests/test_kernels_math.py's TRIG_REDUCED), the rest 2e-5 relative (WGSL allows exp
    # 3 + 2|x| ULP, 179 ULP = 1.1e-5 at |x| = 88) and 2e-6 absolute (SOFTMAX's and LOG_SOFTMAX's values near 0,
    # set by the rounding of the row's sum of O(1) terms).
    x = rng.uniform(-20.0, 20.0, (4, 16)).astype(np.float32)
    x[0, :12] = [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 3.0, 88.0, 89.0, -104.0, -200.0, 1e-40]
    x[1, :5] = [-np.inf, -np.inf, -3.0, -1e-40, -7.5]      # LOG of negatives; (LOG_)SOFTMAX with -inf terms
    x[2] = rng.uniform(-4e5, 4e5, 16)                      # sin and cos past [-pi, pi]
    x[2, :3] = [1e3, 12345.6, -3e4]
    x[3, :3] = [np.nan, np.inf, -1.0]                      # a row of NaN out of (LOG_)SOFTMAX
    litert = LiteRTInterpreter(model_content=special_math_model(),
                               experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    litert.allocate_tensors()
    litert.set_tensor(litert.get_input_details()[0]["index"], x)
    litert.invoke()
    want = [litert.get_tensor(d["index"]) for d in litert.get_output_details()]
    got = _run_in_browser(page, "special", [x])
    for name, g, w in zip(SPECIAL_OPS, got, want):
        assert g.shape == w.shape, name
        special = ~np.isfinite(w) | (w == 0)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{name}: NaN positions")
        np.testing.assert_array_equal(g[special & ~np.isnan(w)].view(np.uint32),
                                      w[special & ~np.isnan(w)].view(np.uint32), err_msg=f"{name}: inf, zeros")
        tol = dict(atol=3e-7, rtol=0.0) if name in ("SIN", "COS") else dict(atol=2e-6, rtol=2e-5)
        np.testing.assert_allclose(g[~special], w[~special], **tol, err_msg=name)


@pytest.mark.parametrize("script, message", [
    ("await model.run([new Float32Array(10), new Int32Array(15)])",
     'input "image" (shape [2,7,9,5], float32) must have 630 values, got 10'),
    ("await model.run([new Float64Array(630), new Int32Array(15)])",
     'input "image" (shape [2,7,9,5], float32) must be a Float32Array, got a Float64Array of 630 values'),
    ("await model.run([new Float32Array(630), new Float32Array(15)])",
     'input "counts" (shape [3,5], int32) must be a Int32Array, got a Float32Array of 15 values'),
    ("await model.run({image: new Float32Array(630), count: new Int32Array(15)})",
     'unknown input "count"; the model\'s inputs are image, counts'),
    ("await model.run({image: new Float32Array(630)})", 'missing input "counts"'),
    ("await model.run([new Float32Array(630)])", "the model takes 2 input(s) (image, counts), got 1"),
], ids=["length", "dtype", "int_dtype", "unknown_name", "missing_name", "count"])
def test_bad_inputs_get_errors_naming_the_input(page, script, message):
    error = _browser_error(page, script)
    assert error.startswith("TflfuseError: ") and message in error, error


def test_a_good_run_after_a_bad_one(page, device, small_fused, rng):
    assert "must have" in _browser_error(page, "await model.run([new Float32Array(1), new Int32Array(15)])")
    xs = _small_inputs(rng)
    np.testing.assert_allclose(_run_in_browser(page, "small", xs)[0], _interpreter_outputs(small_fused, xs, device)[0],
                               **BROWSER_TOL)


def test_missing_feature_and_lost_device_and_no_webgpu(browser, page):
    # SwiftShader offers no shader-f16: a float16 export is refused at load, naming the feature.
    has_f16 = page.evaluate("async () => (await navigator.gpu.requestAdapter()).features.has('shader-f16')")
    if not has_f16:
        error = page.evaluate("""async () => {
          const {load} = await import("/small/tflfuse.js");
          try { await load("/face16/"); return "loaded"; } catch (e) { return `${e.name}: ${e.message}`; }
        }""")
        assert 'needs the WebGPU feature "shader-f16"' in error, error
    # A destroyed device: the next run says it is lost.
    error = _browser_error(page, "model.device.destroy(); await model.device.lost; await model.run([])")
    assert "the WebGPU device was lost (destroyed" in error and "load the model again" in error, error
    # No navigator.gpu (a browser without WebGPU, or an insecure context): on a page of its own.
    other = browser.new_page()
    try:
        other.goto(page.url)
        error = other.evaluate("""async () => {
          const {load} = await import("/small/tflfuse.js");
          Object.defineProperty(navigator, "gpu", {value: undefined, configurable: true});
          try { await load("/small/"); return "loaded"; } catch (e) { return `${e.name}: ${e.message}`; }
        }""")
    finally:
        other.close()
    assert "WebGPU is not available: navigator.gpu is missing" in error, error


def test_a_limit_the_adapter_lacks_is_refused_naming_it(page, site):
    root, _ = site
    plan = json.loads((root / "small" / "plan.json").read_text())
    plan["requires"]["limits"]["maxComputeWorkgroupsPerDimension"] = 2 ** 31   # past every adapter's
    shutil.copytree(root / "small", root / "too_big")
    (root / "too_big" / "plan.json").write_text(json.dumps(plan))
    error = page.evaluate("""async () => {
      const {load} = await import("/small/tflfuse.js");
      try { await load("/too_big"); return "loaded"; } catch (e) { return `${e.name}: ${e.message}`; }
    }""")
    assert "needs the WebGPU limit maxComputeWorkgroupsPerDimension >= 2147483648; the adapter" in error, error


# ---- WebGPU's limits ---------------------------------------------------------------------------------------------
def _wide_block(**attrs) -> bytes:
    """One fused_bottleneck contracting 4,096 input channels to 16 on an 8x8 map (a 1x1 expand conv, a 3x3
    depthwise conv, a projection to 16), seeded weights scaled for unit-variance sums."""
    rng = np.random.default_rng(17)
    shapes = [(4096, 16), (16,), (3, 3, 16), (16,), (16, 16), (16,)]
    weights = [(rng.standard_normal(s) / np.sqrt(s[0] if len(s) == 2 else 9)).astype(np.float32) for s in shapes]
    tensors = [t((1, 8, 8, 4096), name="x")] + [t(s, data=w) for s, w in zip(shapes, weights)] + \
        [t((1, 8, 8, 16), name="y")]
    custom = flexbuffers.Dumps(encode_attrs({"expansion": 1, "target": "gpu", **attrs}))
    return build(tensors, [dict(op="fused_bottleneck", inputs=list(range(7)), outputs=[7], custom=custom)], [0], [7])


def _declared_workgroup_bytes(wgsl: str) -> int:
    """The bytes of a shader's ``var<workgroup>`` arrays of f32 (the only kind the tiled bottleneck declares), each
    rounded up to 16 bytes as WebGPU counts them."""
    sizes = re.findall(r"var<workgroup>\s+\w+\s*:\s*array<f32,\s*(\d+)>", wgsl)
    assert len(sizes) == wgsl.count("var<workgroup>"), wgsl
    return sum(-(-4 * int(n) // 16) * 16 for n in sizes)


def test_wide_tiled_block_lists_the_workgroup_memory_it_needs(page, site, device, rng):
    # The tiled strategy, asked for at Cin 4,096, stages one expanded channel's 4,096 expand weights beside its
    # halo: past WebGPU's default 16 KiB of workgroup memory, so plan.json's requires.limits names what its shader
    # declares, tflfuse.js asks the adapter for it, and the Python executor refuses a device offering less.
    root, _ = site
    tiled = _wide_block(strategy="tiled")
    data = export_web(tiled, root / "wide", device=device, target="gpu", demo=False)
    need = max(_declared_workgroup_bytes(data.shaders[name]) for name in data.plan["shaders"])
    assert need > 16384 and data.plan["requires"]["limits"]["maxComputeWorkgroupStorageSize"] >= need
    # the block's default schedule keeps within the default (the staged strategy: tests/test_bottleneck.py)
    default = export_web(_wide_block(), root / "wide_default", device=device, target="gpu", demo=False)
    assert 0 < default.plan["requires"]["limits"]["maxComputeWorkgroupStorageSize"] <= 16384
    # the data alone, on this adapter: the Interpreter's outputs bit for bit (the same WGSL); refused, naming the
    # limit and the op, on a device that offers 16 KiB
    x = rng.standard_normal((1, 8, 8, 4096)).astype(np.float32)
    want = _interpreter_outputs(tiled, [x], device)
    np.testing.assert_array_equal(PlanDataExecutor(data, device).run([x])[0], want[0])
    small = types.SimpleNamespace(features=device.features, name="a 16 KiB adapter",
                                  limits={**device.limits, "max-compute-workgroup-storage-size": 16384})
    with pytest.raises(ValueError, match=rf"maxComputeWorkgroupStorageSize >= {need} \(op fused_bottleneck, "
                                         rf"operator 0, program fused_bottleneck\); a 16 KiB adapter offers 16384"):
        PlanDataExecutor(data, small)
    # in the browser: tflfuse.js requests the limit where the adapter offers it (without, its device would have
    # WebGPU's default 16 KiB and refuse the pipeline), and refuses it, naming it, where it does not
    offered = page.evaluate("async () => (await navigator.gpu.requestAdapter()).limits.maxComputeWorkgroupStorageSize")
    if offered >= need:
        np.testing.assert_allclose(_run_in_browser(page, "wide", [x])[0], want[0], **BROWSER_TOL)
    else:
        with pytest.raises(RuntimeError, match=f"needs the WebGPU limit maxComputeWorkgroupStorageSize >= {need}"):
            _run_in_browser(page, "wide", [x])


#: The bounds test_web_models.py holds these models' exports to against LiteRT CPU (|d| <= rel * (max |want| +
#: |want|)): their masks are sigmoids of logits in the hundreds. Measured here (the GPU schedules on the software
#: adapter, 2026-12-07): 1.8e-5 and 9.7e-6.
_SELFIE_REL = {"selfie_segmentation": 5e-5, "selfie_segmentation_landscape": 2e-4}


@pytest.mark.parametrize("name", sorted(_SELFIE_REL))
def test_fused_selfie_plans_keep_within_the_default_limits(device, name):
    # fused_squeeze_excite's GPU form of the selfie decoder's attention (the mean of x + addend) bound x and the
    # addend twice, as vec4s for its mean and as f32 for its scaling: 9 storage buffers, past WebGPU's default 8,
    # which tflfuse.js refused on an adapter offering 8. Both targets' plans now ask for the defaults at most.
    stock = zoo.fetch(name).read_bytes()
    fused, _ = tflfuse.fuse(stock)
    for target in ("gpu", "cpu"):
        data = serialize_plan(plan_for_export(Model(fused), device, target=target))
        limits = data.plan["requires"]["limits"]
        assert 0 < limits["maxStorageBuffersPerShaderStage"] <= 8, target
        assert max(len(d["bindings"]) for d in data.plan["dispatches"]) == limits["maxStorageBuffersPerShaderStage"]
        assert 0 < limits["maxComputeWorkgroupStorageSize"] <= 16384, target
        assert any(d["op"] == "fused_squeeze_excite" for d in data.plan["dispatches"]), target
    # the GPU plan's values (its merged squeeze-excite dispatches) against LiteRT CPU on the stock model
    x = np.random.default_rng(1).uniform(0, 1, zoo.ALL_MODELS[name].input_shape).astype(np.float32)
    data = serialize_plan(plan_for_export(Model(fused), device, target="gpu"))
    assert any(d["program"] == "fused_squeeze_excite_gate_scale" for d in data.plan["dispatches"])
    got = PlanDataExecutor(data, device).run([x])
    litert = LiteRTInterpreter(model_content=stock)
    litert.allocate_tensors()
    litert.set_tensor(litert.get_input_details()[0]["index"], x)
    litert.invoke()
    want = [litert.get_tensor(d["index"]) for d in litert.get_output_details()]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = float(np.abs(w).max())
        assert (np.abs(g - w) <= _SELFIE_REL[name] * (scale + np.abs(w))).all(), float(np.abs(g - w).max())


def test_float16_bits_round_as_numpy(page):
    # tflfuse.js rounds float16 inputs itself: to nearest even, as NumPy's astype(float16), at every edge.
    values = np.asarray([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 65519.99, 1e6, -1e6, 6.1e-5, 5.96e-8, 2.98e-8,
                         2.99e-8, 1e-9, 1.0009765625, 1.00048828125, 1.00146484375, 3.14159, np.inf, -np.inf,
                         np.nan, 1e-5, -7.3e-6], np.float32)
    rng = np.random.default_rng(3)
    values = np.concatenate([values, rng.standard_normal(200).astype(np.float32) * 10.0 ** rng.integers(-8, 5, 200)])
    values = values.astype(np.float32)
    bits = page.evaluate("""async (v) => {
      const {float16Bits} = await import("/small/tflfuse.js");
      return Array.from(float16Bits(Float32Array.from(v.map(x => x === null ? NaN : x))));
    }""", [None if np.isnan(v) else float(v) for v in values])
    with np.errstate(over="ignore"):   # past 65504 is inf, as in tflfuse.js
        want = values.astype(np.float16).view(np.uint16)
    nan = np.isnan(values)
    np.testing.assert_array_equal(np.asarray(bits[:values.size], np.uint16)[~nan], want[~nan])
    assert all(b & 0x7c00 == 0x7c00 and b & 0x3ff for b in np.asarray(bits)[:values.size][nan])


# ---- the demo page -------------------------------------------------------------------------------------------
def _is_red(rgb) -> np.ndarray:
    """Pixels of the demo's box colour, rgb(255, 0, 0), as the canvas shows it (antialiasing blends edges)."""
    rgb = np.asarray(rgb, np.int32)
    return (rgb[..., 0] > 200) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)


def test_demo_page_draws_the_face_box(browser, site, device, face_fused):
    from PIL import Image

    root, base = site
    demo = browser.new_page()
    try:
        demo.goto(f"{base}/face/index.html")
        demo.wait_for_selector("body[data-status=done], body[data-status=error]", timeout=60_000)
        assert demo.get_attribute("body", "data-status") == "done", demo.text_content("#error")
        result = demo.evaluate("window.demoResult")
        adapter, times = demo.text_content("#adapter"), demo.text_content("#times")
        box = demo.evaluate("""() => { const c = document.getElementById("view"), r = c.getBoundingClientRect();
          return {x: r.left + c.clientLeft, y: r.top + c.clientTop, width: c.clientWidth, height: c.clientHeight}; }""")
        shot = Image.open(io.BytesIO(demo.screenshot(clip=box))).convert("RGB")   # the canvas, its border left out
    finally:
        demo.close()
    assert "swiftshader" in adapter.lower() and " ms" in times and len(result["times"]) == 5
    # The box the page drew is the one tflfuse's Interpreter finds on the same input (demo/input.bin).
    x = np.fromfile(root / "face" / "demo" / "input.bin", np.float32).reshape(1, 128, 128, 3)
    want = fd.best_detection(*_interpreter_outputs(face_fused, [x], device))
    # The page decodes in float64, face_detection.py in float64 rounded to float32 (6e-8 relative), from outputs
    # that agree within BROWSER_TOL: 1e-4 (0.05 photo pixels for the box) is far above both, far below a pixel.
    assert want.score > 0.5 and abs(result["face"]["score"] - want.score) < 1e-4
    np.testing.assert_allclose(result["face"]["box"], want.box, atol=1e-4)
    # The screenshot: red along each edge of the box, the photo (not red) inside and outside it.
    pixels = np.asarray(shot)
    assert pixels.shape[:2] == (512, 512)
    y0, x0, y1, x1 = (int(round(v * 512)) for v in want.box)
    xs, ys = np.linspace(x0 + 6, x1 - 6, 12).astype(int), np.linspace(y0 + 6, y1 - 6, 12).astype(int)
    for edge in (pixels[y0, xs], pixels[y1, xs], pixels[ys, x0], pixels[ys, x1]):
        assert _is_red(edge).all(), edge
    assert not _is_red(pixels[y0 + 10:y1 - 10, x0 + 10:x1 - 10]).any()
    assert _is_red(pixels).sum() < 4 * 6 * (x1 - x0 + y1 - y0)   # one box of a 4-pixel line, nothing else


def test_demo_page_of_another_model_lists_its_outputs(browser, site):
    demo = browser.new_page()
    try:
        demo.goto(f"{site[1]}/small/index.html")
        demo.wait_for_selector("body[data-status=done], body[data-status=error]", timeout=60_000)
        assert demo.get_attribute("body", "data-status") == "done", demo.text_content("#error")
        rows = demo.locator("#outputs tr").all_inner_texts()
    finally:
        demo.close()
    assert [r.split("\t")[:2] for r in rows[1:]] == [["features", "[2,7,9,3]"], ["shifted", "[3,5]"]], rows


def test_cli_export(tmp_path, small_fused):
    model = tmp_path / "small.tflite"
    model.write_bytes(small_fused)
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "export", str(model), "--web", str(tmp_path / "web")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "python -m http.server -d" in r.stdout
    for name in ("plan.json", "weights.bin", "tflfuse.js", "index.html", "demo/demo.json"):
        assert (tmp_path / "web" / name).is_file(), name
    assert json.loads((tmp_path / "web" / "demo" / "demo.json").read_text())["kind"] == "generic"
    # A model that needs LiteRT's CPU interpreter: exit 2 naming the op, nothing written.
    model.write_bytes(build([t((2, 3)), t((2, 3, 3))], [dict(op="MATRIX_DIAG", inputs=[0], outputs=[1])], [0], [1]))
    r = subprocess.run([sys.executable, "-m", "tflfuse.cli", "export", str(model), "--web", str(tmp_path / "no")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "MATRIX_DIAG (operator 0" in r.stderr, r.stderr
    assert not (tmp_path / "no").exists()


def test_float16_values_as_numpy(page):
    # Every binary16 bit pattern read back as float32 (a float16 plan's outputs), against NumPy's conversion.
    got = page.evaluate("""async () => {
      const {float16Values} = await import("/small/tflfuse.js");
      return Array.from(float16Values(Uint16Array.from({length: 65536}, (_, i) => i)));
    }""")
    want = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    got = np.asarray(got, np.float32)
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))   # -0.0 stays negative

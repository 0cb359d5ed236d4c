"""Every MediaPipe model tflfuse runs (``zoo.MODELS``), fused, and MobileNetV2 from composites (fused), exported
with ``export_web`` and run by tflfuse.js in Chromium (WebGPU on SwiftShader), on seeded inputs: against
tflfuse's Python Interpreter, LiteRT's CPU interpreter, and LiteRT.js (``@litertjs/core``, its WebGPU
accelerator, on the stock .tflite) in the same page.

The export plans for the browser's adapter kind as the Interpreter does (``"cpu"`` schedules on the software
adapter here), with fused_bottleneck's staged strategy instead of the blocked one, which SwiftShader cannot
compile (:func:`tflfuse.web.export.browser_schedules`).
"""

import tflfuse  # noqa: I001  (before anything that can load TensorFlow)

import json

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from test_real_models import CASES

from tflfuse import zoo
from tflfuse.model import Model
from tflfuse.runtime.serialize import load_serialized
from tflfuse.web import export_web
from tflfuse.web.executor import PlanDataExecutor
from tflfuse.web.export import plan_for_export
from tflfuse.web import browser as web

#: tflfuse.js against tflfuse's Interpreter: the same kernels run by another WebGPU implementation (Dawn on
#: SwiftShader against wgpu-native on llvmpipe), and for fused_bottleneck the staged strategy against the
#: Interpreter's blocked one, so sums in another order. Measured (2026-12-02, these seeds): bit for bit on
#: face_detection_short_range, face_landmark, iris_landmark and palm_detection_lite; 3.3e-6 of the largest value
#: on hand_landmark_lite (its world landmarks, sums of 1152 terms); 8.0e-6 on selfie_segmentation, whose mask is
#: a sigmoid of logits up to |855| (each implementation's exp) with a slope of 1/4 at 0. Checked as
#: |d| <= REL * (max |want| + |want|): the worst element used 0.40 of it (selfie_segmentation).
REL = 1e-5

#: MobileNetV2 (composites, alpha 0.35, 64x64, 10 classes, seeded weights) against LiteRT CPU on its unfused
#: twin: 17 fused_bottleneck blocks, then a softmax whose probabilities are O(0.1); float32 sums in another
#: order, as the MediaPipe models' 1e-5 (test_real_models.CASES). Measured 4.1e-6 of the largest probability
#: (0.21 of the check's bound).
MOBILENET_REL = 1e-5


def _close(got: np.ndarray, want: np.ndarray, rel: float, what: str) -> None:
    """|got - want| <= rel * (max |want| + |want|) per element, after shape and dtype."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale, err_msg=what)


@pytest.fixture(scope="module")
def browser():
    """Chromium on SwiftShader; a missing Playwright, browser or LiteRT.js fails, naming the fix (./bootstrap.sh
    test installs all three): a broken set-up, not a reason to skip."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[test]' (or ./bootstrap.sh test)")
    if not (web.LITERTJS_DIR / "core" / "wasm").is_dir():
        pytest.fail(f"LiteRT.js is missing from {web.LITERTJS_DIR}: ./bootstrap.sh test installs it "
                    f"(npm install --prefix .web --no-save @litertjs/core@2.5.3)")
    with sync_playwright() as p:
        try:
            chromium = web.launch(p)
        except FileNotFoundError as e:
            pytest.fail(str(e))
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    with web.Site(root) as url:
        yield root, url


@pytest.fixture
def page(browser, site):
    """A fresh page per model (its GPU memory goes with it) on /compare.html, which loads both runtimes."""
    pg = browser.new_page()
    pg.goto(f"{site[1]}/compare.html")
    yield pg
    pg.close()


def _interpreter_outputs(tflite: bytes, x: np.ndarray, device) -> dict[str, np.ndarray]:
    it = tflfuse.Interpreter(model_content=tflite, device=device)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _litert_outputs(tflite: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    it = LiteRTInterpreter(model_content=tflite)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _check(page, site, device, name: str, fused: bytes, stock: bytes, x: np.ndarray, rel: float) -> None:
    """Exports ``fused`` and runs it in the browser; ``stock`` (builtins only) goes to LiteRT CPU and
    LiteRT.js. ``rel``: the Python interpreter's own tolerance against LiteRT CPU for this model."""
    root, _ = site
    export_web(fused, root / name, device=device, demo=False)
    (root / f"{name}.tflite").write_bytes(stock)
    outs, _ = web.run_tflfuse(page, f"/{name}/", [x])
    names = [o["name"] for o in json.loads((root / name / "plan.json").read_text())["outputs"]]
    got = dict(zip(names, outs))
    ours = _interpreter_outputs(fused, x, device)
    lite = _litert_outputs(stock, x)
    assert set(got) == set(ours) == set(lite), (sorted(got), sorted(ours), sorted(lite))
    # Against LiteRT CPU: the Interpreter's own bound (measured worst: selfie_segmentation's mask, 5.9e-5 of its
    # max with rel 5e-5, 0.59 of the bound with its per-element term; the others <= 0.21 of it).
    for k in got:
        _close(got[k], ours[k], REL, f"{name} {k}: tflfuse.js vs the Interpreter")
        _close(got[k], lite[k], rel, f"{name} {k}: tflfuse.js vs LiteRT CPU")
    # LiteRT.js on WebGPU at fp32 (asked for: gpuOptions.precision "fp32"; LiteRT's default on an adapter with
    # shader-f16 is fp16, which SwiftShader does not offer): another float32 implementation with its own
    # order of sums, so it may differ from tflfuse.js by both implementations' distances from LiteRT CPU: 2 rel.
    # Measured 1.1e-5 of the largest value on selfie_segmentation's mask (rel 5e-5), 1.7e-5 on MobileNetV2's
    # probabilities (0.43 of its bound), <= 3.8e-6 elsewhere.
    litejs, _ = web.run_litert(page, f"/{name}.tflite", [x])
    assert len(litejs) == len(got), sorted(litejs)
    by_name = litejs if set(litejs) == set(got) else dict(zip(names, litejs.values()))
    for k in got:
        _close(by_name[k].reshape(got[k].shape).astype(got[k].dtype), got[k], 2 * rel,
               f"{name} {k}: LiteRT.js (WebGPU) vs tflfuse.js")


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_mediapipe_model_in_the_browser(page, site, device, name):
    stock = zoo.fetch(name).read_bytes()
    fused, report = tflfuse.fuse(stock)
    assert sum(report.patterns.values()) > 0, str(report)
    case = CASES[name]
    x = np.random.default_rng(sorted(zoo.MODELS).index(name)).uniform(
        case.low, case.high, zoo.MODELS[name].input_shape).astype(np.float32)
    _check(page, site, device, name, fused, stock, x, case.rel)


@pytest.fixture(scope="module")
def mobilenet():
    import composites

    fused = tflfuse.convert(composites.mobilenet_v2(input_shape=(64, 64, 3), alpha=0.35, classes=10, seed=0,
                                                    batch_size=1))
    assert fused.report.fused("fused_bottleneck") == 17, str(fused.report)
    stock, counts = tflfuse.unfuse(fused.tflite)
    assert counts.get("fused_bottleneck") == 17, counts
    return fused.tflite, stock


def test_mobilenet_v2_composite_in_the_browser(page, site, device, mobilenet):
    fused, stock = mobilenet
    x = np.random.default_rng(11).uniform(-1, 1, (1, 64, 64, 3)).astype(np.float32)
    _check(page, site, device, "mobilenet_v2", fused, stock, x, MOBILENET_REL)


def test_blocked_bottlenecks_export_staged(device, tmp_path):
    # hand_landmark_lite on the software adapter: the Interpreter's plan runs each large fused_bottleneck as one
    # blocked dispatch (program "fused_bottleneck"); the export runs the staged strategy's expand, depthwise
    # and project programs instead.
    fused, _ = tflfuse.fuse(zoo.fetch("hand_landmark_lite").read_bytes())
    it = tflfuse.Interpreter(model_content=fused, device=device)
    it.allocate_tensors()
    assert device.is_software and it.dispatch_count < 40
    data = export_web(fused, tmp_path / "hand", device=device, target="cpu", demo=False)
    programs = {d["program"].split("[")[0] for d in data.plan["dispatches"] if d["op"] == "fused_bottleneck"}
    assert programs == {"fused_bottleneck_expand", "fused_bottleneck_depthwise", "fused_bottleneck_project"}, programs
    assert len(data.plan["dispatches"]) > it.dispatch_count
    # The data alone (plan.json, weights.bin, shaders: what tflfuse.js runs), executed in Python, gives the
    # outputs of the ExecutionPlan it was serialised from bit for bit: the same WGSL, buffers and dispatches.
    plan = plan_for_export(Model(fused), device, target="cpu")
    x = np.random.default_rng(5).uniform(0, 1, (1, 224, 224, 3)).astype(np.float32)
    plan.write(plan.graph.inputs[0], x)
    plan.run()
    got = PlanDataExecutor(load_serialized(tmp_path / "hand"), device).run([x])
    for t, g in zip(plan.graph.outputs, got):
        np.testing.assert_array_equal(g, plan.read(t))


def test_demo_page_shows_mobilenet_top_classes(browser, site, device, mobilenet):
    fused, _ = mobilenet
    root, url = site
    export_web(fused, root / "classifier", device=device)
    demo = browser.new_page()
    try:
        demo.goto(f"{url}/classifier/index.html")
        demo.wait_for_selector("body[data-status=done], body[data-status=error]", timeout=60_000)
        assert demo.get_attribute("body", "data-status") == "done", demo.text_content("#error")
        result = demo.evaluate("window.demoResult")
        summary, adapter, times = (demo.text_content(s) for s in ("#summary", "#adapter", "#times"))
        rows = demo.locator("#outputs tr").all_inner_texts()
        canvas_shown = demo.evaluate("!document.getElementById('view').hidden")
    finally:
        demo.close()
    # The top classes are those of tflfuse's Interpreter on the same input (demo/input.bin), in order.
    x = np.fromfile(root / "classifier" / "demo" / "input.bin", np.float32).reshape(1, 64, 64, 3)
    (probs,) = _interpreter_outputs(fused, x, device).values()
    want = [int(i) for i in np.argsort(-probs[0], kind="stable")[:5]]
    assert result["top"] == want, (result["top"], probs)
    assert f"Top class: index {want[0]} of 10" in summary and "random weights" in summary, summary
    assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in want], rows
    assert canvas_shown and "swiftshader" in adapter.lower() and " ms" in times and len(result["times"]) == 5

"""Both import orders run a converted model on WebGPU, each in a fresh process.

``import tensorflow`` before ``import tflfuse`` (what most scripts and notebooks do) leaves TensorFlow's
LLVM symbols process-wide; Mesa's software adapter (llvmpipe) then crashed compiling a shader unless tflfuse
opened Mesa's drivers with RTLD_DEEPBIND first (tflfuse/_tfload.py). ``import tflfuse`` first has TensorFlow
load its libraries with RTLD_LOCAL instead. A crash kills the process, so each order runs in a subprocess.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The model: a fused conv (one composite: one fused op) with stride 2 SAME and 5 output channels, then a
#: plain Dense; converted with tflfuse.convert, run on WebGPU, compared with Keras in the same process; then
#: TensorFlow runs again after the GPU device exists, and the device's adapter is reported.
_SCRIPT = """
import json, sys
first = sys.argv[1]
if first == "tensorflow":
    import tensorflow as tf
    import tflfuse
else:
    import tflfuse
    import tensorflow as tf
import numpy as np
import keras
import composites

inp = keras.Input((9, 11, 3), batch_size=2)
x = composites.FusedConv2D(5, 3, strides=2, padding="same", activation="relu")(inp)
out = keras.layers.Dense(4)(keras.layers.Flatten()(x))
model = keras.Model(inp, out)
result = tflfuse.convert(model)
interp = tflfuse.Interpreter(model_content=result.tflite)
interp.allocate_tensors()
x = np.random.default_rng(0).uniform(-1, 1, (2, 9, 11, 3)).astype(np.float32)
interp.set_tensor(interp.get_input_details()[0]["index"], x)
interp.invoke()
got = interp.get_tensor(interp.get_output_details()[0]["index"])
want = np.asarray(model(x))
again = np.asarray(tf.reduce_sum(model(x)))
print(json.dumps({"err": float(np.max(np.abs(got - want))), "scale": float(np.max(np.abs(want))),
                  "fused": [result.report.composites["fused_conv2d"].traced, result.report.composites["fused_conv2d"].fused], "again": float(again), "sum": float(want.sum()),
                  "adapter": interp.device.describe(), "software": interp.device.is_software,
                  "tf_global": tflfuse._tfload.tensorflow_symbols_global(),
                  "deepbind": tflfuse._tfload.isolate_vulkan_drivers()}))
"""


@pytest.mark.parametrize("first", ["tensorflow", "tflfuse"])
def test_import_order_runs_a_model(device, first):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, first], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    # Keras' conv and matmul against the WGSL kernels: sums of 27 and 120 terms in another order, unit-scale
    # data (ACCUMULATION in conftest: 1e-5 absolute and relative).
    assert r["err"] <= 1e-5 + 1e-5 * r["scale"], r
    assert r["fused"] == [1, 1], r
    assert abs(r["again"] - r["sum"]) <= 1e-5 * max(1.0, abs(r["sum"])), r
    # The TensorFlow-first process took the DEEPBIND path, the other did not need it.
    assert r["tf_global"] is (first == "tensorflow"), r
    if first == "tensorflow" and r["software"]:
        assert any("libvulkan_lvp" in p for p in r["deepbind"]), r
    if first == "tflfuse":
        assert r["deepbind"] == [], r


#: TensorFlow first, then MediaPipe's face detector on WebGPU against LiteRT's CPU interpreter.
_FACE = """
import json, sys
import tensorflow as tf
if sys.argv[1] == "wgpu-first":   # the application lists adapters itself before tflfuse can step in
    import wgpu
    wgpu.gpu.enumerate_adapters_sync()
import numpy as np
import tflfuse
from tflfuse import zoo
from ai_edge_litert.interpreter import Interpreter as LiteRT
path = str(zoo.fetch("face_detection_short_range"))
x = np.random.default_rng(0).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
try:
    outs = []
    for interp in (tflfuse.Interpreter(model_path=path, adapter="llvmpipe"), LiteRT(model_path=path)):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
    print(json.dumps({"ratio": max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(*outs))}))
except tflfuse.NoAdapterError as e:
    print(json.dumps({"error": str(e)}), flush=True)
"""


@pytest.fixture(scope="module")
def lvp_manifest(device) -> Path:
    from tflfuse._tfload import _manifest_dirs

    found = [m for d in _manifest_dirs() for m in sorted(Path(d).glob("*.json")) if "libvulkan_lvp" in m.read_text()]
    if not found:
        pytest.skip("Mesa's software driver (llvmpipe, mesa-vulkan-drivers) is not installed")
    return found[0]


def _face(tmp_path, mode: str, **env) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    proc = subprocess.run([sys.executable, "-c", _FACE, mode], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"exit {proc.returncode}, no result:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def _manifest(path: Path, library: str) -> Path:
    path.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": library,
                                                                          "api_version": "1.1.0"}}))
    return path


def test_tensorflow_first_passes_over_drivers_it_cannot_open(tmp_path, lvp_manifest):
    # A "Mesa" driver that is no library at all (as another architecture's is to this process) listed first:
    # the loader passes over it, and so must tflfuse. Each output within 1e-5 of its scale (test_real_models).
    fake = tmp_path / "libvulkan_fake.so"
    fake.write_text("not an ELF file")
    listed = f"{_manifest(tmp_path / 'fake.json', str(fake))}:{lvp_manifest}"
    r = _face(tmp_path, "tensorflow-first", VK_ICD_FILENAMES=listed)
    assert r.get("ratio", 1.0) <= 1e-5, r


def test_tensorflow_first_reads_the_added_driver_files(tmp_path, lvp_manifest):
    # The standard folders hold no driver; VK_ADD_DRIVER_FILES names llvmpipe's manifest.
    (tmp_path / "empty" / "vulkan" / "icd.d").mkdir(parents=True)
    r = _face(tmp_path, "tensorflow-first", XDG_DATA_DIRS=str(tmp_path / "empty"),
              XDG_CONFIG_DIRS=str(tmp_path / "empty"), VK_ADD_DRIVER_FILES=str(lvp_manifest))
    assert r.get("ratio", 1.0) <= 1e-5, r


def test_adapters_listed_by_wgpu_before_tflfuse_get_a_clear_error(tmp_path, lvp_manifest):
    # Mesa's drivers were opened against TensorFlow's LLVM before tflfuse could step in: the first shader
    # would crash the process; tflfuse says so and what to do instead.
    r = _face(tmp_path, "wgpu-first")
    assert "before using wgpu yourself" in r.get("error", ""), r

"""tflfuse.js against LiteRT.js in one browser page: the latency ratio tflfuse.js / LiteRT.js per model.

    python benchmarks/web.py [--models=face_detection_short_range,...] [--repeats=10] [--out=benchmarks/RESULTS.md]

Each MediaPipe model tflfuse runs (``tflfuse.zoo.MODELS``) and MobileNetV2 from composites (224x224, alpha 1,
seeded weights; ``--mobilenet=false`` leaves it out: it needs TensorFlow to convert) is fused, exported with
``tflfuse.export_web`` (the schedules the Interpreter picks on this machine's adapter, see
``tflfuse.web.export.browser_schedules``) and run by tflfuse.js in headless Chromium; the stock .tflite (for
MobileNetV2 its unfused twin) runs through LiteRT.js (``@litertjs/core``, WebGPU accelerator, fp32) in the same
page, on the same seeded input. A run is what an application waits for: the input's upload, the model, the
outputs' read-back. Latency is the median of ``--repeats`` runs after 2 warm-up runs.

It writes (or replaces) only its own section of ``--out``, between the two marker lines below; the rest of the
file is left as it is. On a machine without a GPU the browser's adapter is SwiftShader, a CPU: the section says
so, and its ratios say nothing of a GPU. Needs ``./bootstrap.sh test`` (Chromium, Playwright, LiteRT.js).
"""

from __future__ import annotations

import datetime
import platform
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
from absl import app, flags

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tflfuse  # noqa: E402
from tflfuse import zoo  # noqa: E402
from tflfuse.web import browser as web  # noqa: E402
from tflfuse.web import export_web  # noqa: E402

BEGIN, END = "<!-- benchmarks/web.py: begin -->", "<!-- benchmarks/web.py: end -->"
WARMUP = 2

FLAGS = flags.FLAGS
flags.DEFINE_list("models", sorted(zoo.MODELS), "zoo models to time")
flags.DEFINE_bool("mobilenet", True, "also MobileNetV2 from composites (converted with TensorFlow)")
flags.DEFINE_integer("repeats", 10, "timed runs per runtime and model (after 2 warm-up runs)")
flags.DEFINE_string("out", str(REPO / "benchmarks" / "RESULTS.md"), "Markdown file whose section to write")


def _models():
    """(name, fused bytes, stock bytes, input) per model."""
    for name in FLAGS.models:
        stock = zoo.fetch(name).read_bytes()
        fused, _ = tflfuse.fuse(stock)
        low = -1.0 if name == "face_detection_short_range" else 0.0   # MediaPipe's input ranges
        x = np.random.default_rng(0).uniform(low, 1.0, zoo.MODELS[name].input_shape).astype(np.float32)
        yield name, fused, stock, x
    if FLAGS.mobilenet:
        import composites

        fused = tflfuse.convert(composites.mobilenet_v2(input_shape=(224, 224, 3), seed=0, batch_size=1)).tflite
        stock, _ = tflfuse.unfuse(fused)
        yield "mobilenet_v2 (composites)", fused, stock, np.random.default_rng(0).uniform(
            -1, 1, (1, 224, 224, 3)).astype(np.float32)


def measure(page, root: Path, device) -> list[dict]:
    rows = []
    for name, fused, stock, x in _models():
        folder = re.sub(r"[^a-z0-9_]+", "_", name).strip("_")
        data = export_web(fused, root / folder, device=device, demo=False)
        (root / f"{folder}.tflite").write_bytes(stock)
        ours, t_ours = web.run_tflfuse(page, f"/{folder}/", [x], repeats=WARMUP + FLAGS.repeats)
        theirs, t_theirs = web.run_litert(page, f"/{folder}.tflite", [x], repeats=WARMUP + FLAGS.repeats)
        theirs = list(theirs.values())
        err = max(float(np.abs(a - b.reshape(a.shape)).max() / max(float(np.abs(b).max()), 1e-30))
                  for a, b in zip(ours, theirs))
        row = {"model": name, "dispatches": len(data.plan["dispatches"]),
               "ours_ms": float(np.median(t_ours[WARMUP:])), "theirs_ms": float(np.median(t_theirs[WARMUP:])),
               "first_ours_ms": t_ours[0], "first_theirs_ms": t_theirs[0], "rel_diff": err}
        rows.append(row)
        print(f"{name}: tflfuse.js {row['ours_ms']:.1f} ms, LiteRT.js {row['theirs_ms']:.1f} ms, "
              f"ratio {row['ours_ms'] / row['theirs_ms']:.2f}x, max diff {err:.1e} of the largest value", flush=True)
    return rows


def section(rows: list[dict], adapter: str, browser: str) -> str:
    lines = [BEGIN, "## In the browser: tflfuse.js / LiteRT.js (SwiftShader on a CPU)", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: "
             f"{platform.machine()}, {_cores()} CPU cores shared with other work, no GPU",
             f"- browser: {browser}, headless, WebGPU adapter: {adapter} (SwiftShader's Vulkan: a CPU, so these "
             f"ratios say nothing of a GPU); LiteRT.js @litertjs/core "
             f"{_litertjs_version()}, WebGPU accelerator, gpuOptions.precision fp32",
             f"- method: `python benchmarks/web.py` (this section only). Both runtimes in one page on the same "
             f"seeded input; a run is the input's upload, the model and the outputs' read-back; latency is the "
             f"median of {FLAGS.repeats} runs after {WARMUP} warm-up runs. tflfuse.js runs the fused model "
             f"(`tflfuse.export_web`, the software adapter's schedules with staged fused_bottleneck blocks), "
             f"LiteRT.js the published file (for MobileNetV2 its unfused twin). The first run (pipeline "
             f"compilation included) is listed apart.", "",
             "| model | tflfuse.js dispatches | tflfuse.js ms | LiteRT.js ms | tflfuse.js / LiteRT.js | first run ms "
             "(tflfuse.js, LiteRT.js) | max diff / max value |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dispatches']} | {r['ours_ms']:.1f} | {r['theirs_ms']:.1f} | "
                     f"{r['ours_ms'] / r['theirs_ms']:.2f}x | {r['first_ours_ms']:.0f}, {r['first_theirs_ms']:.0f} | "
                     f"{r['rel_diff']:.1e} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    """Replaces the text between :data:`BEGIN` and :data:`END` in ``path`` (appends it where absent)."""
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text.rstrip("\n") + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + text
    path.write_text(new)


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def _litertjs_version() -> str:
    import json

    return json.loads((web.LITERTJS_DIR / "core" / "package.json").read_text())["version"]


def main(argv):
    del argv
    from playwright.sync_api import sync_playwright

    device = tflfuse.Device()
    with tempfile.TemporaryDirectory() as tmp, web.Site(tmp) as url, sync_playwright() as p:
        browser = web.launch(p)
        page = browser.new_page()
        page.goto(f"{url}/compare.html")
        adapter = page.evaluate("""async () => { const a = await navigator.gpu.requestAdapter();
          return [a.info.vendor, a.info.architecture, a.info.description].filter(Boolean).join(" "); }""")
        rows = measure(page, Path(tmp), device)
        version = browser.version
        browser.close()
    write_section(Path(FLAGS.out), section(rows, adapter, f"Chromium {version}"))
    print(f"wrote its section of {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)

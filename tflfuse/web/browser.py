"""Exports in a real browser: headless Chromium with WebGPU (SwiftShader's Vulkan on a machine without a GPU),
a local http server, and one page that runs a model through ``tflfuse.js`` and, beside it, a stock .tflite
through LiteRT.js (``@litertjs/core``, its WebGPU accelerator).

Used by ``tests/test_web.py`` and ``benchmarks/web.py``; needs Playwright for Python (``tflfuse[test]``) and
Debian's ``chromium-headless-shell`` (``./bootstrap.sh test`` installs both, and LiteRT.js into ``.web/``).

The page ``/compare.html`` maps the bare module names of LiteRT.js (``@litertjs/core``, ``@litertjs/wasm-utils``)
to ``/litertjs/``, which the server maps to the installed npm packages (their ``dist/`` and ``wasm/`` folders:
LiteRT.js fetches its .wasm files from the folder given to ``loadLiteRt``). Arrays cross between Python and the
page as base64 of their bytes (little-endian, as both sides are).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import shutil
import threading
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

__all__ = ["BROWSER_FLAGS", "BROWSER_PATHS", "LITERTJS_DIR", "Site", "find_browser", "launch",
           "run_litert", "run_tflfuse"]

#: Debian's chromium-headless-shell, where its package puts it.
BROWSER_PATHS = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium-headless-shell")
#: The flags that give Chromium WebGPU on a machine without a GPU (SwiftShader's Vulkan), with nothing that
#: reaches the network.
BROWSER_FLAGS = ("--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-vulkan=swiftshader",
                 "--use-webgpu-adapter=swiftshader", "--no-sandbox", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")
#: Where ``./bootstrap.sh test`` installs ``@litertjs/core`` (and ``@litertjs/wasm-utils``, its dependency): the
#: ``@litertjs`` folder of ``.web/node_modules`` in the source tree.
LITERTJS_DIR = Path(__file__).resolve().parents[2] / ".web" / "node_modules" / "@litertjs"

_COMPARE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tflfuse.js and LiteRT.js</title>
<script type="importmap">
{"imports": {"@litertjs/core": "/litertjs/core/dist/index.js",
             "@litertjs/wasm-utils": "/litertjs/wasm-utils/dist/index.js"}}
</script></head><body>tflfuse.js and LiteRT.js on one page</body></html>
"""


def find_browser() -> str | None:
    """The path of chromium-headless-shell, or None where it is not installed."""
    return next((p for p in BROWSER_PATHS if Path(p).exists()), shutil.which("chromium-headless-shell"))


def launch(playwright, path: str | None = None):
    """Launches Chromium with :data:`BROWSER_FLAGS` through a Playwright instance (``sync_playwright()``'s).

    Raises:
      FileNotFoundError: no chromium-headless-shell (naming the package to install).
    """
    path = path or find_browser()
    if path is None:
        raise FileNotFoundError("chromium-headless-shell is missing: apt-get install -y chromium-headless-shell "
                                "(./bootstrap.sh test does it as root)")
    return playwright.chromium.launch(executable_path=path, args=list(BROWSER_FLAGS))


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files of ``directory``; ``/litertjs/...`` from the LiteRT.js packages; ``/compare.html`` from memory."""

    def __init__(self, *args, mounts: Mapping[str, Path], **kwargs):
        self._mounts = mounts
        super().__init__(*args, **kwargs)

    def translate_path(self, path: str) -> str:
        clean = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, folder in self._mounts.items():
            if clean.startswith(f"/{prefix}/"):
                target = (folder / clean[len(prefix) + 2:]).resolve()
                # nothing outside the mounted folder: a path with ".." gets a 404
                return str(target) if target.is_relative_to(folder.resolve()) else str(folder / ".not-served")
        return super().translate_path(path)

    def do_GET(self):
        if self.path.split("?", 1)[0] == "/compare.html":
            body = _COMPARE_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args):   # one line per request on stderr otherwise
        pass


@contextlib.contextmanager
def Site(root: str | Path, litertjs: str | Path | None = LITERTJS_DIR) -> Iterator[str]:
    """Serves ``root`` over http on 127.0.0.1 (a secure context: WebGPU needs one) on a free port; yields the
    base URL (no trailing slash). ``/litertjs/`` serves the ``@litertjs`` folder ``litertjs`` (None: none),
    ``/compare.html`` the page that loads both runtimes."""
    mounts = {"litertjs": Path(litertjs)} if litertjs is not None else {}
    handler = functools.partial(_Handler, directory=str(root), mounts=mounts)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _encode(arrays: Sequence[np.ndarray]) -> list[dict]:
    return [{"dtype": str(a.dtype), "shape": list(a.shape), "b64": base64.b64encode(
        np.ascontiguousarray(a).tobytes()).decode()} for a in arrays]


_DTYPES = {"Float32Array": np.float32, "Int32Array": np.int32, "Uint8Array": np.uint8, "BigInt64Array": np.int64}

#: JavaScript shared by both runners: base64 to typed arrays and back.
_JS_CODEC = """
  const TYPES = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array, bool: Uint8Array};
  const decode = x => { const b = Uint8Array.from(atob(x.b64), c => c.charCodeAt(0));
                        return new TYPES[x.dtype](b.buffer); };
  const encode = a => { const b = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = "";
                        for (let i = 0; i < b.length; i += 32768) s += String.fromCharCode(...b.subarray(i, i + 32768));
                        return {type: a.constructor.name, b64: btoa(s)}; };
  const median = t => [...t].sort((a, b) => a - b)[t.length >> 1];
"""


def _decode(outputs: list[dict], shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
    return [np.frombuffer(base64.b64decode(o["b64"]), _DTYPES[o["type"]]).reshape(s) for o, s in zip(outputs, shapes)]


def run_tflfuse(page, folder: str, inputs: Sequence[np.ndarray], repeats: int = 1) -> tuple[list[np.ndarray], list]:
    """Loads the export at ``folder`` (a URL path on the page's site, e.g. ``"/face/"``) with its own
    ``tflfuse.js`` and runs it ``repeats`` times on ``inputs``.

    Returns:
      (the outputs of the last run as arrays of the outputs' shapes, the wall time of each run in ms: upload,
      the dispatches and the read-back).
    Raises:
      RuntimeError: the browser's error message (a TflfuseError names the input, feature or shader).
    """
    result = page.evaluate("""async ([folder, inputs, repeats]) => {""" + _JS_CODEC + """
      try {
        const {load} = await import(`${folder}tflfuse.js`);
        const model = await load(folder);
        const arrays = inputs.map(decode);
        const times = [];
        let outs;
        for (let i = 0; i < repeats; i++) {
          const t0 = performance.now();
          outs = await model.run(arrays);
          times.push(performance.now() - t0);
        }
        model.device.destroy();   // its buffers go now, not at the next garbage collection
        return {outputs: outs.map(encode), shapes: model.outputs.map(o => o.shape), times};
      } catch (e) { return {error: `${e.name}: ${e.message}`}; }
    }""", [folder, _encode(inputs), repeats])
    if "error" in result:
        raise RuntimeError(result["error"])
    return _decode(result["outputs"], result["shapes"]), result["times"]


def run_litert(page, model_url: str, inputs: Sequence[np.ndarray], repeats: int = 1,
               accelerator: str = "webgpu", precision: str = "fp32") -> tuple[dict[str, np.ndarray], list]:
    """Runs the .tflite at ``model_url`` through LiteRT.js (the page must be ``/compare.html``) ``repeats``
    times on ``inputs``, with ``accelerator`` (``"webgpu"`` or ``"wasm"``) and, on WebGPU, ``precision``
    (``"fp32"`` or ``"fp16"``, LiteRT's ``gpuOptions.precision``).

    LiteRT.js is loaded once per page (``loadLiteRt`` on ``/litertjs/core/wasm/``). Each timed run does what a
    tflfuse.js run does: the input's upload (a Tensor copied to the accelerator), the model, the outputs'
    read-back (moved to the CPU, as typed arrays).

    Returns:
      (the outputs of the last run by LiteRT's output name, in its order, the wall time of each run in ms).
    Raises:
      RuntimeError: the browser's error message.
    """
    result = page.evaluate("""async ([url, inputs, repeats, accelerator, precision]) => {""" + _JS_CODEC + """
      try {
        const lrt = await import("@litertjs/core");
        if (!lrt.getGlobalLiteRtPromise()) lrt.loadLiteRt("/litertjs/core/wasm/");
        await lrt.getGlobalLiteRtPromise();
        const model = await lrt.loadAndCompile(url, {accelerator, gpuOptions: {precision}});
        const arrays = inputs.map(decode);
        const times = [];
        let outs;
        for (let i = 0; i < repeats; i++) {
          const t0 = performance.now();
          const host = arrays.map((a, j) => new lrt.Tensor(a, inputs[j].shape));
          const dev = accelerator === "wasm" ? host : await Promise.all(host.map(t => t.moveTo(accelerator)));
          const results = await model.run(dev);
          dev.forEach(t => t.delete());   // (moveTo gave the host tensors' memory to these)
          const back = accelerator === "wasm" ? results : await Promise.all(results.map(t => t.moveTo("wasm")));
          outs = back.map(t => t.toTypedArray().slice());
          back.forEach(t => t.delete());
          times.push(performance.now() - t0);
        }
        const details = model.getOutputDetails();
        const shapes = details.map(d => Array.from(Object.values(d.shape))), names = details.map(d => d.name);
        model.delete();
        return {outputs: outs.map(encode), shapes, names, times};
      } catch (e) { return {error: `${e.name}: ${e.message}`}; }
    }""", [model_url, _encode(inputs), repeats, accelerator, precision])
    if "error" in result:
        raise RuntimeError(result["error"])
    return dict(zip(result["names"], _decode(result["outputs"], result["shapes"]))), result["times"]

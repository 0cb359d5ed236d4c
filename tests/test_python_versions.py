"""The runtime on another supported Python than the one running the suite (3.11, 3.12 and 3.13 are).

A new virtual environment of the other interpreter gets exactly the runtime's dependencies from
pyproject.toml (no TensorFlow), and runs MediaPipe's face detector on WebGPU beside LiteRT's CPU interpreter
in that environment. The interpreter is ``TFLFUSE_OTHER_PYTHON`` where set, else the first of python3.13,
python3.12 and python3.11 (on PATH, then pyenv's versions) whose version differs from this one.
"""

import glob
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tflfuse import zoo

REPO = Path(__file__).resolve().parents[1]
SUPPORTED = ((3, 11), (3, 12), (3, 13))


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60)
    except OSError:
        return None
    return tuple(int(v) for v in out.stdout.split()) if out.returncode == 0 else None


def other_python() -> str:
    """A supported interpreter whose minor version differs from the running one's; fails naming what to do."""
    given = os.environ.get("TFLFUSE_OTHER_PYTHON")
    if given:
        return given
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for major, minor in reversed(SUPPORTED):
        if (major, minor) == sys.version_info[:2]:
            continue
        name = f"python{major}.{minor}"
        for python in (name, *sorted(glob.glob(os.path.join(pyenv, "versions", f"{major}.{minor}*", "bin", name)))):
            if _version(python) == (major, minor):
                return python
    pytest.fail(f"no second supported Python (one of {', '.join('%d.%d' % v for v in SUPPORTED)} other than "
                f"{sys.version_info[0]}.{sys.version_info[1]}) was found on PATH or under {pyenv}/versions; "
                f"install one, or name it in TFLFUSE_OTHER_PYTHON")


_SCRIPT = """
import json, sys
import numpy as np
import tflfuse
from ai_edge_litert.interpreter import Interpreter as LiteRT

path, x_path = sys.argv[1], sys.argv[2]
x = np.load(x_path)
outs = []
for interp in (tflfuse.Interpreter(model_path=path), LiteRT(model_path=path)):
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    outs.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
ratio = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(*outs))
print(json.dumps({"version": list(sys.version_info[:2]), "ratio": ratio,
                  "tensorflow": "tensorflow" in sys.modules}))
"""


@pytest.mark.slow
def test_runtime_on_another_python(device, tmp_path):
    python = other_python()
    version = _version(python)
    assert version in SUPPORTED and version != sys.version_info[:2], (python, version)
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *deps], capture_output=True,
                         text=True, timeout=1200)
    assert pip.returncode == 0, pip.stderr[-3000:]
    model = zoo.fetch("face_detection_short_range")
    x = zoo.sample_photo((128, 128))
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", _SCRIPT, str(model), str(tmp_path / "x.npy")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tuple(r["version"]) == version and r["tensorflow"] is False, r
    # Each output within 1e-5 of its largest LiteRT value, the bound test_real_models holds this model to
    # (measured there <= 1.2e-6: sums of <= 1152 terms in other orders than LiteRT's).
    assert r["ratio"] <= 1e-5, r

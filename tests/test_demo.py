"""``tflfuse demo`` as the README's first command runs it: a subprocess, nothing set in its environment.

MobileNetV2 at 32x32 (the smallest input the architecture takes) keeps the run short; the photo, the
conversion, both runs and the face detector are the real ones. The output must be the demo's own lines
only: no TensorFlow or LiteRT log lines (``TF_CPP_MIN_LOG_LEVEL`` unset, as in a user's shell).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_runs_quietly(device):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "tflfuse.cli", "demo", "--size=32", "--repeats=1"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^fused_bottleneck\s+17\s+17$", out, re.M), out
    # WebGPU against TensorFlow on the photo: float32 sums of <= 960 terms through 52 layers (the demo's
    # own line; 1e-4 of outputs that are probabilities <= 1).
    err = float(re.search(r"max \|error\| (\S+) \(outputs", out).group(1))
    assert err <= 1e-4, out
    top = re.search(r"top class (\d+) \(TensorFlow: (\d+)\)", out)
    assert top.group(1) == top.group(2), out
    iou = float(re.search(r"box IoU (\S+),", out).group(1))
    assert iou >= 0.99, out
    assert "software adapter checks results" in out or "CPU" not in out.splitlines()[0], out
    noise = [line for line in proc.stderr.splitlines() if line.strip()]
    assert noise == [], "\n".join(noise[:20])

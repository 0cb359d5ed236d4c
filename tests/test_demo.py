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


def test_demo_times_the_two_models_in_alternating_rounds():
    """The demo's latencies: one warm-up invoke of each model, then one invoke of each per round, the fused and
    the unfused one taking turns, so that a change in the machine's load during the timing (another job on a
    2-core CPU) reaches both; each latency is the median of its rounds, with the first output read back."""
    from tflfuse import demo

    calls = []

    class Recorded:
        """An Interpreter's invoke and get_tensor, recorded; invoke takes ``seconds`` of wall-clock time."""

        def __init__(self, name, seconds):
            self.name, self.seconds = name, seconds

        def invoke(self):
            calls.append(("invoke", self.name))
            t0 = demo.time.perf_counter()
            while demo.time.perf_counter() - t0 < self.seconds:
                pass

        def get_output_details(self):
            return [{"index": 7}]

        def get_tensor(self, index):
            calls.append(("read", self.name, index))

    fused, unfused = Recorded("fused", 0.002), Recorded("unfused", 0.006)
    ms = demo._alternating_ms([fused, unfused], 3)
    invokes = [c[1] for c in calls if c[0] == "invoke"]
    assert invokes == ["fused", "unfused"] * 4   # a warm-up each, then 3 rounds
    assert calls.count(("read", "fused", 7)) == calls.count(("read", "unfused", 7)) == 4
    # each median, in its model's place, is at least that model's busy wait (a lower bound on any machine)
    assert ms[0] >= 2.0 and ms[1] >= 6.0, ms

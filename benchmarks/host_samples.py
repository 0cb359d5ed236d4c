"""The host-side samples that ``record_loop.py`` and ``pattern_ab.py`` take of an allocated interpreter, and the
Markdown they write."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import tflfuse


def ready_interpreter(data: bytes, device):
    """An allocated :class:`tflfuse.Interpreter` of ``data`` on ``device``, its inputs uniform in [-1, 1) (seed
    0), invoked 3 times (the first command buffer goes through wgpu's API; the next ones are the native ones);
    returns it and its first output's tensor index."""
    interp = tflfuse.Interpreter(model_content=data, device=device)
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]))
    out = interp.get_output_details()[0]["index"]
    for _ in range(3):
        interp.invoke()
    interp.get_tensor(out)
    return interp, out


def host_sample(interp, out: int, batch: int, n: int) -> dict:
    """One round of seconds: ``encode`` (``batch`` command buffers recorded and finished back to back, per buffer;
    then all submitted and waited for, so that the GPU's work is outside the timing), ``thr`` (``n`` invokes back
    to back and one read-back of tensor ``out``, per invoke) and ``lat`` (one invoke and its read-back, median of
    5)."""
    plan = interp._plan(0)
    t0 = time.perf_counter()
    buffers = [plan._native.encode() for _ in range(batch)]
    sample = {"encode": (time.perf_counter() - t0) / batch}
    for buf in buffers:
        buf.submit()
    interp.get_tensor(out)
    t0 = time.perf_counter()
    for _ in range(n):
        interp.invoke()
    interp.get_tensor(out)
    sample["thr"] = (time.perf_counter() - t0) / n
    lat = []
    for _ in range(5):
        t0 = time.perf_counter()
        interp.invoke()
        interp.get_tensor(out)
        lat.append(time.perf_counter() - t0)
    sample["lat"] = statistics.median(lat)
    return sample


def write_table(lines: list[str], out: str | None) -> None:
    """Prints the Markdown ``lines`` and writes them to ``out`` (none where empty)."""
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")

"""LiteRT's CPU interpreter for ``tflfuse check``, run in a child process.

LiteRT's C++ trusts the file it is given: a malformed .tflite (a required op input of -1, an out-of-range tensor
index) can crash it with a segmentation fault inside ``allocate_tensors``, which no ``try`` can catch. tflfuse's
own checks (:class:`tflfuse.model.Model`, :func:`tflfuse.runtime.plan.lower`) name many such faults, but not
every one LiteRT may trip on, and they cannot judge a file whose ops have no tflfuse kernel. So every LiteRT
run of a check happens in a child process (``python -m tflfuse.check_litert``, which imports no TensorFlow):
a crash ends the child, and the check reports it (:class:`LiteRTCrash`) instead of dying with it. The cost is
one process start (about half a second) per model.

:func:`run_litert` takes the .tflite bytes and a list of jobs, each run on its own interpreter:

* ``{"kind": "signatures", "signatures": SIGS, "feeds": [{key: {input name: array}}, ...]}``: per sample, per
  signature key (None: subgraph 0 by its tensor indices), ``{output name: array}``;
* ``{"kind": "tensors", "signatures": SIGS, "key": KEY, "feed": {input name: array}, "tensors": [t, ...]}``:
  one invoke with every tensor preserved; ``{t: array}``, or for a tensor LiteRT does not keep, the error text.

``SIGS`` is :func:`tflfuse.check_config._signatures` of the file.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import warnings
from typing import Any, Mapping

import numpy as np
from absl import logging

__all__ = ["LiteRTCrash", "LiteRTError", "run_litert", "run_signature"]


class LiteRTError(RuntimeError):
    """LiteRT raised (a Python exception in the child: a file it refuses, inputs it rejects)."""


class LiteRTCrash(RuntimeError):
    """LiteRT's process ended without a result (a signal such as SIGSEGV: most likely a malformed file)."""


def run_signature(interp, signatures: Mapping, key, feeds: Mapping[str, np.ndarray]) -> dict:
    """Runs one signature (or subgraph 0 by tensor index for key None) on an interpreter with LiteRT's API
    (LiteRT's or :class:`tflfuse.Interpreter`); its outputs by name."""
    if key is not None:
        return {k: np.asarray(v) for k, v in interp.get_signature_runner(key)(**feeds).items()}
    sig = signatures[None]
    for name, t in sig["inputs"].items():
        interp.set_tensor(t, feeds[name])
    interp.invoke()
    return {name: interp.get_tensor(t) for name, t in sig["outputs"].items()}


def run_litert(data: bytes, jobs: list[dict]) -> list[dict]:
    """Runs ``jobs`` (see the module docstring) on LiteRT's CPU interpreter in a child process.

    Returns:
      Per job, ``{"result": ...}`` or ``{"error": "ValueError: ..."}`` (what LiteRT raised).
    Raises:
      LiteRTCrash: the child ended without a result (killed by a signal); the message names the signal and
        the Python function it hit (``allocate_tensors``, ``invoke``).
    """
    with tempfile.TemporaryDirectory(prefix="tflfuse-litert-") as tmp:
        request, answer = os.path.join(tmp, "request.pkl"), os.path.join(tmp, "answer.pkl")
        with open(request, "wb") as f:
            pickle.dump({"data": data, "jobs": jobs, "verbosity": logging.get_verbosity()}, f, protocol=5)
        proc = subprocess.run([sys.executable, "-m", "tflfuse.check_litert", request, answer],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
        if proc.returncode == 0 and os.path.exists(answer):
            if proc.stderr:
                sys.stderr.write(proc.stderr)
            with open(answer, "rb") as f:
                return pickle.load(f)
    rc = proc.returncode
    logging.info("LiteRT's child process ended with status %d; its stderr:\n%s", rc, proc.stderr)
    if rc < 0 and -rc in signal.valid_signals():
        frame = re.search(r'^\s*File ".*", line \d+ in (\w+)$', proc.stderr, re.M)   # faulthandler's innermost
        raise LiteRTCrash(f"LiteRT's CPU interpreter was killed by {signal.Signals(-rc).name}"
                          + (f" in {frame[1]}" if frame else ""))
    last = proc.stderr.strip().splitlines()[-1:] or ["nothing on stderr"]
    raise LiteRTCrash(f"LiteRT's CPU interpreter exited with status {rc} and no result ({last[0]})")


def _run_job(data: bytes, job: dict) -> Any:
    from tflfuse._litert import cpu_interpreter

    if job["kind"] == "signatures":
        interp = cpu_interpreter(model_content=data)
        return [{key: run_signature(interp, job["signatures"], key, f) for key, f in sample.items()}
                for sample in job["feeds"]]
    with warnings.catch_warnings():  # LiteRT warns that preserving every tensor is for debugging: it is
        warnings.simplefilter("ignore", UserWarning)
        interp = cpu_interpreter(model_content=data, experimental_preserve_all_tensors=True)
    run_signature(interp, job["signatures"], job["key"], job["feed"])
    out: dict[int, Any] = {}
    for t in job["tensors"]:
        try:
            out[t] = np.array(interp.get_tensor(t))
        except ValueError as e:   # a tensor LiteRT does not keep (folded at load)
            out[t] = str(e)
    return out


def _main(request_path: str, answer_path: str) -> None:
    # a crash names the function it hit (run_litert reads it from stderr), written to a copy of stderr's fd:
    # cpu_interpreter points fd 2 elsewhere while LiteRT allocates
    crash_log = os.fdopen(os.dup(2), "w")
    faulthandler.enable(file=crash_log)
    with open(request_path, "rb") as f:
        request = pickle.load(f)
    logging.set_verbosity(request["verbosity"])
    results = []
    for job in request["jobs"]:
        try:
            results.append({"result": _run_job(request["data"], job)})
        except Exception as e:   # noqa: BLE001  (LiteRT's refusal is the check's to report)
            results.append({"error": " ".join(f"{type(e).__name__}: {e}".split())})   # one line
    with open(answer_path + ".part", "wb") as f:
        pickle.dump(results, f, protocol=5)
    os.replace(answer_path + ".part", answer_path)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])

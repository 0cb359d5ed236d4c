"""LiteRT's CPU interpreter, as tflfuse's check, demo and benchmarks make it.

LiteRT's C++ writes ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` straight to file descriptor 2
when it first allocates tensors, whatever ``TF_CPP_MIN_LOG_LEVEL`` says. :func:`cpu_interpreter` moves its
``INFO:`` lines to absl's log (shown with ``--verbosity=0`` or more) and passes every other line on to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from absl import logging

__all__ = ["cpu_interpreter", "info_lines_to_log"]


@contextlib.contextmanager
def info_lines_to_log(prefix: str = "LiteRT"):
    """Captures what native code writes to fd 2 inside the block; ``INFO:`` lines go to absl's log at INFO,
    the rest back to stderr afterwards. Where fd 2 cannot be duplicated (no stderr), nothing is captured."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode("utf-8", "replace").splitlines():
                if line.startswith("INFO: "):
                    logging.info("%s: %s", prefix, line[len("INFO: "):])
                elif line:
                    print(line, file=sys.stderr)


def cpu_interpreter(**kwargs):
    """``ai_edge_litert.interpreter.Interpreter(**kwargs)`` with its tensors allocated, its INFO lines logged.

    Args:
      kwargs: the arguments of LiteRT's Interpreter (``model_path=``, ``model_content=``,
        ``experimental_preserve_all_tensors=``...).
    Returns:
      The allocated LiteRT Interpreter.
    Raises:
      ValueError, RuntimeError: as LiteRT raises them (a malformed file, an op it has no kernel for).
    """
    from ai_edge_litert.interpreter import Interpreter

    with info_lines_to_log():
        interp = Interpreter(**kwargs)
        interp.allocate_tensors()
    return interp

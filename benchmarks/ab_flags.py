"""The flags of the alternating-round A/B benchmarks (``readback_ab.py``, ``upload_ab.py``,
``native_commands_ab.py``, ``submit_split_ab.py``): ``--rounds`` and ``--invokes``, each at least 1; ``--models``,
``--select`` and ``--batch`` or ``--batches``."""

from __future__ import annotations

import re

from absl import flags


def define_rounds_and_invokes(rounds: int, invokes: int, what: str) -> None:
    """Defines ``--rounds`` (default ``rounds``: alternating rounds, one sample of each ``what`` per round) and
    ``--invokes`` (default ``invokes``: timed calls per ``what`` and round, of which the median is the sample), and
    their validators."""
    flags.DEFINE_integer("rounds", rounds, f"alternating rounds (one sample of each {what} per round)")
    flags.DEFINE_integer("invokes", invokes, f"timed calls per {what} and round (median)")
    flags.register_validator("rounds", lambda v: v >= 1, "--rounds must be at least 1")
    flags.register_validator("invokes", lambda v: v >= 1, "--invokes must be at least 1")


def define_models_select_batch(select: list[str]) -> None:
    """Defines ``--models`` (a folder of .tflite models, default ``.bench``), ``--select`` (globs of its file stems,
    default ``select``) and ``--batch`` (the first input dimension, at least 1)."""
    flags.DEFINE_string("models", ".bench", "folder of .tflite models")
    flags.DEFINE_list("select", select, "globs of file stems to time")
    flags.DEFINE_integer("batch", 1, "batch size (the first input dimension)")
    flags.register_validator("batch", lambda v: v >= 1, "--batch must be at least 1")


def define_models_select_batches(select: list[str]) -> None:
    """Defines ``--models`` (a folder of .tflite models, default ``.bench``), ``--select`` (globs of its file stems,
    default ``select``) and ``--batches`` (first input dimensions, each at least 1; default 1 and 32)."""
    flags.DEFINE_string("models", ".bench", "folder of .tflite models")
    flags.DEFINE_list("select", select, "globs of file stems to time")
    flags.register_validator("select", bool, "--select takes at least one glob")
    flags.DEFINE_list("batches", ["1", "32"], "batch sizes (the first input dimension)")
    flags.register_validator("batches", lambda v: bool(v) and all(re.fullmatch(r"0*[1-9][0-9]{0,8}", b, re.ASCII)
                                                                  for b in v),
                             "--batches takes positive integers below 10**9, comma-separated (e.g. 1,32)")

"""The models of a benchmark folder (``benchmarks/run.py --prepare``) that ``--select`` globs pick, each real
model's fused twin made at load with :func:`tflfuse.fuse` where the folder has none (as ``run.py`` does)."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Iterator, Sequence

import tflfuse


def selected_models(folder: Path, globs: Sequence[str]) -> Iterator[tuple[str, bytes]]:
    """``(name, .tflite bytes)`` of each ``*.tflite`` of ``folder`` whose stem matches one of ``globs``, in
    name order; before a ``NAME_unfused`` file without its ``NAME_fused`` file, ``NAME_fused`` made from it. A glob
    may name that twin too (``hand_landmark_*_fused``): it picks the twin alone.

    Raises:
      SystemExit: (with its message, before any model is read) where a glob picks no model of ``folder``.
    """
    picks = []   # (path, the twin to make from it or None, whether the file itself is picked)
    matched = set()
    paths = sorted(folder.glob("*.tflite"))
    for path in paths:
        name = path.stem
        twin = f"{name[:-8]}_fused" if name.endswith("_unfused") else None
        if twin and (folder / f"{twin}.tflite").exists():
            twin = None   # the folder has it: a file of its own
        own = {g for g in globs if fnmatch.fnmatch(name, g)}
        twins = {g for g in globs if twin and fnmatch.fnmatch(twin, g)}
        matched |= own | twins
        if own or twins:
            picks.append((path, twin, bool(own)))
    unmatched = [g for g in globs if g not in matched]
    if unmatched:
        stems = ", ".join(p.stem for p in paths) or "none"
        raise SystemExit(f"no model of {folder} matches --select={','.join(unmatched)}; nothing written (the "
                         f"models are its *.tflite stems, and NAME_fused for each NAME_unfused without one: {stems})")
    for path, twin, own in picks:
        data = path.read_bytes()
        if twin:
            yield twin, tflfuse.fuse(data)[0]
        if own:
            yield path.stem, data

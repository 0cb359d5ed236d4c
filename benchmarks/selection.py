"""The models of a benchmark folder (``benchmarks/run.py --prepare``) that ``--select`` globs pick, each real
model's fused twin made at load with :func:`tflfuse.fuse` where the folder has none (as ``run.py`` does)."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Iterator, Sequence

import tflfuse


def selected_models(folder: Path, globs: Sequence[str]) -> Iterator[tuple[str, bytes]]:
    """``(name, .tflite bytes)`` of each ``*.tflite`` of ``folder`` whose stem matches one of ``globs``, in
    name order; before a ``NAME_unfused`` file without its ``NAME_fused`` file, ``NAME_fused`` made from it."""
    for path in sorted(folder.glob("*.tflite")):
        if not any(fnmatch.fnmatch(path.stem, g) for g in globs):
            continue
        data, name = path.read_bytes(), path.stem
        if name.endswith("_unfused") and not (folder / f"{name[:-8]}_fused.tflite").exists():
            yield f"{name[:-8]}_fused", tflfuse.fuse(data)[0]
        yield name, data

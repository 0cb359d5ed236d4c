"""A plan's dispatches recorded by one call into C: set pipeline, set bind group, dispatch, for every step.

An invoke records its command buffer through wgpu-native's C entry points (:func:`tflfuse.runtime.plan.
_pass_recorder`). From Python that is three cffi calls per dispatch, and on a 2-core CPU their argument
conversion and Python's loop cost more than wgpu-native's own recording: iris_landmark's 81 dispatches (the
software adapter's plan) took 0.91-1.38 us each to record through cffi, 0.19 us each through the loop below
(2026-12-04, 300 passes each), and a whole command buffer (recording, then wgpu-native's validation and
encoding at its end) 79 against 149 us. The host's time per dispatch sets the throughput of small models,
whose GPU work is shorter than their recording (README: "Where an invoke's time goes").

The loop is a plain C function (no Python headers, so one build serves every Python), compiled on first use
with the machine's C compiler (``$CC``, else ``cc``) into ``$XDG_CACHE_HOME/tflfuse/native`` (else
``~/.cache/tflfuse/native``), named by a hash of its source and the machine's architecture, and opened with
wgpu's cffi instance (ABI mode, as wgpu opens wgpu-native). It calls wgpu-native's functions through the
pointers cffi gives for them, so it links against nothing. Where there is no compiler, the build fails (or
takes over 30 s), the cache cannot be written, or the environment variable ``TFLFUSE_NATIVE_RECORD`` is ``0``,
:func:`library` returns None and the plan records through cffi, as before; the reason is logged once (absl,
INFO).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from absl import logging

__all__ = ["SOURCE", "cache_dir", "forget", "library", "library_path", "recorder"]

#: The C source: ``n`` steps, each setting ``pipelines[i]`` where it is not NULL (a pass keeps its pipeline),
#: bind group 0 to ``groups[i]`` (no dynamic offsets) and dispatching ``xyz[3i..3i+2]`` workgroups, through
#: the three wgpu-native functions given as pointers (webgpu.h's signatures). It includes no header and links
#: no C library (``-nostdlib``): the compiler alone builds it, without the C library's development files.
SOURCE = r"""
typedef __SIZE_TYPE__ size_t;
typedef __UINT32_TYPE__ uint32_t;
typedef void (*set_pipeline_fn)(void *, void *);
typedef void (*set_bind_group_fn)(void *, uint32_t, void *, size_t, const uint32_t *);
typedef void (*dispatch_fn)(void *, uint32_t, uint32_t, uint32_t);
void tflfuse_record(void *pass, size_t n, void *const *pipelines, void *const *groups, const uint32_t *xyz,
                    void *set_pipeline, void *set_bind_group, void *dispatch) {
    set_pipeline_fn sp = (set_pipeline_fn)set_pipeline;
    set_bind_group_fn sbg = (set_bind_group_fn)set_bind_group;
    dispatch_fn d = (dispatch_fn)dispatch;
    for (size_t i = 0; i < n; i++) {
        if (pipelines[i]) sp(pass, pipelines[i]);
        sbg(pass, 0, groups[i], 0, (const uint32_t *)0);
        d(pass, xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
    }
}
"""
_CDEF = ("void tflfuse_record(void *pass, size_t n, void *const *pipelines, void *const *groups, "
         "const uint32_t *xyz, void *set_pipeline, void *set_bind_group, void *dispatch);")
_ENTRY_POINTS = ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                 "wgpuComputePassEncoderDispatchWorkgroups")
_COMPILE_TIMEOUT_S = 30   # a build takes well under a second; a compiler that hangs is given up on

_lock = threading.Lock()
_loaded: dict = {}   # "lib": the opened library or None, once per process; "why": the reason for None
_declared: set = set()   # ids of the cffi instances given _CDEF (cffi refuses a second declaration)


def cache_dir() -> Path:
    """Where the compiled loop is kept: ``$XDG_CACHE_HOME/tflfuse/native``, else ``~/.cache/tflfuse/native``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tflfuse" / "native"


def library_path() -> Path:
    """The compiled loop's file: in :func:`cache_dir`, named by a hash of :data:`SOURCE` and the machine's
    architecture."""
    key = hashlib.sha256(f"{SOURCE}\n{platform.machine()}".encode()).hexdigest()[:16]
    return cache_dir() / f"record-{key}.so"


def _build(target: Path) -> None:
    """Compiles :data:`SOURCE` into the shared library ``target`` (written under another name, then renamed,
    so that processes building at once never open a partial file). Raises OSError or
    subprocess.SubprocessError with the compiler's message."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "record.c", Path(tmp) / target.name
        src.write_text(SOURCE)
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-nostdlib", "-o", str(out), str(src)],
                              capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
        if proc.returncode != 0 or not out.exists():
            raise OSError(f"{cc} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[:500]}")
        os.replace(out, target)


def forget() -> None:
    """For tests and benchmarks: the next :func:`library` call decides again (reading ``TFLFUSE_NATIVE_RECORD``
    and the cache anew); plans made before keep the recording they were made with."""
    with _lock:
        _loaded.clear()


def library(ffi):
    """The compiled loop, opened with wgpu-native's cffi instance ``ffi`` (built on first use and cached on
    disk), or None where it cannot be had (see the module's docstring). Never raises."""
    if "lib" in _loaded:
        return _loaded["lib"]
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        lib, why = None, None
        if os.environ.get("TFLFUSE_NATIVE_RECORD", "").strip() == "0":
            why = "TFLFUSE_NATIVE_RECORD=0"
        else:
            target = library_path()
            try:
                if not target.exists():
                    _build(target)
                if id(ffi) not in _declared:
                    ffi.cdef(_CDEF)
                    _declared.add(id(ffi))
                lib = ffi.dlopen(str(target))
                lib.tflfuse_record   # noqa: B018  (a file of another content in the cache raises here)
            except Exception as e:  # noqa: BLE001  (any failure: record through cffi instead)
                lib, why = None, f"{type(e).__name__}: {e}"
        if lib is None:
            logging.info("tflfuse: dispatches are recorded through cffi, one call each (%s)", why)
        _loaded.update(lib=lib, why=why)
        return lib


def recorder(ffi, lib, handles):
    """A function ``record(pass_handle)`` that records ``handles`` (``(pipeline or None, bind group, x, y, z)``
    per step: wgpu-native handles, None where the pipeline is the step before's) in one call of the compiled
    loop, or None where :func:`library` gives none. The arrays are made once; the caller keeps the objects
    owning the handles alive."""
    native = library(ffi) if handles else None
    if native is None:
        return None
    null = ffi.NULL
    pipelines = ffi.new("void *[]", [null if p is None else ffi.cast("void *", p) for p, *_ in handles])
    groups = ffi.new("void *[]", [ffi.cast("void *", b) for _, b, *_ in handles])
    xyz = ffi.new("uint32_t[]", [int(v) for *_, x, y, z in handles for v in (x, y, z)])
    entry = [ffi.cast("void *", ffi.addressof(lib, name)) for name in _ENTRY_POINTS]
    call, n = native.tflfuse_record, len(handles)

    def record(h) -> None:
        call(h, n, pipelines, groups, xyz, *entry)
    record.arrays = (pipelines, groups, xyz)   # kept alive with the function
    return record

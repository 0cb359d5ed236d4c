"""A plan's dispatches recorded by one call into C: set pipeline, set bind group, dispatch, for every step.

An invoke records its command buffer through wgpu-native's C entry points (:func:`tflfuse.runtime.plan.
_pass_recorder`). From Python that is three cffi calls per dispatch, and on a 2-core CPU their argument
conversion and Python's loop cost more than wgpu-native's own recording: iris_landmark's 81 dispatches (the
software adapter's plan) took 0.91-1.38 us each to record through cffi, 0.19 us each through the loop below
(2026-12-04, 300 passes each), and a whole command buffer (recording, then wgpu-native's validation and
encoding at its end) 79 against 149 us. The host's time per dispatch sets the throughput of small models,
whose GPU work is shorter than their recording (README: "Where an invoke's time goes").

The loop is a plain C function (no Python headers, so one build serves every Python), compiled on first use
with the machine's C compiler (``$CC`` split into words, else ``cc``) into ``$XDG_CACHE_HOME/tflfuse/native``
(else ``~/.cache/tflfuse/native``; a folder of this user's that no one else may write to), named by a hash of
its source, the compiler's command and flags and the machine's architecture, and opened with a cffi instance
of tflfuse's own (ABI mode). It calls the WebGPU library's functions (wgpu-native's or Dawn's) through the
pointers cffi gives for them, so it links against nothing. The library and its digest are built in a folder of
their own, renamed into place whole; before use, the file must match that digest (a truncated or altered file is built
again rather than opened) and the loop pass a self-test: three made-up steps with Python callbacks in place
of wgpu-native's functions. The cache folder and every folder above it must be this user's or root's and
not writable by others (but sticky ones, as ``/tmp``): a library another user could place would run here.
Where there is no compiler, the build fails or runs past :data:`COMPILE_TIMEOUT_S` (then a marker file keeps
later processes from waiting on it again), the folder cannot be used, or the environment variable ``TFLFUSE_NATIVE_RECORD`` is ``0`` (false, no,
off), :func:`library` returns None and the plan records through cffi, as before; the reason is logged once
(absl, INFO).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from absl import logging

from .device import _env_bool

__all__ = ["SOURCE", "cache_dir", "forget", "library", "library_path", "recorder", "timeout_marker"]

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
_FLAGS = ("-O2", "-shared", "-fPIC", "-nostdlib")
#: A build takes well under a second; a compiler still running after this is killed (its whole process group)
#: and a marker file (:func:`timeout_marker`) keeps later processes from waiting on it again until it is deleted.
COMPILE_TIMEOUT_S = 10
_MAX_OUTPUT = 1 << 20   # bytes: the most compiler output, and the largest library or digest file, taken

_lock = threading.Lock()
_loaded: dict = {}   # "lib": the opened library or None, once per process; "why": the reason for None
_own: list = []   # tflfuse's cffi instance, declared with _CDEF, made on first use


def cache_dir() -> Path:
    """Where the compiled loop is kept: ``$XDG_CACHE_HOME/tflfuse/native`` where that is an absolute path (the
    XDG spec ignores a relative one), else ``~/.cache/tflfuse/native``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = str(Path.home() / ".cache")
    return Path(base) / "tflfuse" / "native"


def _compiler() -> list[str]:
    """The compiler's command: ``$CC`` split into words as make and Python's build tools split it (``ccache
    gcc``), else ``cc``."""
    return shlex.split(os.environ.get("CC") or "") or ["cc"]


def library_path() -> Path:
    """The compiled loop's file, ``record.so`` in a folder of :func:`cache_dir` named by a hash of
    :data:`SOURCE`, the compiler's command, its flags and the machine's architecture; beside it in that folder,
    ``record.sha256`` holds the digest of the file as built (a file that does not match it is built again). The
    folder is made whole elsewhere and renamed into place, so the two always belong together."""
    key = hashlib.sha256("\n".join([SOURCE, *_compiler(), *_FLAGS, platform.machine()]).encode()).hexdigest()
    return cache_dir() / f"record-{key[:16]}" / "record.so"


def timeout_marker() -> Path:
    """The file that says a build of :func:`library_path` ran past :data:`COMPILE_TIMEOUT_S`."""
    return library_path().parent.with_suffix(".timeout")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _safe_folder(folder: Path) -> None:
    """Makes ``folder`` (mode 0o700) and checks it and every folder above it: each must belong to this user or
    to root, and none may be writable by other users unless sticky (``/tmp``); ``folder`` itself must be this
    user's. A library that another user could put or swap in would run in this process. Raises OSError."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    real = Path(os.path.realpath(folder))
    uid = os.getuid() if hasattr(os, "getuid") else None
    for p in (real, *real.parents):
        st = p.stat()
        if uid is not None and st.st_uid not in (uid, 0) or (p == real and uid is not None and st.st_uid != uid):
            raise OSError(f"{p} belongs to another user")
        if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and p != real):
            raise OSError(f"{p} is writable by other users (mode {st.st_mode & 0o7777:o})")


def _build(target: Path) -> None:
    """Compiles :data:`SOURCE` into a new folder with the library and its digest, then renames the folder to
    ``target``'s (a process that finds it there already keeps the one there). The compiler's output goes to a
    file (at most :data:`_MAX_OUTPUT` bytes are allowed); a compiler running past :data:`COMPILE_TIMEOUT_S` is
    killed with its process group and the timeout marker written. Raises OSError with the compiler's message,
    or subprocess.TimeoutExpired."""
    cc = _compiler()
    if shutil.which(cc[0]) is None:
        raise OSError(f"no C compiler {cc[0]!r} on PATH")
    tmp = Path(tempfile.mkdtemp(dir=target.parent.parent, prefix=".build-"))
    try:
        src, out, log = tmp / "record.c", tmp / target.name, tmp / "compiler.log"
        src.write_text(SOURCE)
        with open(log, "wb") as sink:
            proc = subprocess.Popen([*cc, *_FLAGS, "-o", str(out), str(src)], stdin=subprocess.DEVNULL,
                                    stdout=sink, stderr=sink, start_new_session=True)
            deadline = time.monotonic() + COMPILE_TIMEOUT_S
            while proc.poll() is None:
                if time.monotonic() > deadline or log.stat().st_size > _MAX_OUTPUT:
                    os.killpg(proc.pid, signal.SIGKILL)   # the compiler and what it started
                    proc.wait()
                    if log.stat().st_size <= _MAX_OUTPUT:
                        timeout_marker().write_text(f"{' '.join(cc)} ran past {COMPILE_TIMEOUT_S} s\n")
                        raise subprocess.TimeoutExpired(cc, COMPILE_TIMEOUT_S)
                    raise OSError(f"{' '.join(cc)} wrote more than {_MAX_OUTPUT} bytes of output")
                time.sleep(0.01)
        if proc.returncode != 0 or not out.is_file():
            message = log.read_bytes()[:500].decode(errors="replace").strip()
            raise OSError(f"{' '.join(cc)} failed ({proc.returncode}): {message}")
        (tmp / "record.sha256").write_text(_digest(out))
        src.unlink()
        log.unlink()
        try:
            os.rename(tmp, target.parent)
        except OSError:
            if not target.parent.is_dir():
                raise   # else another process put its build there first: that one is used
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _self_test(ffi, lib) -> None:
    """Runs the loop on three made-up steps (the middle one keeping its pipeline) with callbacks standing in for
    wgpu-native's functions, and raises OSError unless it made exactly the calls it must."""
    calls = []
    addr = lambda p: int(ffi.cast("uintptr_t", p))  # noqa: E731
    callbacks = (
        ffi.callback("void(void *, void *)", lambda h, p: calls.append(("pipeline", addr(h), addr(p)))),
        ffi.callback("void(void *, uint32_t, void *, size_t, const uint32_t *)",
                     lambda h, i, g, k, o: calls.append(("group", addr(h), i, addr(g), k, addr(o)))),
        ffi.callback("void(void *, uint32_t, uint32_t, uint32_t)",
                     lambda h, x, y, z: calls.append(("dispatch", addr(h), x, y, z))))
    p = lambda v: ffi.cast("void *", v)  # noqa: E731
    lib.tflfuse_record(p(0x99), 3, ffi.new("void *[]", [p(0x10), ffi.NULL, p(0x30)]),
                       ffi.new("void *[]", [p(0x11), p(0x21), p(0x31)]), ffi.new("uint32_t[]", list(range(1, 10))),
                       *(ffi.cast("void *", c) for c in callbacks))
    want = [("pipeline", 0x99, 0x10), ("group", 0x99, 0, 0x11, 0, 0), ("dispatch", 0x99, 1, 2, 3),
            ("group", 0x99, 0, 0x21, 0, 0), ("dispatch", 0x99, 4, 5, 6),
            ("pipeline", 0x99, 0x30), ("group", 0x99, 0, 0x31, 0, 0), ("dispatch", 0x99, 7, 8, 9)]
    if calls != want:
        raise OSError(f"the compiled loop made the calls {calls[:4]}..., not those of its source")


def _ffi():
    """tflfuse's own cffi instance (ABI mode), declared with the loop's signature. The loop is opened with it
    rather than with the WebGPU library's: Dawn's (``wgpudawn``) is a compiled instance, which cannot declare
    more, and the pointers of either pass to it as they are."""
    if not _own:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        _own.append(ffi)
    return _own[0]


def _open(target: Path):
    """The library at ``target`` opened and checked (its digest, then :func:`_self_test`). Raises OSError."""
    stamp = target.with_suffix(".sha256")
    for path in (target, stamp):   # not a FIFO or a device that a read would wait on, nor a huge file
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_OUTPUT:
            raise OSError(f"{path} is not a file of the size a build writes")
    if stamp.read_text().strip() != _digest(target):
        raise OSError(f"{target} does not match the digest it was built with")
    ffi = _ffi()
    lib = ffi.dlopen(str(target))
    _self_test(ffi, lib)
    return lib


def _remove(target: Path) -> None:
    """Removes the folder of ``target`` (the library and its digest), or whatever stands at its name."""
    folder = target.parent
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
    else:
        try:
            folder.unlink()
        except OSError:
            pass


def forget() -> None:
    """For tests and benchmarks: the next :func:`library` call decides again (reading ``TFLFUSE_NATIVE_RECORD``
    and the cache anew); plans made before keep the recording they were made with."""
    with _lock:
        _loaded.clear()


def _switched_off() -> bool:
    """Whether ``TFLFUSE_NATIVE_RECORD`` says off (read as ``TFLFUSE_SHADER_CHECKS`` is:
    :func:`~tflfuse.runtime.device._env_bool`); a value that is neither on nor off is logged as a warning and
    leaves the loop on (:func:`library` never raises)."""
    if not os.environ.get("TFLFUSE_NATIVE_RECORD", "").strip():
        return False
    try:
        return not _env_bool("TFLFUSE_NATIVE_RECORD")
    except ValueError as e:
        logging.warning("tflfuse: %s; the compiled loop stays on", e)
        return False


def library():
    """The compiled loop, opened with tflfuse's own cffi instance (:func:`_ffi`; built on first use and cached on
    disk), or None where it cannot be had (see the module's docstring). A cached file that fails its digest, does
    not open or fails the self-test is built again, once. Never raises."""
    if "lib" in _loaded:
        return _loaded["lib"]
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        lib, why = None, None
        if _switched_off():
            why = "TFLFUSE_NATIVE_RECORD is off"
        else:
            try:
                target = library_path()   # ($CC's words, the home folder: any of it may raise)
                _safe_folder(target.parent.parent)
                if os.path.lexists(timeout_marker()):
                    raise OSError(f"a build ran past {COMPILE_TIMEOUT_S} s before; delete {timeout_marker()} to "
                                  f"try again")
                if os.path.lexists(target.parent):
                    try:
                        lib = _open(target)
                    except Exception as e:  # noqa: BLE001  (a damaged or foreign file: built again)
                        logging.info("tflfuse: the cached recording loop %s is built again (%s)", target, e)
                        _remove(target)
                if lib is None:
                    _build(target)
                    try:
                        lib = _open(target)
                    except Exception:
                        _remove(target)
                        raise
            except Exception as e:  # noqa: BLE001  (any failure: record through cffi instead)
                lib, why = None, f"{type(e).__name__}: {e}"
        if lib is None:
            logging.info("tflfuse: dispatches are recorded through cffi, one call each (%s)", why)
        _loaded.update(lib=lib, why=why)
        return lib


def recorder(ffi, lib, handles):
    """A function ``record(pass_handle)`` that records ``handles`` (``(pipeline or None, bind group, x, y, z)``
    per step: handles of the WebGPU library ``lib`` (wgpu-native's or Dawn's) and its cffi instance ``ffi``, None
    where the pipeline is the step before's) in one call of the compiled loop, or None where :func:`library` gives
    none. The arrays are made once; the caller keeps the objects owning the handles alive."""
    native = library() if handles else None
    if native is None:
        return None
    lib_ffi, ffi = ffi, _ffi()
    null = ffi.NULL
    pipelines = ffi.new("void *[]", [null if p is None else ffi.cast("void *", p) for p, *_ in handles])
    groups = ffi.new("void *[]", [ffi.cast("void *", b) for _, b, *_ in handles])
    xyz = ffi.new("uint32_t[]", [int(v) for *_, x, y, z in handles for v in (x, y, z)])
    entry = [ffi.cast("void *", lib_ffi.addressof(lib, name)) for name in _ENTRY_POINTS]
    call, n = native.tflfuse_record, len(handles)

    def record(h) -> None:
        call(h, n, pipelines, groups, xyz, *entry)
    record.arrays = (pipelines, groups, xyz)   # kept alive with the function
    return record

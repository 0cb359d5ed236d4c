"""The device under stress: a lost device, a shader that does not compile, several threads, and the storage
binding limit forced low on the software adapter."""

import tflfuse  # noqa: I001  (before anything that can import TensorFlow)

import dataclasses
import re
import threading

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

from tflfuse.kernels import KernelError, kernel_class
from tflfuse.runtime import DeviceLostError, ShaderCompileError

from conftest import ACCUMULATION
from tflite_builder import build, t

_X = (1, 8, 8, 3)


def _conv_tanh() -> bytes:
    """tanh(conv2d(x, w, SAME) + b): [1, 8, 8, 3] -> [1, 8, 8, 4]."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    return build([t(_X), t(w.shape, data=w), t(b.shape, data=b), t((1, 8, 8, 4)), t((1, 8, 8, 4), name="y")],
                 [dict(op="CONV_2D", inputs=[0, 1, 2], outputs=[3],
                       options=("Conv2DOptions", {"padding": 0, "strideH": 1, "strideW": 1})),
                  dict(op="TANH", inputs=[3], outputs=[4])], [0], [4])


@pytest.fixture(scope="module")
def model() -> bytes:
    return _conv_tanh()


def _run(interp, x: np.ndarray) -> np.ndarray:
    interp.set_tensor(0, x)
    interp.invoke()
    return interp.get_tensor(4)


def _litert(model: bytes, xs) -> list[np.ndarray]:
    ref = LiteRTInterpreter(model_content=model)
    ref.allocate_tensors()
    return [_run(ref, x) for x in xs]


# ---- a lost device ----------------------------------------------------------------------------------------

_LOST_QUIETLY = """
import logging, sys
import numpy as np
import tflfuse
import wgpu   # before the logging set-up: wgpu installs its own logger class
from tflfuse.runtime import DeviceLostError
{quiet}
interp = tflfuse.Interpreter(model_path=sys.argv[1], device=tflfuse.Device())
interp.allocate_tensors()
interp.set_tensor(0, np.ones({shape}, np.float32))
for _ in range({invokes}):   # from the second on, each invoke records the next one's command buffer ahead
    interp.invoke()
interp.device.device.destroy()
try:
    interp.invoke()
except DeviceLostError as e:
    print("DeviceLostError", e)
import gc
del interp   # the plan's finalizer submits nothing on a lost device (_submit_ahead)
gc.collect()
print("dropped")
"""


@pytest.mark.parametrize("invokes", [1, 2], ids=["recorded_then", "recorded_ahead"])
@pytest.mark.parametrize("quiet", ['logging.getLogger("wgpu").setLevel(logging.CRITICAL)',
                                   "logging.disable(logging.ERROR)"])
def test_lost_device_with_wgpu_logging_silenced(model, tmp_path, quiet, invokes):
    """Neither the command buffer recorded ahead nor one recorded after a loss through wgpu-native's C entry
    points is submitted, whatever the logging set-up, nor the one recorded ahead when the plan is dropped
    after the loss (wgpu-native aborts the process on any of them); in a subprocess, so that an abort fails
    the test."""
    import subprocess
    import sys

    (tmp_path / "m.tflite").write_bytes(model)
    proc = subprocess.run([sys.executable, "-c", _LOST_QUIETLY.format(quiet=quiet, shape=_X, invokes=invokes),
                           str(tmp_path / "m.tflite")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DeviceLostError invoke(): the WebGPU device" in proc.stdout
    assert proc.stdout.rstrip().endswith("dropped")

def test_lost_device_raises_on_the_next_call(model, rng):
    device = tflfuse.Device()   # its own: destroyed below
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    x = rng.standard_normal(_X).astype(np.float32)
    before = _run(interp, x)
    device.device.destroy()
    with pytest.raises(DeviceLostError, match=rf"invoke\(\): the WebGPU device {re.escape(device.name)}.* was lost .*"
                                              r"Make a new tflfuse.Device and new Interpreters"):
        interp.invoke()
    assert issubclass(DeviceLostError, RuntimeError)
    # Nothing returns the dead device's buffers (the output of the invoke before the loss).
    with pytest.raises(DeviceLostError, match=r"get_tensor\(\)"):
        interp.get_tensor(4)
    with pytest.raises(DeviceLostError, match=r"set_tensor\(\)"):
        interp.set_tensor(0, x)
    other = tflfuse.Interpreter(model_content=model, device=device)
    with pytest.raises(DeviceLostError, match=r"allocate_tensors\(\)"):
        other.allocate_tensors()
    # A new device runs the model again.
    fresh = tflfuse.Interpreter(model_content=model, device=tflfuse.Device())
    fresh.allocate_tensors()
    np.testing.assert_array_equal(_run(fresh, x), before)   # the same kernels on the same adapter: bit-identical


# ---- a shader that does not compile -------------------------------------------------------------------------

def test_shader_compile_error_names_the_op_and_its_input_shapes(model, monkeypatch):
    cls = kernel_class("TANH")
    programs = cls.programs

    def broken(self):
        return [dataclasses.replace(p, source=p.source + "\nfn broken( {") for p in programs(self)]

    monkeypatch.setattr(cls, "programs", broken)
    interp = tflfuse.Interpreter(model_content=model, device=tflfuse.Device())
    with pytest.raises(ShaderCompileError) as info:
        interp.allocate_tensors()
    message = str(info.value)
    assert message.startswith("TANH (operator 1 of subgraph 0, program "), message
    assert "input shapes [[1, 8, 8, 4]]" in message and "failed to compile" in message, message
    assert issubclass(ShaderCompileError, RuntimeError)


# ---- threads ------------------------------------------------------------------------------------------------

_THREADS, _ROUNDS = 4, 8


def _inputs(seed: int) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    return [r.standard_normal(_X).astype(np.float32) for _ in range(_ROUNDS)]


def _in_threads(work, count: int = _THREADS) -> list:
    """Runs ``work(k)`` in ``count`` threads started together; their results, or the first error."""
    results, errors = [None] * count, []
    start = threading.Barrier(count)

    def main(k):
        try:
            start.wait()
            results[k] = work(k)
        except BaseException as e:  # noqa: BLE001  (re-raised in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=main, args=(k,)) for k in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hangs"
    if errors:
        raise errors[0]
    return results


def test_interpreters_sharing_a_device_in_threads(model, device):
    """Each thread makes, allocates and runs its own Interpreter on one shared Device (one pipeline cache)."""
    xs = [_inputs(k) for k in range(_THREADS)]
    single = tflfuse.Interpreter(model_content=model, device=device)
    single.allocate_tensors()
    want = [[_run(single, x) for x in xk] for xk in xs]

    def work(k):
        interp = tflfuse.Interpreter(model_content=model, device=device)
        interp.allocate_tensors()
        return [_run(interp, x) for x in xs[k]]

    got = _in_threads(work)
    for k in range(_THREADS):
        for g, w, r in zip(got[k], want[k], _litert(model, xs[k])):
            np.testing.assert_array_equal(g, w)      # the same kernels as the single-threaded run: bit-identical
            np.testing.assert_allclose(g, r, **ACCUMULATION)   # and LiteRT's result (27-term dot products)


def test_read_backs_in_many_threads(device):
    """Sixteen threads, each with its own Interpreter on the shared Device, invoke and read back 500 times: every
    read-back waits for its own map while the other threads poll the same device (a map whose callback another
    thread's poll ran, or a poll that returned first, must neither fail nor leave the buffer mapped for the next
    submit). Exact: x + 1 in float32."""
    from tflite_builder import build, t

    tflite = build([t((8, 8)), t((1, 1), data=np.ones((1, 1), np.float32)), t((8, 8))],
                   [dict(op="ADD", inputs=[0, 1], outputs=[2])], [0], [2])

    def work(k):
        interp = tflfuse.Interpreter(model_content=tflite, device=device)
        interp.allocate_tensors()
        wrong = []
        for i in range(500):
            x = np.full((8, 8), float(1000 * k + i), np.float32)
            interp.set_tensor(0, x)
            interp.invoke()
            if not np.array_equal(interp.get_tensor(2), x + 1):
                wrong.append(i)
        return wrong

    assert _in_threads(work, 16) == [[]] * 16


def test_one_interpreter_in_threads_with_a_caller_lock(model, device):
    """One Interpreter, its inputs shared state: the caller holds a lock around set_tensor/invoke/get_tensor
    (as with LiteRT); each thread gets the result of its own input."""
    xs = [_inputs(10 + k) for k in range(_THREADS)]
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    want = [[_run(interp, x) for x in xk] for xk in xs]
    lock = threading.Lock()

    def work(k):
        out = []
        for x in xs[k]:
            with lock:
                out.append(_run(interp, x))
        return out

    got = _in_threads(work)
    for k in range(_THREADS):
        for g, w in zip(got[k], want[k]):
            np.testing.assert_array_equal(g, w)   # the same plan as the single-threaded run: bit-identical


def test_one_interpreter_in_threads_without_a_lock(model, device):
    """Unsynchronised calls on one Interpreter from several threads, all with the same input: no crash, no
    error, and every result is the model's output (the interpreter's own lock keeps each call whole)."""
    x = _inputs(20)[0]
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    want = _litert(model, [x])[0]
    got = _in_threads(lambda k: [_run(interp, x) for _ in range(_ROUNDS)])
    for outs in got:
        for g in outs:
            np.testing.assert_allclose(g, want, **ACCUMULATION)


# ---- the storage binding limit, forced low ------------------------------------------------------------------

def _fully_connected() -> bytes:
    w = np.ones((16, 64), np.float32)
    return build([t((1, 64)), t(w.shape, data=w, name="fc/weights"), t((1, 16))],
                 [dict(op="FULLY_CONNECTED", inputs=[0, 1], outputs=[2])], [0], [2])


def _broadcast_add() -> bytes:
    return build([t((64, 1)), t((1, 64)), t((64, 64), name="sum")],
                 [dict(op="ADD", inputs=[0, 1], outputs=[2])], [0, 1], [2])


@pytest.mark.parametrize("make, limit, match", [
    (_fully_connected, 1024, r"constant tensor 1 \('fc/weights'\) \[16, 64\] is 4096 bytes, over the device's "
                             r"max storage binding of 1024 bytes"),
    (_broadcast_add, 4096, r"tensor 2 \('sum'\) \[64, 64\] needs 16384 bytes, over the device's max storage "
                           r"binding of 4096 bytes"),
])
def test_tensor_past_a_low_storage_binding_limit(make, limit, match, device, monkeypatch):
    """The adapter's limit forced low: a weight or an output past it is refused by allocate_tensors(), naming
    the tensor and the limit; with the adapter's own limit the same model runs."""
    model = make()
    monkeypatch.setitem(device.limits, "max-storage-buffer-binding-size", limit)
    interp = tflfuse.Interpreter(model_content=model, device=device)
    with pytest.raises(KernelError, match=match):
        interp.allocate_tensors()
    monkeypatch.undo()
    interp.allocate_tensors()
    ref = LiteRTInterpreter(model_content=model)
    ref.allocate_tensors()
    rng = np.random.default_rng(3)
    for d in ref.get_input_details():
        x = rng.standard_normal(d["shape"]).astype(np.float32)
        interp.set_tensor(d["index"], x)
        ref.set_tensor(d["index"], x)
    interp.invoke()
    ref.invoke()
    out = ref.get_output_details()[0]["index"]
    np.testing.assert_allclose(interp.get_tensor(out), ref.get_tensor(out), **ACCUMULATION)  # <= 64-term sums


# ---- command buffers through wgpu-native's C entry points ------------------------------------------------------

def test_command_buffers_after_the_first_go_through_the_c_entry_points(model, device):
    """The first invoke's command buffer goes through wgpu's API (which raises for what wgpu-native refuses);
    the next ones through its C entry points: every invoke, each on a new input, matches LiteRT's CPU
    interpreter, and an unsubmitted command buffer is released when the plan drops it."""
    from tflfuse.runtime.plan import _NativeCommandBuffer

    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    xs = [_inputs(k)[0] for k in range(4)]
    got = [_run(interp, x) for x in xs]
    plan = interp._plan(0)
    assert plan._native is not None and isinstance(plan._ahead[0], _NativeCommandBuffer)
    for g, r in zip(got, _litert(model, xs)):
        np.testing.assert_allclose(g, r, **ACCUMULATION)
    pending = plan._ahead[0]
    plan._ahead[0] = None
    pending.release()   # what its __del__ does
    assert pending.handle is None
    np.testing.assert_allclose(_run(interp, xs[0]), got[0], **ACCUMULATION)   # encodes anew, then runs on


# ---- dispatches recorded by a compiled loop (tflfuse.runtime.record) ------------------------------------------

def _fresh_record_state(monkeypatch, **env):
    """tflfuse.runtime.record as in a new process (no library opened yet), with ``env`` set."""
    from tflfuse.runtime import record

    monkeypatch.setattr(record, "_loaded", {})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return record


def _runs_as_litert(model, device, seed: int) -> None:
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    xs = _inputs(seed)[:4]
    for g, r in zip([_run(interp, x) for x in xs], _litert(model, xs)):
        np.testing.assert_allclose(g, r, **ACCUMULATION)


def _compiler():
    """The machine's C compiler as tflfuse.runtime.record looks for it, or None."""
    import os
    import shutil

    return shutil.which((os.environ.get("CC") or "cc").split()[0])


def test_the_compiled_recording_loop_is_built_once_and_records_every_dispatch(model, device, monkeypatch, tmp_path):
    """Where the machine has a C compiler, the loop is compiled into the cache folder on first use (the library
    and its digest), opened from there by the next process without building again, and every invoke it records
    matches LiteRT's CPU interpreter; where it has none, library() says None and the plan records through cffi,
    with the same results."""
    record = _fresh_record_state(monkeypatch, XDG_CACHE_HOME=str(tmp_path), TFLFUSE_NATIVE_RECORD="1")
    lib = record.library()
    assert (lib is not None) == (_compiler() is not None), record._loaded.get("why")
    native = tmp_path / "tflfuse" / "native"
    built = sorted(str(p.relative_to(native)) for p in native.rglob("*"))
    # record-KEY/ with record.so and record.sha256, and nothing left of the build
    assert len(built) == (3 if _compiler() else 0) and not any(".build" in b for b in built), built
    _runs_as_litert(model, device, 30)
    if _compiler():   # a new process opens the cached file without compiling again

        def build(target):
            raise AssertionError("built again")
        monkeypatch.setattr(record, "_loaded", {})
        monkeypatch.setattr(record, "_build", build)
        assert record.library() is not None
        assert sorted(str(p.relative_to(native)) for p in native.rglob("*")) == built


def _script(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("case", ["switched_off", "no_compiler", "compiler_fails", "cache_is_a_file",
                                  "cache_writable_by_others", "loop_that_does_nothing", "compiler_hangs"])
def test_without_the_compiled_loop_dispatches_are_recorded_through_cffi(model, device, monkeypatch, tmp_path,
                                                                        case):
    """No loop (TFLFUSE_NATIVE_RECORD off, no compiler, a compiler that fails, a cache path that is a file or a
    folder others may write to, a compiler whose loop makes no calls (the self-test), a compiler that hangs
    (killed after COMPILE_TIMEOUT_S, here 1 s, and not waited on again by the next process)): library() gives
    None with the reason, nothing raises, and invokes match LiteRT's CPU interpreter."""
    import time

    cache = tmp_path / "cache"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"switched_off": dict(TFLFUSE_NATIVE_RECORD="Off"),
           "no_compiler": dict(CC=str(tmp_path / "no-such-compiler")),
           "compiler_fails": dict(CC="false"),
           "cache_is_a_file": dict(XDG_CACHE_HOME=str(blocker)),
           # a loop of the right name that returns at once: it opens, and fails the self-test
           "loop_that_does_nothing": dict(CC=_script(tmp_path / "noop-cc", f"printf 'void tflfuse_record(void) {{}}\\n' "
                                                     f"> {tmp_path}/noop.c; exec {_compiler() or 'cc'} -shared "
                                                     f"-fPIC -nostdlib -o \"$(eval echo \\${{$(($#-1))}})\" "
                                                     f"{tmp_path}/noop.c")),
           "compiler_hangs": dict(CC=_script(tmp_path / "hang-cc", "sleep 600"))}.get(case, {})
    env.setdefault("XDG_CACHE_HOME", str(cache))
    env.setdefault("TFLFUSE_NATIVE_RECORD", "1")
    record = _fresh_record_state(monkeypatch, **env)
    monkeypatch.setattr(record, "COMPILE_TIMEOUT_S", 1)
    if case == "cache_writable_by_others":
        (cache / "tflfuse" / "native").mkdir(parents=True)
        (cache / "tflfuse" / "native").chmod(0o777)
    assert record.library() is None
    assert record._loaded["why"]
    if case == "compiler_hangs":   # the next process does not wait for the compiler again
        assert record.timeout_marker().exists()
        monkeypatch.setattr(record, "_loaded", {})
        t0 = time.perf_counter()
        assert record.library() is None and "delete" in record._loaded["why"]
        assert time.perf_counter() - t0 < 1
    _runs_as_litert(model, device, 31)


@pytest.mark.parametrize("case", ["truncated", "foreign_library", "digest_missing"])
def test_a_damaged_cached_loop_is_built_again(model, device, monkeypatch, tmp_path, case):
    """A file under the loop's name that does not match the digest written when it was built (truncated,
    another library, or no digest) is never opened (a truncated library can crash the process on opening): it
    is built again where the machine has a compiler (the loop then records, matching LiteRT's CPU interpreter),
    and dispatches go through cffi where it has none."""
    from wgpu.backends.wgpu_native._ffi import get_wgpu_lib_path

    record = _fresh_record_state(monkeypatch, XDG_CACHE_HOME=str(tmp_path), TFLFUSE_NATIVE_RECORD="1")
    target = record.library_path()
    target.parent.mkdir(parents=True, mode=0o700)
    if case == "truncated":
        target.write_bytes(open(get_wgpu_lib_path(), "rb").read(4096))
        target.with_suffix(".sha256").write_text("0" * 64)
    elif case == "foreign_library":
        target.write_bytes(open(get_wgpu_lib_path(), "rb").read())
        target.with_suffix(".sha256").write_text("0" * 64)
    else:
        target.write_bytes(b"\x7fELF")
    lib = record.library()
    assert (lib is not None) == (_compiler() is not None), record._loaded.get("why")
    if lib is not None:
        assert target.with_suffix(".sha256").read_text() == record._digest(target)
    _runs_as_litert(model, device, 32)


def test_a_compiler_command_of_several_words(model, device, monkeypatch, tmp_path):
    """``CC`` holding a command with arguments is split into words, as make splits it: the loop builds with it
    where the machine has a compiler."""
    cc = _compiler()
    record = _fresh_record_state(monkeypatch, XDG_CACHE_HOME=str(tmp_path), TFLFUSE_NATIVE_RECORD="1",
                                 CC=f"{cc or 'cc'} -O1 -g0")
    assert (record.library() is not None) == (cc is not None), record._loaded.get("why")
    _runs_as_litert(model, device, 33)


def test_a_late_map_callback_is_not_taken_for_the_next_read(model, device):
    """A read-back whose map timed out is cancelled, but its callback may still come during the next read;
    read() takes only the callback of the map it waits for (its serial number): a stale success passes for
    nothing, and read-backs go on matching LiteRT's CPU interpreter."""
    from wgpu.backends.wgpu_native import _api

    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    xs = [_inputs(k)[0] for k in range(3)]
    got = [_run(interp, x) for x in xs[:2]]
    native = interp._plan(0)._native
    assert native is not None
    message = _api.ffi.new("WGPUStringView *")[0]
    success = native.lib.WGPUMapAsyncStatus_Success
    native._mapped[0] = None
    native._on_mapped(success, message, _api.ffi.cast("void *", native._serial[0] - 1), _api.ffi.NULL)   # stale
    assert native._mapped[0] is None
    native._on_mapped(success, message, _api.ffi.cast("void *", native._serial[0]), _api.ffi.NULL)
    assert native._mapped[0] == success
    got.append(_run(interp, xs[2]))
    for g, r in zip(got, _litert(model, xs)):
        np.testing.assert_allclose(g, r, **ACCUMULATION)


class _CountingPolls:
    """A stand-in for wgpu-native's library object that counts ``wgpuDevicePoll`` calls by their ``wait``
    argument and, with ``interrupt``, raises KeyboardInterrupt from the first poll (as Ctrl-C would)."""

    def __init__(self, lib, interrupt: bool = False):
        self._lib, self.interrupt, self.polls = lib, interrupt, {True: 0, False: 0}

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def wgpuDevicePoll(self, device, wait, index):
        self.polls[bool(wait)] += 1
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt("while waiting for a read-back")
        return self._lib.wgpuDevicePoll(device, wait, index)


def test_read_back_polls_before_blocking_and_matches_litert(model, device, monkeypatch):
    """On a hardware adapter a read-back first polls without blocking (``READBACK_SPIN_S``), then waits in the
    driver; a software adapter waits at once. With the polling forced on here, a spin long enough for the GPU
    reads back after non-blocking polls alone, one of 0 polls only blocking; the values read back match
    LiteRT's CPU interpreter either way."""
    import tflfuse.runtime.plan as plan_module

    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    xs = [_inputs(k)[0] for k in range(3)]
    got = [_run(interp, xs[0])]
    native = interp._plan(0)._native
    assert native is not None
    assert native._spins is (not device.is_software)
    native._spins = True
    for spin, x in zip((5.0, 0.0), xs[1:]):
        monkeypatch.setattr(plan_module, "READBACK_SPIN_S", spin)
        native.lib = counting = _CountingPolls(native.lib)
        got.append(_run(interp, x))
        native.lib = counting._lib
        assert (counting.polls[False] > 0, counting.polls[True] == 0) == (spin > 0, spin > 0), counting.polls
    for g, r in zip(got, _litert(model, xs)):
        np.testing.assert_allclose(g, r, **ACCUMULATION)


class _InterruptAfterMap:
    """A stand-in for a library object whose first ``wgpuBufferMapAsync`` starts the map, then raises
    KeyboardInterrupt (Ctrl-C landing as the call returns)."""

    def __init__(self, lib):
        self._lib, self.interrupt = lib, True

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def wgpuBufferMapAsync(self, *args):
        future = self._lib.wgpuBufferMapAsync(*args)
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt("as the map started")
        return future


@pytest.mark.parametrize("spin, when", [(0.0, "waiting"), (5.0, "waiting"), (0.0, "mapping")])
def test_a_read_back_interrupted_leaves_no_buffer_mapped(model, device, monkeypatch, spin, when):
    """KeyboardInterrupt (Ctrl-C) while a read-back waits, blocking or polling first, or right after its map is asked
    for, cancels the map: the next invoke submits (a mapped read-back buffer would abort the process in wgpu-native,
    as one interrupted as its map started did before 2026-12-07) and reads back LiteRT's CPU values."""
    import tflfuse.runtime.plan as plan_module

    monkeypatch.setattr(plan_module, "READBACK_SPIN_S", spin)
    interp = tflfuse.Interpreter(model_content=model, device=device)
    interp.allocate_tensors()
    xs = [_inputs(k)[0] for k in range(3)]
    got = [_run(interp, xs[0])]
    native = interp._plan(0)._native
    assert native is not None
    native._spins = True
    native.lib = _CountingPolls(native.lib, interrupt=True) if when == "waiting" else _InterruptAfterMap(native.lib)
    with pytest.raises(KeyboardInterrupt):
        _run(interp, xs[1])
    native.lib = native.lib._lib
    got.append(_run(interp, xs[2]))
    for g, r in zip(got, _litert(model, [xs[0], xs[2]])):
        np.testing.assert_allclose(g, r, **ACCUMULATION)


# ---- the shader translator's runtime checks ------------------------------------------------------------------

def test_trusted_and_checked_shaders_agree_with_litert(model, device, monkeypatch):
    """The default device compiles tflfuse's programs as trusted modules (no index clamps, no loop counters);
    ``shader_checks=True`` keeps wgpu's runtime checks. Every index of a correct kernel is in bounds, so both
    give the same bits, and both match LiteRT's CPU interpreter."""
    import tflfuse.runtime.device as device_module

    trusted = []
    make = device_module._trusted_module
    monkeypatch.setattr(device_module, "_trusted_module", lambda *a: trusted.append(a[2]) or make(*a))
    monkeypatch.delenv("TFLFUSE_SHADER_CHECKS", raising=False)
    xs = [_inputs(k)[0] for k in range(2)]
    got = {}
    for checks in (False, True):
        dev = tflfuse.Device(device.name, shader_checks=checks)
        assert dev.shader_checks is checks
        before = len(trusted)
        interp = tflfuse.Interpreter(model_content=model, device=dev)
        interp.allocate_tensors()
        got[checks] = [_run(interp, x) for x in xs]
        assert (len(trusted) > before) is not checks   # the trusted path compiled the programs, or was not used
    for g, c, r in zip(got[False], got[True], _litert(model, xs)):
        np.testing.assert_array_equal(g, c)
        np.testing.assert_allclose(g, r, **ACCUMULATION)   # 27-term dot products


@pytest.mark.parametrize("env, want", [("1", True), ("0", False), ("", None), (" Off ", False), ("TRUE", True)])
def test_shader_checks_from_the_environment(env, want, device, monkeypatch):
    """``TFLFUSE_SHADER_CHECKS`` where set; else on for a software adapter, off on a GPU."""
    monkeypatch.setenv("TFLFUSE_SHADER_CHECKS", env)
    want = device.is_software if want is None else want
    assert tflfuse.Device(device.name).shader_checks is want
    assert tflfuse.Device(device.name, shader_checks=not want).shader_checks is not want   # the argument wins


def test_shader_checks_must_be_a_bool():
    with pytest.raises(TypeError, match=r"shader_checks=.*True, False or None.*'yes'"):
        tflfuse.Device(shader_checks="yes")


def test_shader_checks_from_an_unclear_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("TFLFUSE_SHADER_CHECKS", "2")
    with pytest.raises(ValueError, match=r"TFLFUSE_SHADER_CHECKS='2': set it to 1 \(on\) or 0 \(off\)"):
        tflfuse.Device()


def test_shader_module_compiles_as_the_library_does():
    """Device.shader_module: trusted where trusted_shaders (shader_checks off, wgpu-native), else checked; either way
    a module a pipeline takes; invalid WGSL raises wgpu's error naming the label, and a source or label that is
    not a str raises TypeError before anything reaches wgpu."""
    source = """@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(1) fn main() { y[0] = 1.0; }"""
    for checks in (False, True):
        dev = tflfuse.Device(shader_checks=checks)
        assert dev.trusted_shaders is (not checks)   # wgpu-native here: it has the trusted entry point
        module = dev.shader_module(source, "one")
        dev.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        with pytest.raises(Exception, match="bad_wgsl"):
            dev.shader_module("fn main( {", "bad_wgsl")
        for bad in ((None, "x"), (b"fn", "x"), (5, "x"), (source, 7)):
            with pytest.raises(TypeError, match="WGSL text and a str label"):
                dev.shader_module(*bad)

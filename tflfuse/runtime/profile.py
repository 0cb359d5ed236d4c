"""GPU timing of a plan's dispatches from WebGPU timestamp queries: the whole pass (:func:`gpu_time_plan`,
:func:`pass_gpu_us`) or each dispatch (:func:`profile_plan`). For the benchmarks and the profiler; invoke() never
uses it. (Moved out of :mod:`tflfuse.runtime.plan`, which re-exports the names.)"""

from __future__ import annotations

import math
import numbers
import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .plan import ExecutionPlan

__all__ = ["MAX_COUNT", "MAX_WARM_MS", "SUSTAINED_REPS", "WARM_MS", "gpu_time_plan", "pass_gpu_us", "profile_plan",
           "profile_plan_in_sequence", "wall_seconds", "warm_up"]


#: Why timing repeats work inside one pass (``reps``): on an H200, one short pass between idle moments ran up to
#: 5x slower than the same dispatches run back to back, the GPU's clocks not yet those of sustained work.
SUSTAINED_REPS = 20

#: Milliseconds for which :func:`pass_gpu_us` and :func:`profile_plan` keep the GPU running the work they time,
#: untimed, before they time it (:func:`warm_up`). Measured on an H200 (Vulkan, driver 580.159.04, 2026-12-04,
#: ``nvidia-smi``): after about 4 s of host work with the GPU nearly idle (40 pipeline compiles) its SM clock had
#: fallen from 1980 to 345 MHz and a 26 us matrix product took 138 us; 200 runs back to back (28 ms) left it at
#: 345 MHz, 2000 runs (118 ms) brought it to 1980 MHz, and 0.2 s of idling afterwards did not lower it again.
WARM_MS = 200.0
#: The longest warm-up :func:`warm_up` takes, in milliseconds (one minute).
MAX_WARM_MS = 60_000.0


def wall_seconds(run, read, first: int, repeats: int = 10) -> float:
    """Median wall-clock seconds of ``run()`` plus ``read(first)`` (the read-back of one output), over
    ``repeats`` runs after one warm-up."""
    run()
    read(first)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        read(first)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _timed_pass(device, record, reps: int, stamps: _PassTimestamps) -> float:
    """GPU microseconds per run of ``record`` in one compute pass running it ``reps`` times back to back, timed
    with ``stamps`` (one pass's)."""
    encoder = device.device.create_command_encoder()
    cpass = encoder.begin_compute_pass(timestamp_writes=stamps.writes(0))
    for _ in range(reps):
        record(cpass)
    cpass.end()
    ((start, end),) = stamps.submit(encoder)
    return float(end - start) / 1e3 / reps   # WebGPU timestamps are nanoseconds


def _check_ms(ms) -> None:
    try:
        ok = not isinstance(ms, bool) and isinstance(ms, numbers.Real) and 0 <= float(ms) <= MAX_WARM_MS
    except (OverflowError, ValueError):   # an int past float's range
        ok = False
    if not ok:
        raise ValueError(f"warm-up milliseconds must be a number from 0 to {MAX_WARM_MS:g}, got {ms!r}")


#: The most ``repeats`` and ``reps`` a timing takes: each rep is recorded into one command buffer, so an
#: unbounded count would exhaust memory before the GPU ran anything.
MAX_COUNT = 10_000


def _check_counts(repeats, reps) -> tuple[int, int]:
    """``repeats`` and ``reps`` as Python ints (NumPy integers are taken; their own widths would overflow the
    sizes computed from them). Raises ``ValueError`` for a value that is not an int from 1 to
    :data:`MAX_COUNT`."""
    for name, value in (("repeats", repeats), ("reps", reps)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_COUNT:
            raise ValueError(f"{name} must be an int >= 1 and at most {MAX_COUNT}, got {value!r}")
    return int(repeats), int(reps)


def warm_up(device, record, ms: float = WARM_MS) -> int:
    """Keeps the GPU running ``record(cpass)`` back to back for ``ms`` milliseconds of wall time, untimed for
    the caller, so that its clocks are those of sustained work when timing starts (see :data:`WARM_MS`): in
    passes of 1, 2, 4, ... runs of ``record`` up to about 5 ms each (measured by the host's clock, so that
    neither a slow record nor an adapter's timestamps can stretch one far past ``ms``), the next recorded
    while the GPU runs the last, so that it idles only as long as a submit takes (or, where recording is
    slower than the GPU, as an invoke's own recording leaves it). Returns the passes run. Does nothing on a
    software adapter (a CPU has no such clocks to ramp) or where ``ms`` is 0. Raises ``ValueError`` for an
    ``ms`` that is not a number from 0 to :data:`MAX_WARM_MS`."""
    _check_ms(ms)
    if ms == 0 or device.is_software:
        return 0
    queue = device.device.queue
    sync = device.create_buffer(16, label="warm-up sync")
    reps = 1

    def one_pass():
        encoder = device.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        for _ in range(reps):
            record(cpass)
        cpass.end()
        return encoder.finish()

    end = time.perf_counter() + ms / 1e3
    queue.submit([one_pass()])
    passes = 1
    while time.perf_counter() < end:
        start = time.perf_counter()
        following = one_pass()               # recorded while the GPU runs the last pass
        queue.read_buffer(sync, 0, 4)        # a read-back waits for the work submitted before it
        queue.submit([following])
        passes += 1
        cycle = time.perf_counter() - start  # about one pass: the longer of its recording and the GPU's run
        if cycle < 0.0025 and reps < 2000:
            reps *= 2
        elif cycle > 0.01 and reps > 1:
            reps //= 2
    queue.read_buffer(sync, 0, 4)
    return passes


def gpu_time_plan(plan: ExecutionPlan, repeats: int = 20, reps: int = 1, warm_ms: float = WARM_MS) -> float:
    """Median GPU microseconds of the plan's dispatches recorded as :meth:`ExecutionPlan.run` records them
    (one compute pass), from timestamp queries at the pass's start and end: the GPU's share of an invoke,
    without the CPU's recording, submit and read-back. ``reps`` > 1 records the invoke that many times in
    the pass and divides (the GPU busy throughout; see :data:`SUSTAINED_REPS`), after :func:`warm_up` for
    ``warm_ms``. Raises ``RuntimeError`` where the device has no ``timestamp-query`` feature, ``ValueError``
    for ``repeats`` or ``reps`` outside 1 to :data:`MAX_COUNT` or a ``warm_ms`` :func:`warm_up` refuses."""
    return pass_gpu_us(plan.device, plan._record, repeats, reps, warm_ms)


def pass_gpu_us(device, record, repeats: int = 20, reps: int = 1, warm_ms: float = WARM_MS) -> float:
    """Median GPU microseconds of one compute pass whose commands ``record(cpass)`` writes, from timestamp
    queries at the pass's start and end (``repeats`` submits after one warm-up pass and :func:`warm_up` for
    ``warm_ms``); with ``reps`` > 1, per run of ``record`` in a pass that runs it ``reps`` times back to
    back. Raises ``RuntimeError`` where the device has no ``timestamp-query`` feature, ``ValueError`` for
    ``repeats`` or ``reps`` outside 1 to :data:`MAX_COUNT` or a ``warm_ms`` :func:`warm_up` refuses."""
    if "timestamp-query" not in device.features:
        raise RuntimeError(f"the adapter {device.name} has no timestamp-query feature")
    _check_ms(warm_ms)
    repeats, reps = _check_counts(repeats, reps)
    stamps = _PassTimestamps(device, 1)
    _timed_pass(device, record, reps, stamps)   # a warm-up: pipelines and buffers in place
    warm_up(device, record, warm_ms)
    return float(np.median([_timed_pass(device, record, reps, stamps) for _ in range(repeats)]))


def _ready_to_profile(plan: ExecutionPlan, repeats, reps, warm_ms) -> tuple[int, int] | None:
    """Checks the arguments of a per-dispatch timing (raising as :func:`profile_plan` says) and, where the plan has
    dispatches, runs :func:`warm_up`; returns ``repeats`` and ``reps`` as ints, or None for a plan without any."""
    dev = plan.device
    if "timestamp-query" not in dev.features:
        raise RuntimeError(f"the adapter {dev.name} has no timestamp-query feature")
    _check_ms(warm_ms)
    counts = _check_counts(repeats, reps)
    if not plan.steps:
        return None
    warm_up(dev, plan._record, warm_ms)
    return counts


#: Timestamps in one WebGPU query set, at most (the API's limit).
_MAX_QUERIES = 4096


class _PassTimestamps:
    """Start and end timestamps of ``passes`` compute passes recorded into one command encoder: query sets of at
    most :data:`_MAX_QUERIES` timestamps, resolved into one buffer at offsets aligned to WebGPU's 256 bytes."""

    def __init__(self, device, passes: int):
        wgpu = device._wgpu
        self.per_set = _MAX_QUERIES // 2   # passes per query set
        self.passes = passes
        counts = [min(self.per_set, passes - k) for k in range(0, passes, self.per_set)]
        self.sets = [device.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * c) for c in counts]
        self.counts = counts
        self.stride = -(-16 * counts[0] // 256) * 256   # bytes per set: the first set is the fullest
        self.resolve = device.device.create_buffer(size=self.stride * len(counts),
                                                   usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.queue = device.device.queue

    def writes(self, j: int) -> dict:
        """The ``timestamp_writes`` of pass ``j``."""
        qs, i = self.sets[j // self.per_set], j % self.per_set
        return {"query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1}

    def submit(self, encoder) -> np.ndarray:
        """Resolves the timestamps, submits ``encoder`` and returns them, int64 nanoseconds ``[passes, 2]`` (start,
        end): differences are taken in integers, since float64 rounds timestamps near 2**60 to 256 ns."""
        for k, (qs, c) in enumerate(zip(self.sets, self.counts)):
            encoder.resolve_query_set(qs, 0, 2 * c, self.resolve, self.stride * k)
        self.queue.submit([encoder.finish()])
        raw = np.frombuffer(self.queue.read_buffer(self.resolve, 0, self.stride * len(self.sets)), np.uint64)
        raw = raw.reshape(len(self.sets), self.stride // 8)[:, :2 * self.counts[0]].reshape(-1, 2)
        return raw[:self.passes].astype(np.int64)


def _dispatch_pass(encoder, stamps: _PassTimestamps, j: int, step, reps: int) -> None:
    """Records a compute pass running the plan's ``step`` (program, pipeline, bind group) ``reps`` times, its
    start and end written to the timestamps of pass ``j``."""
    prog, pipeline, bind_group = step
    cpass = encoder.begin_compute_pass(timestamp_writes=stamps.writes(j))
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, bind_group)
    for _ in range(reps):
        cpass.dispatch_workgroups(*prog.dispatch)
    cpass.end()


def profile_plan(plan: ExecutionPlan, repeats: int = 5, reps: int = 1, warm_ms: float = WARM_MS) -> list[dict]:
    """GPU time of each dispatch of a plan, from timestamp queries (one compute pass per dispatch, holding
    the dispatch ``reps`` times back to back: see :data:`SUSTAINED_REPS`), after the plan's invokes run back
    to back for ``warm_ms`` (:func:`warm_up`).

    Returns one dict per dispatch: ``op`` (op name), ``index`` (op index), ``program`` and ``us`` (median
    microseconds per dispatch over ``repeats`` runs); none for a plan without dispatches. Raises
    ``RuntimeError`` where the device has no ``timestamp-query`` feature, ``ValueError`` for ``repeats`` or
    ``reps`` outside 1 to :data:`MAX_COUNT` or a ``warm_ms`` :func:`warm_up` refuses.
    """
    counts = _ready_to_profile(plan, repeats, reps, warm_ms)
    if counts is None:
        return []
    repeats, reps = counts
    dev = plan.device
    stamps = _PassTimestamps(dev, len(plan.steps))
    samples = []
    for _ in range(repeats):
        encoder = dev.device.create_command_encoder()
        for i, step in enumerate(plan.steps):
            _dispatch_pass(encoder, stamps, i, step, reps)
        ticks = stamps.submit(encoder)
        samples.append((ticks[:, 1] - ticks[:, 0]) / 1e3 / reps)   # WebGPU timestamps are nanoseconds
    med = np.median(np.array(samples), axis=0)
    return [{"op": op.name, "index": op.index, "program": prog.name, "us": float(us)}
            for op, (prog, _, _), us in zip(plan.step_ops, plan.steps, med)]


def profile_plan_in_sequence(plan: ExecutionPlan, repeats: int = 5, reps: int = 1,
                             warm_ms: float = WARM_MS) -> list[dict]:
    """GPU time of each dispatch of a plan where it runs in the plan's order, after the dispatch before it
    (its inputs just written, the caches as the invoke leaves them), from timestamp queries: each dispatch in
    a compute pass of its own, the plan's passes ``reps`` times back to back in one command encoder (see
    :data:`SUSTAINED_REPS`), after the plan's invokes run back to back for ``warm_ms`` (:func:`warm_up`).
    :func:`profile_plan` times each dispatch alone instead, repeated in its own pass.

    Returns one dict per dispatch: ``op`` (op name), ``index`` (op index), ``program``, ``us`` (median
    microseconds from its pass's start to its end over the ``repeats * reps`` runs) and ``gap_us`` (median
    microseconds from the end of the pass before it, the plan's last in the invoke before, to its start; NaN for
    the first dispatch where ``reps`` is 1, none running before it in its encoder). Raises ``RuntimeError``
    where the device has no ``timestamp-query`` feature, ``ValueError`` for ``repeats`` or ``reps`` outside 1
    to :data:`MAX_COUNT` or a ``warm_ms`` :func:`warm_up` refuses.
    """
    counts = _ready_to_profile(plan, repeats, reps, warm_ms)
    if counts is None:
        return []
    repeats, reps = counts
    dev, n = plan.device, len(plan.steps)
    stamps = _PassTimestamps(dev, n * reps)   # pass r n + i: run r's dispatch i
    runs, gaps = [], []
    for _ in range(repeats):
        encoder = dev.device.create_command_encoder()
        for r in range(reps):
            for i, step in enumerate(plan.steps):
                _dispatch_pass(encoder, stamps, r * n + i, step, 1)
        ticks = stamps.submit(encoder)   # [n reps, 2] int64 nanoseconds
        runs.append(((ticks[:, 1] - ticks[:, 0]) / 1e3).reshape(reps, n))
        gap = np.full(reps * n, np.nan)
        gap[1:] = (ticks[1:, 0] - ticks[:-1, 1]) / 1e3
        gaps.append(gap.reshape(reps, n))
    us = np.median(np.concatenate(runs), axis=0)
    gaps = np.concatenate(gaps)
    gap_us = [float(np.median(g[~np.isnan(g)])) if (~np.isnan(g)).any() else math.nan for g in gaps.T]
    return [{"op": op.name, "index": op.index, "program": prog.name, "us": float(u), "gap_us": float(g)}
            for op, (prog, _, _), u, g in zip(plan.step_ops, plan.steps, us, gap_us)]

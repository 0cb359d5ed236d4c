"""GPU timing of a plan's dispatches from WebGPU timestamp queries: the whole pass (:func:`gpu_time_plan`,
:func:`pass_gpu_us`) or each dispatch (:func:`profile_plan`). For the benchmarks and the profiler; invoke() never
uses it. (Moved out of :mod:`tflfuse.runtime.plan`, which re-exports the names.)"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .plan import ExecutionPlan

__all__ = ["SUSTAINED_REPS", "gpu_time_plan", "pass_gpu_us", "profile_plan", "wall_seconds"]


#: Why timing repeats work inside one pass (``reps``): on an H200, one short pass between idle moments ran up to
#: 5x slower than the same dispatches run back to back, the GPU's clocks not yet those of sustained work.
SUSTAINED_REPS = 20


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


def gpu_time_plan(plan: ExecutionPlan, repeats: int = 20, reps: int = 1) -> float:
    """Median GPU microseconds of the plan's dispatches recorded as :meth:`ExecutionPlan.run` records them
    (one compute pass), from timestamp queries at the pass's start and end: the GPU's share of an invoke,
    without the CPU's recording, submit and read-back. ``reps`` > 1 records the invoke that many times in
    the pass and divides (the GPU busy throughout; see :data:`SUSTAINED_REPS`). Raises ``RuntimeError``
    where the device has no ``timestamp-query`` feature."""
    return pass_gpu_us(plan.device, plan._record, repeats, reps)


def pass_gpu_us(device, record, repeats: int = 20, reps: int = 1) -> float:
    """Median GPU microseconds of one compute pass whose commands ``record(cpass)`` writes, from timestamp
    queries at the pass's start and end (``repeats`` submits after one warm-up); with ``reps`` > 1, per run
    of ``record`` in a pass that runs it ``reps`` times back to back. Raises ``RuntimeError`` where the
    device has no ``timestamp-query`` feature."""
    if "timestamp-query" not in device.features:
        raise RuntimeError(f"the adapter {device.name} has no timestamp-query feature")
    wgpu = device._wgpu
    qs = device.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolve = device.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    samples = []
    for _ in range(repeats + 1):   # the first is a warm-up
        encoder = device.device.create_command_encoder()
        cpass = encoder.begin_compute_pass(timestamp_writes={
            "query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        for _ in range(reps):
            record(cpass)
        cpass.end()
        encoder.resolve_query_set(qs, 0, 2, resolve, 0)
        device.device.queue.submit([encoder.finish()])
        ticks = np.frombuffer(device.device.queue.read_buffer(resolve, 0, 16), np.uint64).astype(np.float64)
        samples.append((ticks[1] - ticks[0]) / 1e3 / reps)   # WebGPU timestamps are nanoseconds
    return float(np.median(samples[1:]))


def profile_plan(plan: ExecutionPlan, repeats: int = 5, reps: int = 1) -> list[dict]:
    """GPU time of each dispatch of a plan, from timestamp queries (one compute pass per dispatch, holding
    the dispatch ``reps`` times back to back: see :data:`SUSTAINED_REPS`).

    Returns one dict per dispatch: ``op`` (op name), ``index`` (op index), ``program`` and ``us`` (median
    microseconds per dispatch over ``repeats`` runs). Raises ``RuntimeError`` where the device has no
    ``timestamp-query`` feature.
    """
    dev = plan.device
    if "timestamp-query" not in dev.features:
        raise RuntimeError(f"the adapter {dev.name} has no timestamp-query feature")
    wgpu = dev._wgpu
    n = len(plan.steps)
    qs = dev.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
    resolve = dev.device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    samples = []
    for _ in range(repeats):
        encoder = dev.device.create_command_encoder()
        for i, (prog, pipeline, bind_group) in enumerate(plan.steps):
            cpass = encoder.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, bind_group)
            for _ in range(reps):
                cpass.dispatch_workgroups(*prog.dispatch)
            cpass.end()
        encoder.resolve_query_set(qs, 0, 2 * n, resolve, 0)
        dev.device.queue.submit([encoder.finish()])
        ticks = np.frombuffer(dev.device.queue.read_buffer(resolve, 0, 16 * n), np.uint64).astype(np.float64)
        samples.append((ticks[1::2] - ticks[0::2]) / 1e3 / reps)   # WebGPU timestamps are nanoseconds
    med = np.median(np.array(samples), axis=0)
    return [{"op": op.name, "index": op.index, "program": prog.name, "us": float(us)}
            for op, (prog, _, _), us in zip(plan.step_ops, plan.steps, med)]

"""A model's ExecutionPlan at a batch size, and its GPU time dispatch by dispatch: what
``benchmarks/dispatch_profile.py`` and ``benchmarks/half_math_ab.py`` time (no flags of their own)."""

from __future__ import annotations

import time

import numpy as np

import tflfuse


def at_batch(interp, batch: int, xs=None):
    """Resizes each input of ``interp`` (tflfuse's or LiteRT's Interpreter) to ``batch`` along axis 0 where it
    differs, then calls ``allocate_tensors``, then, with ``xs`` (arrays in input order), :func:`set_inputs`;
    returns ``interp``."""
    for d in interp.get_input_details():
        if d["shape"][0] != batch:
            interp.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
    interp.allocate_tensors()
    return interp if xs is None else set_inputs(interp, xs)


def set_inputs(interp, xs):
    """Sets each input of ``interp`` to the array of ``xs`` in the same place; returns ``interp``."""
    for d, x in zip(interp.get_input_details(), xs):
        interp.set_tensor(d["index"], x)
    return interp


def latency_us(interp, output: int, invokes: int) -> float:
    """The median wall-clock microseconds of ``invokes`` invokes, each with the read-back of ``output``."""
    times = []
    for _ in range(invokes):
        t0 = time.perf_counter()
        interp.invoke()
        interp.get_tensor(output)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def throughput_us(interp, output: int, invokes: int) -> float:
    """Wall-clock microseconds per invoke of ``invokes`` invokes back to back, then one read-back of ``output``."""
    t0 = time.perf_counter()
    for _ in range(invokes):
        interp.invoke()
    interp.get_tensor(output)
    return (time.perf_counter() - t0) / invokes * 1e6


def seeded_inputs(interp, seed: int = 0) -> list:
    """Uniform values in [-1, 1) of each input's shape and dtype, from ``seed``."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) for d in interp.get_input_details()]


def planned(data: bytes, batch: int, precision: str = "float32"):
    """An Interpreter of the model at ``batch`` with seeded inputs set and one invoke run, and its
    ExecutionPlan. Raises ``TypeError`` where the model does not run as one plan (a CPU fallback)."""
    from tflfuse.runtime.plan import ExecutionPlan

    interp = at_batch(tflfuse.Interpreter(model_content=data, precision=precision), batch)
    set_inputs(interp, seeded_inputs(interp)).invoke()
    plan = interp._plan(0)
    if not isinstance(plan, ExecutionPlan):
        raise TypeError(f"expected one ExecutionPlan, got {type(plan).__name__}")
    return interp, plan


def profile_plan_dispatches(plan, repeats: int, in_sequence: bool = True) -> dict:
    """The one-pass GPU time and each dispatch's GPU time (with its program's name, workgroup size and
    dispatch size) of ``plan``, alone (:func:`~tflfuse.runtime.profile.profile_plan`) and in the plan's order
    (:func:`~tflfuse.runtime.profile.profile_plan_in_sequence`: ``in_sequence_us`` and the ``gap_us`` before
    it; not with ``in_sequence`` False). Raises ``RuntimeError`` where the adapter has no timestamps."""
    from tflfuse.runtime.profile import SUSTAINED_REPS, gpu_time_plan, profile_plan, profile_plan_in_sequence

    one_pass = gpu_time_plan(plan, repeats=max(5, repeats), reps=SUSTAINED_REPS)
    rows = profile_plan(plan, repeats=repeats, reps=SUSTAINED_REPS)
    for r, (prog, _, _) in zip(rows, plan.steps):
        r["workgroup"] = list(prog.workgroup_size)
        r["dispatch"] = list(prog.dispatch)
        r["invocations"] = int(np.prod(prog.workgroup_size) * np.prod(prog.dispatch))
    result = {"one_pass_us": one_pass, "dispatches": rows, "sum_us": sum(r["us"] for r in rows)}
    if in_sequence:
        for r, s in zip(rows, profile_plan_in_sequence(plan, repeats=repeats, reps=SUSTAINED_REPS)):
            r["in_sequence_us"], r["gap_us"] = s["us"], s["gap_us"]
        result.update(in_sequence_us=sum(r["in_sequence_us"] for r in rows), gaps_us=sum(r["gap_us"] for r in rows))
    return result

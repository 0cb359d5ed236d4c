"""The main job end to end: annotated MobileNetV2 -> one fused op per bottleneck -> WebGPU, against Keras;
and the real face detector on WebGPU against LiteRT's CPU interpreter, on a real photo.

Tolerances:
- MobileNetV2 (float32 throughout): 53 layers of float32 sums in another order than TF's; the softmax
  output is at most 1, and the measured error is ~1e-6. atol 2e-5 on probabilities (and logits-free),
  rtol 1e-3 keeps a 10x margin while any wrong kernel (an error of 1e-2 or more) fails.
- face detector: LiteRT CPU runs the same float32 graph (fp16 weights dequantized to the same float32
  values); regressors reach ~100 (pixels of the 128 input), classificators are logits of magnitude ~10.
  Sums over up to 1,152 products in another order: atol 1e-5 of each output's scale, rtol 1e-4.
"""

import math

import numpy as np
import pytest

import tflfuse
from tflfuse import face_detection, zoo

from test_face_detection import _assert_on_face


@pytest.fixture(scope="module")
def mobilenet():
    import composites

    model = composites.mobilenet_v2(input_shape=(96, 96, 3), seed=0, batch_size=2)
    return model


def test_fused_mobilenet_v2_matches_keras_on_webgpu(device, mobilenet):
    import tensorflow as tf

    result = tflfuse.convert(mobilenet)
    assert result.report.fused("fused_bottleneck") == 17
    assert result.report.ok
    interp = tflfuse.Interpreter(model_content=result.tflite, device=device)
    interp.allocate_tensors()
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    assert list(inp["shape"]) == [2, 96, 96, 3]
    photo = np.concatenate([zoo.sample_photo((96, 96)), zoo.sample_photo((96, 96), name="chelsea")])
    interp.set_tensor(inp["index"], photo)
    interp.invoke()
    got = interp.get_tensor(out["index"])
    want = mobilenet(tf.constant(photo), training=False).numpy()
    assert got.shape == want.shape == (2, 1000)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-3)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # 17 fused bottlenecks (the stem conv folded into the first) + head conv, MEAN, FULLY_CONNECTED, SOFTMAX: one
    # dispatch each on a GPU (the tiled schedule; a split one adds a summing dispatch, a staged one three) and on the
    # software adapter (the blocked schedule; the first block's resident form): fewer than the 65 of the unfused
    # model either way.
    assert len(interp.model.op_names(0)) == 21
    assert (interp.dispatch_count == 21) if device.is_software else (21 <= interp.dispatch_count < 65)


def test_unfused_mobilenet_v2_needs_three_times_the_dispatches(device, mobilenet):
    plain = tflfuse.convert(mobilenet, annotations=False)
    assert plain.report.fused("fused_bottleneck") == 0
    interp = tflfuse.Interpreter(model_content=plain.tflite, device=device)
    interp.allocate_tensors()
    assert interp.dispatch_count == 65   # 35 CONV_2D, 17 DEPTHWISE_CONV_2D, 10 ADD, MEAN, FC, SOFTMAX


@pytest.fixture(scope="module")
def face_model():
    return zoo.fetch("face_detection_short_range")


def _outputs(interp, x):
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}


@pytest.mark.parametrize("source", ["astronaut", "noise"])
def test_face_detector_on_webgpu_matches_litert(device, face_model, source):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    if source == "astronaut":
        x = zoo.sample_photo((128, 128))
    else:
        x = np.random.default_rng(7).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    gpu = tflfuse.Interpreter(model_path=face_model, device=device)
    gpu.allocate_tensors()
    cpu = LiteRT(model_path=str(face_model))
    cpu.allocate_tensors()
    got, want = _outputs(gpu, x), _outputs(cpu, x)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape
        assert got[name].dtype == want[name].dtype == np.float32
        scale = float(np.abs(want[name]).max())
        np.testing.assert_allclose(got[name], want[name], atol=1e-5 * scale, rtol=1e-4, err_msg=name)
    if source == "astronaut":
        regs = next(v for v in got.values() if v.shape == (1, 896, 16))
        cls = next(v for v in got.values() if v.shape == (1, 896, 1))
        best = face_detection.best_detection(regs, cls)
        assert best.score > 0.5
        _assert_on_face(best)


def test_buffers_are_reused_by_tensor_lifetime(device, face_model):
    interp = tflfuse.Interpreter(model_path=face_model, device=device)
    interp.allocate_tensors()
    mem = interp._plan(0).memory_report()
    # 86 dispatches, each reading one or two live tensors: reuse keeps under a third of all tensors' bytes
    assert 0 < mem["activations"] < mem["all_tensors"] / 3
    assert mem["constants"] > 0


def test_per_dispatch_gpu_times_cover_every_dispatch(device, face_model, monkeypatch):
    from tflfuse.runtime.plan import profile_plan

    interp = tflfuse.Interpreter(model_path=face_model, device=device)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], zoo.sample_photo((128, 128)))
    if "timestamp-query" not in device.features:   # an adapter without timestamps: refused, naming the feature
        with pytest.raises(RuntimeError, match="no timestamp-query feature"):
            profile_plan(interp._plan(0), repeats=1)
        return
    rows = profile_plan(interp._plan(0), repeats=1)
    assert len(rows) == interp.dispatch_count
    # Durations, not their size: WebGPU lets an adapter quantize timestamps, so a short dispatch may read 0 us
    # (no assertion on timing here; performance is measured in benchmarks/).
    assert all(isinstance(r["us"], float) and math.isfinite(r["us"]) and r["us"] >= 0 for r in rows), rows
    assert {r["op"] for r in rows} <= set(interp.model.op_names(0))
    # sustained timing: each dispatch twice per pass, the whole invoke twice per pass; outputs unchanged
    from tflfuse.runtime.plan import gpu_time_plan

    out = interp.get_output_details()[0]["index"]
    interp.invoke()
    before = interp.get_tensor(out)
    twice = profile_plan(interp._plan(0), repeats=1, reps=2)
    assert [r["program"] for r in twice] == [r["program"] for r in rows]
    assert math.isfinite(gpu_time_plan(interp._plan(0), repeats=1, reps=2))
    # in the plan's order: the same dispatches, each with the gap before it; nothing runs before the first
    # dispatch of an encoder's first run, so with one run per encoder that gap is NaN, every other one a duration
    from tflfuse.runtime.profile import profile_plan_in_sequence

    for repeats, reps in ((1, 1), (1, np.uint8(2)), (np.int16(2), 1)):   # NumPy's narrow ints too
        seq = profile_plan_in_sequence(interp._plan(0), repeats=repeats, reps=reps)
        assert [r["program"] for r in seq] == [r["program"] for r in rows]
        assert all(math.isfinite(r["us"]) and r["us"] >= 0 for r in seq), seq
        assert all(math.isfinite(r["gap_us"]) for r in seq[1:]), seq
        assert math.isnan(seq[0]["gap_us"]) == (reps == 1), seq[0]
    # past WebGPU's 4096 timestamps per query set the passes take several sets: here 4 passes a set, so that
    # the face model's dispatches (and 3 runs of them) span many sets, the last one partly filled
    from tflfuse.runtime import profile

    monkeypatch.setattr(profile, "_MAX_QUERIES", 8)
    assert len(rows) % 4 and len(profile_plan(interp._plan(0), repeats=1, reps=np.uint8(200))) == len(rows)
    seq = profile_plan_in_sequence(interp._plan(0), repeats=1, reps=3)
    assert [r["program"] for r in seq] == [r["program"] for r in rows]
    assert all(r["us"] >= 0 and math.isfinite(r["gap_us"]) for r in seq), seq
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(out), before)


def test_timing_warm_up(device, face_model, monkeypatch):
    """The timings' warm-up (profile.warm_up): a warm-up time that is not a number from 0 to a minute is refused
    by every timing function before any work (a huge one would never end), as are repeats and runs per pass
    outside 1 to profile.MAX_COUNT (a huge count would fill memory with commands); on a GPU it runs the plan's
    invokes in passes (here forced on the software adapter, which otherwise skips it) and leaves the outputs
    as they were. No assertion on timing: performance is measured in benchmarks/."""
    from tflfuse.runtime import profile
    from tflfuse.runtime.profile import gpu_time_plan, pass_gpu_us, profile_plan, profile_plan_in_sequence, warm_up

    interp = tflfuse.Interpreter(model_path=face_model, device=device)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], zoo.sample_photo((128, 128)))
    plan = interp._plan(0)
    for bad in (float("inf"), float("nan"), -1.0, True, "200", 1e300, 10 ** 400):
        with pytest.raises(ValueError, match="warm-up milliseconds must be a number from 0 to 60000"):
            warm_up(device, plan._record, bad)
        if "timestamp-query" in device.features:
            for timing in (lambda: gpu_time_plan(plan, 1, warm_ms=bad), lambda: profile_plan(plan, 1, warm_ms=bad),
                           lambda: profile_plan_in_sequence(plan, 1, warm_ms=bad),
                           lambda: pass_gpu_us(device, plan._record, 1, warm_ms=bad)):
                with pytest.raises(ValueError, match="warm-up milliseconds"):
                    timing()
    if "timestamp-query" in device.features:
        for repeats, reps in ((0, 1), (1, 0), (1, -1), (1.5, 1), (1, profile.MAX_COUNT + 1), (10 ** 30, 1)):
            for timing in (lambda: gpu_time_plan(plan, repeats, reps), lambda: profile_plan(plan, repeats, reps),
                           lambda: profile_plan_in_sequence(plan, repeats, reps)):
                with pytest.raises(ValueError, match="must be an int >= 1"):
                    timing()
        from tflfuse.runtime.plan import op_plan

        empty = op_plan(device, "RESHAPE", [np.zeros((2, 128), np.float32)], {"new_shape": [1, 256]})
        assert not empty.steps and profile_plan(empty, 1) == []   # no dispatches: nothing to time
        assert profile_plan_in_sequence(empty, 1) == []
    passes = warm_up(device, plan._record, np.float64(5.0))   # NumPy numbers are taken
    assert passes == 0 if device.is_software else passes >= 1
    if "timestamp-query" not in device.features:
        return
    out = interp.get_output_details()[0]["index"]
    interp.invoke()
    before = interp.get_tensor(out)
    monkeypatch.setattr(type(device), "is_software", property(lambda self: False))
    assert warm_up(device, plan._record, 1) >= 1
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(out), before)

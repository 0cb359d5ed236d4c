"""The one helper every kernel test runs through: :func:`check_op`.

It converts a TensorFlow function with the stock ``tf.lite.TFLiteConverter`` (float32, no optimizations
unless asked), checks that the .tflite holds exactly the ops the test means to exercise, runs the file on
``tflfuse.Interpreter`` and on LiteRT's CPU interpreter, and compares shape, then dtype, then values with
LiteRT and with TensorFlow's own result of the function. Where LiteRT and TensorFlow disagree beyond the
tolerance, a float64 NumPy computation given by the test decides.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

import tflfuse


@dataclasses.dataclass
class OpResult:
    """What :func:`check_op` ran: the .tflite bytes, the inputs and each side's outputs."""

    model: bytes
    ops: list[str]
    inputs: list[np.ndarray]
    ours: list[np.ndarray]
    litert: list[np.ndarray]
    tf: list[np.ndarray]


def _litert_ops(model: bytes) -> list[str]:
    # Read before allocate_tensors(): afterwards XNNPACK replaces the ops it takes by one DELEGATE node.
    return [d["op_name"] for d in LiteRTInterpreter(model_content=model)._get_ops_details()]


def _run(interp, shapes: Sequence[tuple[int, ...]], inputs: Sequence[np.ndarray], resize: bool) -> list[np.ndarray]:
    details = {d["name"]: d["index"] for d in interp.get_input_details()}
    if resize:
        for i, x in enumerate(inputs):
            interp.resize_tensor_input(details[f"a{i}"], list(x.shape))
    interp.allocate_tensors()
    for i, x in enumerate(inputs):
        interp.set_tensor(details[f"a{i}"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol))


def check_op(tf_fn: Callable, input_shapes: Sequence[Sequence[int]], *, device: "tflfuse.Device",
             expect_ops: Sequence[str], atol: float, rtol: float, rng: np.random.Generator,
             const_inputs: Mapping[int, np.ndarray] | None = None,
             make_input: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray] | None = None,
             np_ref: Callable[..., np.ndarray | Sequence[np.ndarray]] | None = None,
             dynamic_batch: bool = False, fp16_weights: bool = False,
             edit: Callable[[bytes], bytes] | None = None, tf_ref: Callable | None = None,
             litert_unedited: bool = False, tf_tol: Mapping[str, float] | None = None,
             input_dtypes: Sequence | None = None, output_dtypes: Sequence | None = None) -> OpResult:
    """Converts ``tf_fn`` to .tflite, runs it on tflfuse and LiteRT, compares both with TensorFlow.

    Args:
      tf_fn: TF function of the op (``tf.nn.conv2d`` with a constant filter, ``tf.add``...). Its positional
        arguments are the runtime inputs, in order, with ``const_inputs`` spliced in at their positions.
      input_shapes: shapes of the runtime inputs (float32 unless ``input_dtypes``), e.g. ``[(1, 7, 7, 3)]``.
      device: the shared :class:`tflfuse.Device`.
      expect_ops: the ops the .tflite must hold, exactly (as a multiset), so that the test really runs
        those kernels (a fused activation shows as no separate activation op).
      atol, rtol: the tolerance of tflfuse's result against LiteRT's and TF's (and NumPy's).
      rng: the seeded generator for the inputs.
      const_inputs: argument position -> array passed to ``tf_fn`` as a ``tf.constant`` (a weight).
      make_input: ``(rng, shape) -> float32 array``; default standard normal.
      np_ref: float64 NumPy version of the op (arguments as ``tf_fn``'s), required only where LiteRT and TF
        disagree beyond the tolerance: it then decides, and tflfuse must match it.
      dynamic_batch: convert with a ``None`` batch dimension and resize both interpreters to the shapes.
      fp16_weights: convert with float16 weights (``Optimize.DEFAULT`` + ``supported_types=[tf.float16]``).
      edit: ``bytes -> bytes`` applied to the converted model (a model the converter never writes, such as
        SOFTMAX with ``beta != 1``); ``tf_ref`` then gives TF's result for the edited model.
      litert_unedited: LiteRT runs the model as converted, tflfuse the edited one: for an edit that means the
        same but that LiteRT's kernels refuse (a float CONV_2D without its zero bias).
      tf_tol: ``dict(atol=, rtol=)`` against TF and NumPy when it differs from LiteRT's (float16 weights).
      input_dtypes: NumPy dtypes of the runtime inputs (``np.int32``, ``np.bool_``...); default all float32.
        ``make_input`` then makes values of them.
      output_dtypes: the dtypes every side's outputs must have; default all float32. Outputs that are not
        floats (bool, int32, int64) must be equal, element for element (``atol`` and ``rtol`` must be 0).
    Returns:
      An :class:`OpResult`.
    """
    const_inputs = dict(const_inputs or {})
    make_input = make_input or (lambda g, s: g.standard_normal(s).astype(np.float32))
    tf_tol = dict(tf_tol or dict(atol=atol, rtol=rtol))
    n_args = len(input_shapes) + len(const_inputs)
    in_dtypes = [np.dtype(d) for d in (input_dtypes or [np.float32] * len(input_shapes))]
    assert len(in_dtypes) == len(input_shapes), (in_dtypes, input_shapes)

    def args_of(runtime, wrap):
        it = iter(runtime)
        return [wrap(const_inputs[p]) if p in const_inputs else next(it) for p in range(n_args)]

    def body(*runtime):
        return tf_fn(*args_of(runtime, tf.constant))

    signature = [tf.TensorSpec([None, *s[1:]] if dynamic_batch else list(s), tf.as_dtype(d), name=f"a{i}")
                 for i, (s, d) in enumerate(zip(input_shapes, in_dtypes))]
    fn = tf.function(body, input_signature=signature, autograph=False)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
    if fp16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    model = converter.convert()
    litert_model = model
    if edit is not None:
        model = edit(model)
        litert_model = litert_model if litert_unedited else model

    ops = _litert_ops(model)
    assert collections.Counter(ops) == collections.Counter(expect_ops), \
        f"the converted model holds {ops}, the test means to exercise {list(expect_ops)}"

    shapes = [tuple(s) for s in input_shapes]
    inputs = [np.array(make_input(rng, s), dtype=d, order="C") for s, d in zip(shapes, in_dtypes)]
    # cpu_fallback=False: every op runs on its WebGPU kernel (an op without one fails here, not on LiteRT's CPU)
    ours = _run(tflfuse.Interpreter(model_content=model, device=device, cpu_fallback=False), shapes, inputs,
                dynamic_batch)
    lite = _run(LiteRTInterpreter(model_content=litert_model), shapes, inputs, dynamic_batch)
    tf_out = (tf_ref or tf_fn)(*args_of([tf.constant(x) for x in inputs], tf.constant))
    tf_out = [np.asarray(t) for t in (tf_out if isinstance(tf_out, (list, tuple)) else [tf_out])]

    assert len(ours) == len(lite) == len(tf_out), (len(ours), len(lite), len(tf_out))
    out_dtypes = [np.dtype(d) for d in (output_dtypes or [np.float32] * len(ours))]
    assert len(out_dtypes) == len(ours), (out_dtypes, len(ours))
    for k, (o, l, t, d) in enumerate(zip(ours, lite, tf_out, out_dtypes)):
        assert o.shape == l.shape == t.shape, f"output {k}: shape {o.shape}, LiteRT {l.shape}, TF {t.shape}"
        assert o.dtype == l.dtype == t.dtype == d, \
            f"output {k}: dtype {o.dtype}, LiteRT {l.dtype}, TF {t.dtype}, expected {d}"
    for k, (o, l, t) in enumerate(zip(ours, lite, tf_out)):
        if o.dtype.kind != "f":   # bool and integer outputs: equal, element for element
            assert atol == rtol == 0, f"output {k} is {o.dtype}: compare it exactly (atol = rtol = 0)"
            np.testing.assert_array_equal(o, l, err_msg=f"output {k} vs LiteRT")
            np.testing.assert_array_equal(o, t, err_msg=f"output {k} vs TensorFlow")
            continue
        if _close(l, t, **tf_tol):
            np.testing.assert_allclose(o, l, atol=atol, rtol=rtol, err_msg=f"output {k} vs LiteRT")
            np.testing.assert_allclose(o, t, **tf_tol, err_msg=f"output {k} vs TensorFlow")
            continue
        diff = float(np.max(np.abs(l.astype(np.float64) - t)))
        assert np_ref is not None, (f"output {k}: LiteRT and TF differ by up to {diff:g}, beyond the "
                                    f"tolerance; give np_ref (float64) to decide")
        ref = np_ref(*args_of([x.astype(np.float64) for x in inputs], lambda c: np.asarray(c, np.float64)))
        ref = np.asarray(ref if not isinstance(ref, (list, tuple)) else ref[k])
        assert ref.shape == o.shape, f"output {k}: np_ref shape {ref.shape}, ours {o.shape}"
        np.testing.assert_allclose(o, ref, **tf_tol, err_msg=f"output {k} vs float64 NumPy "
                                                              f"(LiteRT and TF differ by {diff:g})")
    return OpResult(model, ops, inputs, ours, lite, tf_out)

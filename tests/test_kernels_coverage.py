"""Kernels that the models of benchmarks/coverage.py needed: REVERSE_V2 (Keras ``Bidirectional`` recurrent
layers) and int32 ADD/SUB/MUL/MAXIMUM/MINIMUM (index arithmetic, e.g. Keras ``Embedding``'s wrapping of negative
ids), each against LiteRT's CPU interpreter and TensorFlow through :func:`oplib.check_op`, over odd shapes,
size-1 dimensions, batch > 1 and broadcasting.

Tolerances: REVERSE_V2 moves data (EXACT); int32 arithmetic is exact and wraps as TFLite's (equal elements).
"""

import numpy as np
import pytest
import tensorflow as tf

from conftest import EXACT
from oplib import check_op
from tflfuse.kernels import KernelError, kernel_class
from tflfuse.kernels.base import TensorSpec


@pytest.mark.parametrize("shape, axis", [
    ((7,), [0]), ((3, 5), [1]), ((2, 7, 5), [1]), ((2, 7, 5), [-1]), ((1, 3, 1, 5), [1, 2, 3]),
    ((2, 3, 4, 5), [1, 2]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reverse_v2(shape, axis, dtype, device, rng):
    def make(g, s):
        return (g.integers(-1000, 1000, s) if dtype == np.int32 else g.standard_normal(s)).astype(dtype)

    check_op(lambda x: tf.reverse(x, axis), [shape], device=device, rng=rng, expect_ops=["REVERSE_V2"],
             input_dtypes=[dtype], output_dtypes=[dtype], make_input=make, **EXACT)


def test_reverse_v2_refuses_what_tflite_refuses():
    with pytest.raises(KernelError, match="REVERSE_V2.*twice"):
        kernel_class("REVERSE_V2")([TensorSpec((2, 3)), TensorSpec((2,), "int32")], {"axis": [1, -1]}).check()
    # LiteRT: "Non-contiguous `axes` not supported"
    with pytest.raises(KernelError, match="REVERSE_V2.*neighbouring"):
        kernel_class("REVERSE_V2")([TensorSpec((2, 3, 4)), TensorSpec((2,), "int32")], {"axis": [0, 2]}).check()


_INT_OPS = {"ADD": tf.add, "SUB": tf.subtract, "MUL": tf.multiply, "MAXIMUM": tf.maximum, "MINIMUM": tf.minimum}


@pytest.mark.parametrize("shapes", [[(3, 5), (3, 5)], [(2, 1, 7), (4, 1)], [(1, 16), ()], [(2, 3, 1, 5), (5,)]])
@pytest.mark.parametrize("op", sorted(_INT_OPS))
def test_int32_binary(op, shapes, device, rng):
    # values up to 2**20: MUL's products wrap past int32 as TFLite's and TensorFlow's do
    def make(g, s):
        return g.integers(-2 ** 20, 2 ** 20, s).astype(np.int32)

    check_op(_INT_OPS[op], shapes, device=device, rng=rng, expect_ops=[op], input_dtypes=[np.int32] * 2,
             output_dtypes=[np.int32], make_input=make, **EXACT)


def test_int32_add_of_a_constant(device, rng):
    """An int32 ADD of a runtime tensor and a constant scalar, in the index wrapping Keras ``Embedding`` writes."""
    check_op(lambda x, c: tf.where(x < 0, x + c, x), [(2, 9)], const_inputs={1: np.int32(97)}, device=device,
             rng=rng, expect_ops=["LESS", "ADD", "SELECT"], input_dtypes=[np.int32], output_dtypes=[np.int32],
             make_input=lambda g, s: g.integers(-97, 97, s).astype(np.int32), **EXACT)


def test_int32_binary_refuses_a_fused_activation():
    spec = TensorSpec((3,), "int32")
    with pytest.raises(KernelError, match="ADD.*fused activation RELU"):
        kernel_class("ADD")([spec, spec], {"fused_activation_function": "RELU"}).check()
    with pytest.raises(KernelError, match="DIV.*float32"):
        kernel_class("DIV")([spec, spec], {}).check()

"""DEQUANTIZE of int8 weights (per-tensor with a zero point, and per-channel), decoded once at load, feeding
a CONV_2D: against LiteRT's CPU interpreter on the same file and a float64 NumPy reference.

Tolerance: the dequantized weights are exact in float32 (small integers times a float32 scale); the
convolution sums 3 products per output, so float32 rounding is a few ULP: the ACCUMULATION tolerance.
"""

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter as LiteRT

import tflfuse
from conftest import ACCUMULATION
from tflite_builder import build, t

Q = np.array([[[[-128, 5, 127]]], [[[3, -7, 0]]]], np.int8)   # OHWI [2, 1, 1, 3]


def _model(scale, zero_point, dim):
    def edit(m):
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = list(scale), list(zero_point), dim
        m.subgraphs[0].tensors[1].quantization = q

    tensors = [t((1, 4, 5, 3)), t(Q.shape, type="INT8", data=Q), t(Q.shape),
               t((2,), data=np.array([0.5, -0.25], np.float32)), t((1, 4, 5, 2))]
    ops = [dict(op="DEQUANTIZE", inputs=[1], outputs=[2]),
           dict(op="CONV_2D", inputs=[0, 2, 3], outputs=[4],
                options=("Conv2DOptions", {"padding": schema.Padding.VALID, "strideW": 1, "strideH": 1}))]
    return build(tensors, ops, [0], [4], edit=edit)


@pytest.mark.parametrize("scale, zero_point, dim", [([0.05], [3], 0), ([0.1, 0.02], [0, 0], 0)],
                         ids=["per-tensor", "per-channel"])
def test_int8_weights_are_dequantized_as_litert_does(device, rng, scale, zero_point, dim):
    model = _model(scale, zero_point, dim)
    x = rng.standard_normal((1, 4, 5, 3)).astype(np.float32)
    ours = tflfuse.Interpreter(model_content=model, device=device)
    ours.allocate_tensors()
    assert "DEQUANTIZE" in ours.model.op_names(0) and ours.dispatch_count == 1   # folded at load
    ours.set_tensor(0, x)
    ours.invoke()
    ref = LiteRT(model_content=model)
    ref.allocate_tensors()
    ref.set_tensor(0, x)
    ref.invoke()
    got, want = ours.get_tensor(4), ref.get_tensor(4)
    s = np.asarray(scale, np.float64).reshape(-1, 1, 1, 1)
    w = (Q.astype(np.float64) - np.asarray(zero_point, np.float64).reshape(-1, 1, 1, 1)) * s
    numpy_ref = np.einsum("nhwc,ocij->nhwo", x.astype(np.float64), w.transpose(0, 3, 1, 2)) + [0.5, -0.25]
    assert got.shape == want.shape == (1, 4, 5, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **ACCUMULATION)
    np.testing.assert_allclose(got, numpy_ref, **ACCUMULATION)

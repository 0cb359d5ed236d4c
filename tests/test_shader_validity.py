"""Every shader valid: each key's WGSL, over a grid of shapes (test_shader's table plus the edge shapes of
the kernel tests), compiles with wgpu's WGSL front end and, run by :func:`tflfuse.shader.run_shader` from its
ShaderInfo alone (as another runtime would consume it), gives the interpreter's result for the same op.

The interpreter's path (:func:`tflfuse.runtime.plan.run_op`) builds buffers, bind groups and dispatches its
own way; both run the same WGSL, so the comparison checks the ShaderInfo's bindings, sizes, dispatch and
uniform layout, and the two results must be bit-identical.
"""

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels import kernel_class, supported_ops
from tflfuse.runtime.plan import run_op
from tflfuse.shader import run_shader

from test_shader import CASES, NO_SHADER

_B = (1, 8, 8, 4), (4, 24), (24,), (3, 3, 24), (24,), (24, 4), (4,)   # a small fused bottleneck


def _bottleneck(n, h, w, cin, t, cout):
    e = cin * t
    return [(n, h, w, cin)] + ([(cin, e), (e,)] if t > 1 else []) + [(3, 3, e), (e,), (e, cout), (cout,)]


# Edge shapes beyond test_shader's one case per key: odd sizes, stride 2 with SAME, 1xN and Nx1 filters,
# dilation, channel counts not divisible by 4, batch > 1, and a dispatch past 65,535 workgroups.
EXTRA = [
    ("fused_lstm", [(3, 7, 5), (5, 24), (6, 24), (24,), (3, 6), (3, 6)],
     {"return_sequences": True, "return_state": True, "initial_state": True}),
    ("fused_lstm", [(2, 7, 5), (5, 24), (6, 24), (24,)], {"go_backwards": True, "strategy": "stepwise"}),
    ("fused_gru", [(3, 7, 5), (5, 18), (6, 18), (2, 18)], {"return_sequences": True}),
    ("fused_gru", [(1, 7, 5), (5, 18), (6, 18), (18,), (1, 6)],
     {"reset_after": False, "initial_state": True, "return_state": True, "return_sequences": True,
      "strategy": "stepwise"}),
    ("UNIDIRECTIONAL_SEQUENCE_LSTM", [(2, 7, 5)] + [(6, 5)] * 4 + [(6, 6)] * 4 + [None] * 3 + [(6,)] * 4 + [None] * 8,
     {}),
    ("ELU", [(3, 5)], {}),
    ("GELU", [(3, 5)], {"approximate": False}),
    ("CONV_2D", [(2, 9, 11, 5), (7, 1, 3, 5), (7,)], {"padding": "SAME", "stride_h": 2, "stride_w": 2}),
    ("CONV_2D", [(1, 10, 9, 3), (4, 3, 1, 3), None], {"padding": "VALID", "dilation_h_factor": 2,
                                                      "fused_activation_function": "RELU"}),
    ("DEPTHWISE_CONV_2D", [(2, 9, 9, 5), (1, 3, 3, 5), (5,)], {"padding": "SAME", "stride_h": 2, "stride_w": 2,
                                                               "fused_activation_function": "RELU6"}),
    ("FULLY_CONNECTED", [(3, 7), (5, 7), None], {}),
    ("FULLY_CONNECTED", [(3, 7), (7, 5), (5,)], {"weights_layout": "IO"}),
    ("CONV_2D", [(2, 9, 11, 5), (3, 1, 5, 7), (7,)], {"padding": "SAME", "stride_h": 2, "filter_layout": "HWIO"}),
    ("CONV_2D", [(1, 6, 6, 4), (3, 3, 2, 6), None], {"padding": "VALID", "filter_layout": "HWIO"}),  # 2 groups
    ("MAX_POOL_2D", [(2, 9, 7, 5)], {"filter_height": 2, "filter_width": 3, "padding": "SAME", "stride_h": 2,
                                     "stride_w": 2}),
    ("AVERAGE_POOL_2D", [(1, 9, 9, 3)], {"filter_height": 3, "filter_width": 3, "padding": "SAME", "stride_h": 2,
                                         "stride_w": 2}),
    ("ADD", [(2, 1, 5, 3), (4, 1, 3)], {}),
    ("MEAN", [(2, 7, 5, 3), None], {"axis": [1, 2], "keep_dims": False}),
    ("SOFTMAX", [(2, 3, 1001)], {"beta": 1.0}),
    ("CONCATENATION", [(2, k + 1) for k in range(9)], {"axis": 1}),   # two dispatches of at most 7 inputs
    ("RESIZE_BILINEAR", [(2, 5, 7, 3), None], {"size": [3, 11], "align_corners": True}),
    ("TRANSPOSE_CONV", [None, (3, 4, 4, 5), (2, 5, 5, 5), None], {"output_shape": [2, 10, 10, 3],
                                                                  "padding": "SAME", "stride_h": 2, "stride_w": 2}),
    ("RELU", [(65535 * 64 + 129,)], {}),                              # spills into dispatch y
    ("fused_squeeze_excite", [(2, 9, 7, 8), (8, 12), (12,), (2, 9, 7, 12), (2, 9, 7, 12)],
     {"has_squeeze": False, "has_scaled": True, "has_addend": True}),   # one layer: the mean to the gate
    ("fused_squeeze_excite", [(1, 72, 63, 16), (16, 4), (4,), (4, 16), (16,), (1, 72, 63, 16)],
     {"has_addend": True, "pool_addend": True}),                      # partial sums of x + addend, as vec4s
    ("fused_bottleneck", _bottleneck(2, 9, 7, 5, 6, 5), {"expansion": 6, "residual": True}),
    ("fused_bottleneck", _bottleneck(1, 17, 16, 3, 1, 7), {"expansion": 1, "stride": 2}),
    ("fused_bottleneck", _bottleneck(1, 7, 7, 16, 6, 20), {"expansion": 6, "splits": 3, "chunk": 8}),
    ("fused_bottleneck", _bottleneck(1, 9, 9, 8, 6, 8), {"expansion": 6, "target": "cpu"}),   # blocked
]

GRID = [(key, c[0], c[1], c[2] if len(c) > 2 else ["float32"] * len(c[0])) for key, c in sorted(CASES.items())] + \
    [(key, shapes, attrs, ["float32"] * len(shapes)) for key, shapes, attrs in EXTRA]


def _inputs(key, shapes, dtypes, rng):
    arrays = []
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        if shape is None:
            arrays.append(None)
        elif dtype == "int32":
            arrays.append(rng.integers(0, shapes[0][0], shape).astype(np.int32))   # GATHER's indices
        elif dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays


def test_grid_covers_every_key_with_a_shader():
    assert {g[0] for g in GRID} == set(supported_ops()) - set(NO_SHADER)


@pytest.mark.parametrize("key, shapes, attrs, dtypes", GRID, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRID)])
def test_shader_runs_from_its_info_as_the_interpreter_runs_it(device, rng, key, shapes, attrs, dtypes):
    info = tflfuse.get_shader(key, shapes, attrs, dtypes)
    arrays = _inputs(key, shapes, dtypes, rng)
    static = kernel_class(key).static_inputs
    ours = run_shader(device, info, [a.astype(np.int32) if a is not None and a.dtype == bool else a  # bool: i32 0/1
                                     for a in arrays])
    theirs = run_op(device, key, [None if i in static else a for i, a in enumerate(arrays)], attrs,
                    constant=[False] * len(arrays))
    assert len(ours) == len(theirs) == len(info.output_shapes)
    for got, want, shape in zip(ours, theirs, info.output_shapes):
        assert got.shape == want.shape == tuple(shape)
        np.testing.assert_array_equal(got, want.astype(np.int32) if want.dtype == bool else want)

"""CAST to and from int8/uint8 (tflfuse.kernels.quant.cast) on the GPU adapter (cpu_fallback=False) against
LiteRT's builtin kernel (BUILTIN_WITHOUT_DEFAULT_DELEGATES) on one-op files built on LiteRT's schema: every
pair of int8/uint8 with float32, int32, int64, bool, int8 and uint8, over the edges (halves, the types' limits
and one past them, NaN, infinities, values past int32) and every int8/uint8 code (int64 inputs within int32,
which the runtime holds as int32). A CAST from int8/uint8 to int64 runs on LiteRT's CPU (the runtime sends int64
results to the CPU) and matches.

Tolerance: none; every element must equal LiteRT's.
"""

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels import KernelError
from test_quant_activations import _compare, _litert
from test_quant_models import _run
from tflite_builder import build, t

FLOATS = np.array([0.0, -0.0, 1.7, -1.7, 0.5, -0.5, 127.9, 128.5, -128.7, 200.5, -200.5, 255.9, 256.0, 300.0, 1e10,
                   -1e10, np.nan, np.inf, -np.inf, 2.5e9, -2.5e9, 1e-30], np.float32)
INTS = np.array([0, 1, -1, 127, 128, -128, -129, 255, 256, 300, -300, 65535, 2 ** 31 - 1, -2 ** 31], np.int64)
CODES = {"int8": np.arange(-128, 128, dtype=np.int8), "uint8": np.arange(256, dtype=np.uint8)}
NP = {"FLOAT32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_, "INT8": np.int8,
      "UINT8": np.uint8}


def _cast(src, dst, x, device):
    n = x.size
    data = build([t((n,), type=src), t((n,), type=dst)], [dict(op="CAST", inputs=[0], outputs=[1])], [0], [1])
    got = _compare(data, [x], device)[0]
    assert got.dtype == np.dtype(NP[dst])


@pytest.mark.parametrize("dst", ["INT8", "UINT8"])
@pytest.mark.parametrize("src", ["FLOAT32", "INT32", "INT64", "BOOL", "INT8", "UINT8"])
def test_cast_to_8_bits(device, src, dst):
    if src == "FLOAT32":
        x = FLOATS
    elif src == "BOOL":
        x = np.array([True, False, True], np.bool_)
    elif src in ("INT8", "UINT8"):
        x = CODES[src.lower()]
    else:
        info = np.iinfo(NP[src])
        x = np.clip(INTS, max(info.min, -2 ** 31), min(info.max, 2 ** 31 - 1)).astype(NP[src])
    _cast(src, dst, x, device)


@pytest.mark.parametrize("dst", ["FLOAT32", "INT32", "BOOL"])
@pytest.mark.parametrize("src", ["INT8", "UINT8"])
def test_cast_from_8_bits(device, src, dst):
    _cast(src, dst, CODES[src.lower()], device)



@pytest.mark.parametrize("src, dst, x", [("INT8", "INT64", CODES["int8"]), ("UINT8", "INT64", CODES["uint8"])])
def test_cast_to_int64_runs_on_litert(device, src, dst, x):
    # the runtime holds int64 as int32 and sends int64 results to LiteRT's CPU: refused on the GPU alone
    data = build([t((x.size,), type=src), t((x.size,), type=dst)], [dict(op="CAST", inputs=[0], outputs=[1])],
                 [0], [1])
    with pytest.raises(KernelError, match="CAST.*int64 arithmetic"):
        _run(tflfuse.Interpreter(model_content=data, device=device, cpu_fallback=False), [x])
    it = tflfuse.Interpreter(model_content=data, device=device)
    got, want = _run(it, [x])[0], _run(_litert(data), [x])[0]
    assert [name for _, name, _ in it.fallback_ops] == ["CAST"]
    np.testing.assert_array_equal(got, want)

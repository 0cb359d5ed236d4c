"""A deterministic sample of TFLite's fully-quantized op tests (``tests/optests/quant_grids.py``), so that the
harness behind ``benchmarks/op_tests.py --quantized`` keeps working: each sampled case is built as TF's op test
builds it, converted as TF's ``mlir_convert`` converts a ``fully_quantize`` case (int8 inside, float32 or uint8
at the ends), run on tflfuse with ``cpu_fallback=False`` and compared with LiteRT's CPU interpreter (builtin
kernels): it must be bit-exact (``benchmarks/OP_TESTS_INT8.md`` lists every case and the few that are not).
"""

import tflfuse  # noqa: F401,I001  (before TensorFlow: see tflfuse/_tfload.py)

import numpy as np
import pytest

from optests import builders, harness_int8, quant_grids

#: Family -> case names' ``index/io``: per family one case in each I/O form, chosen among the cases with ops
#: (not an identity the converter folds away), the larger shapes and the other attribute values where cheap.
SAMPLE = {
    "conv": ["0/float32", "143/uint8"], "depthwiseconv": ["21/float32", "140/uint8"],
    "fully_connected": ["7/float32", "12/uint8"], "transpose_conv": ["2/float32", "3/uint8"], "add": ["0/float32", "2/uint8"], "sub": ["3/float32", "0/uint8"],
    "mul": ["2/float32", "4/uint8"], "mean": ["0/float32", "60/uint8"], "avg_pool": ["86/float32", "127/uint8"],
    "max_pool": ["86/float32", "127/uint8"], "concat": ["13/float32", "107/uint8"], "pad": ["0/float32", "28/uint8"],
    "reshape": ["2/float32", "12/uint8"], "squeeze": ["2/float32", "20/uint8"], "softmax": ["0/float32", "13/uint8"],
    "tanh": ["4/float32", "5/uint8"], "leaky_relu": ["18/float32", "21/uint8"], "prelu": ["0/float32", "5/uint8"],
    "resize_bilinear": ["3/float32", "25/uint8"], "resize_nearest_neighbor": ["3/float32", "13/uint8"],
    "sigmoid": ["0/float32", "3/uint8"], "hardswish": ["4/float32", "5/uint8"],
}


def test_quant_grids_expand_as_tf():
    """Each set expands to the product of its lists' lengths, every point in both of TF's I/O forms, in TF's
    order; the sample names cases that exist."""
    assert set(SAMPLE) <= set(quant_grids.QUANT_FAMILIES)
    for name, family in quant_grids.QUANT_FAMILIES.items():
        points = sum(int(np.prod([len(v) for v in s.values()])) for s in family["sets"])
        cases = harness_int8.expand(name)
        assert len(cases) == 2 * points, name
        assert [c.name for c in cases[:2]] == [f"{name}/0/float32", f"{name}/0/uint8"]
        assert len({c.key for c in cases}) == len(cases), name
        assert family["builder"] in builders.BUILDERS, name
    assert len(harness_int8.expand("conv")) == 2 * 2 * 3 * 2 * 3 * 2 * 2   # conv.py's quantized set, two forms
    for name in (f"{f}/{s}" for f, ss in SAMPLE.items() for s in ss):
        assert harness_int8.find(name).name == name


def test_conversion_is_tfs():
    """A converted case is int8 inside with QUANTIZE/DEQUANTIZE at float32 ends, or uint8 at the ends."""
    from ai_edge_litert.interpreter import Interpreter
    for io, end in (("float32", np.float32), ("uint8", np.uint8)):
        case = harness_int8.find(f"add/0/{io}")
        graph = builders.build(case.spec, case.params, np.random.default_rng(case.seed()))
        model, status, error = harness_int8.convert(case, graph, cache=False)
        assert model is not None, (status, error)
        interp = Interpreter(model_content=model)
        assert [d["dtype"] for d in interp.get_input_details()] == [end, end]
        assert interp.get_output_details()[0]["dtype"] == end
        ops = [d["op_name"] for d in interp._get_ops_details()]
        assert "ADD" in ops and ("DEQUANTIZE" in ops) == (io == "float32")
        add = next(d for d in interp._get_ops_details() if d["op_name"] == "ADD")
        tensors = {t["index"]: t for t in interp.get_tensor_details()}
        assert tensors[add["outputs"][0]]["dtype"] == np.int8


def test_compare_counts_steps():
    """Differences are judged in steps of the output: 0 bit-exact, up to 1 (with float32's rounding) one step."""
    ref = [np.array([0.5, 0.25, -1.0], np.float32)]
    assert harness_int8.compare_steps([ref[0].copy()], ref, [0.25])[:2] == ("bit_exact", 0.0)
    one = [np.array([0.5, 0.5, -1.0], np.float32)]
    verdict, steps, msg = harness_int8.compare_steps(one, ref, [0.25])
    assert (verdict, steps) == ("one_step", 1.0) and "at [1]" in msg
    assert harness_int8.compare_steps([np.array([0.5, 0.75, -1.0], np.float32)], ref, [0.25])[:2] == ("wrong", 2.0)
    assert harness_int8.compare_steps([np.array([0.5, 0.2500001, -1.0], np.float32)], ref, [None])[0] == "wrong"
    u8 = [np.array([3, 200], np.uint8)]
    assert harness_int8.compare_steps([np.array([4, 200], np.uint8)], u8, [1.0])[:2] == ("one_step", 1.0)
    assert harness_int8.compare_steps([np.array([5, 200], np.uint8)], u8, [1.0])[0] == "wrong"
    assert harness_int8.compare_steps([u8[0].astype(np.int8)], u8, [1.0])[0] == "wrong"         # dtype
    assert harness_int8.compare_steps([u8[0][:1]], u8, [1.0])[0] == "wrong"                     # shape


@pytest.mark.parametrize("name", [f"{f}/{s}" for f, ss in SAMPLE.items() for s in ss])
def test_sampled_case_is_bit_exact(name, device):
    rec = harness_int8.run_case(harness_int8.find(name), device, cache=False)
    assert rec["status"] == "bit_exact", rec
    assert rec["ops"], rec     # the case ran ops (the converter did not fold it to an identity)

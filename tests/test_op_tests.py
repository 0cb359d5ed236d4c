"""A deterministic sample of TFLite's generated op tests (``tests/optests``), so that the harness behind
``benchmarks/op_tests.py`` keeps working: each sampled case is built as TF's op test builds it, converted by the
stock converter, run on tflfuse with ``cpu_fallback=False`` (every op on its WebGPU kernel) and must match LiteRT's
CPU interpreter within its family's tolerance (``harness.TOLERANCES``, one justification each).
"""

import tflfuse  # noqa: F401,I001  (before TensorFlow: see tflfuse/_tfload.py)

import numpy as np
import pytest

from optests import builders, grids, harness

#: Family -> case indices (TF's order within the family's grid): per family the first case tflfuse runs, the first
#: with int32 or bool data and the last (where the family has more than a few), among the cases that pass today
#: (benchmarks/OP_TESTS.md lists the others and why).
SAMPLE = {
    "conv": [0, 287], "depthwiseconv": [0, 291], "fully_connected": [0, 31], "batchmatmul": [0, 11],
    "transpose_conv": [0, 71], "add": [0, 1, 26], "sub": [0, 2, 27], "mul": [0, 1, 26], "div": [0, 2, 27],
    "pow": [0, 26], "floor_div": [0, 1, 19, 26], "floor_mod": [0, 1, 26], "squared_difference": [0, 1, 15, 26],
    "maximum": [0, 48], "minimum": [0, 48], "avg_pool": [42, 127], "max_pool": [42, 127], "l2_pool": [42, 127],
    "relu": [0], "relu6": [0], "elu": [0], "tanh": [0], "sigmoid": [0], "hardswish": [0], "leaky_relu": [0, 29],
    "prelu": [0], "softmax": [0, 13], "log_softmax": [0], "l2norm": [0, 71], "abs": [0], "neg": [0, 3],
    "floor": [0], "ceil": [0], "exp": [0], "sin": [0], "cos": [0], "log": [0], "sqrt": [0], "rsqrt": [0],
    "square": [0], "cast": [10], "mean": [0, 76, 327], "sum": [0, 76, 327], "reduce_prod": [0, 76, 327],
    "reduce_max": [0, 76, 327], "reduce_min": [0, 76, 327], "reduce_any": [0, 228, 327], "arg_max": [2, 23],
    "arg_min": [2, 23], "cumsum": [0, 71], "topk": [0, 6, 11], "equal": [0, 6, 11], "not_equal": [0, 6, 11],
    "less": [0, 10], "less_equal": [0, 10], "greater": [0, 10], "greater_equal": [0, 10], "logical_and": [0],
    "logical_or": [0], "logical_xor": [0], "where": [0, 2, 8, 27], "concat": [0, 2, 334], "reshape": [0, 32, 67],
    "pad": [0, 16, 29], "padv2": [0, 32, 107], "mirror_pad": [0], "slice": [0, 107], "strided_slice": [0, 340],
    "strided_slice_1d_exhaustive": [1, 399], "transpose": [0, 20, 21], "gather": [0, 111], "gather_nd": [0, 39],
    "scatter_nd": [0], "resize_bilinear": [0, 39], "resize_nearest_neighbor": [0, 15], "split": [0, 151],
    "splitv": [2, 223], "pack": [0, 216, 245], "unpack": [0, 35], "squeeze": [0, 60], "expand_dims": [0, 12, 23],
    "tile": [0, 19], "broadcast_to": [0, 16, 37], "space_to_batch_nd": [12, 159], "batch_to_space_nd": [0, 48, 75],
    "gelu": [0, 15], "relu1": [3], "round": [4], "sign": [4], "depth_to_space": [0, 7], "space_to_depth": [3, 5],
    "reverse_v2": [0, 18, 35], "shape": [0, 11],
}


def test_grids_expand_as_tf():
    """Each set expands to the product of its lists' lengths (make_zip_of_tests' cartesian product), in order,
    and every family named by the sample exists."""
    assert set(SAMPLE) <= set(grids.FAMILIES)
    for name, family in grids.FAMILIES.items():
        expected = sum(int(np.prod([len(v) for v in s.values()])) for s in family["sets"])
        cases = harness.expand(name)
        assert len(cases) == expected, name
        assert [c.index for c in cases] == list(range(expected))
        # equal parameters give equal keys (TF's grids repeat a few: maximum.py's shape list, unused axes)
        assert all((a.key == b.key) == (a.params == b.params) for a, b in zip(cases, cases[1:])), name
    conv = harness.expand("conv")
    assert len(conv) == 2 * 3 * 2 * 3 * 2 * 2 * 2     # conv.py's float set
    assert conv[0].params["input_shape"] == [1, 3, 4, 3] and conv[-1].params["channel_multiplier"] == 2


def test_inputs_drawn_as_tf():
    """create_tensor_data's ranges: floats in [lo, hi), ints in [lo, hi], bools both; seeded per case."""
    rng = np.random.default_rng(0)
    f = builders.create_tensor_data(rng, "float32", [1000], -1, 1)
    i = builders.create_tensor_data(rng, "int32", [1000], -1, 1)
    b = builders.create_tensor_data(rng, "bool", [1000])
    assert f.dtype == np.float32 and f.min() >= -1 and f.max() < 1
    assert i.dtype == np.int32 and set(np.unique(i)) == {-1, 0, 1}
    assert b.dtype == np.bool_ and b.any() and not b.all()
    case = harness.expand("add")[0]
    g1 = builders.build(case.spec, case.params, np.random.default_rng(case.seed()))
    g2 = builders.build(case.spec, case.params, np.random.default_rng(case.seed()))
    assert all(np.array_equal(a.value, b.value) for a, b in zip(g1.inputs, g2.inputs))


def test_compare_judges_shape_dtype_values():
    """The comparison the harness classifies by: shape, then dtype, then values within the tolerance class."""
    ref = [np.array([1.0, -2.0, np.nan, np.inf], np.float32)]
    assert harness.compare([ref[0].copy()], ref, "exact")[0]
    near = np.array([1.0 + 2 ** -22, -2.0, np.nan, np.inf], np.float32)
    assert not harness.compare([near], ref, "exact")[0]
    assert harness.compare([near], ref, "elementwise")[0]
    assert not harness.compare([np.array([1.0, -2.0, 0.0, np.inf], np.float32)], ref, "elementwise")[0]   # NaN
    assert not harness.compare([np.array([1.0, -2.0, np.nan, -np.inf], np.float32)], ref, "elementwise")[0]
    assert not harness.compare([ref[0][:3]], ref, "exact")[0]                               # shape
    assert not harness.compare([ref[0].astype(np.float64)], ref, "exact")[0]                # dtype
    assert not harness.compare([np.array([1, 2], np.int32)], [np.array([1, 3], np.int32)], "accumulation")[0]
    ok, err, _ = harness.compare([np.array([100.0 + 1e-3], np.float32)], [np.array([100.0], np.float32)],
                                 "accumulation")
    assert ok and err == pytest.approx(1e-3, rel=1e-3)   # 1e-5 of the output's magnitude (100) is 1e-3


@pytest.mark.parametrize("name", [f"{f}/{i}" for f, idx in SAMPLE.items() for i in idx])
def test_sampled_case_passes(name, device):
    family, index = name.split("/")
    case = harness.expand(family)[int(index)]
    rec = harness.run_case(case, device, cache=False)
    assert rec["status"] == "pass", rec


def test_builder_faults_are_not_counted_as_tf_failures(monkeypatch, device):
    """A Python error in a builder (here or while TF traces its body) is this harness's fault: ``harness_error``,
    never hidden among the cases TF rejects (``tf_invalid``), which a ValueError of TF's stays."""
    case = harness.expand("relu")[0]

    def raising(error):
        def body(x):
            raise error
        return lambda c: (c.arg(c.p["input_shape"], "float32"), body)[1]

    monkeypatch.setitem(builders.BUILDERS, "unary", lambda c: c.missing_attribute)
    assert harness.run_case(case, device, cache=False)["status"] == "harness_error"
    monkeypatch.setitem(builders.BUILDERS, "unary", raising(KeyError("axis")))
    assert harness.run_case(case, device, cache=False)["status"] == "harness_error"
    monkeypatch.setitem(builders.BUILDERS, "unary", raising(ValueError("Shape must be rank 4 but is rank 0")))
    assert harness.run_case(case, device, cache=False)["status"] == "tf_invalid"

"""``precision="float16"``: float tensors stored as float16 on the GPU, arithmetic in float32
(:mod:`tflfuse.kernels.half`).

Reference for every kernel: its float32 result on the same inputs already rounded to float16 by NumPy (the
float32 kernels are checked against TF and LiteRT in the kernel tests). A float16 plan reads the same values,
computes the same float32 sums and rounds once, at the store, so each output must be a float16 value within one
float16 ulp of the float32 result: ``|got - want| <= 2**-10 * max(|want|, 2**-14)``; except a fused op that keeps
tensors of its own in f16 (the fused bottleneck's expanded tensor), whose bound its own tests derive. One ulp, not half: WGSL
lets a conversion to f16 round to either neighbour; 2**-14 is float16's smallest normal, below which the spacing
is fixed at 2**-24. Whole models against LiteRT CPU are in test_real_models.py (``rel16``).
"""

import types
import warnings

import numpy as np
import pytest

import tflfuse
from tflfuse.kernels import kernel_class
from tflfuse.kernels.base import MAX_WORKGROUPS_PER_DIM, Binding, KernelError, Program
from tflfuse.kernels.half import half_storage
from tflfuse.runtime.plan import ExecutionPlan, lower, op_plan, run_op
from tflfuse.shader import ShaderInfo, get_shader, run_shader

from test_shader_validity import GRID, _inputs

_ULP_1 = 2.0 ** -10
_MIN_NORMAL = 2.0 ** -14


def _as_half(a):
    return a.astype(np.float16).astype(np.float32) if a is not None and a.dtype == np.float32 else a


@pytest.mark.parametrize("key, shapes, attrs, dtypes", GRID, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRID)])
def test_every_kernel_stores_float16(device, rng, key, shapes, attrs, dtypes):
    arrays = [_as_half(a) for a in _inputs(key, shapes, dtypes, rng)]
    static = kernel_class(key).static_inputs
    ins = [None if i in static else a for i, a in enumerate(arrays)]
    want = run_op(device, key, ins, attrs)
    got = run_op(device, key, ins, attrs, precision="float16")
    # the same shader run from its ShaderInfo alone, as another runtime would: bit-identical
    info = get_shader(key, shapes, attrs, dtypes, precision="float16")
    for p in info.programs:
        for b in p.bindings:
            assert b["type"] != "f32" or b["role"][0] == "scratch"   # every float tensor is bound as f16
            assert f"{b['name']}: array<{b['type']}>" in p.wgsl
    # a kernel that keeps tensors of its own in f16 scratch buffers (Program.half_scratch) rounds them too, not
    # only at the store: its bound is derived stage by stage in its own tests (test_bottleneck.py,
    # test_float16_block_rounds_its_tensors_to_float16); here its outputs are checked as stored float16
    rounds_inside = any(b["role"][0] == "scratch" and "f16" in b["type"] for p in info.programs for b in p.bindings)
    shader_run = run_shader(device, info, [a.astype(np.int32) if a is not None and a.dtype == bool else a
                                           for a in arrays])   # a bool tensor is bound as i32 0/1
    assert len(got) == len(want) == len(shader_run)
    for g, w, s in zip(got, want, shader_run):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, s)
        if w.dtype != np.float32:
            np.testing.assert_array_equal(g, w)
            continue
        np.testing.assert_array_equal(g, _as_half(g))   # stored as float16
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        if rounds_inside:
            continue
        finite = np.isfinite(w)
        err = np.abs(g[finite].astype(np.float64) - w[finite])
        bound = _ULP_1 * np.maximum(np.abs(w[finite]), _MIN_NORMAL)
        assert (err <= bound).all(), f"{key}: worst {float((err / bound).max()):.3g} ulp of float16"


def test_odd_empty_and_out_of_range_tensors(device):
    # 15 values (an odd count: the upload is padded to 4 bytes), and float16's range: past 65504 is inf
    x = np.array([[0.1, -0.2, 3.0, 65504.0, 70000.0], [-70000.0, 1e-8, -1e-8, 2.0 ** -24, 0.0],
                  [np.inf, -np.inf, 0.5, 1.0, -1.0]], np.float32)
    (got,) = run_op(device, "RELU", [x], precision="float16")
    with np.errstate(over="ignore"):
        want = np.maximum(x.astype(np.float16), np.float16(0)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    (empty,) = run_op(device, "RELU", [np.zeros((0, 3), np.float32)], precision="float16")
    assert empty.shape == (0, 3) and empty.dtype == np.float32


def test_float16_plan_halves_the_gpu_memory(device):
    from tflfuse import zoo

    path = zoo.fetch("face_detection_short_range")
    reports = {}
    for precision in ("float32", "float16"):
        interp = tflfuse.Interpreter(model_path=path, device=device, precision=precision)
        interp.allocate_tensors()
        reports[precision] = interp._plan(0).memory_report()
    full, half = reports["float32"], reports["float16"]
    assert half["constants"] <= full["constants"] / 2 + 4 * 256   # each weight padded to 4 bytes at most
    # each buffer rounded up to 16 bytes, and the float32 buffer that the input is uploaded into (rounded to
    # float16 on the GPU: plan.HALF_INPUTS_ON_GPU)
    upload = 4 * int(np.prod(interp.get_input_details()[0]["shape"]))
    assert half["activations"] <= full["activations"] / 2 + 16 * 64 + upload


def test_bad_precision_and_missing_feature(device):
    from tflfuse import zoo

    path = zoo.fetch("face_detection_short_range")
    with pytest.raises(ValueError, match=r"precision must be one of \['float32', 'float16'\], got 'bfloat16'"):
        tflfuse.Interpreter(model_path=path, precision="bfloat16")
    with pytest.raises(ValueError, match="precision must be one of"):
        get_shader("RELU", [[4]], precision="half")
    graph = lower(tflfuse.model.Model.from_path(path))
    no_f16 = types.SimpleNamespace(features=frozenset({"timestamp-query"}), name="an adapter without f16")
    with pytest.raises(ValueError, match="needs the WebGPU feature 'shader-f16'.*an adapter without f16.*float32"):
        ExecutionPlan(graph, no_f16, precision="float16")


def test_rewrite_refuses_a_float_binding_it_cannot_follow():
    binds = (Binding("x", ("input", 0), "read", "f32", 64), Binding("y", ("output", 0), "read_write", "f32", 64))
    source = ("@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
              "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n"
              "@compute @workgroup_size(1) fn main() { y[0] = f32(arrayLength(&x)); }\n")
    with pytest.raises(KernelError, match=r"COUNT \(binding 'x'\).*index it"):
        half_storage(Program("COUNT", source, (1, 1, 1), (1, 1, 1), binds))


def test_rewrite_ignores_comments_and_refuses_an_undeclared_binding(device):
    binds = (Binding("x", ("input", 0), "read", "f32", 16), Binding("y", ("output", 0), "read_write", "f32", 16))
    body = ("@compute @workgroup_size(4) fn main(@builtin(local_invocation_index) i: u32) {\n"
            "  // y is x squared\n  y[i] = x[i] * x[i]; /* and x stays */\n}\n")
    declared = ("@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
                "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n")
    prog = half_storage(Program("SQUARE_DEMO", declared + body, (4, 1, 1), (1, 1, 1), binds))
    info = ShaderInfo("SQUARE_DEMO", prog.source, "main", (4, 1, 1), (1, 1, 1),
                      tuple({"binding": i, "role": list(b.role), "type": b.elem_type, "size": b.size}
                            for i, b in enumerate(prog.bindings)), (), ((4,),))
    x = np.array([0.5, -3.0, 300.0, 1e-3], np.float32)
    (got,) = run_shader(device, info, [x])
    with np.errstate(over="ignore"):   # 300 squared is past float16's 65504: inf
        want = (x.astype(np.float16).astype(np.float32) ** 2).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(KernelError, match=r"SQUARE_DEMO \(binding 'x'\): not declared once as array<f32>"):
        half_storage(Program("SQUARE_DEMO", declared.replace("x: array<f32>", "x: array<u32>") + body, (4, 1, 1),
                             (1, 1, 1), binds))


def test_rewrite_keeps_a_read_converted_to_f16_as_f16(device):
    """In a HalfMathProgram's float16 source, ``f16(x[i])`` reads the stored f16 value as it is (no round trip
    through f32), while any other read of ``x`` is converted to f32; the result is the same either way (f16
    values convert exactly), checked against NumPy: ``y = 3 x + x`` of float16 inputs, the product taken in f16
    (exact for these values: 3 x needs at most one more bit than x) and rounded once to f16 at the store."""
    from tflfuse.kernels.half import with_half_math

    binds = (Binding("x", ("input", 0), "read", "f32", 16), Binding("y", ("output", 0), "read_write", "f32", 16))
    declared = ("@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
                "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n")
    main = "@compute @workgroup_size(4) fn main(@builtin(local_invocation_index) i: u32) {{\n  {}\n}}\n"
    prog = with_half_math(Program("TIMES_FOUR", declared + main.format("y[i] = x[i] * 3.0 + x[i];"), (4, 1, 1),
                                  (1, 1, 1), binds),
                          declared + main.format("y[i] = f32(f16(x[i]) * f16(3.0)) + x[i];"))
    half = half_storage(prog)
    assert "f32(f16(x[i]) * f16(3.0)) + f32(x[i])" in half.source
    info = ShaderInfo("TIMES_FOUR", half.source, "main", (4, 1, 1), (1, 1, 1),
                      tuple({"binding": i, "role": list(b.role), "type": b.elem_type, "size": b.size}
                            for i, b in enumerate(half.bindings)), (), ((4,),))
    x = np.array([0.5, -3.0, 1024.0, 1e-3], np.float32)
    (got,) = run_shader(device, info, [x])
    x16 = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(got, (4 * x16).astype(np.float16))


#: Number literals a kernel may store (float32 WGSL, as written) and the float32 values they stand for: past f16's
#: range, rounding to its largest value, subnormal, to zero, with conversions and brackets around them.
LITERAL_STORES = [("1e5f", 1e5), ("-3.4028234663852886e+38f", -3.4028234663852886e38), ("65519.0f", 65519.0),
                  ("65520.0", 65520.0), ("(3e-8f)", 3e-8), ("f32(-1e-9)", -1e-9), ("0", 0.0), ("f32(-0.0)", -0.0),
                  ("-(7e4)", -7e4), ("- f32(-1e5f)", 1e5)]


def literal_stores_program() -> Program:
    """A program storing :data:`LITERAL_STORES` and then ``x[0]`` into ``y`` (f32), and two literals splat into
    ``v`` (``vec4<f32>``): as a float16 plan runs it (:func:`half_storage`)."""
    binds = (Binding("x", ("input", 0), "read", "f32", 4),
             Binding("y", ("output", 0), "read_write", "f32", 4 * len(LITERAL_STORES) + 4),
             Binding("v", ("output", 1), "read_write", "vec4<f32>", 32))
    stores = "".join(f"  y[{i}] = {text};\n" for i, (text, _) in enumerate(LITERAL_STORES))
    source = ("@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
              "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n"
              "@group(0) @binding(2) var<storage, read_write> v: array<vec4<f32>>;\n"
              f"@compute @workgroup_size(1) fn main() {{\n{stores}  y[{len(LITERAL_STORES)}] = x[0];\n"
              "  v[0] = vec4<f32>(-1e5);\n  v[1] = vec4<f32>(3e-8f);\n}\n")
    return half_storage(Program("LITERALS", source, (1, 1, 1), (1, 1, 1), binds))


def test_stored_literals_hold_their_float16_rounding(device):
    # a literal stored in an f16 binding is a constant expression, which WGSL must hold within f16's range (a
    # shader-creation error in Tint past it: test_kernels.py compiles this one there): the float16 plan stores
    # np.float16 of the float32 value, written exactly, an infinity made at run time
    prog = literal_stores_program()
    assert "f16(1e5" not in prog.source and "f32_from_bits(" in prog.source
    info = ShaderInfo("LITERALS", prog.source, "main", (1, 1, 1), (1, 1, 1),
                      tuple({"binding": i, "role": list(b.role), "type": b.elem_type, "size": b.size}
                            for i, b in enumerate(prog.bindings)), (), ((len(LITERAL_STORES) + 1,), (8,)))
    x = np.array([70000.0], np.float32)
    y, v = run_shader(device, info, [x])
    with np.errstate(over="ignore"):
        want_y = np.array([value for _, value in LITERAL_STORES] + [70000.0], np.float32).astype(np.float16)
        want_v = np.repeat(np.array([-1e5, 3e-8], np.float32).astype(np.float16), 4)
    np.testing.assert_array_equal(y.astype(np.float16).view(np.uint16), want_y.view(np.uint16))   # -0 too
    np.testing.assert_array_equal(v.astype(np.float16).view(np.uint16), want_v.view(np.uint16))


def test_half_math_forms_switches_and_restores():
    """half_math_forms: the named forms on and the others off inside the block, every switch as it was after it
    (also after an exception), and an unknown name refused before anything changes."""
    from tflfuse.kernels import conv
    from tflfuse.kernels.fused import resident
    from tflfuse.kernels.half import half_math_forms

    def switches():
        return resident.RESIDENT_HALF_MATH, conv.DEPTHWISE_HALF_MATH, conv.CONV_HALF_MATH

    before = switches()
    with half_math_forms(["conv", "resident"]):
        assert switches() == (True, False, True)
    assert switches() == before
    with pytest.raises(RuntimeError, match="inside"):
        with half_math_forms(["depthwise"]):
            assert switches() == (False, True, False)
            raise RuntimeError("inside")
    assert switches() == before
    with pytest.raises(ValueError, match=r"unknown f16-arithmetic forms \['convs'\]; the forms are"):
        with half_math_forms(["convs"]):
            pass
    assert switches() == before


#: Constants whose float16 rounding (np.float16 of the float32 value, to nearest even) is an edge of float16:
#: +-FLT_MAX and +-1e5 overflow to +-inf, 65504 is the largest finite value, 65519 rounds down to it and 65520 up
#: to inf; 1e-7 and 3e-8 round to subnormals (2 and 1 times 2**-24), -1e-9 to -0; inf and NaN stay as they are.
F16_EDGE_FILLS = [-3.4028234663852886e38, 3.4028234663852886e38, 1e5, -1e5, 65504.0, 65519.0, 65520.0, 1e-7, 3e-8,
                  -1e-9, -np.inf, np.nan]


@pytest.mark.parametrize("fill", F16_EDGE_FILLS, ids=repr)
def test_pad_constant_is_held_as_its_float16_rounding(device, rng, fill):
    """PADV2 in a float16 plan holds its constant as np.float16 of the float32 value (the rounding LiteRT's GPU
    delegate's f16 would hold; a shader-creation error in Tint where written as an f16 constant past 65504) and
    the input as the plan rounded it on upload: against np.float16 of LiteRT CPU's float32 result, bit for bit
    (NaN as NaN). LiteRT's result is first checked against NumPy's float64 np.pad: padding does no arithmetic."""
    from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter

    from tflite_builder import build, t

    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    pads = np.array([[0, 1], [2, 0], [1, 1]], np.int32)
    model = build([t((2, 3, 4)), t((3, 2), type="INT32", data=pads), t((1,), data=np.array([fill], np.float32)),
                   t((3, 5, 6))], [dict(op="PADV2", inputs=[0, 1, 2], outputs=[3])], [0], [3])
    outs = []
    for interp in (LiteRTInterpreter(model_content=model),
                   tflfuse.Interpreter(model_content=model, device=device, precision="float16", cpu_fallback=False)):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    lite, got = outs
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(lite, np.pad(x.astype(np.float64), pads, constant_values=fill)
                                      .astype(np.float32))
        want = lite.astype(np.float16)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    held = got[~np.isnan(got)].astype(np.float16)
    np.testing.assert_array_equal(held.astype(np.float32), got[~np.isnan(got)])   # a float16 value
    np.testing.assert_array_equal(held.view(np.uint16), want[~np.isnan(want)].view(np.uint16))   # and its sign


def test_every_float16_value_reads_back_as_numpy_converts_it(device):
    """A float16 plan's outputs come back as float32 through a look-up of all 65,536 float16 bit patterns
    (tflfuse.runtime.plan._half_to_float): each the value NumPy's float16 -> float32 conversion gives, bit for bit
    (NaN payloads too), and through a whole plan, NEG of every finite float16 value (exact in float16) comes back
    as NumPy's negation of it."""
    from tflfuse.runtime.plan import _half_to_float

    bits = np.arange(1 << 16).astype(np.uint16)
    got = _half_to_float(bits)
    assert got.dtype == np.float32 and got.shape == bits.shape
    np.testing.assert_array_equal(got.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))
    finite = bits.view(np.float16)[np.isfinite(bits.view(np.float16))].astype(np.float32)   # 63,488 values
    (neg,) = run_op(device, "NEG", [finite.reshape(248, 256)], precision="float16")
    np.testing.assert_array_equal(neg.reshape(-1).view(np.uint32), (-finite).view(np.uint32))


def _float16_through_a_plan(device, x: np.ndarray) -> np.ndarray:
    """``x`` (float32, 1-D) set as the input of a float16 plan of one RESHAPE (a view: its output is the input's
    float16 buffer, which only the plan's FLOAT16_INPUT dispatch writes), read back after a run."""
    plan = op_plan(device, "RESHAPE", [x], {"new_shape": [x.size]}, precision="float16")
    assert [(d["op"], d["program"]) for d in plan.dispatches] == [("FLOAT16_INPUT", "FLOAT16_INPUT")]
    plan.run()
    return plan.read(plan.graph.outputs[0])


def _assert_numpy_rounding(got: np.ndarray, x: np.ndarray) -> None:
    """``got`` is ``x`` rounded to float16 as NumPy rounds it, bit for bit; a NaN as a NaN of the same sign (NumPy
    keeps the top of a NaN's payload in its own conversion, but where it uses the CPU's conversion instruction, x86's
    sets the quiet bit: the bits of a NaN depend on the machine)."""
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all() and (np.signbit(got[nan]) == np.signbit(x[nan])).all()


def test_float16_inputs_round_on_the_gpu_as_numpy(device):
    """A float16 plan uploads its inputs as float32 and rounds them on the GPU (kernels.half.half_pack_program):
    every value NumPy's float32 -> float16 conversion gives, bit for bit, at each edge of the rounding: every
    finite float16 value, each midpoint between neighbours (ties to even) and the float32 values either side of
    it, the overflow bound (65520 and the float32 just below it), subnormal float16 down to half the smallest
    (a tie to zero), float32 subnormals, signed zeros, infinities and NaNs with and without payloads (odd count:
    the last word's upper half). Before the run, get_tensor() of the input gives the same values."""
    halves = np.arange(1 << 16).astype(np.uint16).view(np.float16)
    finite = np.unique(halves[np.isfinite(halves)].astype(np.float64))            # 63,487 (one zero)
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)                    # exact in float32
    specials = np.array([0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x7f800000, 0xff800000, 0x7fc00000,
                         0xffc00001, 0x7f800001, 0xff800001, 0x7fbfffff, 0x477ff000, 0x477fefff, 0xc77ff000,
                         0x33000000, 0x33000001, 0xb3000001, 0x33800000, 0x337fffff, 0x387fffff, 0x38800000,
                         0x477fe000, 0x47800000, 0x7f7fffff], np.uint32).view(np.float32)
    x = np.concatenate([finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                        np.nextafter(mids, np.float32(-np.inf)), specials, np.float32([1.0])])
    x = np.concatenate([x, -x])[:-1]                                              # an odd count
    assert x.size % 2 == 1
    _assert_numpy_rounding(_float16_through_a_plan(device, x), x)
    plan = op_plan(device, "RESHAPE", [x], {"new_shape": [x.size]}, precision="float16")
    _assert_numpy_rounding(plan.read(plan.graph.inputs[0]), x)


def test_float16_input_too_large_as_float32_is_rounded_on_the_host(device, monkeypatch):
    """An input whose float16 values fit the device's max storage binding but whose float32 values would not is
    rounded by NumPy in set_tensor(), as before the FLOAT16_INPUT dispatch: no dispatch and no float32 buffer for
    it, the same values. (The binding limit the plan reads is lowered to 64 KiB here: 20,001 values are 80,004
    bytes as float32 and 40,004 as float16.)"""
    monkeypatch.setitem(device.limits, "max-storage-buffer-binding-size", 1 << 16)
    x = np.random.default_rng(5).standard_normal(20_001).astype(np.float32) * 7e4   # past 65504 too
    plan = op_plan(device, "NEG", [x], precision="float16")
    assert plan.input_staging == {} and [d["op"] for d in plan.dispatches] == ["NEG"]
    plan.run()
    _assert_numpy_rounding(-plan.read(plan.graph.outputs[0]), x)
    _assert_numpy_rounding(plan.read(plan.graph.inputs[0]), x)


def test_float16_input_rounding_past_65535_workgroups(device):
    """The FLOAT16_INPUT dispatch (256 invocations a workgroup, two values each) over more than 65,535 workgroups
    spills into dispatch y: 2**25 + 101 random float32 bit patterns (every exponent, NaNs among them), within the
    software adapter's 128 MiB storage binding, against NumPy's rounding."""
    from tflfuse.kernels.half import half_pack_program

    n = 2 * 256 * MAX_WORKGROUPS_PER_DIM + 101
    assert half_pack_program(n).dispatch[:2] == (MAX_WORKGROUPS_PER_DIM, 2)
    x = np.random.default_rng(7).integers(0, 1 << 32, n, dtype=np.uint32).view(np.float32)
    _assert_numpy_rounding(_float16_through_a_plan(device, x), x)


@pytest.mark.parametrize("n", [0, 1, 15, (1 << 18) - 1, (1 << 18) + 1, 3_000_001])
def test_float16_uploads_round_as_numpy_in_parallel_parts(n):
    """A float16 plan's uploads (tflfuse.runtime.plan._half_bytes): from 2**18 values the rounding runs in
    parallel parts; every size gives NumPy's float32 -> float16 conversion bit for bit (ties to even, past 65504
    inf, NaN, subnormals), flat, padded with one zero to an even count, and warns of nothing."""
    from tflfuse.runtime.plan import _half_bytes

    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3e4).astype(np.float32)
    for start, value in enumerate([7e4, -1e6, np.nan, 1e-9, np.inf, 65520.0, 65519.99, 2.0 ** -25]):
        x[start::97] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _half_bytes(x)
    with np.errstate(over="ignore"):
        want = np.concatenate([x.astype(np.float16), np.zeros(n % 2, np.float16)])
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))

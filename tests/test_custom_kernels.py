"""User kernels for user composites: the examples of docs/custom_kernels.md run end to end (annotate, convert,
register, run on tflfuse.Interpreter, compare with TensorFlow), then tflfuse.kernels.compose in detail and the
errors (a registered name, WGSL that does not compile).

References are TF ops or float64 NumPy written here, never the kernels' logic. Tolerances: RMS norm and the
conv sums reorder <= 60 terms and use inverseSqrt (a few ULP): ACCUMULATION; elementwise expressions:
ELEMENTWISE; data movement: EXACT.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tflfuse
from conftest import ACCUMULATION, ELEMENTWISE, EXACT
from tflfuse.kernels import Kernel, KernelError, TensorSpec, UnsupportedOpError, kernel_class, register
from tflfuse.kernels.compose import register_composition, register_elementwise
from tflfuse.kernels.wgsl import elementwise_program
from tflfuse.runtime.plan import run_op

DOC = Path(__file__).resolve().parents[1] / "docs" / "custom_kernels.md"
_BLOCK = re.compile(r"<!-- example: ([\w ]+) -->\s*```python\n(.*?)```", re.S)


@pytest.fixture(scope="module", autouse=True)
def _restore_kernel_registry():
    """The kernels registered here leave the registry with this module (other tests list every key)."""
    from tflfuse.kernels import registry

    saved = dict(registry._KERNELS)
    yield
    registry._KERNELS.clear()
    registry._KERNELS.update(saved)


def test_examples_import_tflfuse_before_tensorflow():
    # Run here, the examples find tflfuse already imported; a user's fresh process needs it first, or
    # TensorFlow's LLVM clashes with the software adapter's (the README's import-order note).
    for name, code in _BLOCK.findall(DOC.read_text()):
        imports = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
        assert imports and imports[0].startswith("import tflfuse"), (name, imports[:3])


@pytest.fixture(scope="module")
def examples():
    """Each example of the guide, executed once (it registers kernels), by name -> its namespace."""
    blocks = dict(_BLOCK.findall(DOC.read_text()))
    assert set(blocks) == {"kernel class", "elementwise", "composition"}
    spaces = {}
    for name, code in blocks.items():
        ns = {"__name__": f"custom_kernels_example_{name.replace(' ', '_')}"}
        exec(compile(code, f"{DOC}:{name}", "exec"), ns)  # the example asserts its own result against TF
        spaces[name] = ns
    return spaces


def test_kernel_class_example(examples):
    ns = examples["kernel class"]
    assert dict(ns["result"].report.op_counts) == {"rms_norm": 1}
    x = ns["x"].astype(np.float64)
    gamma = np.linspace(0.5, 1.5, 10)
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * gamma
    np.testing.assert_allclose(ns["y"], ref, **ACCUMULATION)
    wgsl = tflfuse.get_shader("rms_norm", [[2, 7, 10], [10]], {"eps": 1e-5}).wgsl
    assert "inverseSqrt" in wgsl and "params.eps" in wgsl


def test_elementwise_example(examples):
    ns = examples["elementwise"]
    assert dict(ns["result"].report.op_counts) == {"scaled_softsign": 1}
    x = ns["x"].astype(np.float64)
    np.testing.assert_allclose(ns["y"], 2.5 * x / (1 + np.abs(x)), **ELEMENTWISE)


def test_composition_example(examples):
    ns = examples["composition"]
    assert dict(ns["result"].report.op_counts) == {"conv_residual": 1}
    layer = ns["model"].layers[-1]
    x = ns["x"]
    ref = tf.nn.relu(tf.nn.conv2d(x, layer.kernel, 1, "SAME") + layer.bias + x).numpy()
    np.testing.assert_allclose(ns["y"], ref, **ACCUMULATION)
    progs = tflfuse.get_shader("conv_residual", [[2, 9, 7, 6], [3, 3, 6, 6], [6], [2, 9, 7, 6]]).programs
    assert [p.wgsl.count("@compute") for p in progs] == [1, 1, 1]   # TRANSPOSE, CONV_2D, ADD: one op


def test_registering_a_registered_name_raises(examples):
    with pytest.raises(ValueError, match="'rms_norm' is already registered"):
        register("rms_norm")(type("Other", (Kernel,), {}))
    with pytest.raises(ValueError, match="'CONV_2D' is already registered"):
        register_elementwise("CONV_2D", "x")
    with pytest.raises(ValueError, match="'scaled_softsign' is already registered"):
        register_composition("scaled_softsign", lambda chain, x: x)
    with pytest.raises(ValueError, match="identifier"):
        register_elementwise("my op", "x")


def test_bad_wgsl_of_a_user_kernel_raises_shader_compile_error(device):
    register_elementwise("test_bad_wgsl", "x +* 2.0")

    @tflfuse.composite("test_bad_wgsl")
    def bad(x):
        return x * 2.0

    fn = tf.function(lambda x: bad(x))
    result = tflfuse.convert([fn.get_concrete_function(tf.TensorSpec([4], tf.float32))])
    interp = tflfuse.Interpreter(model_content=result.tflite, device=device)
    with pytest.raises(tflfuse.ShaderCompileError, match=r"test_bad_wgsl \(operator 0"):
        interp.allocate_tensors()


def test_bad_wgsl_of_a_kernel_class_names_the_op(device):
    @register("test_bad_kernel_class")
    class Bad(Kernel):
        def output_specs(self):
            return (TensorSpec(self.input(0).shape),)

        def programs(self):
            return [elementwise_program(self.key, self.io_bindings(["x", "y"]), self.input(0).size,
                                        "  y[idx] = undefined_fn(x[idx]);")]

    with pytest.raises(tflfuse.ShaderCompileError, match="test_bad_kernel_class"):
        run_op(device, "test_bad_kernel_class", [np.zeros(3, np.float32)])


def test_elementwise_broadcasts_and_reads_uniforms(device, rng):
    register_elementwise("test_axpb", "alpha * x0 * x1 + beta + helper(x1)", inputs=2, uniforms=["alpha", "beta"],
                         helpers="fn helper(v: f32) -> f32 { return v * v; }")
    a = rng.standard_normal((2, 3, 5), dtype=np.float32)
    b = rng.standard_normal((3, 1), dtype=np.float32)
    (y,) = run_op(device, "test_axpb", [a, b], {"alpha": -1.5, "beta": 0.25}, constant=[False, False])
    ref = (-1.5 * tf.constant(a) * b + 0.25 + tf.square(b)).numpy()
    assert y.shape == (2, 3, 5)
    np.testing.assert_allclose(y, ref, **ELEMENTWISE)
    with pytest.raises(KernelError, match="missing attribute 'alpha'"):
        kernel_class("test_axpb")([TensorSpec((2,)), TensorSpec((2,))], {"beta": 1.0})


def _scaled_by_global_mean(chain, x):
    """x * mean_hw(x) + x through fused_global_pool2d (which has scratch of its own), a RESHAPE view, MUL (into
    a scratch buffer) and ADD; the mean is also the op's second output, the input is returned as a third (copied)."""
    m = chain.call("fused_global_pool2d", [x], pooling="avg", activation="linear", keepdims=True)
    flat = chain.call("RESHAPE", [m], shape=[x.shape[0], 1, 1, x.shape[-1]])
    t = chain.call("MUL", [x, flat])
    return chain.call("ADD", [t, x]), m, x


def test_composition_scratch_views_and_several_outputs(device, rng):
    register_composition("test_scaled_by_mean", _scaled_by_global_mean)
    x = rng.standard_normal((2, 23, 19, 5), dtype=np.float32)   # 437 pixels: the pool uses its scratch
    k = kernel_class("test_scaled_by_mean")([TensorSpec(x.shape)], {})
    assert k.scratch_sizes() == (x.nbytes, 2 * 5 * 21 * 4)   # MUL's output, then the pool's 21 chunks of partial sums
    y, m, same = run_op(device, "test_scaled_by_mean", [x], constant=[False])
    mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True).numpy()
    np.testing.assert_allclose(m, mean, **ACCUMULATION)
    np.testing.assert_allclose(y, x * mean + x, **ACCUMULATION)
    np.testing.assert_allclose(same, x, **EXACT)


def test_composition_errors():
    def static_as_value(chain, x, perm):
        return chain.call("TRANSPOSE", [x, perm])

    register_composition("test_static_as_value", static_as_value)
    with pytest.raises(KernelError, match=r"step 0 \(TRANSPOSE\): input 1 \(perm\) is read at plan time"):
        kernel_class("test_static_as_value")([TensorSpec((2, 3)), TensorSpec((2,))], {})

    register_composition("test_unknown_step", lambda chain, x: chain.call("NO_SUCH_OP", [x]))
    with pytest.raises(UnsupportedOpError, match="NO_SUCH_OP"):
        kernel_class("test_unknown_step")([TensorSpec((2, 3))], {})

    register_composition("test_bad_step", lambda chain, x: chain.call("CONV_2D", [x, x]))
    with pytest.raises(KernelError, match=r"test_bad_step step 0 \(CONV_2D\)"):
        kernel_class("test_bad_step")([TensorSpec((2, 3))], {})

    register_composition("test_returns_nothing", lambda chain, x: None)
    with pytest.raises(KernelError, match="must return a Value"):
        kernel_class("test_returns_nothing")([TensorSpec((2, 3))], {})


def test_float16_composition_keeps_a_block_step_in_float16(device):
    """A user's composition (tflfuse.kernels.compose) with a fused_bottleneck step: the step's f16 scratch
    buffers keep their precision at their new places among the composition's, so the float16 plan runs it and
    its output is the block's own float16 result through RELU, bit for bit (the block's programs are the same,
    RELU commutes with the monotone rounding to f16, and the value passed between the steps stays float32)."""
    from test_bottleneck import ORDER, _weights

    def block_then_relu(chain, x, *weights):
        y = chain.call("fused_bottleneck", [x, *weights], expansion=6, target="gpu", strategy="staged",
                       output_activation="linear", residual=False)
        return chain.call("RELU", [y])

    register_composition("test_block_then_relu", block_then_relu)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 9, 7, 8)).astype(np.float32)
    w = _weights(rng, 8, 6, 12)
    inputs = [x] + [w[k] for k in ORDER if k in w]
    kernel = kernel_class("test_block_then_relu")([TensorSpec(a.shape) for a in inputs], {})
    assert kernel.half_scratch() == (1, 2)   # after the step's output (scratch 0): its expanded and depthwise
    (got,) = run_op(device, "test_block_then_relu", inputs, precision="float16")
    attrs = {"expansion": 6, "target": "gpu", "strategy": "staged", "residual": False}
    (block,) = run_op(device, "fused_bottleneck", inputs, attrs, precision="float16")
    np.testing.assert_array_equal(got, np.maximum(block, 0))


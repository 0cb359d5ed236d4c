"""Shared test set-up: import order, seeding, the WebGPU device fixture and the tolerances.

``import tflfuse`` comes first: it makes a later ``import tensorflow`` load TensorFlow's libraries with
RTLD_LOCAL (tflfuse/_tfload.py), the order most of the suite runs in; test_import_order.py runs the other.
"""

import tflfuse  # noqa: I001  (must precede every import that can load TensorFlow)

import os
import random
import sys

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")     # wgpu/Vulkan loaders warn (or fail) without it
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Overflow, division by zero and invalid operations in NumPy code are errors, not silent infs and NaNs;
# underflow is not: float32 results such as exp(-60) flush to zero by design.
np.seterr(all="raise", under="ignore")

#: Seed of every test's ``rng``: tests are reproducible, and independent of the order they run in.
SEED = 20240611

# ---- tolerances (atol, rtol), one justification each ------------------------------------------------
#: Data movement, selection and clamping (PAD, CONCATENATION, views, MAX_POOL, MAXIMUM, RELU*): no
#: arithmetic that can round, so the result is bit-identical.
EXACT = dict(atol=0.0, rtol=0.0)
#: One correctly rounded f32 operation per element (ADD/SUB/MUL, SQUARED_DIFFERENCE's two) or WGSL's
#: division (2.5 ULP in the WGSL spec): within a few ULP, 2**-20 relative covers 8 ULP of float32.
ELEMENTWISE = dict(atol=1e-6, rtol=2.0 ** -20)
#: exp/tanh-based ops (LOGISTIC, TANH, SOFTMAX's exp): WGSL allows 3 + 2|x| ULP for exp and tanh is
#: derived from it; on inputs |x| <= 8 that is ~20 ULP: 1e-5 relative, 1e-6 absolute near 0.
TRANSCENDENTAL = dict(atol=1e-6, rtol=1e-5)
#: Sums of K products or terms in another order than the reference's (CONV_2D, DEPTHWISE_CONV_2D,
#: FULLY_CONNECTED, MEAN, AVERAGE_POOL_2D): with unit-scale data and 1/sqrt(K)-scaled weights the
#: reordering error is ~sqrt(K) ULP of O(1) partial sums; K <= 1000 here, so 1e-5 leaves 2x margin.
ACCUMULATION = dict(atol=1e-5, rtol=1e-5)
#: The same over K ~ 2**18 terms (a dot product at the software adapter's loop cap): ~sqrt(K) = 512 ULP
#: of O(1) partial sums is 6e-5; 2e-4 leaves 3x.
LONG_ACCUMULATION = dict(atol=2e-4, rtol=2e-4)
#: TF's own op computes with the float32 weights that a float16-weight model rounded to 11 significant
#: bits (relative error <= 2**-11 per weight); over a 1/sqrt(K)-scaled dot product that is ~1e-3.
FP16_WEIGHTS = dict(atol=3e-3, rtol=3e-3)


def invoke(interp, inputs) -> list[np.ndarray]:
    """Allocates ``interp`` (tflfuse's or LiteRT's Interpreter), sets its inputs in order, invokes it once and
    returns its outputs in order."""
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator seeded with :data:`SEED`."""
    return np.random.default_rng(SEED)


@pytest.fixture(autouse=True)
def _seeded_global_generators():
    """Python's, NumPy's global and, once loaded, Keras' and TensorFlow's generators seeded with :data:`SEED`
    before every test: a Keras layer built without a seed (its kernel_initializer draws from Keras' global
    generator) gets the same weights in every run, whatever ran before it. Module-scoped fixtures are set up
    before this one, so those that build unseeded layers call ``keras.utils.set_random_seed`` themselves."""
    random.seed(SEED)
    np.random.seed(SEED)
    if "keras" in sys.modules:      # not imported here: tests that never load TensorFlow stay without it
        sys.modules["keras"].utils.set_random_seed(SEED)
    elif "tensorflow" in sys.modules:
        sys.modules["tensorflow"].random.set_seed(SEED)


@pytest.fixture(scope="session")
def device():
    """One WebGPU device shared by every GPU test; skips (naming the fix) only where no adapter exists. Its
    shaders are trusted modules (no runtime checks), as on a GPU by default, also on the software adapter
    (which keeps the checks by default): the tests check the kernels GPUs run."""
    try:
        return tflfuse.Device(shader_checks=False)
    except tflfuse.NoAdapterError as e:
        pytest.skip(f"no WebGPU adapter ({e}); on Debian/Ubuntu `apt-get install mesa-vulkan-drivers` "
                    f"provides the software adapter")

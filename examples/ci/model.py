"""Example model entry points for ``tflfuse check`` (``examples/ci/model.py:mobilenet_v2``).

An entry point is a function without arguments that returns a Keras model (or concrete functions); CI calls
it, converts the model and checks the result.
"""

import composites


def mobilenet_v2():
    """MobileNetV2 at 96x96 (width 0.35) built from 17 annotated ``fused_bottleneck`` blocks."""
    return composites.mobilenet_v2(input_shape=(96, 96, 3), alpha=0.35, seed=0)


def mobilenet_v2_small():
    """The same architecture at 64x64 with 10 classes: a second model for the manifest example."""
    return composites.mobilenet_v2(input_shape=(64, 64, 3), alpha=0.35, classes=10, seed=1)

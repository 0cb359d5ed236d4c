"""Ready-made composites: a TensorFlow body annotated for fusion, its attributes and a Keras layer each.

Importing this package imports TensorFlow and Keras (the converter side).
"""

from .bottleneck import InvertedResidual, fold_batch_norm, fused_bottleneck, random_conv_bn
from .mobilenet_v2 import mobilenet_v2

__all__ = ["InvertedResidual", "fold_batch_norm", "fused_bottleneck", "mobilenet_v2", "random_conv_bn"]

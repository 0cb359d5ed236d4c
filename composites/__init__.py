"""Ready-made composites: a TensorFlow body annotated for fusion, its attributes and a Keras layer each.

Importing this package imports TensorFlow and Keras (the converter side).
"""

from .activations import Clip, HardSwish, clip_by_value, hard_swish
from .conv import (FusedConv2D, FusedDense, FusedDepthwiseConv2D, FusedSeparableConv2D, fused_conv2d,
                   fused_depthwise_conv2d, fused_matmul, separable_conv2d)
from .bottleneck import InvertedResidual, fold_batch_norm, fused_bottleneck, random_conv_bn
from .mobilenet_v2 import mobilenet_v2
from .mobilenet_v3 import mobilenet_v3_small, mobilenet_v3_small_from_keras
from .pooling import (FusedAveragePooling2D, FusedGlobalAveragePooling2D, FusedGlobalMaxPooling2D, FusedMaxPooling2D,
                      global_pool2d, pool2d)
from .recurrent import GRU, LSTM, fused_gru, fused_lstm, gru, lstm
from .squeeze_excite import SqueezeExcite, make_divisible, squeeze_excite

__all__ = ["FusedConv2D", "FusedDense", "FusedDepthwiseConv2D", "FusedSeparableConv2D", "fused_conv2d",
           "fused_depthwise_conv2d", "fused_matmul", "separable_conv2d", "Clip", "FusedAveragePooling2D", "FusedGlobalAveragePooling2D", "FusedGlobalMaxPooling2D",
           "FusedMaxPooling2D", "GRU", "HardSwish", "InvertedResidual", "LSTM", "SqueezeExcite", "clip_by_value",
           "fold_batch_norm", "fused_bottleneck", "fused_gru", "fused_lstm", "global_pool2d", "gru", "hard_swish",
           "lstm", "make_divisible", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_small_from_keras", "pool2d", "random_conv_bn", "squeeze_excite"]

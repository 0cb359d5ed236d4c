"""TFLite's generated op tests, rebuilt as data: the parameter grids of TensorFlow's
``tensorflow/lite/testing/op_tests/*.py`` (their float32 sets, with the int32 and bool sets where an op has them),
graph builders written with TF ops for each family, and the harness that converts each case with the stock
converter and compares tflfuse with LiteRT's CPU interpreter.

``grids.py`` is the specification (data only), ``builders.py`` turns one case into a ``tf.function``,
``harness.py`` converts, runs and classifies. ``benchmarks/op_tests.py`` runs every case; ``tests/test_op_tests.py``
runs a deterministic sample in the default suite. ``quant_grids.py`` and ``harness_int8.py`` do the same for the
fully-quantized (int8, with float32 or uint8 ends) sets of the same files, judged in quantization steps
(``benchmarks/op_tests.py --quantized``, ``tests/test_op_tests_int8.py``).
"""

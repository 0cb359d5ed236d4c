"""The quantization side of :func:`tflfuse.convert`: argument checks, the converter's settings, the refusals of
modes that would leave fused ops half-quantized, and the checks of the int8 fused ops (the module docstring of
:mod:`tflfuse.conversion` describes each mode)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Model

__all__ = ["INT8_COMPOSITES", "QUANTIZATIONS", "QUANTIZED_TYPES", "check_fused_float", "check_int8_fused",
           "check_quantization", "quantize", "refuse_quantization"]

#: The quantization modes of :func:`tflfuse.convert` (None: float32 throughout).
QUANTIZATIONS = (None, "dynamic", "float16", "int8")
#: Composites with an int8 fused form (``quantization="int8"``): the fused op of their int8 builtin chain.
INT8_COMPOSITES = frozenset({"fused_bottleneck"})


def check_quantization(quantization, representative_dataset) -> None:
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if quantization == "int8" and representative_dataset is None:
        raise ValueError("quantization='int8' needs a representative_dataset (a callable returning an iterable "
                         "of input lists, as tf.lite.TFLiteConverter.representative_dataset)")
    if quantization != "int8" and representative_dataset is not None:
        raise ValueError(f"representative_dataset applies to quantization='int8', not to {quantization!r}")
    if representative_dataset is not None and not callable(representative_dataset):
        raise TypeError(f"representative_dataset must be a callable returning an iterable of input lists, got "
                        f"{type(representative_dataset).__name__}")


def refuse_quantization(quantization: str, kind: str, traced: collections.Counter) -> None:
    """Refuses the quantization modes that leave fused ops half-quantized, and composites without an int8 form
    (module docstring)."""
    from .conversion import ConversionError

    calls = ", ".join(f"{n}: {c}" for n, c in sorted(traced.items()) if c)
    if not calls:
        return
    if quantization == "int8":
        if kind != "Keras model":
            raise ConversionError(
                f"quantization='int8' for a {kind} with fused composites ({calls}): calibration runs the composites' "
                f"bodies as builtins, which needs a model convert() can trace again without annotations; pass "
                f"the Keras model itself")
        lacking = sorted(n for n, c in traced.items() if c and n not in INT8_COMPOSITES)
        if lacking:
            raise ConversionError(
                f"quantization='int8': composite(s) {lacking} ({calls}) have no int8 fused form (tflfuse has "
                f"int8 fused ops for {sorted(INT8_COMPOSITES)} only); convert with annotations=False for a "
                f"full-integer model of builtins, or quantization='float16'")
        return
    why = ("dynamic-range quantization makes CONV_2D and FULLY_CONNECTED hybrid ops (int8 weights, activations "
           "quantized at run time) but leaves each fused op float32 with float32 weights: a half-quantized file, "
           "whose hybrid ops tflfuse has no kernels for")
    raise ConversionError(
        f"quantization={quantization!r} does not apply to a {kind} with fused composites ({calls}): {why}. Use "
        f"quantization='int8' (a representative dataset; int8 fused bottlenecks), quantization='float16' "
        f"(weights stored as float16, every op float32: LiteRT and tflfuse run it), or convert with "
        f"annotations=False for a quantized model of builtins only (LiteRT runs it, and tflfuse runs full-integer "
        f"files with its int8 kernels)")


def checked_dataset(representative_dataset):
    """``representative_dataset`` as the converter calls it, each sample checked first: a sample holding NaN
    or infinity (whose calibrated scale TensorFlow's converter cannot represent: it crashed the process), and a
    dataset of no samples, raise ValueError naming the sample and the input; the converter reports it (and
    :func:`tflfuse.convert` raises ConversionError with its text)."""
    import numpy as np

    def samples():
        count = 0
        for k, sample in enumerate(representative_dataset()):
            values = sample.items() if isinstance(sample, dict) else enumerate(
                sample if isinstance(sample, (list, tuple)) else [sample])
            for name, value in values:
                array = np.asarray(value)
                if array.dtype.kind in "fc" and not np.isfinite(array).all():
                    raise ValueError(f"representative_dataset: sample {k}, input {name!r} holds NaN or infinity; "
                                     f"calibration needs finite values")
            count += 1
            yield sample
        if count == 0:
            raise ValueError("representative_dataset yielded no samples; calibration needs at least one")

    return samples


def quantize(converter, quantization: str | None, representative_dataset) -> None:
    import tensorflow as tf

    converter.optimizations = [] if quantization is None else [tf.lite.Optimize.DEFAULT]
    if quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif quantization == "int8":   # full-integer or an error: no op silently left float
        converter.representative_dataset = checked_dataset(representative_dataset)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]


#: Tensor types of a quantized or reduced-precision value, which no fused op reads or writes.
QUANTIZED_TYPES = frozenset({"INT8", "UINT8", "INT16", "INT4", "FLOAT16"})


def check_fused_float(m: Model, int8: frozenset = frozenset()) -> None:
    """No fused op reads or writes a quantized or float16 tensor (its weights are dequantized before it), or
    ConversionError; fused ops named in ``int8`` (the int8 fused forms) are exempt."""
    from .annotate import registry
    from .conversion import ConversionError

    specs = set(registry()) - set(int8)
    for sg in range(len(m.subgraphs)):
        for i, name in enumerate(m.op_names(sg)):
            comp = m.composite(sg, i)
            name = comp.name if comp is not None else name
            if name not in specs:
                continue
            bad = [(t, m.tensor_type_name(sg, t)) for t in m.op_inputs(sg, i) + m.op_outputs(sg, i)
                   if t >= 0 and m.tensor_type_name(sg, t) in QUANTIZED_TYPES]
            if bad:
                raise ConversionError(f"fused op {name!r} (operator {i} of subgraph {sg}) reads or writes "
                                      f"{', '.join(f'tensor {t} as {ty}' for t, ty in bad)}; fused ops compute "
                                      f"in float32, so this file would be half-quantized")


def check_int8_fused(report) -> None:
    """Every annotated call became one int8 fused op (whatever ``check``: a block left as int8 builtins would
    pass unseen), or ConversionError naming each composite with both counts."""
    from .conversion import ConversionError

    if report.ok:
        return
    lines = [f"composite {c.name!r}: {c.traced} annotated call(s) traced, {c.fused} int8 {c.name!r} op(s)"
             for c in report.mismatches]
    raise ConversionError(
        "quantization='int8': not every annotated call became one int8 fused op:\n  " + "\n  ".join(lines) +
        "\nAn int8 fused_bottleneck is an expand 1x1 conv (or none) + relu6/relu, a 3x3 or 5x5 depthwise conv "
        "of stride 1 or 2, a 1x1 projection [+ the input]; squeeze-excite and hard_swish blocks have no int8 "
        "form. Convert with annotations=False for a full-integer model of builtins.")

"""Schedule sweep of CONV_2D's windowed (not 1x1) convolutions (tflfuse.kernels.conv) on real models' shapes.

    python benchmarks/sweep_conv.py --batches=1,32 --out=sweep_conv.json

For each shape (MobileNetV2's stem and the windowed convolutions of MediaPipe's models), the GPU time
(timestamp queries around 50 runs back to back, median of --repeats passes) of each ``strip`` (0: one
invocation per output element, its dot products split between lanes where outputs are few; 1-8: output
pixels per invocation of the vec4 strip schedule) and of the default choice, against the op's roofline bound
(its bytes at the copy bandwidth or its FLOPs at the f32 FMA rate, both measured in the same run). Every
schedule's output is checked against float64 NumPy first. Needs no TensorFlow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tflfuse  # noqa: E402
from tflfuse.kernels import kernel_class  # noqa: E402
from tflfuse.kernels.base import TensorSpec  # noqa: E402

from chain import time_strips  # noqa: E402
from peaks import copy_bandwidth_gb_per_s, fma_tflops  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_list("strips", ["0", "1", "2", "4"], "Strips to try (0: the per-element schedule; P/Q: P pixels "
                  "and Q output-channel vec4s per invocation, CONV_2D's strip_quads).")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 10, "Timed passes per schedule.")

#: (H, W, Cin, Cout, KH, KW, stride, padding, where it is from)
SHAPES = [(224, 224, 3, 32, 3, 3, 2, "SAME", "MobileNetV2 stem"),
          (192, 192, 3, 32, 5, 5, 2, "SAME", "palm_detection stem"),
          (256, 256, 3, 16, 3, 3, 2, "SAME", "selfie_segmentation stem"),
          (3, 3, 32, 1404, 3, 3, 3, "VALID", "face_landmark head"),
          (32, 32, 64, 64, 2, 2, 2, "VALID", "iris_landmark"),
          (128, 128, 8, 8, 2, 2, 2, "VALID", "hand_recrop"),
          (56, 56, 24, 48, 3, 3, 1, "SAME", "a 3x3 conv over 24 channels")]


def reference(x, f, b, stride, padding):
    """float64 NumPy CONV_2D (HWIO filter) + bias: TFLite's SAME puts the extra padding at the end."""
    n, h, w, _ = x.shape
    kh, kw, _, cout = f.shape
    if padding == "SAME":
        oh, ow = -(-h // stride), -(-w // stride)
        ph, pw = max((oh - 1) * stride + kh - h, 0), max((ow - 1) * stride + kw - w, 0)
    else:
        oh, ow, ph, pw = (h - kh) // stride + 1, (w - kw) // stride + 1, 0, 0
    xp = np.pad(x.astype(np.float64), ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    y = np.zeros((n, oh, ow, cout)) + b
    for ky in range(kh):
        for kx in range(kw):
            y += xp[:, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride, :] @ f[ky, kx].astype(np.float64)
    return y


def main(argv):
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    bandwidth, peak = copy_bandwidth_gb_per_s(device), fma_tflops(device, "f32")
    print(f"copy bandwidth: {bandwidth:.0f} GB/s; f32 FMA {peak:.1f} TFLOP/s", flush=True)
    rng = np.random.default_rng(0)
    results = {"adapter": device.describe(), "copy_gb_per_s": bandwidth, "f32_tflops": peak, "convs": []}
    for n in map(int, FLAGS.batches):
        for h, w, cin, cout, kh, kw, s, pad, where in SHAPES:
            x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
            f = (rng.standard_normal((kh, kw, cin, cout)) / np.sqrt(kh * kw * cin)).astype(np.float32)
            b = rng.standard_normal(cout).astype(np.float32)
            want = reference(x, f, b, s, pad)
            nbytes = 4 * (x.size + f.size + b.size + want.size)
            bound_us = max(nbytes / bandwidth / 1e3, 2 * want.size * kh * kw * cin / peak / 1e6)
            row = {"batch": n, "shape": [h, w, cin, cout, kh, kw, s, pad], "where": where, "bound_us": bound_us}
            attrs = {"padding": pad, "stride_h": s, "stride_w": s, "filter_layout": "HWIO"}
            specs = [TensorSpec(x.shape), TensorSpec(f.shape), TensorSpec(b.shape)]
            row["default"] = kernel_class("CONV_2D")(specs, attrs).strip()
            row["strips"] = time_strips(device, "CONV_2D", x, f, b, attrs, [
                v for v in FLAGS.strips if (cout // 4) % int((v.partition("/")[2] or "1")) == 0], want, bound_us,
                                        FLAGS.repeats)
            best = min(row["strips"], key=lambda k: row["strips"][k]["us"])
            print(f"N{n} {where} {h}x{w}x{cin}->{cout} {kh}x{kw}/{s}: bound {bound_us:.1f} us; default strip "
                  f"{row['default']}; best {best}; "
                  + ", ".join(f"{k}: {v['us']:.1f} us ({v['pct_of_bound']:.0f}%, err {v['rel_err']:.1e})"
                              for k, v in row["strips"].items()), flush=True)
            results["convs"].append(row)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)

"""Schedule sweep of DEPTHWISE_CONV_2D (tflfuse.kernels.conv) over MobileNetV2's depthwise convolutions.

    python benchmarks/sweep_depthwise.py --batches=1,32 --out=sweep_depthwise.json

For each of MobileNetV2's (224x224, alpha 1) 3x3 depthwise convolutions, the GPU time (timestamp queries around
50 runs back to back, median of --repeats passes) of each ``strip`` (0: one invocation per output element;
1-8: output pixels per invocation of the vec4 strip schedule) and of the default choice, against the memory
bound: the bytes the op must move (input, filter, bias, output) at the copy bandwidth measured in the same run.
Every schedule's output is checked against float64 NumPy first. Needs no TensorFlow.
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
from tflfuse.kernels.conv import depthwise_strip  # noqa: E402

from chain import BLOCKS, time_strips  # noqa: E402
from peaks import copy_bandwidth_gb_per_s  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_list("strips", ["0", "1", "2", "4", "8"], "Strips to try (0: one invocation per output element).")
flags.DEFINE_string("out", None, "JSON file for the results.")
flags.DEFINE_integer("repeats", 10, "Timed passes per schedule.")


def reference(x, w, b, stride):
    """float64 NumPy depthwise 3x3 with SAME padding (TFLite's: the extra row/column of padding at the end)."""
    n, h, wd, c = x.shape
    oh, ow = -(-h // stride), -(-wd // stride)
    ph, pw = max((oh - 1) * stride + 3 - h, 0), max((ow - 1) * stride + 3 - wd, 0)
    xp = np.pad(x.astype(np.float64), ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    y = np.zeros((n, oh, ow, c)) + b
    for ky in range(3):
        for kx in range(3):
            y += xp[:, ky:ky + stride * oh:stride, kx:kx + stride * ow:stride, :] * w[0, ky, kx]
    return y


def main(argv):
    device = tflfuse.Device()
    print(f"adapter: {device.describe()}", flush=True)
    bandwidth = copy_bandwidth_gb_per_s(device)
    print(f"copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    results = {"adapter": device.describe(), "copy_gb_per_s": bandwidth, "convs": []}
    for n in map(int, FLAGS.batches):
        for h, cin, t, _, s in dict.fromkeys((h, cin, t, 0, s) for h, cin, t, _, s in BLOCKS):
            c = cin * t
            x = rng.standard_normal((n, h, h, c)).astype(np.float32)
            w = rng.standard_normal((1, 3, 3, c)).astype(np.float32)
            b = rng.standard_normal(c).astype(np.float32)
            want = reference(x, w, b, s)
            nbytes = 4 * (x.size + w.size + b.size + want.size)
            bound_us = nbytes / bandwidth / 1e3
            row = {"batch": n, "h": h, "c": c, "stride": s, "bound_us": bound_us}
            attrs = {"padding": "SAME", "stride_h": s, "stride_w": s}
            g = kernel_class("DEPTHWISE_CONV_2D")([TensorSpec(x.shape), TensorSpec(w.shape), TensorSpec(b.shape)],
                                                  attrs).g
            row["default"] = depthwise_strip(g, c, 1)
            row["strips"] = time_strips(device, "DEPTHWISE_CONV_2D", x, w, b, attrs, map(int, FLAGS.strips), want,
                                        bound_us, FLAGS.repeats)
            best = min(row["strips"], key=lambda k: row["strips"][k]["us"])
            print(f"N{n} {h}x{h}x{c} s{s}: bound {bound_us:.1f} us; default strip {row['default']}; best {best}; "
                  + ", ".join(f"{k}: {v['us']:.1f} us ({v['pct_of_bound']:.0f}%)" for k, v in row["strips"].items()),
                  flush=True)
            results["convs"].append(row)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    app.run(main)

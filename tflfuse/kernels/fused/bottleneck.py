"""fused_bottleneck: the MobileNetV2 inverted-residual block in ONE dispatch.

Semantics (``composites.bottleneck.fused_bottleneck``, BatchNorm folded): for input ``x [N, H, W, Cin]``

    e = act(x @ expand_w + expand_b)                      # 1x1 expand, [N, H, W, Cexp]   (expansion > 1)
    d = act(depthwise3x3(e, dw_w, stride, SAME) + dw_b)   # [N, OH, OW, Cexp]
    y = d @ project_w + project_b (+ x when residual)     # 1x1 projection, linear, [N, OH, OW, Cout]

with ``act`` = ReLU6 by default. Op inputs, in order: ``x``; ``expand_w [Cin, Cexp]`` and ``expand_b [Cexp]``
when expansion > 1; ``dw_w [3, 3, Cexp]``, ``dw_b [Cexp]``, ``project_w [Cexp, Cout]``, ``project_b [Cout]``.
Attributes: ``expansion`` (int), ``stride`` (1 or 2), ``residual`` (bool), ``activation`` (str).

The kernel never writes the expanded tensor to memory. A workgroup owns a tile of output pixels and a
block of output channels; it walks the expanded channels in chunks: the 1x1 expansion of the tile's
input halo goes into workgroup memory, each invocation applies the 3x3 depthwise filter for its pixel and
accumulates the projection into registers. Only ``x`` is read and only ``y`` written.
"""

from __future__ import annotations

from ..base import MAX_WORKGROUPS_PER_DIM, Kernel, Program, TensorSpec
from ..conv import conv_output_size
from ..registry import register
from ..wgsl import activation_fn, dot, prelude

__all__ = ["FusedBottleneck"]

#: Workgroups a GPU needs in flight to be busy (an H200 has 132 SMs); tiles shrink until a dispatch has this many.
_GPU_WORKGROUPS = 256
_MAX_CHUNK = 16      # expanded channels per pass through workgroup memory
_WG_BYTES = 16384    # WebGPU's default maxComputeWorkgroupStorageSize


@register("fused_bottleneck")
class FusedBottleneck(Kernel):
    """Input ``x [N, H, W, Cin]`` float32 and the folded weights (see module doc) -> ``[N, OH, OW, Cout]``,
    ``OH = ceil(H / stride)``. Raises :class:`~tflfuse.kernels.KernelError` for weights whose shapes
    disagree, a stride other than 1 or 2, or a residual on a block whose input and output differ."""

    input_names = ("x", "expand_w", "expand_b", "dw_w", "dw_b", "project_w", "project_b")
    attr_defaults = {"expansion": 6, "stride": 1, "residual": False, "activation": "relu6", "target": "gpu"}

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        from ...annotate import decode_attrs

        return decode_attrs(options)

    def check(self):
        x = self.expect_rank(0, 4)
        n, h, w, cin = x.shape
        self.has_expand = len(self.inputs) == 7
        if len(self.inputs) not in (5, 7):
            raise self.fail(f"expects 5 inputs (expansion 1) or 7, got {len(self.inputs)}")
        off = 2 if self.has_expand else 0
        if self.has_expand:
            ew, eb = self.expect_rank(1, 2).shape, self.expect_rank(2, 1).shape
            if ew[0] != cin or eb[0] != ew[1]:
                raise self.fail(f"expand_w {list(ew)} / expand_b {list(eb)} do not fit {cin} input channels")
            cexp = ew[1]
        else:
            cexp = cin
        dw, db = self.expect_rank(1 + off, 3).shape, self.expect_rank(2 + off, 1).shape
        pw, pb = self.expect_rank(3 + off, 2).shape, self.expect_rank(4 + off, 1).shape
        if dw != (3, 3, cexp) or db != (cexp,):
            raise self.fail(f"dw_w must be [3, 3, {cexp}] and dw_b [{cexp}], got {list(dw)} and {list(db)}")
        if pw[0] != cexp or pb != (pw[1],):
            raise self.fail(f"project_w {list(pw)} / project_b {list(pb)} do not fit {cexp} expanded channels")
        self.cin, self.cexp, self.cout = cin, cexp, pw[1]
        self.stride = int(self.attr("stride"))
        if self.stride not in (1, 2):
            raise self.fail(f"stride must be 1 or 2, got {self.stride}")
        self.residual = bool(self.attr("residual"))
        if self.residual and (self.stride != 1 or cin != self.cout):
            raise self.fail(f"residual needs stride 1 and Cin == Cout, got stride {self.stride}, "
                            f"Cin {cin}, Cout {self.cout}")
        activation_fn(self.attr("activation"))  # validates the name
        self.oh, self.pt = conv_output_size(h, 3, self.stride, 1, "SAME")
        self.ow, self.pl = conv_output_size(w, 3, self.stride, 1, "SAME")
        tile, lanes, block = self._schedule()
        self.tile = int(self.attrs.get("tile") or tile)
        self.lanes = int(self.attrs.get("lanes") or lanes)
        self.out_block = int(self.attrs.get("out_block") or block)
        if self.tile not in (1, 2, 4, 8) or self.lanes not in (1, 2, 4, 8, 16) or self.out_block < 1:
            raise self.fail(f"tile must be 1, 2, 4 or 8, lanes 1..16 (a power of two) and out_block >= 1; got "
                            f"{self.tile}, {self.lanes}, {self.out_block}")

    def output_specs(self):
        return (TensorSpec((self.input(0).shape[0], self.oh, self.ow, self.cout)),)

    def _schedule(self) -> tuple[int, int, int]:
        """(tile side, lanes per pixel, output channels per workgroup) for the ``target`` attribute.

        ``"cpu"`` (the software adapter: a few cores, barriers are costly): 8x8 tiles, 4 lanes, blocks of
        up to 128 output channels. ``"gpu"``: the largest tile and output block whose dispatch still has
        :data:`_GPU_WORKGROUPS` workgroups, so that small late-stage feature maps at batch 1 still fill the
        GPU; a smaller tile or block recomputes more of the expansion, so the largest that suffices wins.
        Tuning only: every choice computes the same values. The attributes ``tile``, ``lanes``,
        ``out_block`` and ``chunk`` (expanded channels per pass) override it.
        """
        n = self.input(0).shape[0]
        target = str(self.attr("target"))
        if target not in ("gpu", "cpu"):
            raise self.fail(f"target must be 'gpu' or 'cpu', got {target!r}")
        if target == "cpu":
            return 8, 4, min(self.cout, 128)
        best = None
        for tile in (8, 4, 2):
            for block in (128, 64, 32, 16):
                block = min(block, self.cout)
                groups = n * -(-self.oh // tile) * -(-self.ow // tile) * -(-self.cout // block)
                recompute = ((tile - 1) * self.stride + 3) ** 2 / (tile * self.stride) ** 2 * -(-self.cout // block)
                key = (groups < _GPU_WORKGROUPS, recompute if groups >= _GPU_WORKGROUPS else -groups)
                if best is None or key < best[0]:
                    best = (key, tile, block)
        _, tile, block = best
        lanes = {8: 4, 4: 8, 2: 16}[tile]
        while lanes > block:
            lanes //= 2
        return tile, lanes, block

    def _blocking(self):
        """(halo side, expanded channels per chunk, output channels per block, number of blocks).

        The chunk divides Cexp (so every chunk is full) and its halo fits in workgroup memory beside the
        depthwise results."""
        halo = (self.tile - 1) * self.stride + 3
        fit = max(1, _WG_BYTES // (4 * (halo * halo + self.tile * self.tile)))
        want = int(self.attrs.get("chunk") or _MAX_CHUNK)
        chunk = max(d for d in range(1, min(self.cexp, want, fit) + 1) if self.cexp % d == 0)
        nblocks = -(-self.cout // self.out_block)
        block = -(-self.cout // nblocks)
        return halo, chunk, block, nblocks

    def loop_trips(self) -> int:
        """Loop iterations one invocation runs, at most (see :func:`tflfuse.kernels.wgsl.dot`)."""
        halo, ec, cb, _ = self._blocking()
        chunks = self.cexp // ec
        per_chunk = -(-halo * halo * ec // (self.tile * self.tile * self.lanes)) * (1 + self.cin // 4) + \
            -(-ec // self.lanes) + -(-cb // self.lanes)
        return chunks * (1 + per_chunk) + -(-cb // self.lanes)

    def programs(self):
        n, h, w, cin = self.input(0).shape
        cexp, cout, s = self.cexp, self.cout, self.stride
        hw, ec, cb, nblocks = self._blocking()
        T = self.tile
        threads = T * T * self.lanes
        jb = -(-cb // self.lanes)  # accumulators per invocation
        names = ["x", "ew", "eb", "dw", "db", "pw", "pb", "y"] if self.has_expand else \
            ["x", "dw", "db", "pw", "pb", "y"]
        binds = self.io_bindings(names)
        if self.has_expand:
            expand = (f"        var v = eb[e];\n        let xb = ((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {cin}u;\n"
                      + "        " + dot(cin, "x[xb + {k}]", f"ew[({{k}}) * {cexp}u + e]") + "\n        val = act(v);")
        else:
            expand = f"        val = x[((n * {h}u + u32(iy)) * {w}u + u32(ix)) * {cin}u + e];"
        taps = " + ".join(f"halo[(u32(ly + {ky}) * {hw}u + u32(lx + {kx})) * {ec}u + c] * dw[{ky * 3 + kx}u * {cexp}u + e]"
                          for ky in range(3) for kx in range(3))
        residual = f" + x[((n * {h}u + u32(oy)) * {w}u + u32(ox)) * {cin}u + co]" if self.residual else ""
        lanes = self.lanes
        proj = " + ".join(f"dv[p * {ec}u + {c}u] * pw[(e0 + {c}u) * {cout}u + co]" for c in range(ec))
        source = prelude(binds) + activation_fn(self.attr("activation")) + f"""
var<workgroup> halo: array<f32, {hw * hw * ec}>;   // expanded input halo, one chunk of channels
var<workgroup> dv: array<f32, {T * T * ec}>;          // depthwise results of the tile, same chunk

@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {{
  let n = wid.z / {nblocks}u;
  let co0 = (wid.z % {nblocks}u) * {cb}u;
  let co_end = min(co0 + {cb}u, {cout}u);
  let ty0 = i32(wid.y) * {T};
  let tx0 = i32(wid.x) * {T};
  let p = lidx % {T * T}u;       // the output pixel of this invocation within the tile
  let lane = lidx / {T * T}u;    // which share of the output channels it handles
  let oy = ty0 + i32(p / {T}u);
  let ox = tx0 + i32(p % {T}u);
  let live = oy < {self.oh} && ox < {self.ow};
  let ly = (oy - ty0) * {s};
  let lx = (ox - tx0) * {s};
  var acc: array<f32, {jb}>;
  for (var e0 = 0u; e0 < {cexp}u; e0 += {ec}u) {{
    // 1x1 expansion of the input halo for channels e0..e0+{ec}; zero outside the image (SAME padding).
    for (var i = lidx; i < {hw * hw * ec}u; i += {threads}u) {{
      let e = e0 + i % {ec}u;
      let hx = i32((i / {ec}u) % {hw}u);
      let hy = i32(i / {ec * hw}u);
      let iy = ty0 * {s} - {self.pt} + hy;
      let ix = tx0 * {s} - {self.pl} + hx;
      var val = 0.0;
      if (iy >= 0 && iy < {h} && ix >= 0 && ix < {w}) {{
{expand}
      }}
      halo[i] = val;
    }}
    workgroupBarrier();
    // 3x3 depthwise conv for this pixel, channels lane, lane + {lanes}, ...
    for (var c = lane; c < {ec}u; c += {lanes}u) {{
      let e = e0 + c;
      dv[p * {ec}u + c] = act(db[e] + {taps});
    }}
    workgroupBarrier();
    // 1x1 projection: output channels co0 + lane + {lanes} j.
    for (var j = 0u; j < {jb}u; j++) {{
      let co = min(co0 + lane + {lanes}u * j, {cout - 1}u);
      acc[j] += {proj};
    }}
    workgroupBarrier();
  }}
  if (!live) {{ return; }}
  for (var j = 0u; j < {jb}u; j++) {{
    let co = co0 + lane + {lanes}u * j;
    if (co >= co_end) {{ break; }}
    y[((n * {self.oh}u + u32(oy)) * {self.ow}u + u32(ox)) * {cout}u + co] = acc[j] + pb[co]{residual};
  }}
}}
"""
        dispatch = (-(-self.ow // T), -(-self.oh // T), n * nblocks)
        if max(dispatch) > MAX_WORKGROUPS_PER_DIM:
            raise self.fail(f"dispatch {dispatch} exceeds {MAX_WORKGROUPS_PER_DIM} workgroups in a dimension")
        return [Program(self.key, source, (threads, 1, 1), dispatch, binds, loop_trips=self.loop_trips())]

"""fused_bottleneck's ``blocked`` strategy: the whole block in ONE dispatch, each invocation's tile in registers.

Made for the software adapter (llvmpipe), where what costs is a load whose address is not a compile-time
constant: every such load of a storage buffer or of workgroup memory is a scalar loop over the SIMD lanes
(about 3.4 ns per lane-element on a 2-core machine, 30x an FMA; vec4 loads cost the same per component,
workgroup memory twice as much; measured 2026-12-01). So the kernel keeps no tensor in workgroup memory and
counts loads, not FLOPs:

* an invocation owns ``tile`` neighbouring output pixels of one row and a block of ``out_block`` output
  channels. It walks the expanded channels in chunks of ``chunk``: it expands its input halo (``K`` rows x
  ``(tile - 1) * stride + K`` columns) for the chunk into registers (each input value loaded once per
  chunk serves ``chunk`` expanded channels, each expand weight serves the whole halo), applies the KxK
  depthwise filter and folds the result into the projection sums (a private array; for wide outputs a
  float32 scratch buffer, bias and residual written first, copied to the output through its activation after
  the last chunk, so that a float16 plan's sums stay float32 until the one rounding at the store);
* the expanded and depthwise tensors never reach memory, and the weights are read once per invocation, not
  once per output element as the separate ops read them.

Measured on llvmpipe (LLVM 15, Mesa 22.3, 2 cores, 2026-12-01; one-op plans, median wall time, while
other work shared the machine, so the ratios are the result): MobileNetV2's 17 blocks at 224x224, batch 1,
took 899 ms blocked against 3,877 ms staged and 3,886 ms as the separate CONV_2D, DEPTHWISE_CONV_2D, CONV_2D
(and ADD) ops, 3.2x (7x7 blocks) to 7.1x (stride-2 blocks) per block; the demo's whole model 710 against
2,285 ms unfused. The price is compile time: llvmpipe compiles each block's shader in 1-3 s on first use
(the demo's first invoke took 17 s with Mesa's shader cache off, under a second with it warm).
Sums run in another order than the staged kernels' (rounding only).
"""

from __future__ import annotations

from ..base import DEFAULT_MAX_STORAGE_BINDING, Program, linear_dispatch
from ..wgsl import linear_main, prelude

__all__ = ["blocked_geometry", "blocked_loop_trips", "blocked_program", "blocked_schedule"]

#: Invocations per workgroup: one SIMD row of llvmpipe (8 lanes of 256 bits), so that even a 7x7 map fills
#: both cores of a small machine; no workgroup memory or barriers are used.
WORKGROUP = 8
#: Output channels the projection's inner step unrolls (weights loaded per step: chunk x this).
_CO_STEP = 4
#: Projection sums kept in a private array up to this many floats; past it they accumulate in the output
#: buffer (an indexed private array of 1,280 floats took llvmpipe a minute to compile, 256 floats 3.4 s).
_PRIVATE_SUMS = 128


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, max(cap, 1)) + 1) if n % d == 0)


#: Halo values x expanded channels an invocation holds in registers per chunk, at most: beyond, LLVM's
#: compile time grows fast (a few seconds per shader here) for little gain. Below, the compile gets shorter and
#: the blocks slower: MobileNetV2 at 224x224 (composites, fused) on llvmpipe with Mesa's shader cache off
#: (2026-12-07, 2 cores, three Interpreters in one process, invokes alternating) took 16.1, 12.5 and 10.2 s
#: in its first invoke with 256, 192 and 128, and 1.00x, 1.07x and 1.44x the time in the next ones.
_HALO_REGISTERS = 256
#: The loop cap of the software adapter (65,535 iterations in all per invocation), with a margin.
_LOOP_CAP = 60000


def blocked_schedule(k) -> dict:
    """The default schedule of the blocked strategy for kernel ``k`` (a :class:`FusedBottleneck` whose
    shapes are checked): the widest row tile (8, 4, 2 or 1 pixels; 4 at most with stride 2, whose halo is
    twice as wide) that still gives two workgroups (both cores of a small machine busy), the largest chunk
    of expanded channels whose halo fits :data:`_HALO_REGISTERS`, all output channels in one invocation
    (a block of them would expand the halo once per block). ``None`` where an invocation would pass the
    loop cap, or where the projection sums need a scratch buffer (:func:`blocked_sums_bytes`) larger than
    :data:`~tflfuse.kernels.base.DEFAULT_MAX_STORAGE_BINDING` (float32 sums, twice a float16 plan's output).

    Measured on llvmpipe (2 cores, 2026-12-01, MobileNetV2's 12 block shapes at 224x224, batch 1, each
    weighted by its count, on a loaded machine: the ratios are the result): 4-pixel tiles with 8-channel
    chunks took 1,626 ms in all, 16-channel chunks 1,262 ms, 8-pixel tiles with 8-channel chunks 1,197 ms,
    the staged kernels 5,775 ms. Splitting the output channels of a 7x7 block between invocations (blocks
    of 32 of 320) made it 7x slower: each block expands the halo again. Halos of 18 x 16 values compile in
    about 3 s; projection sums past :data:`_PRIVATE_SUMS` in a private array took a minute.
    """
    n = k.input(0).shape[0]
    for tw in (8, 4, 2, 1):
        if (tw <= 4 or k.stride == 1) and (n * k.oh * -(-k.ow // tw) > WORKGROUP or tw == 1):
            break
    q = k.k * ((tw - 1) * k.stride + k.k)
    chunk = _divisor_at_most(k.cexp, max(4, _HALO_REGISTERS // q))
    step = _projection_steps(k.cout)[0]
    trips = k.cexp // chunk * (1 + (k.cin if k.has_expand else 0) + -(-k.cout // step)) + k.cout
    if trips >= _LOOP_CAP:
        return None
    if _sums_in_scratch(tw, k.cout) and _sums_bytes(k) > DEFAULT_MAX_STORAGE_BINDING:
        return None   # its float32 sums would pass the binding every adapter grants (a float16 output can fit)
    return {"strategy": "blocked", "tile": tw, "lanes": 1, "out_block": k.cout, "chunk": chunk, "splits": 1}


def blocked_geometry(k) -> dict:
    """Sizes of the blocked schedule of kernel ``k`` (a :class:`FusedBottleneck` after ``check``):
    ``tw`` output pixels per invocation, ``chunk`` expanded channels per pass (a divisor of Cexp), ``groups``
    output-channel blocks of ``block`` channels (``alloc`` rounded up to the projection's step), the halo
    ``hw`` columns wide, and the invocation count."""
    n = k.input(0).shape[0]
    tw = k.tile
    chunk = _divisor_at_most(k.cexp, k.chunk)
    groups = -(-k.cout // min(k.out_block, k.cout))
    block = -(-k.cout // groups)
    step, alloc = _projection_steps(block)
    tiles_x = -(-k.ow // tw)
    return {"tw": tw, "chunk": chunk, "groups": groups, "block": block, "step": step, "alloc": alloc,
            "tiles_x": tiles_x, "hw": (tw - 1) * k.stride + k.k, "invocations": n * k.oh * tiles_x * groups}


def _projection_steps(block: int) -> tuple[int, int]:
    """``(step, alloc)`` for a block of ``block`` output channels: the projection's channels per step, and the
    sums an invocation holds per pixel (``block`` rounded up to the step)."""
    step = min(_CO_STEP, block)
    return step, -(-block // step) * step


def _sums_bytes(k) -> int:
    """Bytes of the projection sums of every output as float32: the blocked strategy's scratch buffer where
    :func:`_sums_in_scratch`."""
    return k.input(0).shape[0] * k.oh * k.ow * k.cout * 4


def _sums_in_scratch(tw: int, block: int) -> bool:
    """Whether the projection sums of ``tw`` pixels x ``block`` output channels pass :data:`_PRIVATE_SUMS` and
    are kept in a scratch buffer (:func:`blocked_sums_bytes`) instead of a private array."""
    return tw * _projection_steps(block)[1] > _PRIVATE_SUMS


def blocked_loop_trips(k) -> int:
    """Loop iterations of one invocation: per chunk the expansion's walk over Cin and the projection's
    steps, then the store loop."""
    g = blocked_geometry(k)
    chunks = k.cexp // g["chunk"]
    return chunks * (1 + (k.cin if k.has_expand else 0) + g["alloc"] // g["step"]) + g["block"]


def blocked_sums_bytes(k) -> int:
    """Bytes of the float32 scratch buffer that holds the projection sums of kernel ``k``'s blocked schedule
    where they do not fit a private array (:data:`_PRIVATE_SUMS`), else 0."""
    g = blocked_geometry(k)
    return _sums_bytes(k) if _sums_in_scratch(g["tw"], g["block"]) else 0


def blocked_program(k, bindings) -> Program:
    """The one dispatch of the blocked strategy over ``bindings`` named x, [ew, eb,] dw, db, pw, pb, y, and where
    :func:`blocked_sums_bytes` is not 0 its scratch buffer 0 (the sums)."""
    n, h, w, cin = k.input(0).shape
    cexp, cout, K, s = k.cexp, k.cout, k.k, k.stride
    g = blocked_geometry(k)
    tw, E, hw, G, step, alloc = g["tw"], g["chunk"], g["hw"], g["block"], g["step"], g["alloc"]
    sums_bytes = blocked_sums_bytes(k)
    if sums_bytes:
        bindings = tuple(bindings) + (k.binding("sums", "scratch", 0, sums_bytes),)
    halo = [(hy, hx) for hy in range(K) for hx in range(hw)]
    q_of = {pos: i for i, pos in enumerate(halo)}
    L = []   # body lines, indented by two
    L += [f"let cg = idx % {g['groups']}u;", f"let t = idx / {g['groups']}u;",
          f"let ox0 = i32(t % {g['tiles_x']}u) * {tw};", f"let oy = i32((t / {g['tiles_x']}u) % {k.oh}u);",
          f"let n = t / {g['tiles_x'] * k.oh}u;", f"let co0 = cg * {G}u;"]
    for hy in range(K):
        L += [f"let iy{hy} = oy * {s} + {hy - k.pt};", f"let ry{hy} = u32(clamp(iy{hy}, 0, {h - 1}));"]
    for hx in range(hw):
        L += [f"let ix{hx} = ox0 * {s} + {hx - k.pl};", f"let rx{hx} = u32(clamp(ix{hx}, 0, {w - 1}));"]
    for q, (hy, hx) in enumerate(halo):   # the halo's pixels: clamped addresses, and whether inside the image
        L += [f"let xb{q} = ((n * {h}u + ry{hy}) * {w}u + rx{hx}) * {cin}u;",
              f"let ok{q} = iy{hy} >= 0 && iy{hy} < {h} && ix{hx} >= 0 && ix{hx} < {w};"]
    private = tw * alloc <= _PRIVATE_SUMS
    out_at = f"((n * {k.oh}u + u32(oy)) * {k.ow}u + u32(ox0 + {{p}})) * {cout}u + {{co}}"
    res_at = f"((n * {h}u + u32(oy)) * {w}u + u32(ox0 + {{p}})) * {cin}u + {{co}}"

    def store_loop(sums: str, target: str = "y") -> list[str]:
        """target = sums (of pixel ``{p}``, channel offset c) + bias (+ residual) over the block's live outputs,
        through the output activation where ``sums`` is given."""
        out = [f"for (var c = 0u; c < {G}u; c++) {{", "  let co = co0 + c;", f"  if (co >= {cout}u) {{ break; }}",
               "  let bias = pb[co];"]
        for p in range(tw):
            residual = k.residual_term(f"(n * {k.oh}u + u32(oy)) * {k.ow}u + u32(ox0 + {p})", "co",
                                       f"x[{res_at.format(p=p, co='co')}]")
            value = f"{sums.format(p=p * alloc)}bias{residual}"
            out.append(f"  if (ox0 + {p} < {k.ow}) {{ {target}[{out_at.format(p=p, co='co')}] = "
                       f"{k.out_activated(value, 'co') if sums else value}; }}")
        return out + ["}"]
    if private:
        L += [f"var acc: array<f32, {tw * alloc}>;   // projection sums: pixel p, channel co0 + c at p * {alloc} + c"]
    else:   # the sums accumulate in the float32 scratch buffer: bias and residual first
        L += store_loop("", "sums")
    L += [f"for (var e0 = 0u; e0 < {cexp}u; e0 += {E}u) {{"]
    B = []   # the chunk loop's body
    es = range(E)
    qs = range(len(halo))
    if k.has_expand:
        B += [f"var h{q}_{e} = 0.0;" for q in qs for e in es]
        B += [f"for (var c = 0u; c < {cin}u; c++) {{"]
        B += [f"  let w{e} = ew[c * {cexp}u + e0 + {e}u];" for e in es]
        B += [f"  let x{q} = x[xb{q} + c];" for q in qs]
        B += ["  " + " ".join(f"h{q}_{e} += x{q} * w{e};" for e in es) for q in qs]
        B += ["}"]
        B += [f"let b{e} = eb[e0 + {e}u];" for e in es]
        B += [" ".join(f"let a{q}_{e} = select(0.0, {k.expand_activated(f'h{q}_{e} + b{e}', f'e0 + {e}u')}, ok{q});"
                       for e in es) for q in qs]
    else:   # expansion 1: the depthwise conv reads the input itself (zero in the padding)
        B += [" ".join(f"let a{q}_{e} = select(0.0, x[xb{q} + e0 + {e}u], ok{q});" for e in es) for q in qs]
    taps = [(ky, kx) for ky in range(K) for kx in range(K)]
    B += [" ".join(f"let d{t}_{e} = dw[{t * cexp}u + e0 + {e}u];" for e in es) for t in range(len(taps))]
    B += [f"let db{e} = db[e0 + {e}u];" for e in es]
    for p in range(tw):
        for e in es:
            terms = " + ".join(f"a{q_of[(ky, p * s + kx)]}_{e} * d{t}_{e}" for t, (ky, kx) in enumerate(taps))
            B.append(f"let v{p}_{e} = {k.dw_activated(f'db{e} + {terms}')};")
    B += [f"for (var c = 0u; c < {alloc}u; c += {step}u) {{"]
    B += [f"  let o{j} = min(co0 + c + {j}u, {cout - 1}u);" for j in range(step)]
    B += ["  " + " ".join(f"let p{e}_{j} = pw[(e0 + {e}u) * {cout}u + o{j}];" for j in range(step)) for e in es]
    if private:
        for p in range(tw):
            for j in range(step):
                B.append(f"  acc[c + {p * alloc + j}u] += " + " + ".join(f"v{p}_{e} * p{e}_{j}" for e in es) + ";")
    else:
        B += [f"  let live{j} = co0 + c + {j}u < min(co0 + {G}u, {cout}u);" for j in range(step)]
        for p in range(tw):
            for j in range(step):
                at = out_at.format(p=p, co=f"o{j}")
                B.append(f"  if (live{j} && ox0 + {p} < {k.ow}) {{ sums[{at}] += "
                         + " + ".join(f"v{p}_{e} * p{e}_{j}" for e in es) + "; }")
    B += ["}"]
    L += ["  " + b for b in B] + ["}"]
    if private:
        L += store_loop("acc[{p}u + c] + ")
    else:   # the sums are complete: through the output activation into y
        L += [f"for (var c = 0u; c < {G}u; c++) {{", "  let co = co0 + c;", f"  if (co >= {cout}u) {{ break; }}"]
        for p in range(tw):
            at = out_at.format(p=p, co="co")
            L.append(f"  if (ox0 + {p} < {k.ow}) {{ y[{at}] = {k.out_activated(f'sums[{at}]', 'co')}; }}")
        L += ["}"]
    total = g["invocations"]
    source = prelude(bindings) + k.activation_fns() + linear_main(
        WORKGROUP, total, "\n".join("  " + line for line in L))
    return Program(k.key, source, (WORKGROUP, 1, 1), linear_dispatch(total, WORKGROUP), bindings,
                   loop_trips=blocked_loop_trips(k))

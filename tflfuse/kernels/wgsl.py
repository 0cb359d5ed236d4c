"""Shared WGSL pieces: the generated prelude (bindings, uniforms), index helpers and activations.

Op bodies stay short templates; everything repeated between kernels is generated here.
"""

from __future__ import annotations

import re
from typing import Sequence

from .base import Binding, KernelError, Program, Uniform, linear_dispatch

__all__ = ["ACTIVATIONS", "ACTIVATION_ALPHA", "F32_FROM_BITS", "F32_INF", "F32_NAN", "F32_NEG_INF", "HELPERS",
           "activation_fn", "activation_uniforms", "dot", "elementwise_program", "f32_value", "fmt_f32", "helpers_for",
           "lane_tree", "linear_main", "prelude", "prelu_fn", "reduction_program", "split_lanes", "with_helpers",
           "workgroup_storage"]


def fmt_f32(x: float) -> str:
    """A WGSL f32 literal that round-trips ``x`` exactly."""
    import numpy as np

    v = float(np.float32(x))
    if v != v or v in (float("inf"), float("-inf")):
        raise KernelError(f"cannot write {x} as a WGSL literal")
    return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"


def prelude(bindings: Sequence[Binding], uniforms: Sequence[Uniform] = ()) -> str:
    """Declarations of the storage buffers (bindings 0..n-1, group 0) and the uniform block (binding n)."""
    lines = []
    for i, b in enumerate(bindings):
        access = "read" if b.access == "read" else "read_write"
        lines.append(f"@group(0) @binding({i}) var<storage, {access}> {b.name}: array<{b.elem_type}>;")
    if uniforms:
        fields = ", ".join(f"{u.name}: {u.wgsl_type}" for u in uniforms)
        lines.append(f"struct Params {{ {fields} }};")
        lines.append(f"@group(0) @binding({len(bindings)}) var<uniform> params: Params;")
    return "\n".join(lines) + "\n"


def linear_main(workgroup: int, total: int, body: str) -> str:
    """A 1-D entry point: ``idx`` is the linear invocation index rebuilt from a dispatch that may spill
    into y and z (past 65,535 workgroups); invocations at or past ``total`` return at once."""
    return f"""
@compute @workgroup_size({workgroup})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let idx = ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * {workgroup}u + lidx;
  if (idx >= {total}u) {{ return; }}
{body}
}}
"""


# Activation name (TFLite fused_activation_function names, lower-cased, and the composite names) ->
# WGSL body of ``fn act(v: f32) -> f32``. Semantics: TFLite's kernels (RELU_N1_TO_1 clamps to [-1, 1],
# HARD_SWISH is x * relu6(x + 3) / 6) and Keras' activations for the composite-only names:
# ``leaky_relu`` (x if x >= 0 else alpha * x) and ``elu`` (x if x > 0 else alpha * (exp(x) - 1)) read
# ``params.alpha`` (see :func:`activation_uniforms`); ``gelu`` is keras.activations.gelu(approximate=False),
# 0.5 x erfc(-x / sqrt(2)), through :data:`_ERFC`; ``gelu_tanh`` is gelu(approximate=True).
ACTIVATIONS = {
    "none": "return v;",
    "linear": "return v;",
    # NaN passes through the clamps, as in LiteRT (WGSL's max/clamp may return either operand for NaN, and
    # compilers fold ``v != v`` to false, so NaN is tested on the bits)
    "relu": "return select(max(v, 0.0), v, is_nan(v));",
    "relu6": "return select(clamp(v, 0.0, 6.0), v, is_nan(v));",
    "relu_n1_to_1": "return select(clamp(v, -1.0, 1.0), v, is_nan(v));",
    "relu_0_to_1": "return select(clamp(v, 0.0, 1.0), v, is_nan(v));",
    # tanh's argument is clamped to +-10 (tanh(+-10) is +-1 in f32): SwiftShader's tanh, Chrome's WebGPU on
    # machines with no GPU, gives NaN past ~44; NaN still passes through
    "tanh": "return select(tanh(clamp(v, -10.0, 10.0)), v, is_nan(v));",
    "sigmoid": "return 1.0 / (1.0 + exp_f(-v));",
    "logistic": "return 1.0 / (1.0 + exp_f(-v));",
    "hard_swish": "return v * (clamp(v + 3.0, 0.0, 6.0) / 6.0);",  # no overflow for large v, as in LiteRT
    "sign_bit": "return select(0.0, 1.0, v < 0.0);",
    "leaky_relu": "return select(v * params.alpha, v, v >= 0.0);",
    "elu": "return select(params.alpha * (exp(min(v, 0.0)) - 1.0), v, v > 0.0 || is_nan(v));",
    "gelu": "return 0.5 * v * erfc_approx(v * -0.70710678118654752);",
    # the tanh argument is clamped: tanh(+-10) is +-1 in f32, and some tanh implementations give NaN past ~44
    "gelu_tanh": "return 0.5 * v * (1.0 + tanh(clamp(0.7978845608028654 * (v + 0.044715 * v * v * v), "
                 "-10.0, 10.0)));",
}

#: Activations that read the uniform ``params.alpha``, with Keras' default for it
#: (keras.activations.leaky_relu's negative_slope 0.2, also tf.nn.leaky_relu's; keras.activations.elu's 1.0).
ACTIVATION_ALPHA = {"leaky_relu": 0.2, "elu": 1.0}


#: ``fn f32_from_bits``: a float32 made from its bits at run time. WGSL makes a constant expression whose value
#: is not finite a shader-creation error, so Tint (the WGSL compiler of Dawn and Chrome) refuses
#: ``bitcast<f32>(0x7fc00000u)``, which naga accepts; a call of a user-declared function is never a constant
#: expression.
F32_FROM_BITS = "fn f32_from_bits(b: u32) -> f32 { return bitcast<f32>(b); }\n"
#: NaN, +inf and -inf as WGSL f32 expressions, through :data:`F32_FROM_BITS`.
F32_NAN, F32_INF, F32_NEG_INF = ("f32_from_bits(0x7fc00000u)", "f32_from_bits(0x7f800000u)",
                                 "f32_from_bits(0xff800000u)")


def f32_value(x: float) -> str:
    """A WGSL f32 expression of ``float32(x)``: the literal of :func:`fmt_f32` where it is finite, else
    ``f32_from_bits`` of its bits (NaN payload and infinity sign kept), made at run time: a constant expression
    whose value is not finite is a shader-creation error (:data:`F32_FROM_BITS`; the program builders declare
    the function where their code calls it: :func:`with_helpers`)."""
    import numpy as np

    with np.errstate(over="ignore"):   # a float past float32's range is +-inf in float32, as a .tflite holds it
        v = np.float32(x)
    return fmt_f32(float(v)) if np.isfinite(v) else f"f32_from_bits(0x{int(v.view(np.uint32)):08x}u)"


# erfc(z) by the Chebyshev fit of Numerical Recipes (erfcc, 2nd ed. section 6.2): fractional error below
# 1.2e-7 for every z in exact arithmetic (WGSL has no erf). In float32, the gelu built on it is within
# 4e-7 absolute (half an ulp of 10) and 3e-6 relative (where |gelu(x)| >= 1e-6) of float64 erf over
# [-10, 10] on the software adapter, as tf.nn.gelu's own float32 result is (tests/test_composite_conv.py).
_ERFC = """fn erfc_approx(z: f32) -> f32 {
  let a = abs(z);
  let t = 1.0 / (1.0 + 0.5 * a);
  let r = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
          + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
  return select(r, 2.0 - r, z < 0.0);
}
"""

# cos and sin of x as C's cosf/sinf (TFLite's SIN and COS kernels call std::sin and std::cos), so that no
# result depends on the adapter's cos and sin: WGSL bounds their error inside [-pi, pi] only, and SwiftShader
# (Chrome's WebGPU without a GPU) is 2e-5 off at x = 1 and 2e-3 at x = 3e4. x = k pi/2 + r, k = round(x 2/pi),
# with pi/2 in five parts (Cody-Waite): the first four have 6 significant bits, so k times each is exact for
# |k| < 2**18 (|x| < 4e5), and every subtraction but the last is exact; r (|r| <= pi/4) then goes into the
# Taylor series of sin to r**11 and of cos to r**12 (truncation below 2e-9). Against float64 over 2e6 points per
# range, in float32 arithmetic without fused multiply-adds: within 8.6e-8 absolute for |x| < 4e5. Past that the
# products k pi/2 round (1.7e-4 absolute at |x| = 1e6, more beyond), so |x| >= 4e5 takes the adapter's cos and
# sin, whatever their accuracy there (C's would need the bits of 2/pi far past float32's). |x| < 2.4e-4 gives
# (1, x) (x**2/2 and x**3/6 are under half a unit in the last place; the sign of a zero kept); infinities and NaN
# give NaN.
_COS_SIN = ("fn cos_sin(x: f32) -> vec2<f32> {\n"
            f"  if (!is_finite(x)) {{ return vec2<f32>({F32_NAN}, {F32_NAN}); }}\n"
            """  if (abs(x) < 2.4e-4) { return vec2<f32>(1.0, x); }
  if (abs(x) >= 4e5) { return vec2<f32>(cos(x), sin(x)); }
  let k = round(x * 0.6366197466850281);
  var r = x - k * 1.5625;
  r = r - k * 0.008056640625;
  r = r - k * 0.00023651123046875;
  r = r - k * 3.159046173095703e-06;
  r = r - k * 1.5893254712295857e-08;
  let z = r * r;
  let sp = (((-2.5052107943679403e-08 * z + 2.7557318844628753e-06) * z - 0.00019841270113829523) * z
            + 0.008333333767950535) * z - 0.1666666716337204;
  let s = r + r * z * sp;
  let cp = ((((2.0876755879584152e-09 * z - 2.755731998149713e-07) * z + 2.4801587642286904e-05) * z
             - 0.0013888889225199819) * z + 0.0416666679084301) * z - 0.5;
  let c = 1.0 + z * cp;
  let q = i32(k) & 3;
  if (q == 0) { return vec2<f32>(c, s); }
  if (q == 1) { return vec2<f32>(-s, c); }
  if (q == 2) { return vec2<f32>(-c, -s); }
  return vec2<f32>(s, -c);
}
""")

#: WGSL helper functions by name, each declared by the program builders (:func:`elementwise_program`,
#: :func:`reduction_program`, ``pool.reduce_program``) and by :func:`activation_fn` where their code calls it
#: and does not declare it (:func:`helpers_for`), with the helpers it calls in turn. Special values are decided
#: on the bits, as WGSL lets a compiler assume that no value is NaN or infinite (so ``v != v`` may fold to
#: false), and made at run time (:data:`F32_FROM_BITS`). ``exp_f``, ``log_f`` and ``cos_sin`` give C's results
#: (TFLite's kernels call expf, logf, sinf, cosf) whatever the adapter's built-ins do with special values:
#: SwiftShader's log of a negative is log|x| and its exp(NaN) is +inf. ``max_nan`` is max with NaN passing
#: through (WGSL's max may return either operand).
HELPERS: dict[str, str] = {
    "f32_from_bits": F32_FROM_BITS,
    "is_nan": "fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }\n",
    "is_finite": "fn is_finite(v: f32) -> bool { return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u; }\n",
    "nan": f"fn nan() -> f32 {{ return {F32_NAN}; }}\n",
    "inf": f"fn inf() -> f32 {{ return {F32_INF}; }}\n",
    "copy_sign": "fn copy_sign(mag: f32, s: f32) -> f32 { return bitcast<f32>(bitcast<u32>(mag) | (bitcast<u32>(s) "
                 "& 0x80000000u)); }\n",
    "max_nan": f"fn max_nan(a: f32, b: f32) -> f32 {{ return select(max(a, b), {F32_NAN}, "
               "is_nan(a) || is_nan(b)); }\n",
    # exp overflows past 88.7228 and is 0 below -103.98 (under the least subnormal's half); between -87.34 and
    # that its results are subnormal, which adapters that flush subnormals give as 0 (within 1.2e-38)
    "exp_f": "fn exp_f(v: f32) -> f32 {\n"
             f"  return select(select(select(exp(v), 0.0, v < -104.0), {F32_INF}, v > 88.8), v, "
             "is_nan(v));\n}\n",
    # log of a positive subnormal b * 2**-149 as log(b) - 149 ln 2 (adapters may flush it to zero)
    "log_f": f"""fn log_f(v: f32) -> f32 {{
  let b = bitcast<u32>(v);
  let l = select(log(v), log(f32(b)) - 103.2789306640625, b < 0x00800000u);
  let special = select({F32_NAN}, {F32_INF}, b == 0x7f800000u);
  return select(select(l, special, b >= 0x7f800000u), {F32_NEG_INF}, (b & 0x7fffffffu) == 0u);
}}
""",
    "cos_sin": _COS_SIN,
    "erfc_approx": _ERFC,
}
_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(")
_DECLARED = re.compile(r"\bfn\s+([A-Za-z_]\w*)\s*\(")


def helpers_for(*code: str, declared: str = "") -> str:
    """The :data:`HELPERS` that ``code`` calls (directly or through another helper) and that neither ``code``
    nor ``declared`` (other WGSL of the same module) declares, in :data:`HELPERS`' order: WGSL refuses a function
    declared twice, and module-scope declarations may come in any order."""
    have = set(_DECLARED.findall("\n".join((*code, declared))))
    needed, todo = set(), list(code)
    while todo:
        for name in _CALL.findall(todo.pop()):
            if name in HELPERS and name not in have and name not in needed:
                needed.add(name)
                todo.append(HELPERS[name])
    return "".join(source for name, source in HELPERS.items() if name in needed)


def with_helpers(helpers: str, *code: str) -> str:
    """``helpers`` (WGSL declarations) with :func:`helpers_for` ``(helpers, *code)`` ahead of them."""
    return helpers_for(helpers, *code) + helpers


def activation_fn(name: str | None, fn_name: str = "act", uniform_alpha: bool = False, declared: str = "") -> str:
    """``fn act(v: f32) -> f32`` for a TFLite fused activation (``"RELU6"``) or a composite's (``"relu6"``).

    Activations in :data:`ACTIVATION_ALPHA` read ``params.alpha`` when ``uniform_alpha`` (the program must
    then declare the uniforms of :func:`activation_uniforms`); otherwise Keras' default alpha is written in.
    The helper functions the body calls are declared with it, except those already in ``declared`` (WGSL of
    the same program, e.g. another activation's function: WGSL refuses a function declared twice).
    """
    key = (name or "none").lower()
    if key not in ACTIVATIONS:
        raise KernelError(f"unsupported activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    body = ACTIVATIONS[key]
    if key in ACTIVATION_ALPHA and not uniform_alpha:
        body = body.replace("params.alpha", fmt_f32(ACTIVATION_ALPHA[key]))
    return f"{helpers_for(body, declared=declared)}fn {fn_name}(v: f32) -> f32 {{ {body} }}\n"


def prelu_fn(fn_name: str, slopes: str) -> str:
    """``fn {fn_name}(v: f32, c: u32) -> f32``: TFLite's PRELU of channel ``c``, ``v >= 0 ? v : v * slopes[c]``
    (NaN stays NaN), its slopes read from the binding named ``slopes``."""
    return f"fn {fn_name}(v: f32, c: u32) -> f32 {{ return select(v * {slopes}[c], v, v >= 0.0); }}\n"


def activation_uniforms(name: str | None, alpha: float | None = None) -> tuple[Uniform, ...]:
    """The uniforms an activation's WGSL reads: ``(Uniform("alpha", "f32", alpha),)`` for ``leaky_relu``
    and ``elu`` (``alpha`` None: Keras' default, :data:`ACTIVATION_ALPHA`), ``()`` for the others.
    A uniform, so one pipeline serves every alpha."""
    key = (name or "none").lower()
    if key not in ACTIVATION_ALPHA:
        return ()
    return (Uniform("alpha", "f32", float(ACTIVATION_ALPHA[key] if alpha is None else alpha)),)


def elementwise_program(name: str, bindings: tuple[Binding, ...], total: int, body: str,
                        helpers: str = "", uniforms: tuple[Uniform, ...] = (), workgroup: int = 64,
                        loop_trips: int = 0) -> Program:
    """A program with one invocation per output element (``idx`` in ``0..total``)."""
    source = prelude(bindings, uniforms) + with_helpers(helpers, body) + linear_main(workgroup, total, body)
    return Program(name, source, (workgroup, 1, 1), linear_dispatch(total, workgroup), bindings, uniforms,
                   loop_trips=loop_trips)


def dot(n: int, a: str, b: str, acc: str = "v", unroll: int = 4, lanes: int = 1) -> str:
    """WGSL statements adding ``sum_k a(k) * b(k)`` for ``k < n`` to the variable ``acc``, unrolled.

    ``a`` and ``b`` are format strings over ``{k}`` (a u32 expression). Unrolling keeps the number of loop
    iterations per invocation low: the software adapter (llvmpipe) silently stops all the loops of an
    invocation after 65,535 iterations in all (see ``Program.loop_trips``). Iterations: ``n // unroll``.

    With ``lanes`` > 1 (inside a :func:`reduction_program`), the invocation of lane ``lane`` adds only its
    share: the unrolled groups ``lane``, ``lane + lanes``, ... (and lane 0 the tail); iterations
    ``ceil(n / (unroll * lanes))``. A lane's groups written out one after another instead of this loop (every
    group's loads known before the first multiply-add; the same sums in the same order) changed nothing on an H100
    (2026-12-07 13:04 UTC, ``benchmarks/switch_ab.py``, MobileNetV2 at batch 1, 2 alternating rounds): the model
    0.999x; its seven split 1x1 projections 0.92-0.97x on 28x28 maps and 1.03-1.04x on 14x14 ones. Not kept.
    """
    main, tail = n - n % unroll, n % unroll
    lines = []
    if main:
        terms = " + ".join(f"{a.format(k=f'k + {u}u')} * {b.format(k=f'k + {u}u')}" for u in range(unroll))
        start = "0u" if lanes == 1 else f"lane * {unroll}u"
        lines.append(f"for (var k = {start}; k < {main}u; k += {unroll * lanes}u) {{ {acc} += {terms}; }}")
    tail_lines = [f"{acc} += {a.format(k=f'{main + u}u')} * {b.format(k=f'{main + u}u')};" for u in range(tail)]
    if tail_lines and lanes > 1:
        tail_lines = [f"if (lane == 0u) {{ {' '.join(tail_lines)} }}"]
    return "\n".join(lines + tail_lines)


#: Invocations per workgroup of a :func:`reduction_program`.
REDUCTION_WORKGROUP = 256
#: :func:`split_lanes` stops splitting once this many invocations are in flight (about what an NVIDIA
#: H200's 132 SMs hold at once, 2,048 each: more lanes then only add workgroup-memory traffic).
_SPLIT_TARGET = 1 << 18


def split_lanes(outputs: int, terms: int, target: str = "gpu", unroll: int = 4, min_groups: int = 2) -> int:
    """Lanes (invocations) per output element for a dot product of ``terms`` terms per output, as
    :func:`reduction_program` runs it: 1 (one invocation per output) on the software adapter
    (``target="cpu"``: a few cores, costly barriers) or where ``outputs`` already fill the GPU; otherwise the
    largest power of two up to 256 that keeps ``outputs * lanes`` within :data:`_SPLIT_TARGET` and every lane
    at least ``min_groups`` unrolled groups of the ``terms``.

    A small layer at batch 1 (a FULLY_CONNECTED of 63 outputs over 672 inputs, a 1x1 projection of a 7x7
    feature map) otherwise leaves the GPU idle while a few invocations walk long dot products: on an NVIDIA
    H200 such dispatches took 25-40 microseconds each, mostly the latency of one serial chain of loads.
    """
    lanes = 1
    if target != "gpu":
        return lanes
    while (lanes < REDUCTION_WORKGROUP and outputs * lanes * 2 <= _SPLIT_TARGET
           and terms // (unroll * lanes * 2) >= min_groups):
        lanes *= 2
    return lanes


def lane_tree(lanes: int, per: int, offsets: Sequence[int] = (0,)) -> str:
    """WGSL adding the ``lanes`` shares of each of ``per`` sums in ``var<workgroup> shares`` (share ``lane`` of
    sum ``i`` at ``lane * per + i``, indexed by ``lidx``) into lane 0's entry: ``log2(lanes)`` halving steps, each
    behind a barrier (every invocation of the workgroup must reach it). ``offsets``: where in ``shares`` each of
    several such sets of shares starts (one tree adds them all, a step each per barrier)."""
    def at(offset: int, extra: int = 0) -> str:
        return f"shares[{offset + extra}u + lidx]" if offset else \
            (f"shares[lidx + {extra}u]" if extra else "shares[lidx]")
    tree, step = [], lanes // 2
    while step:
        if len(offsets) == 1:
            tree.append(f"  if (lane < {step}u) {{ {at(offsets[0])} += {at(offsets[0], step * per)}; }}")
        else:
            tree.append(f"  if (lane < {step}u) {{" + "".join(f"\n    {at(o)} += {at(o, step * per)};" for o in offsets)
                        + "\n  }")
        tree.append("  workgroupBarrier();")
        step //= 2
    return "\n".join(tree)


def reduction_program(name: str, bindings: tuple[Binding, ...], total: int, body: str, store: str,
                      helpers: str = "", uniforms: tuple[Uniform, ...] = (), lanes: int = 1, acc: str = "acc",
                      loop_trips: int = 0, acc_type: str = "f32") -> Program:
    """A program whose ``total`` output elements are each a sum that ``lanes`` invocations share.

    ``body`` decodes ``idx`` (the output element), declares ``var {acc} = 0.0`` and adds this invocation's
    share to it (its dots written with ``dot(..., lanes=lanes)``, which read ``lane``); ``store`` then writes
    output ``idx`` from ``acc``, the whole sum (bias and epilogue belong in ``store``, not in the share).

    ``lanes`` 1: :func:`elementwise_program` (one invocation per output, ``body`` then ``store``). Otherwise
    workgroups of :data:`REDUCTION_WORKGROUP` invocations hold ``256 / lanes`` outputs each (neighbouring
    invocations take neighbouring outputs, so that their weight reads coalesce); the shares meet in workgroup
    memory by a tree of ``log2(lanes)`` steps, and lane 0 runs ``store``. The sum's order differs from the
    serial one by rounding only (``acc_type="i32"``: integer sums, equal in any order). Raises
    :class:`KernelError` for ``lanes`` not a power of two up to 256.
    """
    if lanes == 1:
        return elementwise_program(name, bindings, total, f"{body}\n  {store}", helpers, uniforms,
                                   loop_trips=loop_trips)
    wg = REDUCTION_WORKGROUP
    if lanes > wg or lanes & (lanes - 1):
        raise KernelError(f"{name}: lanes must be a power of two up to {wg}, got {lanes}")
    per = wg // lanes
    tree_src = lane_tree(lanes, per)
    source = prelude(bindings, uniforms) + with_helpers(helpers, body, store) + f"""
var<workgroup> shares: array<{acc_type}, {wg}>;

@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lidx: u32) {{
  let lane = lidx / {per}u;
  let out = ((wid.z * nwg.y + wid.y) * nwg.x + wid.x) * {per}u + lidx % {per}u;
  let idx = min(out, {max(total, 1) - 1}u);   // every invocation reaches the barriers
{body}
  shares[lidx] = {acc};
  workgroupBarrier();
{tree_src}
  if (lane == 0u && out < {total}u) {{
    let {acc} = shares[lidx];
    {store}
  }}
}}
"""
    return Program(name, source, (wg, 1, 1), linear_dispatch(total * lanes, wg), bindings, uniforms,
                   loop_trips=loop_trips + lanes.bit_length())


#: WGSL's scalar types: name -> (size, alignment) in bytes.
_SCALARS = {"f32": (4, 4), "i32": (4, 4), "u32": (4, 4), "f16": (2, 2), "bool": (4, 4)}
_WORKGROUP_VAR = re.compile(r"\bvar\s*<\s*workgroup\s*>\s*(\w+)\s*:\s*([^;=]+?)\s*;")


def _size_align(t: str, where: str) -> tuple[int, int]:
    """WGSL's SizeOf and AlignOf of the type ``t``: a scalar, ``atomic<T>``, ``vecN<T>``, ``array<T, N>``."""
    t = t.replace(" ", "")
    if t in _SCALARS:
        return _SCALARS[t]
    m = re.fullmatch(r"atomic<(\w+)>", t)
    if m:
        return _size_align(m.group(1), where)
    m = re.fullmatch(r"vec([234])<(\w+)>", t)
    if m:
        n, (size, _) = int(m.group(1)), _size_align(m.group(2), where)
        return n * size, (4 if n == 3 else n) * size
    m = re.fullmatch(r"array<(.+),(\d+)u?>", t)
    if m:
        size, align = _size_align(m.group(1), where)
        return int(m.group(2)) * -(-size // align) * align, align
    raise KernelError(f"{where}: cannot size the workgroup variable type {t!r} (scalars, atomics, vectors and "
                      f"fixed-size arrays of them)")


def workgroup_storage(source: str, where: str = "shader") -> int:
    """Bytes of workgroup memory the WGSL ``source`` declares, as WebGPU counts them against the device's
    ``maxComputeWorkgroupStorageSize``: the sum over its ``var<workgroup>`` declarations of each type's size
    (WGSL's SizeOf) rounded up to 16. Every declaration counts (WebGPU counts those the entry point uses: this is
    at least that). Raises :class:`KernelError` for a type it cannot size (a struct), naming ``where``."""
    source = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    return sum(-(-_size_align(t, f"{where} (var<workgroup> {name})")[0] // 16) * 16
               for name, t in _WORKGROUP_VAR.findall(source))

"""float16 storage, and f16 math in matrix products: the plan-level precision ``"float16"``.

:func:`half_storage` rewrites one :class:`~tflfuse.kernels.base.Program` so that its float tensor bindings
(roles ``input`` and ``output`` declared ``array<f32>``, and the scratch buffers a program lists in
:attr:`~tflfuse.kernels.base.Program.half_scratch`: tensors inside a fused op, such as the fused bottleneck's
expanded tensor) hold IEEE binary16 values (``array<f16>``, WGSL's ``shader-f16`` feature): every read ``x[i]``
becomes ``f32(x[i])`` (except as the whole argument of a conversion to f16, ``f16(x[i])``, which then reads
the f16 value as it is) and every store ``y[i] = v`` becomes ``y[i] = f16(v)`` (``array<vec4<f32>>`` bindings
likewise become ``array<vec4<f16>>``); where ``v`` is a number literal (PADV2's constant), the store holds its
float16 rounding, with an infinity made at run time (:func:`_half_value`: ``f16(1e5f)`` is a shader-creation
error in Tint). Arithmetic, accumulators, workgroup memory, uniforms and the other
scratch buffers (partial sums) stay float32, so a reduction accumulates in f32 and rounds once, at the store,
as LiteRT's GPU delegate does with ``precision_loss_allowed``.

The exception is a :class:`HalfMathProgram`, which the matrix products
(:func:`tflfuse.kernels.gemm.tiled_matmul_program`: 1x1 CONV_2D, FULLY_CONNECTED, BATCH_MATMUL and the fused
bottleneck's products) return, as do the fused bottleneck's resident form, DEPTHWISE_CONV_2D's strips (and
the depthwise conv inside a product) and CONV_2D's strips where
:data:`tflfuse.kernels.fused.resident.RESIDENT_HALF_MATH`, :data:`tflfuse.kernels.conv.DEPTHWISE_HALF_MATH`
and :data:`tflfuse.kernels.conv.CONV_HALF_MATH` are set (:func:`with_half_math`): it carries a second source
whose workgroup memory and multiply-adds are f16, with f32 accumulation across the depth (LiteRT's FP16 mode:
"f16 storage and math with f32 accumulation in reductions"), and :func:`half_storage` rewrites that source
instead. The float32 plan never sees it, so its shaders are the same text with or without this mechanism; and
the kernels that build products need no precision argument (the plan decides the precision after the kernels
made their programs). f16 arithmetic has f16's range: in those forms every partial sum of a run (not only the
result) and every value held as f16 must stay within +-65504. Past it a value is +-inf (NaN after inf - inf),
and a clamping activation after it (RELU6 of -inf is 0) turns that into a finite wrong output; LiteRT's FP16
mode shares the limit.

Every kernel works unchanged because kernels touch storage only by indexing their bindings (``name[expr]``):
the rewrite finds those by the binding names, with brackets balanced and statements ended at ``;``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
from collections.abc import Iterable

import numpy as np

from .base import Binding, KernelError, Program
from .wgsl import F32_INF, F32_NEG_INF, elementwise_program, helpers_for

__all__ = ["HALF_BITS", "HALF_MATH_FORMS", "HALF_STEPS", "HALF_TYPES", "HalfMathProgram", "half_binding_size",
           "half_math_forms", "half_pack_program", "half_programs", "half_storage", "is_half_binding", "with_half_math"]

#: A float binding's element type -> its type in a float16 plan.
HALF_TYPES = {"f32": "f16", "vec4<f32>": "vec4<f16>"}
#: The f16-arithmetic forms, each on by default only where timed faster on a GPU: name -> (module, its switch).
HALF_MATH_FORMS = {"resident": ("tflfuse.kernels.fused.resident", "RESIDENT_HALF_MATH"),
                   "depthwise": ("tflfuse.kernels.conv", "DEPTHWISE_HALF_MATH"),
                   "conv": ("tflfuse.kernels.conv", "CONV_HALF_MATH")}
#: The f16 multiply-adds of a float16 form's partial sum before it is added into float32, at most, in the forms
#: written for it outside the matrix products (the fused bottleneck's resident form, DEPTHWISE_CONV_2D's strips
#: and the depthwise conv in a product's A staging, CONV_2D's strips): the steps of the largest tile's slice of
#: :mod:`tflfuse.kernels.gemm`, whose error bound tests/half_math.py derives.
HALF_STEPS = 16


@dataclasses.dataclass(frozen=True)
class HalfMathProgram(Program):
    """A :class:`~tflfuse.kernels.base.Program` that also carries its float16-plan form: ``half_math``, WGSL
    with the same bindings (still declared f32: :func:`half_storage` retypes them as for any program) whose
    arithmetic is partly f16, valid for the source ``half_math_of`` only. A program derived from it with another
    source (``dataclasses.replace``) no longer matches, and :func:`half_storage` falls back to storage only."""

    half_math: str = dataclasses.field(default="", repr=False, compare=False)
    half_math_of: str = dataclasses.field(default="", repr=False, compare=False)
    #: The float16 form's own ``(workgroup_size, dispatch, loop_trips)`` where it differs from the program's (a
    #: tiled product whose float16 form has its own tile), or ``()``: the program's.
    half_shape: tuple = dataclasses.field(default=(), repr=False, compare=False)
    #: Where the float16 form can run on subgroup matrices (:mod:`tflfuse.kernels.matrix`): a function of a
    #: :class:`~tflfuse.kernels.matrix.SubgroupMatrix` giving that form's WGSL (the same bindings, declared f32)
    #: and its ``(workgroup_size, dispatch, loop_trips)``; else None.
    matrix_math: object = dataclasses.field(default=None, repr=False, compare=False)


@contextlib.contextmanager
def half_math_forms(forms: Iterable[str]):
    """Within the ``with`` block, the forms of :data:`HALF_MATH_FORMS` named in ``forms`` are on and the others
    off; each switch is restored after it. Kernels read their switch when they make their programs, so a plan
    keeps the forms it was planned with (a benchmark's A/B: ``benchmarks/half_math_ab.py``).

    Raises:
      ValueError: a name that is not one of :data:`HALF_MATH_FORMS`.
    """
    forms = set(forms)
    if forms - set(HALF_MATH_FORMS):
        raise ValueError(f"unknown f16-arithmetic forms {sorted(forms - set(HALF_MATH_FORMS))}; "
                         f"the forms are {sorted(HALF_MATH_FORMS)}")
    modules = {name: importlib.import_module(module) for name, (module, _) in HALF_MATH_FORMS.items()}
    before = {name: getattr(modules[name], switch) for name, (_, switch) in HALF_MATH_FORMS.items()}
    try:
        for name, (_, switch) in HALF_MATH_FORMS.items():
            setattr(modules[name], switch, name in forms)
        yield
    finally:
        for name, (_, switch) in HALF_MATH_FORMS.items():
            setattr(modules[name], switch, before[name])


def with_half_math(program: Program, half_math: str, shape: tuple = (), matrix_math=None) -> HalfMathProgram:
    """``program`` as a :class:`HalfMathProgram` whose float16 form is the WGSL ``half_math`` (the same bindings,
    declared f32), valid for ``program``'s source; with ``shape``, ``(workgroup_size, dispatch, loop_trips)``, the
    float16 form's own workgroup and dispatch (:attr:`HalfMathProgram.half_shape`); with ``matrix_math``, its form
    on subgroup matrices (:attr:`HalfMathProgram.matrix_math`). Raises ``ValueError`` for a ``shape`` of another
    form."""
    shape = tuple(shape)
    if shape and not (len(shape) == 3 and all(isinstance(v, tuple) and len(v) == 3 and
                                              all(isinstance(n, int) and n > 0 for n in v) for v in shape[:2])
                      and isinstance(shape[2], int) and shape[2] >= 0):
        raise ValueError(f"{program.name}: a float16 form's shape is ((x, y, z) workgroup size, (x, y, z) dispatch, "
                         f"loop trips), positive ints, got {shape!r}")
    return HalfMathProgram(**{f.name: getattr(program, f.name) for f in dataclasses.fields(Program)},
                           half_math=half_math, half_math_of=program.source, half_shape=shape,
                           matrix_math=matrix_math)


def is_half_binding(b: Binding, half_scratch: tuple[int, ...] = ()) -> bool:
    """Whether a binding holds a float tensor that the float16 plan stores as f16: an op's input or output, or
    one of its scratch buffers listed in ``half_scratch`` (a program's
    :attr:`~tflfuse.kernels.base.Program.half_scratch`); other scratch buffers stay f32."""
    return b.elem_type in HALF_TYPES and (b.role[0] in ("input", "output")
                                          or (b.role[0] == "scratch" and b.role[1] in half_scratch))


def half_binding_size(elements: int) -> int:
    """Bytes of an ``array<f16>`` binding of ``elements`` values: 2 each, rounded up to WebGPU's multiple of 4."""
    return -(-2 * elements // 4) * 4


#: ``fn half_bits``: the IEEE binary16 bits of a float32 given as its bits, rounded to nearest even (NumPy's
#: ``astype(np.float16)``; IEEE 754's default rounding): from 65520 on +-inf, below 2**-14 a subnormal (exactly
#: half of 2**-24 and less: +-0), NaN a NaN of the same sign with the top ten bits of its payload (1 where those
#: are all 0), as NumPy's own conversion makes it (where NumPy uses the CPU's instruction, a NaN may be quieted). WGSL
#: leaves a conversion of f32 to f16 free to round either way and an out-of-range one undefined, so the rounding
#: is done on the bits.
HALF_BITS = """
fn half_bits(b: u32) -> u32 {
  let sgn = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return sgn | 0x7c00u | max((a >> 13u) & 0x3ffu, 1u); }
  if (a >= 0x477ff000u) { return sgn | 0x7c00u; }
  if (a >= 0x38800000u) {
    let m = a - 0x38000000u;
    return sgn | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
  }
  let e = a >> 23u;
  if (e < 102u) { return sgn; }
  let f = (a & 0x7fffffu) | 0x800000u;
  let shift = 126u - e;
  let q = f >> shift;
  let rest = f & ((1u << shift) - 1u);
  let mid = 1u << (shift - 1u);
  return sgn | (q + select(0u, 1u, rest > mid || (rest == mid && (q & 1u) == 1u)));
}
"""


def half_pack_program(count: int) -> Program:
    """One dispatch that rounds ``count`` float32 values to float16 on the GPU: binding ``x`` (role
    ``("input", 0)``, ``array<u32>``, the float32 bits, ``4 * count`` bytes) into ``y`` (role ``("output", 0)``,
    ``array<u32>``, two float16 values a word, the lower half first, :func:`half_binding_size` bytes; an odd
    count's last word holds a zero above its value), each value as :data:`HALF_BITS` rounds it: the values
    ``np.float32(x).astype(np.float16)`` gives, NaN as a NaN. A float16 plan's inputs go through it at the start
    of each run (:class:`tflfuse.runtime.plan.ExecutionPlan`), so that the host uploads float32 as it is rather
    than rounding on the CPU. Raises :class:`KernelError` for a ``count`` below 1."""
    if not isinstance(count, int) or count < 1:
        raise KernelError(f"half_pack_program takes a count of at least 1 value, got {count!r}")
    words = -(-count // 2)
    bindings = (Binding("x", ("input", 0), "read", "u32", 4 * count),
                Binding("y", ("output", 0), "read_write", "u32", half_binding_size(count)))
    high = "half_bits(x[i + 1u])" if count % 2 == 0 else \
        f"select(0u, half_bits(x[min(i + 1u, {count - 1}u)]), i + 1u < {count}u)"
    body = f"""  let i = 2u * idx;
  y[idx] = half_bits(x[i]) | ({high} << 16u);"""
    return elementwise_program("FLOAT16_INPUT", bindings, words, body, helpers=HALF_BITS, workgroup=256)


def half_programs(kernel, matrix=None) -> list[Program]:
    """A kernel's programs as a float16 plan runs them (:func:`half_storage` of each, on the device's subgroup
    matrices ``matrix`` where not None, a :class:`~tflfuse.kernels.matrix.SubgroupMatrix`), checked against its
    :meth:`~tflfuse.kernels.base.Kernel.half_scratch`: every float binding of a listed scratch buffer is f16 and
    every other scratch binding keeps its type, so that two programs never read one buffer in two precisions
    and the buffer's size (halved for the listed ones) fits every binding.

    Raises:
      KernelError: a program's binding disagrees (its ``Program.half_scratch`` does not match the kernel's), or
        the kernel lists a scratch buffer that holds no floats; the message names the op and the program.
    """
    halves = set(kernel.half_scratch())
    floats = (*HALF_TYPES, *HALF_TYPES.values())
    programs = []
    for prog in kernel.programs():
        prog = half_storage(prog, matrix)
        for b in prog.bindings:
            if b.role[0] != "scratch":
                continue
            listed = b.role[1] in halves
            if (b.elem_type not in floats and listed) or (b.elem_type in floats and ("f16" in b.elem_type) != listed):
                raise KernelError(f"{kernel.key} (program {prog.name}): scratch buffer {b.role[1]} is bound as "
                                  f"{b.elem_type}, but the kernel's half_scratch() {sorted(halves)} says "
                                  f"otherwise (Program.half_scratch; only float scratch buffers can be listed)")
        programs.append(prog)
    return programs


def half_storage(program: Program, matrix=None) -> Program:
    """``program`` with its float tensor bindings as ``array<f16>`` (see the module docstring), from its
    ``half_math`` source (and workgroup and dispatch, :attr:`HalfMathProgram.half_shape`) where it is a
    :class:`HalfMathProgram` made for its current source, or from its form on subgroup matrices
    (:attr:`HalfMathProgram.matrix_math`) where it has one and ``matrix`` (the device's
    :class:`~tflfuse.kernels.matrix.SubgroupMatrix`) is not None; a plain Program.

    Raises:
      KernelError: a float binding is used other than by indexing (``&x``, ``arrayLength``), is not declared
        by :func:`~tflfuse.kernels.wgsl.prelude`, or its brackets do not balance; the message names the
        program and the binding.
    """
    types = {b.name: b.elem_type for b in program.bindings if is_half_binding(b, program.half_scratch)}
    math = isinstance(program, HalfMathProgram) and program.half_math and program.half_math_of == program.source
    if not types and not math:
        return program
    half_source, half_shape = (program.half_math, program.half_shape) if math else (program.source, ())
    if math and matrix is not None and program.matrix_math is not None:
        half_source, half_shape = program.matrix_math(matrix)
    # comments carry no code, and may hold a binding's name
    source = _COMMENT.sub("", half_source)
    for name, t in types.items():
        declaration = f"> {name}: array<{t}>;"
        if source.count(declaration) != 1:
            raise KernelError(f"{program.name} (binding {name!r}): not declared once as array<{t}> by "
                              f"wgsl.prelude, so the float16 storage rewrite cannot retype it")
        source = source.replace(declaration, f"> {name}: array<{HALF_TYPES[t]}>;")
    source = _rewrite_scoped(source, types, program.name) if types else source
    directives = _DIRECTIVES.match(source).group(0)   # WGSL's directives come before any declaration
    source = "enable f16;\n" + directives + helpers_for(source) + source[len(directives):]
    bindings = tuple(dataclasses.replace(b, elem_type=HALF_TYPES[b.elem_type], size=half_binding_size(b.size // 4))
                     if is_half_binding(b, program.half_scratch) else b for b in program.bindings)
    shape = dict(zip(("workgroup_size", "dispatch", "loop_trips"), half_shape))
    # a Program again: its source is final, and no float16 form of it remains to choose
    return Program(**{f.name: getattr(program, f.name) for f in dataclasses.fields(Program)} | {
        "source": source, "bindings": bindings} | shape)


_CLOSE = {"[": "]", "(": ")", "{": "}"}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
#: A source's leading directives (``enable ...;``, ``diagnostic(...);``).
_DIRECTIVES = re.compile(r"(?:\s*(?:enable\s[^;]*;|diagnostic\s*\([^)]*\)\s*;))*")
_ASSIGN = re.compile(r"\s*([-+*/]?=)(?!=)")


def _matching(s: str, i: int, where: str) -> int:
    """The index of the bracket closing the one at ``s[i]``."""
    depth = []
    for j in range(i, len(s)):
        c = s[j]
        if c in _CLOSE:
            depth.append(_CLOSE[c])
        elif c in ")]}":
            if not depth or depth.pop() != c:
                break
            if not depth:
                return j
    raise KernelError(f"{where}: unbalanced brackets after {s[max(0, i - 20):i + 20]!r}")


def _statement_end(s: str, i: int, where: str) -> int:
    """The index of the ``;`` ending the statement whose right-hand side starts at ``s[i]``."""
    j = i
    while j < len(s):
        c = s[j]
        if c in _CLOSE:
            j = _matching(s, j, where) + 1
            continue
        if c == ";":
            return j
        j += 1
    raise KernelError(f"{where}: a store without ';' after {s[max(0, i - 20):i + 20]!r}")


#: A WGSL number literal, as a float (``1.5f``, ``-3.4e+38``, ``0``) or f16 (``2.0h``) one.
_LITERAL = re.compile(r"([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)([fh]?)")
_CONVERSION = re.compile(r"(?:f32|f16|vec[234]<f(?:32|16)>)?\s*\(")


def _half_value(rhs: str, narrow: str) -> str:
    """``{narrow}(rhs)``, the store of ``rhs`` (f32 WGSL) into an f16 binding of type ``narrow``, except where
    ``rhs`` is a number literal (with a sign, brackets, conversions: ``-1e5f``, ``f32(0)``): a constant
    expression, which WGSL's ``f16(...)`` must hold within f16's finite range (Tint refuses ``f16(1e5f)``, a
    shader-creation error; naga lets it pass). That store is given the IEEE float16 rounding of the literal's
    float32 value, ``np.float16(np.float32(c))`` (to nearest even; subnormal where small; +-inf past 65504, as
    LiteRT's GPU delegate holds it in f16): written exactly where finite, and an infinity made at run time
    (:data:`~tflfuse.kernels.wgsl.F32_INF` converted: a call is never a constant expression)."""
    core, negated = rhs.strip(), False
    while True:   # signs, brackets and conversions around the literal (one argument each)
        if core[:1] in "+-" and not _LITERAL.fullmatch(core):
            core, negated = core[1:].strip(), negated != (core[0] == "-")
            continue
        m = _CONVERSION.match(core)
        if m is None or not core.endswith(")") or _matching(core, m.end() - 1, narrow) != len(core) - 1:
            break
        core = core[m.end():-1].strip()
    m = _LITERAL.fullmatch(core)
    if m is None:
        return f"{narrow}({rhs})"
    c = -float(m.group(1)) if negated else float(m.group(1))
    with np.errstate(over="ignore"):   # past f16's range: +-inf, the value wanted
        value = np.float16(c if m.group(2) == "h" else np.float32(c))
    if np.isinf(value):   # an f32 infinity converted (a vector's splat takes an f16)
        inf = f"f16({F32_INF if value > 0 else F32_NEG_INF})"
        return inf if narrow == "f16" else f"{narrow}({inf})"
    return f"{narrow}({float(value)!r})"


_FN = re.compile(r"\bfn\s+\w+\s*\(")
_PARAM = re.compile(r"(\w+)\s*:")


def _rewrite_scoped(s: str, types: dict[str, str], program: str) -> str:
    """:func:`_rewrite` over ``s``, except that inside a function whose parameters take a binding's name
    (``fn f(x: i32)``) that name is the parameter and stays as it is."""
    out, pos = [], 0
    for m in _FN.finditer(s):
        if m.start() < pos:
            continue
        close = _matching(s, m.end() - 1, program)
        shadowed = set(_PARAM.findall(s[m.end():close])) & set(types)
        if not shadowed:
            continue
        body = s.index("{", close)
        end = _matching(s, body, program) + 1
        out.append(_rewrite(s[pos:m.start()], types, program))
        inner = {k: v for k, v in types.items() if k not in shadowed}
        out.append(_rewrite(s[m.start():end], inner, program) if inner else s[m.start():end])
        pos = end
    out.append(_rewrite(s[pos:], types, program))
    return "".join(out)


def _rewrite(s: str, types: dict[str, str], program: str) -> str:
    """``s`` with each read of a binding in ``types`` (name -> its f32 element type) converted to that type
    and each store converted to the binding's f16 type; a read that is the whole argument of a conversion to
    the f16 type (``vec4<f16>(x[i])``, written by a :class:`HalfMathProgram`'s source) stays f16."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, types)) + r")\b(\s*)(\[|[^\[\s:])")
    out, pos = [], 0
    while True:
        m = pattern.search(s, pos)
        if m is None:
            out.append(s[pos:])
            return "".join(out)
        name, where = m.group(1), f"{program} (binding {m.group(1)!r})"
        out.append(s[pos:m.start()])
        if m.group(3) != "[":   # declarations (``x: array<f16>``) do not match; any other use is refused
            raise KernelError(f"{where}: the float16 storage rewrite needs every use of a float binding to "
                              f"index it, found {s[m.start():m.start() + 40]!r}")
        open_at = m.end() - 1
        close = _matching(s, open_at, where)
        access = f"{name}[{_rewrite(s[open_at + 1:close], types, program)}]"
        wide, narrow = types[name], HALF_TYPES[types[name]]
        op = _ASSIGN.match(s, close + 1)
        if op is None:   # a read: as f32, unless it is the whole argument of a conversion to the f16 type
            k = m.start() - len(narrow) - 1   # where "f16(" or "vec4<f16>(" would start
            raw = (k >= 0 and s.startswith(f"{narrow}(", k) and not (k and (s[k - 1].isalnum() or s[k - 1] == "_"))
                   and s.startswith(")", close + 1))
            out.append(access if raw else f"{wide}({access})")
            pos = close + 1
            continue
        rhs_start = op.end()
        end = _statement_end(s, rhs_start, where)
        rhs = _rewrite(s[rhs_start:end], types, program).strip()
        if op.group(1) == "=":
            out.append(f"{access} = {_half_value(rhs, narrow)}")
        else:   # y[i] += v: read, operate in f32, store
            out.append(f"{access} = {narrow}({wide}({access}) {op.group(1)[0]} ({rhs}))")
        pos = end

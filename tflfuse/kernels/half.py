"""float16 storage for any program: the plan-level precision ``"float16"``.

:func:`half_storage` rewrites one :class:`~tflfuse.kernels.base.Program` so that its float tensor bindings
(roles ``input`` and ``output`` declared ``array<f32>``) hold IEEE binary16 values (``array<f16>``, WGSL's
``shader-f16`` feature): every read ``x[i]`` becomes ``f32(x[i])`` and every store ``y[i] = v`` becomes
``y[i] = f16(v)`` (``array<vec4<f32>>`` bindings likewise become ``array<vec4<f16>>``). Arithmetic, accumulators, workgroup memory, uniforms and scratch buffers stay float32, so a
reduction accumulates in f32 and rounds once, at the store, as LiteRT's GPU delegate does with
``precision_loss_allowed`` (its FP16 mode also does the arithmetic in f16; here only storage is halved).

Every kernel works unchanged because kernels touch storage only by indexing their bindings (``name[expr]``):
the rewrite finds those by the binding names, with brackets balanced and statements ended at ``;``.
"""

from __future__ import annotations

import dataclasses
import re

from .base import Binding, KernelError, Program

__all__ = ["HALF_TYPES", "half_binding_size", "half_storage", "is_half_binding"]

#: A float binding's element type -> its type in a float16 plan.
HALF_TYPES = {"f32": "f16", "vec4<f32>": "vec4<f16>"}


def is_half_binding(b: Binding) -> bool:
    """Whether a binding holds a float tensor that the float16 plan stores as f16 (scratch stays f32)."""
    return b.elem_type in HALF_TYPES and b.role[0] in ("input", "output")


def half_binding_size(elements: int) -> int:
    """Bytes of an ``array<f16>`` binding of ``elements`` values: 2 each, rounded up to WebGPU's multiple of 4."""
    return -(-2 * elements // 4) * 4


def half_storage(program: Program) -> Program:
    """``program`` with its float tensor bindings as ``array<f16>`` (see the module docstring).

    Raises:
      KernelError: a float binding is used other than by indexing (``&x``, ``arrayLength``), is not declared
        by :func:`~tflfuse.kernels.wgsl.prelude`, or its brackets do not balance; the message names the
        program and the binding.
    """
    types = {b.name: b.elem_type for b in program.bindings if is_half_binding(b)}
    if not types:
        return program
    source = _COMMENT.sub("", program.source)   # comments carry no code, and may hold a binding's name
    for name, t in types.items():
        declaration = f"> {name}: array<{t}>;"
        if source.count(declaration) != 1:
            raise KernelError(f"{program.name} (binding {name!r}): not declared once as array<{t}> by "
                              f"wgsl.prelude, so the float16 storage rewrite cannot retype it")
        source = source.replace(declaration, f"> {name}: array<{HALF_TYPES[t]}>;")
    source = "enable f16;\n" + _rewrite(source, types, program.name)
    bindings = tuple(dataclasses.replace(b, elem_type=HALF_TYPES[b.elem_type], size=half_binding_size(b.size // 4))
                     if is_half_binding(b) else b for b in program.bindings)
    return dataclasses.replace(program, source=source, bindings=bindings)


_CLOSE = {"[": "]", "(": ")", "{": "}"}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
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


def _rewrite(s: str, types: dict[str, str], program: str) -> str:
    """``s`` with each read of a binding in ``types`` (name -> its f32 element type) converted to that type
    and each store converted to the binding's f16 type."""
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
        if op is None:   # a read
            out.append(f"{wide}({access})")
            pos = close + 1
            continue
        rhs_start = op.end()
        end = _statement_end(s, rhs_start, where)
        rhs = _rewrite(s[rhs_start:end], types, program).strip()
        if op.group(1) == "=":
            out.append(f"{access} = {narrow}({rhs})")
        else:   # y[i] += v: read, operate in f32, store
            out.append(f"{access} = {narrow}({wide}({access}) {op.group(1)[0]} ({rhs}))")
        pos = end

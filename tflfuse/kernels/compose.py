"""Kernels for a user's own composite without writing a :class:`~tflfuse.kernels.Kernel` class.

Two conveniences, both registering a kernel under the composite's op name (so :class:`tflfuse.Interpreter`
runs the fused op) and both reading the op's attributes with :func:`tflfuse.annotate.decode_attrs`:

* :func:`register_elementwise`: a kernel from one WGSL expression over the inputs (``x0``, ``x1``... broadcast
  NumPy-style) and float attributes passed as uniforms (one pipeline serves every attribute value).
* :func:`register_composition`: a kernel made of existing kernels run one after another (CONV_2D then ADD, a
  TRANSPOSE of a weight then CONV_2D...) as the programs of ONE op, intermediates in scratch buffers. ``build``
  describes the chain on a :class:`Chain` from the op's input specs and attributes; nothing runs on a GPU then.

Writing a whole kernel (a :class:`~tflfuse.kernels.Kernel` subclass with ``output_specs`` and ``programs``) is
described in ``docs/custom_kernels.md``. Every way raises ``ValueError`` for an op name already registered.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from .base import Binding, CompositeKernel, Kernel, KernelError, Program, TensorSpec, Uniform
from .elementwise import broadcast_index
from .registry import kernel_class, register, supported_ops
from .wgsl import elementwise_program

__all__ = ["Chain", "Value", "register_composition", "register_elementwise"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_new_key(name) -> None:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"op name must be an identifier (the composite's name), got {name!r}")
    if name in supported_ops():
        raise ValueError(f"a kernel for {name!r} is already registered ({kernel_class(name).__name__}); one op "
                         f"name has one kernel: name the composite and its kernel differently")



# ---- elementwise ---------------------------------------------------------------------------------------
def register_elementwise(name: str, expression: str, *, inputs: int = 1, uniforms: Sequence[str] = (),
                         helpers: str = "") -> type[Kernel]:
    """Registers a kernel computing ``y = expression`` per element for the custom op ``name``.

    Args:
      name: the op name (the composite's name).
      expression: a WGSL ``f32`` expression over ``x0 .. x{inputs-1}`` (``x`` is ``x0``) and the names in
        ``uniforms``, e.g. ``"alpha * tanh(x0) + x1"``.
      inputs: number of op inputs, float32 tensors broadcast NumPy-style; the output has the broadcast shape.
      uniforms: float attributes of the composite read by the expression (passed as uniforms).
      helpers: WGSL functions the expression calls.
    Returns:
      The registered :class:`~tflfuse.kernels.Kernel` subclass.
    Raises:
      ValueError: ``name`` already registered or not an identifier; a bad ``inputs`` or uniform name.
      (A WGSL error shows when the op is planned: :class:`tflfuse.ShaderCompileError` naming the op.)
    """
    _check_new_key(name)
    if type(inputs) is not int or inputs < 1:
        raise ValueError(f"inputs must be a positive int, got {inputs!r}")
    uniforms = tuple(uniforms)
    for u in uniforms:
        if not isinstance(u, str) or not _IDENT.match(u) or re.fullmatch(r"x\d*|y|idx|params", u):
            raise ValueError(f"uniform name {u!r} must be an identifier other than x, x0.., y, idx, params")
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"expression must be a non-empty WGSL expression, got {expression!r}")

    class ElementwiseKernel(CompositeKernel):
        input_names = tuple(f"x{i}" for i in range(inputs))
        required_attrs = uniforms

        def check(self):
            if len(self.inputs) != inputs:
                raise self.fail(f"expects {inputs} input(s), got {len(self.inputs)}")
            shapes = [self.expect_rank(i, *range(0, 7)).shape for i in range(inputs)]
            try:
                self.out = tuple(np.broadcast_shapes(*shapes))
            except ValueError:
                raise self.fail(f"input shapes {[list(s) for s in shapes]} do not broadcast") from None
            for u in uniforms:
                float(self.attr(u))

        def output_specs(self):
            return (TensorSpec(self.out),)

        def programs(self):
            names = [f"in{i}" for i in range(inputs)]
            body = "".join(broadcast_index(self.out, self.input(i).shape, f"i{i}") + f"  let x{i} = in{i}[i{i}];\n"
                           for i in range(inputs))
            body += "  let x = x0;\n" + "".join(f"  let {u} = params.{u};\n" for u in uniforms)
            body += f"  y[idx] = {expression};"
            unis = tuple(Uniform(u, "f32", float(self.attr(u))) for u in uniforms)
            return [elementwise_program(self.key, self.io_bindings(names + ["y"]), int(np.prod(self.out)), body,
                                        helpers, uniforms=unis)]

    ElementwiseKernel.__name__ = ElementwiseKernel.__qualname__ = f"Elementwise_{name}"
    ElementwiseKernel.__doc__ = f"{name}: y = {expression} per element ({inputs} input(s), broadcast)."
    ElementwiseKernel.key = name
    return register(name)(ElementwiseKernel)


# ---- composition ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """A tensor of a composition: an op input or a step's output. ``spec`` gives its shape and dtype."""

    spec: TensorSpec
    source: tuple  # ("input", i) or ("step", j, k)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape


@dataclasses.dataclass
class _Step:
    key: str
    kernel: Kernel
    inputs: list            # Value or None per kernel input
    outputs: list[Value]


class Chain:
    """Records the steps of a composition; ``build`` calls :meth:`call` once per step.

    Args:
      op: the op name, for messages.
    """

    def __init__(self, op: str):
        self.op = op
        self.steps: list[_Step] = []

    def call(self, key: str, inputs: Sequence[Value | None], **attrs) -> Value | tuple[Value, ...]:
        """Adds a step running the registered kernel ``key`` on ``inputs`` with ``attrs``.

        Args:
          key: an op name with a kernel (``"CONV_2D"``, ``"ADD"``, ``"TRANSPOSE"``, a fused op, another
            composition...).
          inputs: :class:`Value` s in the kernel's input order; ``None`` for an absent optional input. Inputs that
            the kernel reads at plan time (``static_inputs``: TRANSPOSE's ``perm``, MEAN's ``axis``, PAD's
            ``paddings``) are given as attributes instead (``None`` or nothing in their slot).
          **attrs: the kernel's attributes as in a .tflite, snake_case (``padding="SAME"``, ``stride_h=1``,
            ``fused_activation_function="RELU"``).
        Returns:
          The step's output :class:`Value` (a tuple of them for a kernel with several outputs).
        Raises:
          UnsupportedOpError: no kernel for ``key``.
          KernelError: shapes or attributes the kernel refuses (the message names the op and the step), a value in
            a static slot, or a kernel that computes only by folding constants at load (SHAPE).
        """
        cls = kernel_class(key, where=f"step {len(self.steps)} of composition {self.op!r}")
        where = f"{self.op} step {len(self.steps)} ({key})"
        inputs = list(inputs)
        for pos in cls.static_inputs:
            if pos < len(inputs) and inputs[pos] is not None:
                raise KernelError(f"{where}: input {pos} ({cls.static_inputs[pos]}) is read at plan time; give it "
                                  f"as the attribute {cls.static_inputs[pos]}=..., not as a value")
            if pos >= len(inputs) and pos < len(cls.input_names):
                inputs += [None] * (pos + 1 - len(inputs))
        for i, v in enumerate(inputs):
            if v is not None and not isinstance(v, Value):
                raise TypeError(f"{where}: input {i} must be a Value (an op input or a step's output) or None, "
                                f"got {type(v).__name__}")
        try:
            kernel = cls([None if v is None else v.spec for v in inputs], attrs)
            outs = kernel.output_specs()
        except KernelError as e:
            raise KernelError(f"{where}: {e}") from None
        if getattr(kernel, "folds_from_shape", False):
            raise KernelError(f"{where}: this op is computed only by folding at load; it cannot be a step")
        j = len(self.steps)
        values = [Value(s, ("step", j, k)) for k, s in enumerate(outs)]
        self.steps.append(_Step(key, kernel, inputs, values))
        return values[0] if len(values) == 1 else tuple(values)


class ComposedKernel(CompositeKernel):
    """Base of the kernels :func:`register_composition` makes; ``build`` is set per subclass."""

    build: Callable = None  # type: ignore[assignment]

    def check(self):
        attrs = {**self.attr_defaults, **self.attrs}
        self.chain = Chain(self.key)
        ins = [None if s is None else Value(s, ("input", i)) for i, s in enumerate(self.inputs)]
        try:
            outs = type(self).build(self.chain, *ins, **attrs)
        except (TypeError, ValueError) as e:
            if isinstance(e, KernelError):
                raise
            raise self.fail(f"build raised {type(e).__name__}: {e}") from e
        outs = (outs,) if isinstance(outs, Value) else tuple(outs or ())
        if not outs or not all(isinstance(v, Value) for v in outs):
            raise self.fail(f"build must return a Value or a sequence of Values (the op's outputs), got {outs!r}")
        self.outs = outs
        self._place()

    def _place(self) -> None:
        """Where each value lives: op input/output or a scratch slot; copies for outputs no step writes."""
        loc: dict[int, tuple[str, int]] = {}
        for v in self._op_inputs():
            loc[id(v)] = v.source
        final = {}
        for m, v in enumerate(self.outs):
            final.setdefault(id(v), m)
        self.copies: list[tuple[Value, int]] = []   # (value, output index) written by a copy program
        self.scratch: list[int] = []
        self.step_scratch: list[int] = []
        for step in self.chain.steps:
            for v in step.outputs:
                if step.kernel.view:
                    src = step.inputs[0]
                    loc[id(v)] = loc[id(src)]
                elif id(v) in final:
                    loc[id(v)] = ("output", final.pop(id(v)))
                else:
                    loc[id(v)] = ("scratch", len(self.scratch))
                    self.scratch.append(max(v.spec.nbytes, 4))
        for m, v in enumerate(self.outs):
            if loc.get(id(v)) != ("output", m):
                if id(v) not in loc:
                    raise self.fail(f"output {m} of build is not a value of this composition")
                self.copies.append((v, m))
        for step in self.chain.steps:
            self.step_scratch.append(len(self.scratch))
            self.scratch.extend(step.kernel.scratch_sizes())
        self.loc = loc

    def _op_inputs(self) -> list[Value]:
        seen = {}
        for step in self.chain.steps:
            for v in step.inputs:
                if v is not None and v.source[0] == "input":
                    seen[id(v)] = v
        for v in self.outs:
            if v.source[0] == "input":
                seen[id(v)] = v
        return list(seen.values())

    def output_specs(self):
        return tuple(v.spec for v in self.outs)

    def scratch_sizes(self):
        return tuple(self.scratch)

    def half_scratch(self):
        """The steps' own :meth:`~tflfuse.kernels.base.Kernel.half_scratch` buffers, at their places among the
        composition's scratch buffers (the values passed between steps stay float32)."""
        return tuple(self.step_scratch[j] + k for j, step in enumerate(self.chain.steps)
                     for k in step.kernel.half_scratch())

    def programs(self):
        progs: list[Program] = []
        for j, step in enumerate(self.chain.steps):
            for p in step.kernel.programs():
                binds = tuple(self._remap(b, j, step) for b in p.bindings)
                progs.append(dataclasses.replace(p, name=f"{self.key}/{j}_{p.name}", bindings=binds,
                                                 half_scratch=tuple(self.step_scratch[j] + k
                                                                    for k in p.half_scratch)))
        for v, m in self.copies:
            kind, index = self.loc[id(v)]
            src = Binding("x", (kind, index), "read", v.spec.wgsl_type, v.spec.nbytes)
            dst = Binding("y", ("output", m), "read_write", v.spec.wgsl_type, v.spec.nbytes)
            progs.append(elementwise_program(f"{self.key}/copy{m}", (src, dst), v.spec.size, "  y[idx] = x[idx];"))
        return progs

    def _remap(self, b: Binding, j: int, step: _Step) -> Binding:
        kind, k = b.role
        if kind == "scratch":
            role = ("scratch", self.step_scratch[j] + k)
        else:
            v = step.inputs[k] if kind == "input" else step.outputs[k]
            role = self.loc[id(v)]
        return dataclasses.replace(b, role=role)


def register_composition(name: str, build: Callable[..., Value | Sequence[Value]], *,
                         attrs: Mapping[str, object] | None = None,
                         input_names: Sequence[str] = ()) -> type[Kernel]:
    """Registers, for the custom op ``name``, a kernel that runs a chain of existing kernels as one op.

    Args:
      name: the op name (the composite's name).
      build: ``build(chain, *inputs, **attrs) -> Value | [Value, ...]``: ``inputs`` are the op's inputs as
        :class:`Value` s (``.shape``, ``.spec``; ``None`` where absent), ``attrs`` the op's attributes (decoded from
        the file; ``attrs`` below fills the missing ones). It calls :meth:`Chain.call` per step and returns the
        op's outputs. It runs when a model is planned, on static shapes, so it may branch on them.
      attrs: defaults of the op's attributes (also what ``tflfuse.get_shader`` accepts).
      input_names: names of the op's inputs, for listings and the input-count check.
    Returns:
      The registered :class:`~tflfuse.kernels.Kernel` subclass.
    Raises:
      ValueError: ``name`` already registered or not an identifier; ``build`` not callable.

    Every step's programs become programs of the op, in order; a step's output lives in a scratch buffer of the
    op (or in the op's output buffer when it is an output). Views (RESHAPE) cost nothing; an output that no
    step writes (an input, a view) is copied.
    """
    _check_new_key(name)
    if not callable(build):
        raise ValueError(f"build must be callable, got {type(build).__name__}")
    cls = type(f"Composed_{name}", (ComposedKernel,), {
        "key": name, "build": staticmethod(build), "attr_defaults": dict(attrs or {}),
        "input_names": tuple(input_names),
        "__doc__": f"{name}: a composition of existing kernels ({getattr(build, '__name__', 'build')})."})
    return register(name)(cls)

"""The kernel abstraction: frozen op parameters in, WGSL programs out.

A :class:`Kernel` is built from the static description of one op: its input :class:`TensorSpec` s and
its attributes. From those alone it derives the output specs and a list of :class:`Program` s, the
dispatches that compute the op, each with its WGSL source, workgroup size, dispatch size and bindings.
Nothing here touches a GPU, so ``tflfuse.get_shader`` and the interpreter share one code path.

A program's cache key is its WGSL text (shapes and attributes are baked into the source), so no key is
maintained by hand beside the code it describes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import struct
from typing import ClassVar, Mapping, Sequence

__all__ = [
    "Binding", "CompositeKernel", "Kernel", "KernelError", "Program", "TensorSpec", "Uniform", "linear_dispatch",
    "CLAMPED_ACTIVATION_OPS", "MAX_INDEXED_VALUES", "MAX_WORKGROUPS_PER_DIM", "clamped_activation", "is_integral",
    "pack_uniforms", "uniform_layout",
]

#: Builtin ops whose TFLite kernels turn the fused activation into a clamp range (CalculateActivationRange,
#: tensorflow/lite/kernels/kernel_util.h), where TANH and SIGN_BIT are no clamp (:func:`clamped_activation`).
CLAMPED_ACTIVATION_OPS = frozenset({"ADD", "AVERAGE_POOL_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "DIV", "MAX_POOL_2D",
                                    "MUL", "SUB", "TRANSPOSE_CONV"})


def clamped_activation(op: str, activation):
    """A builtin op's fused activation as LiteRT computes it: ``"NONE"`` for TANH and SIGN_BIT on
    :data:`CLAMPED_ACTIVATION_OPS` (their kernels clamp to the activation's range, and these have none), else
    ``activation`` as it is."""
    if op in CLAMPED_ACTIVATION_OPS and str(activation).upper() in ("TANH", "SIGN_BIT"):
        return "NONE"
    return activation


#: WebGPU's default ``maxComputeWorkgroupsPerDimension``.
MAX_WORKGROUPS_PER_DIM = 65535
#: Values one tensor or scratch buffer of a program may hold: WGSL has no 64-bit integers, so shaders index them
#: with u32 and write their sizes into the source as u32 literals (:meth:`Kernel.check_indexing`).
MAX_INDEXED_VALUES = 1 << 32
#: WebGPU's default ``maxComputeWorkgroupStorageSize`` (bytes): every kernel's workgroup memory fits it, so that a
#: plan runs on any adapter.
MAX_WORKGROUP_STORAGE = 16384
#: WebGPU's default ``maxStorageBufferBindingSize`` (bytes), which every adapter grants: where a schedule has a
#: choice, it keeps its scratch within it (a :class:`~tflfuse.runtime.device.Device` may grant more).
DEFAULT_MAX_STORAGE_BINDING = 128 << 20

#: dtype name -> WGSL storage element type. bool tensors (1 byte per element in a .tflite) are held as one i32
#: per element, 0 or 1: WGSL storage has no 8-bit type; int8 and uint8 (quantized) tensors likewise, one value
#: per i32 (-128..127, 0..255), so that kernels that only move values run on them unchanged.
_WGSL_TYPES = {"float32": "f32", "int32": "i32", "uint32": "u32", "bool": "i32", "int8": "i32", "uint8": "i32"}


class KernelError(ValueError):
    """An op's shapes, dtypes or attributes are not what its kernel supports; the message names the op."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The static description of a tensor: shape (e.g. ``(N, H, W, C)``) and dtype name."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise KernelError(f"tensor shape {list(self.shape)} has a negative dimension")

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * 4

    @property
    def wgsl_type(self) -> str:
        try:
            return _WGSL_TYPES[self.dtype]
        except KeyError:
            raise KernelError(f"dtype {self.dtype} has no WGSL storage type") from None


@dataclasses.dataclass(frozen=True)
class Binding:
    """One storage buffer of a program.

    ``role`` says which buffer the runtime binds: ``("input", i)``, ``("output", i)`` or ``("scratch", i)``.
    ``access`` is ``"read"`` or ``"read_write"``; ``size`` is in bytes.
    """

    name: str
    role: tuple[str, int]
    access: str
    elem_type: str
    size: int


_UNIFORM_FORMATS = {"f32": "f", "i32": "i", "u32": "I"}


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A member of a program's uniform block (binding after the storage buffers): a scalar of ``type``
    (``"f32"``, ``"i32"`` or ``"u32"``), or, where ``value`` is a tuple, an array of them held as
    ``array<vec4<type>, ceil(n / 4)>`` (WGSL's uniform arrays have a 16-byte stride, so four elements share
    a vec4: element ``i`` is ``params.name[i / 4][i % 4]``)."""

    name: str
    type: str
    value: float | int | tuple

    @property
    def is_array(self) -> bool:
        return isinstance(self.value, tuple)

    @property
    def wgsl_type(self) -> str:
        return f"array<vec4<{self.type}>, {self.nbytes // 16}>" if self.is_array else self.type

    @property
    def align(self) -> int:
        """Its alignment in the block, bytes (WGSL's: 16 for an array of vec4, 4 for a scalar)."""
        return 16 if self.is_array else 4

    @property
    def nbytes(self) -> int:
        return 16 * max(1, -(-len(self.value) // 4)) if self.is_array else 4

    def pack(self) -> bytes:
        fmt = _UNIFORM_FORMATS[self.type]
        if not self.is_array:
            return struct.pack("<" + fmt, self.value)
        values = list(self.value) + [0] * (self.nbytes // 4 - len(self.value))
        return struct.pack(f"<{len(values)}{fmt}", *values)


def uniform_layout(uniforms: Sequence[Uniform]) -> tuple[list[int], int]:
    """The byte offset of each member of a uniform block, in order, with WGSL's alignment rules, and the
    block's size (a multiple of 16)."""
    offsets, end = [], 0
    for u in uniforms:
        offsets.append(-(-end // u.align) * u.align)
        end = offsets[-1] + u.nbytes
    return offsets, -(-end // 16) * 16


def pack_uniforms(uniforms: Sequence[Uniform]) -> bytes:
    """The bytes of a uniform block (little-endian, laid out by :func:`uniform_layout`)."""
    offsets, size = uniform_layout(uniforms)
    data = bytearray(size)
    for u, off in zip(uniforms, offsets):
        packed = u.pack()
        data[off:off + len(packed)] = packed
    return bytes(data)


@dataclasses.dataclass(frozen=True)
class Program:
    """One dispatch: WGSL source, entry point, workgroup size, dispatch size (workgroups) and bindings."""

    name: str
    source: str
    workgroup_size: tuple[int, int, int]
    dispatch: tuple[int, int, int]
    bindings: tuple[Binding, ...]
    uniforms: tuple[Uniform, ...] = ()
    entry_point: str = "main"
    #: Loop iterations one invocation runs, at most (0: few). The software adapter silently stops an
    #: invocation's loops after 65,535 iterations in all; the plan refuses programs past a device's limit.
    loop_trips: int = 0
    #: The indices of the op's scratch buffers (roles ``("scratch", i)``) that hold a tensor's values rather
    #: than sums, e.g. the fused bottleneck's expanded tensor: a float16 plan stores those as f16, as it stores
    #: the unfused graph's tensors (:func:`tflfuse.kernels.half.half_storage`): the kernel's
    #: :meth:`Kernel.half_scratch`, in every program of the op that binds one of them (the plan checks).
    half_scratch: tuple[int, ...] = ()

    @property
    def cache_key(self) -> str:
        """The pipeline cache key: a digest of the source text, which holds every parameter."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def uniform_bytes(self) -> bytes:
        return pack_uniforms(self.uniforms)


def is_integral(value) -> bool:
    """Whether an attribute value is an integer: an int or a float with no fraction, not a bool or a str
    (``int("01")`` and ``int(2.5)`` would otherwise pass as 1 and 2)."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and float(value).is_integer()


def linear_dispatch(invocations: int, workgroup: int) -> tuple[int, int, int]:
    """A dispatch size for ``invocations`` threads in 1-D workgroups of ``workgroup`` threads.

    Counts past 65,535 workgroups spill into y and z; shaders rebuild the linear index with
    :func:`tflfuse.kernels.wgsl.linear_index`.
    """
    groups = max(1, -(-invocations // workgroup))
    if groups <= MAX_WORKGROUPS_PER_DIM:
        return (groups, 1, 1)
    y = -(-groups // MAX_WORKGROUPS_PER_DIM)
    if y <= MAX_WORKGROUPS_PER_DIM:
        return (MAX_WORKGROUPS_PER_DIM, y, 1)
    z = -(-y // MAX_WORKGROUPS_PER_DIM)
    if z > MAX_WORKGROUPS_PER_DIM:
        raise KernelError(f"{invocations} invocations exceed what one dispatch can address")
    return (MAX_WORKGROUPS_PER_DIM, MAX_WORKGROUPS_PER_DIM, z)


class Kernel:
    """Base class of every kernel. Subclasses are registered with :func:`tflfuse.kernels.register`.

    Class attributes:
      key: the op name as it stands in a .tflite (``"CONV_2D"``, ``"fused_bottleneck"``).
      static_inputs: input index -> attribute name, for inputs that must be constant and are read at
        plan time (PAD's paddings, MEAN's axis); the planner moves them into ``attrs`` as lists.
      optional_inputs: input indices that may be absent (-1 in the file), e.g. a conv's bias.
      view: True for ops whose output is the input's buffer re-shaped (RESHAPE): no programs run.

    An op whose outputs all have no elements (a batch, a channel count or a spatial size of 0) has nothing to
    compute: :meth:`programs`, :meth:`scratch_sizes` and :meth:`half_scratch` give nothing for it, whatever a
    subclass defines (they are wrapped where the subclass is made), and the planner dispatches nothing; its
    outputs read back empty, as LiteRT gives them. A kernel whose outputs are some empty, some not, and one
    whose inputs are empty (a reduction over no elements), computes as its own methods say. Before a subclass's
    :meth:`programs` runs, :meth:`check_indexing` refuses tensors and scratch buffers too large for u32 indices.

    Args:
      inputs: the specs of the op's runtime inputs, in the op's input order (absent optional inputs are
        ``None``; static inputs are left out of the computation but keep their slot as ``None``).
      attrs: the op's attributes (builtin options with snake_case keys, or a composite's attributes).
    Raises:
      KernelError: shapes, dtypes or attributes the kernel does not support; the message names the op.
    """

    key: ClassVar[str] = ""
    static_inputs: ClassVar[Mapping[int, str]] = {}
    optional_inputs: ClassVar[frozenset[int]] = frozenset()
    view: ClassVar[bool] = False
    #: input index -> attribute: inputs the kernel takes at run time whose constant values the planner also passes
    #: as that attribute, for TFLite's invoke-time checks (GATHER's indices); :meth:`check_values` checks values
    #: set from the host.
    constant_attrs: ClassVar[Mapping[int, str]] = {}
    #: (name, description) pairs of the expected inputs, for listings and error messages.
    input_names: ClassVar[Sequence[str]] = ()
    #: attribute name -> default value; attributes not listed are rejected by :meth:`attr`.
    attr_defaults: ClassVar[Mapping[str, object]] = {}
    #: attributes without a default that the kernel needs (e.g. a pool's window).
    required_attrs: ClassVar[Sequence[str]] = ()
    #: other attributes the kernel reads: ones the planner derives from the file (quantization, sparsity)
    #: and tuning knobs.
    extra_attrs: ClassVar[Sequence[str]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in _PLANNED:
            if name in cls.__dict__:
                setattr(cls, name, _planned(cls.__dict__[name]))

    def __init__(self, inputs: Sequence[TensorSpec | None], attrs: Mapping | None = None):
        self.inputs = tuple(inputs)
        self.attrs = dict(attrs or {})
        self.check()
        if "fused_activation_function" in self.attr_defaults:  # refused here, not when the WGSL is made
            from .wgsl import ACTIVATIONS

            act = clamped_activation(self.key, self.attr("fused_activation_function"))
            if act != self.attr("fused_activation_function"):
                self.attrs["fused_activation_function"] = act
            if str(act or "none").lower() not in ACTIVATIONS:
                raise self.fail(f"unsupported fused activation {act!r}; supported: {sorted(ACTIVATIONS)}")

    @classmethod
    def known_attrs(cls) -> frozenset[str]:
        """Every attribute name the kernel reads (``get_shader`` rejects others, naming these)."""
        return frozenset(cls.attr_defaults) | frozenset(cls.static_inputs.values()) | \
            frozenset(cls.required_attrs) | frozenset(cls.extra_attrs)

    # ---- to override -----------------------------------------------------------------------------
    def check(self) -> None:
        """Validates shapes and attributes; raises :class:`KernelError`."""

    def output_specs(self) -> tuple[TensorSpec, ...]:
        raise NotImplementedError

    def programs(self) -> list[Program]:
        """The dispatches that compute the op, in order."""
        raise NotImplementedError

    def scratch_sizes(self) -> tuple[int, ...]:
        """Bytes of each scratch buffer the programs use (``("scratch", i)`` bindings), as float32."""
        return ()

    def half_scratch(self) -> tuple[int, ...]:
        """The indices of :meth:`scratch_sizes` that hold a tensor's values rather than sums: a float16 plan
        allocates them at half the size and every program binding them lists them in its
        :attr:`Program.half_scratch` (the plan checks both)."""
        return ()

    # ---- helpers ---------------------------------------------------------------------------------
    def outputs_empty(self) -> bool:
        """Whether every output has no elements (the op has nothing to write: no programs, no scratch)."""
        return all(s.size == 0 for s in self.output_specs())

    def check_indexing(self) -> None:
        """Raises the op's :class:`KernelError` where an input, an output or a scratch buffer holds
        :data:`MAX_INDEXED_VALUES` (2**32) values or more: its shaders would index them with u32 and write their
        sizes into the WGSL as literals out of u32's range (a shader-creation error)."""
        tensors = [(f"input {i}", s) for i, s in enumerate(self.inputs) if s is not None]
        tensors += [(f"output {i}", s) for i, s in enumerate(self.output_specs())]
        for what, spec in tensors:
            if spec.size >= MAX_INDEXED_VALUES:
                raise self.fail(f"{what} of shape {list(spec.shape)} has {spec.size} elements, too large for 32-bit "
                                f"indexing: a shader indexes a tensor with u32, so fewer than 2**32; split the op "
                                f"over smaller tensors (a smaller batch)")
        for i, nbytes in enumerate(self.scratch_sizes()):
            if nbytes // 4 >= MAX_INDEXED_VALUES:
                raise self.fail(f"its scratch buffer {i} would hold {nbytes // 4} values, too large for 32-bit "
                                f"indexing: a shader indexes a buffer with u32, so fewer than 2**32; split the op "
                                f"over smaller tensors (a smaller batch)")

    def check_values(self, i: int, value) -> None:
        """Checks the values of input ``i``, one of the kernel's ``constant_attrs`` (inputs whose constant values it
        checks when the plan is made, as TFLite's kernel checks them when it runs: GATHER's indices, an int32
        divisor), given at run time from the host (:meth:`tflfuse.Interpreter.set_tensor`). Here: the kernel made
        again with them as that attribute; kernels override it with the check alone. Raises the op's
        :class:`KernelError` for values TFLite's invoke would stop on."""
        type(self)(self.inputs, {**self.attrs, self.constant_attrs[i]: value})

    def fail(self, message: str) -> "KernelError":
        shapes = [list(s.shape) if s is not None else None for s in self.inputs]
        return KernelError(f"{self.key}: {message} (input shapes {shapes})")

    def attr(self, name: str):
        if name in self.attrs and self.attrs[name] is not None:
            return self.attrs[name]
        if name in self.attr_defaults:
            return self.attr_defaults[name]
        raise self.fail(f"missing attribute {name!r}")

    def bool_attr(self, name: str) -> bool:
        """Attribute ``name`` as a bool: a bool (NumPy's too) or the integer 0 or 1; else the op's
        :class:`KernelError` (a string such as ``"false"`` would otherwise read as True)."""
        import numpy as np

        v = self.attr(name)
        if not isinstance(v, (bool, int, np.bool_)) or int(v) not in (0, 1):
            raise self.fail(f"attribute {name} must be a bool, got {v!r}")
        return bool(v)

    def target(self) -> str:
        """The ``target`` attribute, ``"gpu"`` or ``"cpu"`` (the software adapter), that the planner sets for
        kernels listing it in ``attr_defaults``: which schedule to emit; every schedule computes the same
        values. Raises :class:`KernelError` for another value."""
        target = str(self.attr("target"))
        if target not in ("gpu", "cpu"):
            raise self.fail(f"target must be 'gpu' or 'cpu', got {target!r}")
        return target

    def input(self, i: int) -> TensorSpec:
        if i >= len(self.inputs) or self.inputs[i] is None:
            raise self.fail(f"input {i} is missing")
        return self.inputs[i]

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def expect_rank(self, i: int, *ranks: int) -> TensorSpec:
        spec = self.input(i)
        if len(spec.shape) not in ranks:
            raise self.fail(f"input {i} must have rank {' or '.join(map(str, ranks))}, "
                            f"got shape {list(spec.shape)}")
        if spec.dtype != "float32":
            raise self.fail(f"input {i} must be float32, got {spec.dtype}")
        return spec

    def binding(self, name: str, role: str, index: int, spec_or_bytes, access: str | None = None) -> Binding:
        """A storage binding of a tensor (its :class:`TensorSpec`: element type from its dtype) or of a
        scratch buffer of ``spec_or_bytes`` bytes (``f32``)."""
        if isinstance(spec_or_bytes, int):
            size, elem = spec_or_bytes, "f32"
        else:
            size, elem = spec_or_bytes.nbytes, spec_or_bytes.wgsl_type
        access = access or ("read" if role == "input" else "read_write")
        return Binding(name, (role, index), access, elem, size)

    def io_bindings(self, names: Sequence[str]) -> tuple[Binding, ...]:
        """Bindings for every present input (in order) then every output, named by ``names``."""
        present = [i for i, s in enumerate(self.inputs) if s is not None and i not in self.static_inputs]
        outs = self.output_specs()
        if len(names) != len(present) + len(outs):
            raise AssertionError(f"{self.key}: {len(names)} binding names for {len(present)} inputs "
                                 f"and {len(outs)} outputs")
        binds = [self.binding(n, "input", i, self.inputs[i]) for n, i in zip(names, present)]
        binds += [self.binding(n, "output", i, s) for i, (n, s) in enumerate(zip(names[len(present):], outs))]
        return tuple(binds)


#: The :class:`Kernel` methods whose definition in any subclass is wrapped in :func:`_planned` (see the class
#: docstring).
_PLANNED = ("programs", "scratch_sizes", "half_scratch")


def _planned(method):
    """``method`` (programs, scratch_sizes or half_scratch) giving an empty result of its own type for a kernel
    whose outputs all have no elements: the WGSL of such an op would index, divide and take remainders by the
    output's zero sizes (``idx % 0u``, a shader-creation error in Tint, Dawn's and Chrome's compiler). Before
    ``programs``, :meth:`Kernel.check_indexing`."""
    if getattr(method, "_planned", False):
        return method

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        if self.outputs_empty():
            return [] if method.__name__ == "programs" else ()
        if method.__name__ == "programs":
            self.check_indexing()
        return method(self, *args, **kwargs)

    wrapped._planned = True
    return wrapped


class CompositeKernel(Kernel):
    """Base of the kernels of composite ops (``tflfuse.composite``, pattern fusion): the op's custom options
    are the flexbuffer map :func:`tflfuse.annotate.encode_attrs` wrote, decoded back to the attributes the
    composite was given (:func:`tflfuse.annotate.decode_attrs`)."""

    @staticmethod
    def decode_custom_options(options: dict) -> dict:
        from ..annotate import decode_attrs

        return decode_attrs(options)

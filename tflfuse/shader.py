"""Shader lookup: the WGSL of any kernel for an op name, input shapes and attributes, with no GPU."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from .kernels import kernel_class
from .kernels.base import MAX_INDEXED_VALUES, KernelError, TensorSpec, Uniform, is_integral, pack_uniforms, \
    uniform_layout
from .kernels.half import half_programs
from .kernels.matrix import SUBGROUP_SIZES, SubgroupMatrix

__all__ = ["ShaderInfo", "catalog", "get_shader", "model_shaders", "run_shader"]


@dataclasses.dataclass(frozen=True)
class ShaderInfo:
    """One dispatch of a kernel: WGSL text, entry point, workgroup size, dispatch size (in workgroups),
    bindings (name, access, element type, size in bytes; group 0, bindings 0..n-1 in order) and the uniform
    layout (binding n: each member's name, type, value and byte offset; scalars take 4 bytes, arrays (a list
    ``value``) are ``array<vec4<type>>`` aligned to 16 bytes, WGSL's layout). ``programs`` holds every dispatch when the
    op needs several; the top-level fields describe the first."""

    key: str
    wgsl: str
    entry_point: str
    workgroup_size: tuple[int, int, int]
    dispatch: tuple[int, int, int]
    bindings: tuple[dict, ...]
    uniforms: tuple[dict, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    programs: tuple["ShaderInfo", ...] = ()

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["programs"] = [p.to_dict() for p in self.programs]
        return d


def _uniform_infos(uniforms: Sequence[Uniform]) -> tuple[dict, ...]:
    """Each uniform's name, type, value (a list for an array) and byte offset in the block."""
    offsets, _ = uniform_layout(uniforms)
    return tuple({"name": u.name, "type": u.type, "value": list(u.value) if u.is_array else u.value, "offset": off}
                 for u, off in zip(uniforms, offsets))


def _check_shapes(key: str, input_shapes) -> None:
    if isinstance(input_shapes, (str, bytes, Mapping)) or not isinstance(input_shapes, (Sequence, np.ndarray)):
        raise TypeError(f"input_shapes must be a list of shapes such as [[1, 8, 8, 3], [4, 3, 3, 3]], got "
                        f"{input_shapes!r}")
    for i, shape in enumerate(input_shapes):
        if shape is None:
            continue
        if isinstance(shape, np.ndarray) and shape.ndim == 1:
            shape = shape.tolist()
        if isinstance(shape, (str, bytes, Mapping)) or not isinstance(shape, Sequence) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in shape):
            raise TypeError(f"input_shapes[{i}] must be a list of ints (or None for an absent input), got {shape!r}")
        if any(d < 0 for d in shape):
            raise KernelError(f"input_shapes[{i}] = {list(shape)} has a negative dimension")
        if math.prod(shape) >= MAX_INDEXED_VALUES:   # refused before the kernel is made (its checks would be slow)
            raise KernelError(f"{key}: input_shapes[{i}] = {list(shape)} has {math.prod(shape)} elements, too large "
                              f"for 32-bit indexing: a shader indexes a tensor with u32, so fewer than 2**32")


def get_shader(key: str, input_shapes: Sequence[Sequence[int] | None], attrs: Mapping | None = None,
               dtype: str | Sequence[str] = "float32", precision: str = "float32",
               subgroup_matrix: int | None = None) -> ShaderInfo:
    """The WGSL for op ``key`` (its name in a .tflite: ``"CONV_2D"``, ``"fused_bottleneck"``) on inputs of
    ``input_shapes`` (``None`` for an absent optional input) with ``attrs`` (the op's options, snake_case:
    ``stride_h``, ``padding``...; constant inputs such as PAD's paddings are attributes here). No GPU is
    touched. Same inputs give byte-identical WGSL. ``dtype`` is one dtype name for every input or one per
    input (GATHER's indices are ``"int32"``). ``precision="float16"`` gives the shader as a float16 plan runs
    it: its float tensors' bindings are ``array<f16>`` (``enable f16;``, the ``shader-f16`` feature), the
    arithmetic f32 (:mod:`tflfuse.kernels.half`). ``subgroup_matrix`` (a subgroup size, with ``"float16"``) gives
    the shaders as a float16 plan runs them on a Dawn device with subgroup matrices of that subgroup size
    (:mod:`tflfuse.kernels.matrix`: the matrix products on the GPU's matrix units) and WebGPU's default 16 KiB of
    workgroup memory (a device offering more may run other tiles: ``MEASURED_MATRIX_TILES``).

    Raises:
      ValueError: an unknown ``precision``, or ``subgroup_matrix`` not a power of two from 4 to 128 or given
        without ``precision="float16"``.
      UnsupportedOpError: unknown key (the message lists the known keys).
      KernelError: an attribute the kernel does not know (the message lists those it takes), an integer
        option (one whose default is an int: a stride, a size) given a number that is not an integer of int32's range
        (a fraction, a bool, inf), shapes or
        attribute values the kernel does not accept (the message says what it expected),
        including a tensor (input, output, scratch buffer) of 2**32 values or more (too large for 32-bit
        indexing: WGSL indexes with u32; :meth:`~tflfuse.kernels.base.Kernel.check_indexing`); an op that runs
        no shader: a view of its input's buffer (RESHAPE), or one whose outputs hold no elements (a batch, a
        channel count or a spatial size of 0: nothing to compute).
      TypeError: ``input_shapes`` is not a list of shapes (lists of ints) and ``None``.
    """
    from .runtime.plan import PRECISIONS

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    unit = None
    if subgroup_matrix is not None:
        if not isinstance(subgroup_matrix, (int, np.integer)) or isinstance(subgroup_matrix, (bool, np.bool_)) or \
                int(subgroup_matrix) not in SUBGROUP_SIZES or precision != "float16":
            raise ValueError(f"subgroup_matrix is a subgroup size (one of {SUBGROUP_SIZES}) for precision="
                             f"'float16', got {subgroup_matrix!r} with precision={precision!r}")
        unit = SubgroupMatrix(int(subgroup_matrix))
    cls = kernel_class(key)
    _check_shapes(key, input_shapes)
    attrs = dict(attrs or {})
    dtypes = [dtype] * len(input_shapes) if isinstance(dtype, str) else list(dtype)
    if len(dtypes) != len(input_shapes):
        raise KernelError(f"{key}: {len(dtypes)} dtypes for {len(input_shapes)} input shapes")
    unknown = sorted(set(attrs) - cls.known_attrs())
    if unknown:
        raise KernelError(f"{key}: unknown attribute(s) {unknown}; it takes {sorted(cls.known_attrs())}")
    # A number given for an int option (a stride, a size) must be one a .tflite could hold; names (MIRROR_PAD's
    # "REFLECT") are left to the kernel.
    for name, default in cls.attr_defaults.items():
        value = attrs.get(name)
        numeric = isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))
        if type(default) is int and numeric and not (is_integral(value) and -2**31 <= value < 2**31):
            raise KernelError(f"{key}: attribute {name} must be an integer in int32's range, as a .tflite's option "
                              f"is (e.g. {default}), got {value!r}")
    specs = [None if s is None or i in cls.static_inputs else TensorSpec(tuple(s), t)
             for i, (s, t) in enumerate(zip(input_shapes, dtypes))]
    try:
        kernel = cls(specs, attrs)
        outs = tuple(s.shape for s in kernel.output_specs())
        programs = half_programs(kernel, unit) if precision == "float16" else kernel.programs()
        for p in programs:   # a uniform's value its type cannot hold (beta=1e300 for an f32)
            pack_uniforms(p.uniforms)
    except KernelError:
        raise
    except (TypeError, ValueError, OverflowError) as e:  # int("abc") for stride_h="abc"; int(inf)
        raise KernelError(f"{key}: attributes {attrs} or shapes {list(input_shapes)} are not what the kernel "
                          f"takes ({type(e).__name__}: {e})") from e
    infos = []
    for p in programs:
        binds = tuple({"binding": i, "name": b.name, "role": list(b.role), "access": b.access,
                       "type": b.elem_type, "size": b.size} for i, b in enumerate(p.bindings))
        unis = _uniform_infos(p.uniforms)
        infos.append(ShaderInfo(key, p.source, p.entry_point, p.workgroup_size, p.dispatch, binds, unis, outs))
    if not infos and kernel.view:
        raise KernelError(f"{key} runs no shader for these shapes: it is a view of its input's buffer")
    if not infos:
        raise KernelError(f"{key} runs no shader for these shapes: its output shapes {[list(s) for s in outs]} hold "
                          f"no elements, so there is nothing to compute (a plan dispatches nothing for it and "
                          f"reads its outputs back empty)")
    first = infos[0]
    return dataclasses.replace(first, programs=tuple(infos))


def catalog() -> list[dict]:
    """Every kernel key with its expected inputs and attributes, for ``tflfuse shader --list``.

    Each entry: ``key``, ``summary`` (first line of the kernel's docstring), ``inputs`` (names in op order;
    inputs that are constants read at plan time are attributes in :func:`get_shader`, listed under
    ``static_inputs``), ``optional_inputs`` (indices that may be ``None``) and ``attributes`` (name ->
    default, ``None`` where the attribute is required or comes from a static input).
    """
    from .kernels import supported_ops

    out = []
    for key in supported_ops():
        cls = kernel_class(key)
        doc = (cls.__doc__ or "").strip().splitlines()
        attrs = {k: v for k, v in cls.attr_defaults.items()}
        for name in cls.static_inputs.values():
            attrs.setdefault(name, None)
        for name in (*cls.required_attrs, *cls.extra_attrs):
            attrs.setdefault(name, None)
        out.append({"key": key, "summary": doc[0] if doc else "", "inputs": list(cls.input_names),
                    "static_inputs": {int(i): n for i, n in cls.static_inputs.items()},
                    "optional_inputs": sorted(cls.optional_inputs), "attributes": attrs, "view": cls.view})
    return out


def model_shaders(model, target: str = "gpu", precision: str = "float32") -> tuple[dict[str, str], dict]:
    """The distinct shaders of a .tflite model and a manifest mapping each op to them. No GPU.

    Every subgraph that :class:`tflfuse.Interpreter` runs is covered: subgraph 0 and the subgraph of each
    signature (a file with several signatures has one subgraph per signature). Subgraphs that are only called
    by ops (``STABLEHLO_COMPOSITE`` decompositions, which are inlined where the composite has no kernel) are
    not entries of their own.

    Args:
      model: a :class:`tflfuse.model.Model`, the bytes of a .tflite, or its path.
      target: ``"gpu"`` or ``"cpu"`` (the software adapter's schedules).
      precision: ``"float32"`` or ``"float16"`` (float tensors as ``array<f16>``, as :func:`get_shader`; a float16
        plan also rounds each float input in a dispatch of its own, ``FLOAT16_INPUT``
        (:func:`tflfuse.kernels.half.half_pack_program`), which belongs to no op and is not listed here).
    Returns:
      ``(files, manifest)``: ``files`` maps a file name (``"CONV_2D_3f2a9c1e.wgsl"``, named by op and a digest
      of the source; ops of any subgraph share a file) to WGSL text. ``manifest`` holds ``ops``, one entry per
      op of every covered subgraph in subgraph order, each with ``subgraph`` and ``signatures`` (the keys of
      the signatures that run that subgraph; empty for a subgraph 0 that no signature names), its ``index``
      in that subgraph, name, the tensors of that subgraph it reads and writes, and its ``dispatches`` in
      order, each with the shader file, entry point, workgroup size, dispatch size, bindings (each naming the
      tensor it binds: ``tensor`` for an input or output, or a scratch buffer of ``size`` bytes) and uniforms;
      ``subgraphs``, one entry per covered subgraph (``subgraph``, ``signatures``, ``inputs``, ``outputs``,
      ``tensors``: index -> shape and dtype, ``aliases``, ``constants``); and, for readers of one subgraph,
      ``inputs``, ``outputs``, ``tensors``, ``aliases`` and ``constants`` of subgraph 0 at the top level.
      Tensor indices are those of the op's own subgraph.
    Raises:
      ModelError, UnsupportedOpError, KernelError: as :class:`tflfuse.Interpreter` would.
      ValueError: an unknown ``precision``.
    """
    from pathlib import Path

    from .model import Model
    from .runtime.plan import PRECISIONS, lower

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if isinstance(model, (str, Path)):
        model = Model.from_path(model)
    elif not isinstance(model, Model):
        model = Model(model)
    signatures: dict[int, list[str]] = {0: []}
    for key, sig in model.signature_defs().items():
        signatures.setdefault(sig["subgraph"], []).append(key)
    files: dict[str, str] = {}
    ops, subgraphs = [], []
    for si in sorted(signatures):
        graph = lower(model, si, target=target, relayout=False)   # shaders read the file's tensors as they are
        for op in graph.ops:
            ops.append({"subgraph": si, "signatures": signatures[si], **_op_entry(op, files, precision)})
        subgraphs.append({
            "subgraph": si, "signatures": signatures[si], "inputs": graph.inputs, "outputs": graph.outputs,
            "tensors": {str(t): {"shape": list(s.shape), "dtype": s.dtype} for t, s in sorted(graph.specs.items())},
            "aliases": {str(k): v for k, v in graph.aliases.items()}, "constants": sorted(graph.consts)})
    first = {k: v for k, v in subgraphs[0].items() if k not in ("subgraph", "signatures")}
    manifest = {"target": target, "precision": precision, **first, "ops": ops, "subgraphs": subgraphs}
    return files, manifest


def _op_entry(op, files: dict[str, str], precision: str) -> dict:
    """One lowered op's manifest entry; adds its shaders to ``files``."""
    dispatches = []
    try:
        programs = half_programs(op.kernel) if precision == "float16" else op.kernel.programs()
    except KernelError as e:
        raise KernelError(f"{op.name} (operator {op.index}): {e}") from None
    for prog in programs:
        fname = f"{op.name}_{prog.cache_key[:8]}.wgsl"
        files[fname] = prog.source
        binds = []
        for i, b in enumerate(prog.bindings):
            kind, k = b.role
            entry = {"binding": i, "name": b.name, "access": b.access, "type": b.elem_type, "size": b.size,
                     "role": kind}
            if kind in ("input", "output"):
                entry["tensor"] = (op.inputs if kind == "input" else op.outputs)[k]
            else:
                entry["scratch"] = k
            binds.append(entry)
        dispatches.append({"shader": fname, "entry_point": prog.entry_point,
                           "workgroup_size": list(prog.workgroup_size), "dispatch": list(prog.dispatch),
                           "bindings": binds,
                           "uniforms": list(_uniform_infos(prog.uniforms))})
    return {"index": op.index, "op": op.name, "inputs": op.inputs, "outputs": op.outputs,
            "view": op.kernel.view, "dispatches": dispatches}


def run_shader(device, info: ShaderInfo, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Runs a :class:`ShaderInfo` as another runtime would, from its fields alone: one storage buffer per
    binding (``inputs[i]`` for role ``("input", i)``; zeroed buffers of the binding's size for outputs and
    scratch), the uniform block at the binding after them, each program dispatched in order.

    Args:
      device: a :class:`tflfuse.Device`.
      info: from :func:`get_shader`.
      inputs: arrays in the op's input order (``None`` where the op's input is absent or was given as an
        attribute).
    Returns:
      the op's outputs as arrays of ``info.output_shapes`` (float32, or int32 where the binding is i32).
      Inputs bound as ``f16`` (``get_shader(..., precision="float16")``) are rounded to float16, and such
      outputs are read back as float32.
    """
    import wgpu

    dev = device.device
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    buffers: dict[tuple[str, int], object] = {}
    out_types: dict[int, str] = {}
    encoder = dev.create_command_encoder()
    for p in info.programs or (info,):
        entries = []
        for b in p.bindings:
            role = tuple(b["role"])
            if role not in buffers:
                size = max(16, -(-b["size"] // 16) * 16)
                if role[0] == "input":
                    value = np.ascontiguousarray(inputs[role[1]])
                    with np.errstate(over="ignore"):   # past float16's range: inf, as the GPU would store it
                        data = (value.astype(np.float16) if "f16" in b["type"] else value).tobytes()
                    buffers[role] = dev.create_buffer_with_data(data=data + b"\0" * (size - len(data)), usage=usage)
                else:
                    buffers[role] = dev.create_buffer(size=size, usage=usage)
                if role[0] == "output":
                    out_types[role[1]] = b["type"]
            # a binding of an empty tensor is bound as 16 bytes, as the Interpreter's plan binds it (WebGPU refuses
            # a binding of size 0)
            entries.append({"binding": b["binding"], "resource": {"buffer": buffers[role], "offset": 0,
                                                                  "size": max(int(b["size"]), 16)}})
        if p.uniforms:
            data = pack_uniforms([Uniform(u["name"], u["type"], tuple(u["value"]) if isinstance(u["value"], list)
                                          else u["value"]) for u in p.uniforms])
            ubuf = dev.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.UNIFORM)
            entries.append({"binding": len(p.bindings), "resource": {"buffer": ubuf, "offset": 0, "size": len(data)}})
        module = dev.create_shader_module(code=p.wgsl)
        pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": p.entry_point})
        group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        cpass = encoder.begin_compute_pass()
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*p.dispatch)
        cpass.end()
    dev.queue.submit([encoder.finish()])
    outs = []
    for i, shape in enumerate(info.output_shapes):
        dtype = {"i32": np.int32, "f16": np.float16, "vec4<f16>": np.float16}.get(out_types.get(i), np.float32)
        n = math.prod(shape)
        nbytes = -(-n * np.dtype(dtype).itemsize // 4) * 4
        raw = dev.queue.read_buffer(buffers[("output", i)], 0, nbytes) if n else b""
        outs.append(np.frombuffer(raw, dtype)[:n].reshape(shape).astype(np.int32 if dtype == np.int32 else np.float32))
    return outs

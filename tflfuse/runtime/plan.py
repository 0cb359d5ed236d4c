"""ExecutionPlan: buffer lifetimes, weight upload, pipelines and bind groups, built once.

The plan is derived from a :class:`~tflfuse.model.Model` subgraph and never edited by hand. Building it
has two halves: :func:`~tflfuse.runtime.lower.lower` (no GPU: kernel lookup, shape inference, load-time
constant folding; re-exported here) and :class:`ExecutionPlan`. The plan first lays itself out as data, without
the GPU: buffer records (size, kind, the constant a weights buffer holds), each tensor's buffer, and per dispatch
its bindings (buffer, offset, size) and uniform bytes. Those are the records
:func:`~tflfuse.runtime.serialize.serialize_plan` writes for ``tflfuse.js``; the plan then makes its GPU buffers
and bind groups from them (:func:`make_bind_group`, which :class:`tflfuse.web.executor.PlanDataExecutor` uses on
the serialised data too), so that the Python and browser runtimes execute the same data.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
import weakref
from typing import Mapping, Sequence

import numpy as np

from ..kernels import kernel_class
from ..kernels.base import KernelError, Program, TensorSpec
from ..kernels.half import half_binding_size, half_pack_program, half_programs
from ..kernels.wgsl import workgroup_storage
from .device import ShaderCompileError
from .lower import (_DTYPE_NAMES, MAX_FOLDED_ELEMENTS, LoweredGraph, LoweredOp, _has_fused_kernel,  # noqa: F401
                    _narrow_int64, check_supported, held, lower)
from .record import recorder
from .profile import SUSTAINED_REPS, gpu_time_plan, pass_gpu_us, profile_plan, wall_seconds  # noqa: F401 (re-exported)

__all__ = ["ExecutionPlan", "LoweredOp", "LoweredGraph", "PRECISIONS", "check_supported", "lower", "make_bind_group"]

#: The plan-level precisions: ``"float32"`` (the default) and ``"float16"`` (float tensors stored as IEEE
#: binary16 on the GPU, arithmetic in f32 but the matrix products' f16 multiply-adds: :mod:`tflfuse.kernels.half`;
#: needs the ``shader-f16`` feature).
PRECISIONS = ("float32", "float16")
#: Whether a float16 plan's float inputs are uploaded as float32 and rounded to float16 by a dispatch at the start
#: of each run (:func:`~tflfuse.kernels.half.half_pack_program`, the same values as NumPy's rounding) rather than
#: by NumPy on the host: :meth:`ExecutionPlan.write` then costs what a float32 plan's does.
HALF_INPUTS_ON_GPU = True
#: The op name and index of those dispatches in :attr:`ExecutionPlan.dispatches` and profiles (no op of the file).
HALF_INPUT_STEP = ("FLOAT16_INPUT", -1)


def _check_limits(device, op: LoweredOp, prog: Program) -> None:
    """Raises KernelError, naming the op, its index and the program, where ``prog`` needs more storage buffers or
    workgroup memory than ``device`` offers (WebGPU's defaults are 8 and 16,384 bytes; a
    :class:`~tflfuse.runtime.device.Device` asks its adapter for the most it has), rather than wgpu's error when
    the pipeline is made."""
    limits = getattr(device, "limits", {})
    for limit, need, fix in (
            ("max-storage-buffers-per-shader-stage", len(prog.bindings), "use an adapter that offers more"),
            ("max-compute-workgroup-storage-size", workgroup_storage(prog.source, prog.name),
             "leave the op's schedule attributes (strategy, tile, chunk) to their defaults, which keep within "
             "WebGPU's default 16384 bytes where the op can, or use an adapter that offers more")):
        have = limits.get(limit)
        if have is not None and need > have:
            raise KernelError(f"{op.name} (operator {op.index}): program {prog.name} needs {limit} >= {need}; the "
                              f"adapter {device.name} offers {have}: {fix}")


class ExecutionPlan:
    """GPU resources for a lowered graph: weight buffers, reused activation buffers, pipelines and bind
    groups, all made once; :meth:`run` submits every dispatch in one command buffer.

    Args:
      graph: the lowered graph.
      device: the :class:`~tflfuse.runtime.device.Device`.
      preserve_all_tensors: give every tensor its own buffer, so that intermediates can be read.
      precision: one of :data:`PRECISIONS`. ``"float16"`` stores every float32 tensor (inputs, outputs,
        intermediates, weights) as float16 on the GPU: an input's float32 values are rounded to float16 by the
        first dispatch of each run (:data:`HALF_INPUTS_ON_GPU`) and :meth:`read` returns float32 again. int32
        tensors, scratch buffers and the arithmetic stay 32-bit,
        except the tiled matrix products' slices (f16 multiply-adds, f32 across the depth; on a device with
        subgroup matrices, ``device.subgroup_matrix``, exact f16 products summed in f32: :mod:`tflfuse.kernels.matrix`).
    Raises:
      ValueError: an unknown ``precision``, or ``"float16"`` on a device without the ``shader-f16`` feature.
      KernelError: a tensor is larger than the device's max storage binding.
      ShaderCompileError: a kernel's WGSL does not compile; the message names the op, its index, the program
        and the op's input shapes.
      DeviceLostError: the device is lost (as :meth:`write`, :meth:`run` and :meth:`read`).
    """

    def __init__(self, graph: LoweredGraph, device, preserve_all_tensors: bool = False,
                 precision: str = "float32"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        if precision == "float16" and "shader-f16" not in device.features:
            raise ValueError(f"precision 'float16' needs the WebGPU feature 'shader-f16', which the adapter "
                             f"{device.name} does not offer; use precision='float32'")
        self.precision = precision
        self._half = precision == "float16"
        self.graph = graph
        self.preserve_all_tensors = preserve_all_tensors
        self.device = device
        self.buffers: dict[int, object] = {}       # tensor -> GPU buffer (runtime tensors and weights)
        #: float16 plan: input tensor -> the record id of the float32 buffer :meth:`write` fills, which the run's
        #: first dispatches round into the tensor's own float16 buffer (:data:`HALF_INPUTS_ON_GPU`)
        self.input_staging: dict[int, int] = {}
        self.buffer_count = 0
        self.activation_bytes = 0   # GPU memory of the (reused) buffers for inputs, outputs, intermediates, scratch
        self.constant_bytes = 0     # GPU memory of the weights
        with device.guard("allocate_tensors()"):
            self._alloc()
            self._build()

    def _build(self) -> None:
        graph, device = self.graph, self.device
        self.steps: list[tuple[Program, object, object]] = []   # (program, pipeline, bind group)
        self.step_ops: list[LoweredOp] = []                      # the op of each step
        self.dispatches: list[dict] = []                         # each step as data (_dispatch_record)
        name, index = HALF_INPUT_STEP
        for t, staging in self.input_staging.items():   # a float16 plan's inputs rounded on the GPU first
            prog = half_pack_program(graph.specs[t].size)
            rec = _dispatch_data(name, index, prog, (staging, self.tensor_buffer[t]))
            pipeline = device.pipeline(prog)
            self.dispatches.append(rec)
            self.steps.append((prog, pipeline, make_bind_group(device, pipeline, rec, self.gpu_buffers)))
            self.step_ops.append(LoweredOp(index, name, None, [t], [t]))
        for op in graph.ops:
            if op.kernel.view:
                continue
            try:
                programs = half_programs(op.kernel, getattr(device, "subgroup_matrix", None)) if self._half \
                    else op.kernel.programs()
            except KernelError as e:
                raise KernelError(f"{op.name} (operator {op.index}): {e}") from None
            for prog in programs:
                _check_limits(device, op, prog)
                if device.loop_limit is not None and prog.loop_trips >= device.loop_limit:
                    raise KernelError(
                        f"{op.name} (operator {op.index}): its shader runs about {prog.loop_trips} loop "
                        f"iterations per invocation; the adapter {device.name} stops loops after "
                        f"{device.loop_limit} and would return wrong values (input shapes "
                        f"{[list(s.shape) if s else None for s in op.kernel.inputs]})")
                try:
                    pipeline = device.pipeline(prog)
                except ShaderCompileError as e:
                    raise ShaderCompileError(
                        f"{op.name} (operator {op.index} of subgraph {graph.subgraph}, program {prog.name}, "
                        f"input shapes {[list(s.shape) if s else None for s in op.kernel.inputs]}): {e}") from e
                rec = self._dispatch_record(op, prog)
                self.dispatches.append(rec)
                self.steps.append((prog, pipeline, make_bind_group(device, pipeline, rec, self.gpu_buffers)))
                self.step_ops.append(op)
        self._record = _pass_recorder(self.steps)
        # Outputs (the smallest first, up to _STAGING_LIMIT bytes in all) are copied to mappable buffers by each
        # run's own command buffer, so that get_tensor() maps them instead of recording and submitting a copy.
        wgpu = device._wgpu
        self._staging = {}
        staged_bytes = 0
        for t in sorted(dict.fromkeys(t for t in graph.outputs if t in graph.specs and graph.specs[t].nbytes),
                        key=self.storage_nbytes):
            nbytes = self.storage_nbytes(t)
            if staged_bytes + nbytes > _STAGING_LIMIT:
                break
            self._staging[t] = device.device.create_buffer(
                size=nbytes, label=f"read-back {t}", usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            staged_bytes += nbytes
        self.activation_bytes += staged_bytes
        self._staged: set[int] = set()   # outputs whose read-back buffer holds the last run's values
        # the next run's command buffer, recorded ahead (from the second run on), in a list that the plan's
        # finalizer shares: a plan dropped with one submits it then (_submit_ahead)
        self._ahead: list = [None]
        weakref.finalize(self, _submit_ahead, device, self._ahead).atexit = False
        self._runs = 0
        # After the first command buffer, recorded and checked through wgpu's API, the same commands through
        # wgpu-native's or Dawn's C entry points (None on another backend): _NativeCommands.
        self._native = _NativeCommands.of(self)
        self._checked = False   # whether a command buffer went through wgpu's API (its errors raised there)

    # ---- buffers ---------------------------------------------------------------------------------
    def _is_half(self, t: int) -> bool:
        """Whether tensor ``t`` is stored as float16 (a float tensor of a float16 plan)."""
        if not self._half:
            return False
        spec = self.graph.specs.get(t)
        return spec.dtype == "float32" if spec is not None else self.graph.consts[t].dtype.kind == "f"

    def _dtype_name(self, t: int) -> str:
        spec = self.graph.specs.get(t)
        return spec.dtype if spec is not None else str(self.graph.consts[t].dtype)

    def storage_nbytes(self, t: int) -> int:
        """Bytes of tensor ``t``'s values on the GPU (float16 ones: 2 each, rounded up to a multiple of 4)."""
        spec = self.graph.specs[t]
        return half_binding_size(spec.size) if self._is_half(t) else spec.nbytes

    def constant_data(self, t: int) -> bytes:
        """Constant ``t`` exactly as its buffer holds it: float32 (float16 in a float16 plan), int32 (bool, int8 and
        uint8 one per i32) or its own integer dtype, zero-padded to its buffer record's size."""
        value = self.graph.consts[t]
        data = np.ascontiguousarray(value, dtype=np.float32 if value.dtype.kind == "f" else
                                    np.int32 if value.dtype.kind == "b" or value.dtype.itemsize == 1
                                    else value.dtype)   # bool, int8, uint8: one per i32
        raw = (_half_bytes(data) if self._is_half(t) else data).tobytes()
        return raw + b"\0" * (_padded(len(raw)) - len(raw))

    def _alloc(self) -> None:
        """Assigns buffers to tensors without the GPU (:attr:`buffer_records`, :attr:`tensor_buffer`,
        :attr:`scratch_buffers`: the records :func:`~tflfuse.runtime.serialize.serialize_plan` writes), then
        makes one GPU buffer per record, the weights filled."""
        g, dev = self.graph, self.device
        limit = dev.max_storage_binding
        #: ``{id, size, kind, label}`` per buffer (``size`` in bytes, a multiple of 16; ``kind`` "weights" (with
        #: ``tensor``, the constant it holds), "io" (an input's or output's own) or "work" (reused)).
        self.buffer_records: list[dict] = []
        self.tensor_buffer: dict[int, int] = {}    # tensor -> its buffer record's id (runtime tensors and weights)
        self.scratch_buffers: dict[int, list[int]] = {}   # op index -> its scratch buffers' ids

        def record(size: int, kind: str, label: str, **extra) -> int:
            self.buffer_records.append({"id": len(self.buffer_records), "size": _padded(size), "kind": kind,
                                        "label": label, **extra})
            return len(self.buffer_records) - 1

        gpu_read = {t for op in g.ops for pos, t in enumerate(op.inputs)
                    if t >= 0 and pos not in op.kernel.static_inputs}
        for t, value in g.consts.items():
            if t in gpu_read:
                if value.dtype.kind == "f":
                    nbytes = half_binding_size(value.size) if self._is_half(t) else value.size * 4
                else:   # bool, int8, uint8: one per i32
                    nbytes = value.size * (4 if value.dtype.kind == "b" or value.dtype.itemsize == 1
                                           else value.dtype.itemsize)
                if nbytes > limit:
                    raise KernelError(f"constant {g.describe(t)} {list(value.shape)} is {nbytes} bytes, over "
                                      f"the device's max storage binding of {limit} bytes")
                self.tensor_buffer[t] = record(nbytes, "weights", f"const{t}", tensor=int(t))
                self.constant_bytes += nbytes
        # Lifetimes over storage roots: first op writing, last op reading; inputs/outputs are pinned.
        keep = list(g.specs) if self.preserve_all_tensors else g.inputs + g.outputs + g.crossing
        pinned = {g.storage_root(t) for t in keep if t in g.specs}
        io = {g.storage_root(t) for t in g.inputs + g.outputs if t in g.specs}
        last_use: dict[int, int] = {}
        first_def: dict[int, int] = {}
        for pos, op in enumerate(g.ops):
            for t in op.inputs:
                if t in g.specs:
                    last_use[g.storage_root(t)] = pos
            for t in op.outputs:
                r = g.storage_root(t)
                first_def.setdefault(r, pos)
                last_use[r] = max(last_use.get(r, pos), pos)
        free: list[int] = []

        def take(size: int, label: str) -> int:
            if size > limit:
                raise KernelError(f"{label} needs {size} bytes, over the device's max storage binding "
                                  f"of {limit} bytes")
            fits = [i for i in free if self.buffer_records[i]["size"] >= size]
            if fits:
                best = min(fits, key=lambda i: self.buffer_records[i]["size"])
                free.remove(best)
                return best
            self.buffer_count += 1
            self.activation_bytes += _padded(size)
            return record(size, "work", label)

        roots: dict[int, int] = {}
        for r in sorted(pinned):
            nbytes = self.storage_nbytes(r)
            if nbytes > limit:
                raise KernelError(f"{g.describe(r)} {list(g.specs[r].shape)} needs {nbytes} bytes, "
                                  f"over the device's max storage binding of {limit} bytes")
            self.buffer_count += 1
            self.activation_bytes += nbytes
            roots[r] = record(nbytes, "io" if r in io else "work", f"io{r}")
        for pos, op in enumerate(g.ops):
            for t in op.outputs:
                r = g.storage_root(t)
                if r not in roots:
                    roots[r] = take(self.storage_nbytes(r), f"{g.describe(t)} {list(g.specs[r].shape)}")
            halves = set(op.kernel.half_scratch()) if self._half else set()   # float16: 2 bytes per value
            scratch = [take(half_binding_size(n // 4) if i in halves else n, f"scratch of op {op.index}")
                       for i, n in enumerate(op.kernel.scratch_sizes())]
            self.scratch_buffers[op.index] = scratch
            free.extend(scratch)
            for r, last in list(last_use.items()):
                if last == pos and r not in pinned and r in roots:
                    free.append(roots[r])
        for t in g.specs:
            r = g.storage_root(t)
            if r in roots:
                self.tensor_buffer[t] = roots[r]
        if self._half and HALF_INPUTS_ON_GPU:   # each float input's float32 values, rounded on the GPU
            # where an op's dispatches read the input (or a view of it) or it is an output (an op whose outputs
            # are all empty runs no dispatch)
            read = {g.storage_root(t) for t in g.outputs} | {
                g.storage_root(t) for op in g.ops if not op.kernel.view and not op.kernel.outputs_empty()
                for pos, t in enumerate(op.inputs) if t >= 0 and pos not in op.kernel.static_inputs}
            for t in dict.fromkeys(g.inputs):
                # (one whose float32 values would not fit a binding is rounded on the host, as before)
                if t in g.specs and self._is_half(t) and 0 < g.specs[t].nbytes <= limit and t in read:
                    nbytes = g.specs[t].nbytes
                    self.buffer_count += 1
                    self.activation_bytes += _padded(nbytes)
                    self.input_staging[t] = record(nbytes, "io", f"io{t} float32")
        # The GPU buffers, one per record.
        self.gpu_buffers = [dev.create_buffer(rec["size"], label=rec["label"],
                                              data=self.constant_data(rec["tensor"]) if rec["kind"] == "weights"
                                              else None)
                            for rec in self.buffer_records]
        self.buffers = {t: self.gpu_buffers[i] for t, i in self.tensor_buffer.items()}

    def _dispatch_record(self, op: LoweredOp, prog: Program) -> dict:
        """One dispatch of ``op`` as data (:func:`_dispatch_data`), its bindings' buffers those of the op's
        tensors and scratch buffers."""
        buffers = []
        for b in prog.bindings:
            kind, k = b.role
            t = op.inputs[k] if kind == "input" else op.outputs[k] if kind == "output" else None
            if t is not None and self._half and ("f16" in b.elem_type) != self._is_half(t):
                raise KernelError(f"{op.name} (operator {op.index}, program {prog.name}): binding {b.name!r} "
                                  f"declares {b.elem_type} for {self.graph.describe(t)}, stored as "
                                  f"{'f16' if self._is_half(t) else self._dtype_name(t)}")
            buffers.append(self.scratch_buffers[op.index][k] if kind == "scratch" else self.tensor_buffer[t])
        return _dispatch_data(op.name, op.index, prog, buffers)

    def memory_report(self) -> dict:
        """Bytes of GPU memory the plan holds, beside what one buffer per tensor would take.

        ``activations``: the reused buffers (inputs, outputs, intermediates, scratch) and the outputs'
        read-back buffers; ``constants``: weights;
        ``all_tensors``: the sum of every runtime tensor's size (what no reuse would allocate).
        """
        return {"activations": self.activation_bytes, "constants": self.constant_bytes,
                "all_tensors": sum(self.storage_nbytes(t) for t in self.graph.specs)}

    # ---- execution -------------------------------------------------------------------------------
    @property
    def dispatch_count(self) -> int:
        return len(self.steps)

    def host_dtype(self, tensor: int) -> np.dtype:
        """The dtype users set and get tensor ``tensor`` in (the file's): float32, int32, bool, or int64 for a
        tensor held as int32 (:data:`_DTYPE_NAMES`)."""
        if tensor in self.graph.narrowed:
            return np.dtype(np.int64)
        return np.dtype({"float32": np.float32, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}.get(
            self.graph.specs[tensor].dtype, np.int32))

    def write(self, tensor: int, value: np.ndarray, source: str | None = None) -> None:
        """Uploads ``value`` (of the tensor's dtype and shape) into an input's buffer; a float16 plan rounds
        float32 values to float16 (to nearest even; from 65520 on they become inf, as float16 does): a graph
        input's on the GPU at the start of the next run (:data:`HALF_INPUTS_ON_GPU`), another's (a value from a
        CPU segment, or an input whose float32 values would not fit a storage binding) here. bool values are
        stored as int32 0/1, int64 ones as int32 (KernelError naming the tensor, or ``source``, what
        computed the value, if one does not fit)."""
        value = np.ascontiguousarray(value)
        if value.dtype in (np.bool_, np.int8, np.uint8):   # held one per i32
            value = value.astype(np.int32)
        elif value.dtype == np.int64:
            what = (f"{self.graph.describe(tensor)}, computed by {source} and read by a GPU op," if source else
                    f"the value set for {self.graph.describe(tensor)}")
            value = _narrow_int64(value, what)
        staging = self.input_staging.get(tensor)
        if staging is not None:   # float32 as it is: the run's first dispatches round it
            data, target = np.ascontiguousarray(value, np.float32), self.gpu_buffers[staging]
        else:
            data, target = (_half_bytes(value) if self._is_half(tensor) else value), self.buffers[tensor]
        self._staged.discard(tensor)   # a passthrough output's staged copy is now stale
        # (the array itself, which wgpu copies once: with a copy made here first (tobytes) MobileNetV2's input took
        # 12.1 against 9.4 ms at batch 32 and 0.071 against 0.050 ms at batch 1 on a 2-core CPU's llvmpipe)
        if data.nbytes:  # wgpu refuses an empty write; an empty tensor has nothing to upload
            with self.device.guard("set_tensor()"):
                self.device.device.queue.write_buffer(target, 0, data)

    def _encode(self):
        """One command buffer: every dispatch in one compute pass, then the outputs' copies to their
        read-back buffers. The first goes through wgpu's API, which raises for a command the backend refuses;
        the next ones, the same commands, through its C entry points where the backend is wgpu-native or Dawn."""
        if self._checked and self._native is not None:
            return self._native.encode()
        self._checked = True
        encoder = self.device.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        self._record(cpass)
        cpass.end()
        for tensor, staging in self._staging.items():
            encoder.copy_buffer_to_buffer(self.buffers[tensor], 0, staging, 0, self.storage_nbytes(tensor))
        return encoder.finish()

    def run(self) -> None:
        """Submits one command buffer with every dispatch, then, from the plan's second run on, records the next
        invoke's command buffer while the GPU runs this one (WebGPU command buffers are single-use; the
        queue's buffer writes still land before the submit that follows them). Not after the first run: a plan
        run once (``run_op``, an Interpreter invoked once, a shape that ``resize_tensor_input`` leaves again)
        would drop that buffer unsubmitted, and wgpu-native 0.32 keeps about 120 KB of each such buffer
        (2026-12-04: 1,000 plans run once, 128 to 249 MB of resident memory; none with this rule). A plan
        dropped after its second run submits the buffer it recorded ahead (:func:`_submit_ahead`).

        One command buffer, not several: Dawn's Vulkan backend records an invoke's Vulkan commands when the buffer
        is submitted, so on Dawn the submit stands between ``invoke()`` and the GPU's start (MobileNetV2, fused and
        unfused, 36 to 65 dispatches: 102-188 us a submit on an H100, 2026-12-07, against 20-32 us on wgpu-native).
        Submitted as two buffers, the first 4 dispatches alone (the splits of ``benchmarks/submit_split_ab.py``,
        ``--splits=0,4``; the same H100 and day, 3 rounds of 40 invokes), Dawn's latency at batch 32 was 0.93x (fused
        float32 1397 against 1497 us, float16 1100 against 1187; unfused float32 1667 against 1796), but 1.02x and
        1.05x fused at batch 1, where the first dispatches end before the rest is recorded; on wgpu-native every
        split lost (1.01-1.05x; quarters up to 1.17x). A split pays only where the GPU time of the first dispatches
        passes the recording of the rest, which the plan does not know.

        Raises:
          DeviceLostError: the device is lost (now or before).
        """
        with self.device.guard("invoke()"):
            command_buffer, self._ahead[0] = self._ahead[0], None
            if command_buffer is not None or self._checked:
                # a buffer recorded before a loss must never be submitted, nor one recorded through the C entry
                # points on a lost device (wgpu-native aborts the process on either)
                self.device.check_alive()
            if command_buffer is None:
                command_buffer = self._encode()
            if isinstance(command_buffer, _NativeCommandBuffer):
                command_buffer.submit()
            else:
                self.device.device.queue.submit([command_buffer])
            self._staged = set(self._staging)
            self._runs += 1
            if self._runs > 1:
                self._ahead[0] = self._encode()

    def read(self, tensor: int) -> np.ndarray:
        if tensor in self.graph.consts:   # an int64 constant read by a GPU op was narrowed: int64 again
            value = self.graph.consts[tensor].copy()
            return value.astype(np.int64) if tensor in self.graph.narrowed else value
        spec = self.graph.specs[tensor]
        dtype = np.float32 if spec.dtype == "float32" else np.int32
        if tensor in self.input_staging and tensor not in self._staged:   # as set, rounded as the run will round it
            with self.device.guard("get_tensor()"):
                raw = self.device.device.queue.read_buffer(self.gpu_buffers[self.input_staging[tensor]], 0,
                                                           spec.nbytes)
            bits = _half_bytes(np.frombuffer(raw, np.float32)).view(np.uint16)[:spec.size]
            return _half_to_float(bits).reshape(spec.shape)
        if spec.dtype in ("bool", "int8", "uint8") or tensor in self.graph.narrowed:   # held as int32: the file's dtype
            return self._read_raw(tensor, spec, dtype).astype(self.host_dtype(tensor))
        return self._read_raw(tensor, spec, dtype)

    def _read_raw(self, tensor: int, spec: TensorSpec, dtype) -> np.ndarray:
        if spec.size == 0:
            return np.zeros(spec.shape, dtype)
        nbytes = self.storage_nbytes(tensor)
        with self.device.guard("get_tensor()"):
            if tensor in self._staged and self._native is not None:   # copied by the last run's command buffer
                raw = self._native.read(self._staging[tensor], nbytes)
            elif tensor in self._staged:
                staging = self._staging[tensor]
                staging.map_sync(self.device._wgpu.MapMode.READ)
                try:
                    raw = staging.read_mapped(0, nbytes)
                finally:
                    staging.unmap()
            else:
                raw = self.device.device.queue.read_buffer(self.buffers[tensor], 0, nbytes)
        if self._is_half(tensor):
            return _half_to_float(np.frombuffer(raw, np.uint16)[:spec.size]).reshape(spec.shape)
        return np.frombuffer(raw, dtype=dtype).reshape(spec.shape).copy()

    def time_run(self, repeats: int = 10) -> float:
        """Median wall-clock seconds of ``run`` plus a read-back of the first output (after one warm-up)."""
        return wall_seconds(self.run, self.read, self.graph.outputs[0], repeats)


def _submit_ahead(device, ahead: list) -> None:
    """A dropped plan's finalizer: submits the command buffer it recorded ahead, if any (the plan's dispatches
    once more, over its own buffers, which the command buffer keeps alive until it has run). wgpu-native 0.32
    keeps the memory of a command buffer released unsubmitted: an Interpreter on hand_recrop (63 dispatches)
    invoked twice, then dropped, left 2.7 MB of resident memory behind each time on llvmpipe (2026-12-04, 130
    in a row: 214 to 570 MB). Nothing is submitted after a device loss (wgpu-native aborts the process on a
    command buffer recorded before one); the buffer is then only released."""
    command_buffer, ahead[0] = ahead[0], None
    if command_buffer is None or device.lost is not None:
        return
    try:
        device.check_alive()
        if isinstance(command_buffer, _NativeCommandBuffer):
            command_buffer.submit()
        else:
            device.device.queue.submit([command_buffer])
    except Exception as e:  # a finalizer must not raise: the buffer is released with its wrapper
        logging.debug("tflfuse: a dropped plan's command buffer recorded ahead was not submitted: %s", e)


_STAGING_LIMIT = 64 << 20
#: Seconds :meth:`_NativeCommands.read` keeps polling for a map after a poll first returned without it.
_MAP_TIMEOUT_S = 60
#: Seconds :meth:`_NativeCommands.read` polls without blocking (wgpu-native's ``wgpuDevicePoll`` with ``wait`` false,
#: Dawn's ``wgpuInstanceWaitAny`` with no timeout, in a loop) before it waits on the queue in the driver, on a
#: hardware adapter: the read-back of a short invoke returns as soon as the GPU is done rather than when the waiting
#: thread is woken. Measured on an H100 (Vulkan,
#: 2026-12-06, ``benchmarks/readback_ab.py``, batch 1, ``benchmarks/RESULTS-readback.md``): latency 0.92-0.97x,
#: 11-20 us less per invoke (hand_recrop fused 136.8 against 148.1 us, mobilenet_v2_unfused 428.9 against 441.9).
#: 0: block at once. A software adapter always blocks at once: its work runs on the CPU the polling thread would
#: take (on llvmpipe with 2 cores, hand_recrop's latency was 1.12-1.15x with 2 ms of polling).
READBACK_SPIN_S = 0.002


def _padded(nbytes: int) -> int:
    """A buffer's size for ``nbytes`` of values: a multiple of 16, at least 16 (as Device.create_buffer)."""
    return max(16, -(-nbytes // 16) * 16)


def _dispatch_data(op: str, index: int, prog: Program, buffers: Sequence[int]) -> dict:
    """One dispatch as data (the record :func:`~tflfuse.runtime.serialize.serialize_plan` writes, less the shader's
    file): op name and index, its storage bindings (the ids of ``buffers``, in binding order, and the sizes) and
    its uniform bytes."""
    # A zero-size binding is invalid (wgpu-native aborts on it): an empty tensor binds its 16-byte buffer, which
    # the shader never reads (its invocations all return at once).
    binds = [{"binding": i, "buffer": buf, "offset": 0, "size": max(int(b.size), 16)}
             for i, (b, buf) in enumerate(zip(prog.bindings, buffers))]
    uniform = {"binding": len(prog.bindings), "bytes": prog.uniform_bytes().hex()} if prog.uniforms else None
    return {"op": op, "operator": int(index), "program": prog.name, "entry_point": prog.entry_point,
            "workgroup_size": [int(v) for v in prog.workgroup_size],
            "dispatch": [int(v) for v in (tuple(prog.dispatch) + (1, 1))[:3]], "bindings": binds,
            "uniform": uniform}


def make_bind_group(device, pipeline, dispatch: Mapping, buffers: Sequence):
    """The bind group of a dispatch record (``bindings``: ``{binding, buffer, offset, size}`` with ``buffer`` an
    index into ``buffers``; ``uniform``: ``{binding, bytes}`` (hex) or None, put in a uniform buffer of its own),
    for ``pipeline``'s group 0. Both :class:`ExecutionPlan` and :class:`tflfuse.web.executor.PlanDataExecutor`
    bind their dispatches this way."""
    entries = [{"binding": b["binding"], "resource": {"buffer": buffers[b["buffer"]], "offset": b["offset"],
                                                      "size": b["size"]}} for b in dispatch["bindings"]]
    uniform = dispatch.get("uniform")
    if uniform is not None:
        data = bytes.fromhex(uniform["bytes"])
        ubuf = device.create_buffer(len(data), data=data, uniform=True, label=f"{dispatch['program']} params")
        entries.append({"binding": uniform["binding"], "resource": {"buffer": ubuf, "offset": 0, "size": len(data)}})
    return device.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)


@functools.cache
def _half_table() -> np.ndarray:
    """Every float16 bit pattern's float32 value (256 KiB), by numpy's own conversion: bit for bit its values."""
    return np.arange(1 << 16).astype(np.uint16).view(np.float16).astype(np.float32)


def _half_to_float(bits: np.ndarray) -> np.ndarray:
    """float16 values given as their uint16 bits, as a new float32 array: a look-up in :func:`_half_table`, the
    same values as ``astype(np.float32)``. Measured on an H100 machine (2026-12-07, numpy 2.5.2, three
    alternating rounds of 40 invokes each, medians): MobileNetV2 (composites) at batch 32 in a float16 plan took
    1.08-1.11 ms from invoke() to its 32 x 1000 output read back with the look-up, against 1.38 ms with ``astype``
    (float32 plan: 1.26-1.28 ms)."""
    return np.take(_half_table(), bits)


#: Values from which :func:`_half_bytes` rounds to float16 in parallel parts, one per CPU core (at most
#: :data:`_HALF_THREADS`): numpy's float32 -> float16 conversion runs at about 2.2 ns a value on one core and lets
#: other threads run. It rounds a float16 plan's weights when the plan is built, the values CPU segments hand to
#: the GPU, an input too large for a float32 binding and an input read before a run; the graph's other inputs are
#: rounded on the GPU (:data:`HALF_INPUTS_ON_GPU`). Measured when it still rounded every input: MobileNetV2's
#: input at batch 32 (4.8 M values): on a 2-core CPU 6.3 ms against 11.4; on an H100 machine's 16-core host
#: (2026-12-07) 3.5 against 12.0 ms, its float16 plan's set_tensor() 6.2 against 14.3.
#: At batch 4 (602,112 values) on the 2-core CPU 0.76 against 1.15 ms; at batch 1 (150,528) and 196,608 values
#: the parts' overhead ate their gain there (0.30 against 0.29 ms, 0.39 against 0.37).
_HALF_PARALLEL_MIN, _HALF_THREADS = 1 << 18, 8


@functools.cache
def _half_pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=_HALF_THREADS, thread_name_prefix="tflfuse-f16")


def _half_bytes(values: np.ndarray) -> np.ndarray:
    """Float values as float16 (round to nearest even: from 65520 on, inf), flat, padded with a zero to a multiple
    of 4 bytes (WebGPU's unit for buffer writes and copies)."""
    flat = np.ravel(values)
    half = np.zeros(flat.size + flat.size % 2, np.float16)

    def convert(lo: int, hi: int) -> None:
        with np.errstate(over="ignore"):
            np.copyto(half[lo:hi], flat[lo:hi], casting="unsafe")   # as astype casts
    parts = min(os.cpu_count() or 1, _HALF_THREADS) if flat.size >= _HALF_PARALLEL_MIN else 1
    if parts == 1:
        convert(0, flat.size)
        return half
    bounds = [flat.size * i // parts for i in range(parts + 1)]
    for done in [_half_pool().submit(convert, lo, hi) for lo, hi in zip(bounds, bounds[1:])]:
        done.result()
    return half


class _NativeCommandBuffer:
    """A command buffer from :meth:`_NativeCommands.encode`: submitted once, released after its submit or
    when dropped unsubmitted (a plan rebuilt, an interpreter closed)."""

    __slots__ = ("handle", "_commands")

    def __init__(self, handle, commands: "_NativeCommands"):
        self.handle, self._commands = handle, commands

    def submit(self) -> None:
        c = self._commands
        c.submitted[0] = self.handle
        c.lib.wgpuQueueSubmit(c.queue, 1, c.submitted)
        self.release()
        c.raise_errors()

    def release(self) -> None:
        if self.handle is not None:
            self._commands.lib.wgpuCommandBufferRelease(self.handle)
            self.handle = None

    __del__ = release


class _NativeCommands:
    """An invoke's command buffer recorded through the C entry points of wgpu-native or Dawn (both export
    webgpu.h's): create the encoder, begin the compute pass, record the dispatches (:func:`_pass_recorder`'s
    ``native``), end it, copy the outputs to their read-back buffers, finish; the submit; and the outputs'
    read-back (:meth:`read`). wgpu's Python wrappers of these calls (error capture, descriptor structs, wrapper
    objects) cost about 10 us per invoke on a 2-core CPU, about a third of the calls' time (2026-12-04); wgpudawn's
    map and wait cost more (on Dawn's Null backend, 2026-12-07, the same 2-core CPU, MobileNetV2 at batch 1 in float16:
    a read-back after the queue is done took 111 us through ``map_sync``; an invoke and its read-back 0.61-0.78x the
    Python API's time this way, ``benchmarks/native_commands_ab.py``). Errors: a plan's first command buffer goes
    through the Python API, which raises for whatever the backend refuses; the next ones are the same commands on
    the same objects."""

    def __init__(self, plan: "ExecutionPlan", api, record_native):
        self.lib, null = api.lib, api.ffi.NULL
        self.ffi, self.null = api.ffi, null
        self.device = plan.device.device._internal
        self.queue = plan.device.device.queue._internal
        self.submitted = api.ffi.new("WGPUCommandBuffer[1]")
        self.record = record_native
        self._device_check = plan.device.check_alive
        self._spins = not plan.device.is_software   # READBACK_SPIN_S
        self.copies = [(plan.buffers[t]._internal, staging._internal, plan.storage_nbytes(t))
                       for t, staging in plan._staging.items()]
        self._objects = (plan.steps, list(plan._staging.values()), plan.gpu_buffers)   # the handles' owners
        # read(): one map callback for the plan's life (a map at a time), recording the status it is given for
        # the map read() waits for (its serial number in userdata1): a map cancelled at a timeout may still call
        # back later, during the next read, and its status must not pass for that read's
        self._mapped = [None]
        self._serial = [0]
        mapped, serial = self._mapped, self._serial

        @api.ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def on_mapped(status, message, userdata1, userdata2):
            if int(api.ffi.cast("uintptr_t", userdata1)) == serial[0]:
                mapped[0] = status
        self._on_mapped = on_mapped
        self._map_info = api.ffi.new("WGPUBufferMapCallbackInfo *")
        self._map_info.mode = self.lib.WGPUCallbackMode_AllowProcessEvents
        self._map_info.callback = on_mapped
        # Dawn has no wgpuDevicePoll: read() waits for the map's future in wgpuInstanceWaitAny (wgpudawn makes its
        # instance with timed waits), which runs the callback in this thread
        self._dawn = _DAWN_API in api.__name__
        if self._dawn:
            from wgpudawn.backends.dawn._helpers import get_wgpu_instance

            self._instance = get_wgpu_instance()
            self._wait_info = api.ffi.new("WGPUFutureWaitInfo *")
        # Dawn reports a call's validation error while the call runs, into wgpudawn's one list for the process,
        # which its next checked call would raise, whichever device that is on: raised here, by the call that made it
        self._errors = api.error_handler if self._dawn else None

    def raise_errors(self) -> None:
        """Raises (as wgpudawn's error class) the first error Dawn reported during this object's last C calls, if
        any (the others are logged); nothing on wgpu-native, which logs its errors."""
        if self._errors is not None and self._errors.pending:
            self._errors.raise_pending()

    def read(self, staging, nbytes: int) -> bytes:
        """The first ``nbytes`` of read-back buffer ``staging`` once the GPU has written them: map it, wait in this
        thread (wgpu-native's ``wgpuDevicePoll``, Dawn's ``wgpuInstanceWaitAny``, which run the map's callback
        here), copy, unmap. wgpu's ``map_sync`` also submits an empty command buffer and waits on its poll thread: a
        read-back of 256 bytes after an invoke took 37 against 93 microseconds on a 2-core CPU (2026-12-04). Raises
        RuntimeError (naming the status) if the map fails, after :meth:`~tflfuse.runtime.device.Device.check_alive`
        has raised for a lost device, or where an interrupt inside the callback lost its status (Dawn);
        whatever interrupts the map or the wait (a timeout, KeyboardInterrupt) cancels the map first, so that the
        next invoke's submit finds the buffer unmapped. Dawn's errors during these calls are raised here
        (:meth:`raise_errors`)."""
        lib, handle, mapped = self.lib, staging._internal, self._mapped
        mapped[0] = None
        self._serial[0] += 1
        self._map_info.userdata1 = self.ffi.cast("void *", self._serial[0])
        try:
            future = lib.wgpuBufferMapAsync(handle, lib.WGPUMapMode_Read, 0, nbytes, self._map_info[0])
            if self._dawn:
                self._wait_info.future.id, self._wait_info.completed = future.id, False
            self._wait_mapped(staging)
            if mapped[0] is None:   # Dawn: the map is done, but an interrupt inside its callback lost the status
                raise RuntimeError(f"the read-back of {staging.label!r} was interrupted; read it again")
        except BaseException:   # a timeout, or an interrupt while waiting (Ctrl-C): never leave the buffer mapped
            lib.wgpuBufferUnmap(handle)   # cancels the pending map: a mapped buffer must never be submitted
            raise
        if mapped[0] != lib.WGPUMapAsyncStatus_Success:
            self._device_check()
            raise RuntimeError(f"the read-back buffer {staging.label!r} could not be mapped (WGPUMapAsyncStatus "
                               f"{mapped[0]})")
        try:
            data = bytes(self.ffi.buffer(lib.wgpuBufferGetConstMappedRange(handle, 0, nbytes), nbytes))
        finally:
            lib.wgpuBufferUnmap(handle)
        self.raise_errors()
        return data

    def _wait_mapped(self, staging) -> None:
        """Polls until the map :meth:`read` started has called back: first without blocking, for up to
        :data:`READBACK_SPIN_S` (a hardware adapter only), then waiting in the driver. Raises RuntimeError where
        no callback came within :data:`_MAP_TIMEOUT_S` of the GPU's queue finishing (after
        :meth:`~tflfuse.runtime.device.Device.check_alive` has raised for a lost device)."""
        if self._dawn:
            return self._wait_future(staging)
        lib, mapped = self.lib, self._mapped
        if READBACK_SPIN_S > 0 and self._spins:
            spin_end = time.perf_counter() + READBACK_SPIN_S
            while mapped[0] is None and time.perf_counter() < spin_end:
                lib.wgpuDevicePoll(self.device, False, self.null)
        deadline = None
        while mapped[0] is None:
            # Waits for the queue; the callback runs in whichever thread polls, and with other threads polling
            # the same device a poll may return before this map is done: poll again until the deadline.
            lib.wgpuDevicePoll(self.device, True, self.null)
            if mapped[0] is not None:
                break
            now = time.monotonic()
            deadline = deadline or now + _MAP_TIMEOUT_S
            if now > deadline:
                self._device_check()
                raise RuntimeError(f"the read-back buffer {staging.label!r} was not mapped within "
                                   f"{_MAP_TIMEOUT_S} s of the GPU's queue finishing")
            time.sleep(0)

    def _wait_future(self, staging) -> None:
        """:meth:`_wait_mapped` on Dawn: ``wgpuInstanceWaitAny`` on the map's future, without a timeout for up to
        :data:`READBACK_SPIN_S` (a hardware adapter only), then in waits of :data:`_DAWN_WAIT_NS`, until it is
        done; RuntimeError where a wait fails or :data:`_MAP_TIMEOUT_S` pass (after
        :meth:`~tflfuse.runtime.device.Device.check_alive` has raised for a lost device)."""
        lib, info, instance = self.lib, self._wait_info, self._instance
        ok = (lib.WGPUWaitStatus_Success, lib.WGPUWaitStatus_TimedOut)
        spin_end = time.perf_counter() + (READBACK_SPIN_S if READBACK_SPIN_S > 0 and self._spins else 0)
        deadline = time.monotonic() + _MAP_TIMEOUT_S
        while not info.completed:
            status = lib.wgpuInstanceWaitAny(instance, 1, info, 0 if time.perf_counter() < spin_end else _DAWN_WAIT_NS)
            if info.completed:
                break
            if status not in ok or time.monotonic() > deadline:
                self._device_check()
                name = next((n for n in ("Error", "Success", "TimedOut")
                             if getattr(lib, f"WGPUWaitStatus_{n}", None) == status), status)
                why = f"wgpuInstanceWaitAny gave WGPUWaitStatus_{name}" if status not in ok else \
                    f"it was not mapped within {_MAP_TIMEOUT_S} s"
                raise RuntimeError(f"the read-back buffer {staging.label!r} could not be read: {why}")

    @classmethod
    def of(cls, plan: "ExecutionPlan") -> "_NativeCommands | None":
        native = getattr(plan._record, "native", None)
        if native is None:
            return None
        api = _backend_api(plan.device.device)
        if api is None or not all(isinstance(b, api.GPUBuffer)
                                  for b in list(plan._staging.values()) + list(plan.buffers.values())):
            return None
        return cls(plan, api, native)

    def encode(self) -> _NativeCommandBuffer:
        lib, null = self.lib, self.null
        encoder = lib.wgpuDeviceCreateCommandEncoder(self.device, null)
        cpass = lib.wgpuCommandEncoderBeginComputePass(encoder, null)
        self.record(cpass)
        lib.wgpuComputePassEncoderEnd(cpass)
        lib.wgpuComputePassEncoderRelease(cpass)
        for src, dst, nbytes in self.copies:
            lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, src, 0, dst, 0, nbytes)
        handle = lib.wgpuCommandEncoderFinish(encoder, null)
        lib.wgpuCommandEncoderRelease(encoder)
        if self._errors is not None and self._errors.pending:   # Dawn refused a command: no buffer to submit
            lib.wgpuCommandBufferRelease(handle)
            self.raise_errors()
        return _NativeCommandBuffer(handle, self)


#: The modules of wgpu-native's and Dawn's Python wrappers, whose libraries export the same webgpu.h entry points.
_NATIVE_API, _DAWN_API = "wgpu.backends.wgpu_native._api", "wgpudawn.backends.dawn._api"
#: Nanoseconds of one ``wgpuInstanceWaitAny`` of :meth:`_NativeCommands.read` on Dawn (as wgpudawn's own sync
#: waits), so that a wait for a map that does not come returns to check the deadline and KeyboardInterrupt.
_DAWN_WAIT_NS = 100_000_000


def _backend_api(obj):
    """The cffi module (``_api``, with ``lib`` and ``ffi``) of the WebGPU implementation that made ``obj`` (a
    pipeline, a device): wgpu-native's (:data:`_NATIVE_API`) or Dawn's (:data:`_DAWN_API`); None for any other."""
    module = type(obj).__module__
    if module not in (_NATIVE_API, _DAWN_API):
        return None
    return sys.modules.get(module)


def _pass_recorder(steps: Sequence[tuple[Program, object, object]]):
    """A function that records every step (set pipeline, set bind group, dispatch) into a compute pass.

    With wgpu's wgpu-native backend, and with Dawn's (the same webgpu.h entry points), it calls the three C entry
    points directly on the objects' handles:
    the Python wrappers' per-call error capture and argument conversion cost more than wgpu-native's own
    recording (about 250 of 740 microseconds for 53 dispatches on the H200's host); where the machine can
    compile it, one call of a C loop makes them all (:mod:`tflfuse.runtime.record`: cffi's three calls per
    dispatch cost 0.9-1.4 us of a 2-core CPU's time, the loop 0.19). Errors still surface:
    wgpu-native validates a pass when the encoder finishes, which for a plan's first command buffer goes
    through the Python API (:class:`_NativeCommands`). Any other backend records through the Python API (and
    the function's ``native`` is None).
    """
    _api = _backend_api(steps[0][1]) if steps else None
    try:
        native = _api is not None and all(isinstance(p, _api.GPUComputePipeline) and isinstance(b, _api.GPUBindGroup)
                                          for _, p, b in steps)
        lib, null = _api.lib, _api.ffi.NULL
    except AttributeError:
        native = False
    if not native:
        def record(cpass) -> None:
            for prog, pipeline, bind_group in steps:
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, bind_group)
                cpass.dispatch_workgroups(*prog.dispatch)
        record.native = None
        return record

    set_pipeline = lib.wgpuComputePassEncoderSetPipeline
    set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
    dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
    # A pipeline is set only where it changes (a pass keeps it): runs of the same layer, such as
    # palm_detection's blocks, skip a call each (about 0.7 us on the H200's host).
    handles = [(None if i and p is steps[i - 1][1] else p._internal, b._internal,
                *(tuple(prog.dispatch) + (1, 1))[:3]) for i, (prog, p, b) in enumerate(steps)]
    # One call of a compiled loop where the machine can build it (tflfuse.runtime.record), else a cffi call each
    native = recorder(_api.ffi, lib, handles)
    if native is None:
        def native(h) -> None:
            for pipeline, bind_group, x, y, z in handles:
                if pipeline is not None:
                    set_pipeline(h, pipeline)
                set_bind_group(h, 0, bind_group, 0, null)
                dispatch(h, x, y, z)

    def record(cpass) -> None:
        native(cpass._internal)
    record.objects = steps   # the handles stay valid while the wrappers live
    record.native = native   # the same on a pass's C handle (_NativeCommands)
    return record


def run_op(device, key: str, inputs: Sequence[np.ndarray | None], attrs: Mapping | None = None,
           constant: Sequence[bool] | None = None, precision: str = "float32") -> list[np.ndarray]:
    """Runs one kernel on arrays: the first input as a runtime tensor, the rest as constants (weights).

    For kernel tests and shader checks: the same plan, buffers and dispatch path as a model's op.

    Args:
      device: a :class:`~tflfuse.runtime.device.Device`.
      key: the op name (``"CONV_2D"``, ``"fused_bottleneck"``).
      inputs: float32 (or int32, or bool) arrays in the op's input order (``None`` for an absent optional input).
      attrs: the op's attributes.
      constant: per input, whether it is a constant (default: all but the first).
      precision: the plan's precision (:data:`PRECISIONS`).
    Returns:
      the op's outputs as arrays of their dtypes (float32, int32, bool).
    """
    plan = op_plan(device, key, inputs, attrs, constant, precision)
    plan.run()
    return [plan.read(t) for t in plan.graph.outputs]


def op_plan(device, key: str, inputs: Sequence[np.ndarray | None], attrs: Mapping | None = None,
            constant: Sequence[bool] | None = None, precision: str = "float32", kernel=None) -> "ExecutionPlan":
    """The :class:`ExecutionPlan` :func:`run_op` runs (its arguments), its runtime inputs written; ``kernel``: an
    instance of ``key``'s kernel class to plan instead of one made from ``inputs`` and ``attrs``."""
    inputs = [None if a is None else np.asarray(a, np.int32 if np.asarray(a).dtype.kind in "iu" else
                                                np.bool_ if np.asarray(a).dtype.kind == "b" else np.float32)
              for a in inputs]
    specs = [None if a is None else TensorSpec(a.shape, _DTYPE_NAMES[a.dtype]) for a in inputs]
    if kernel is None:
        kernel = kernel_class(key)(specs, dict(attrs or {}))
    constant = list(constant) if constant is not None else [i > 0 for i in range(len(inputs))]
    n_in = len(inputs)
    outs = kernel.output_specs()
    out_ids = list(range(n_in, n_in + len(outs)))
    in_ids = [-1 if a is None else i for i, a in enumerate(inputs)]
    specs_map = {t: s for t, s in zip(out_ids, outs)}
    consts = {}
    runtime = []
    for i, a in enumerate(inputs):
        if a is None:
            continue
        if constant[i]:
            consts[i] = np.ascontiguousarray(a)
        else:
            specs_map[i] = specs[i]
            runtime.append(i)
    graph = LoweredGraph(0, [LoweredOp(0, key, kernel, in_ids, out_ids)], specs_map, consts, runtime,
                         out_ids, {out_ids[0]: in_ids[0]} if kernel.view else {})
    plan = ExecutionPlan(graph, device, precision=precision)
    for i in runtime:
        plan.write(i, np.ascontiguousarray(inputs[i]))
    return plan

"""The execution plan as data: an :class:`~tflfuse.runtime.plan.ExecutionPlan` serialised for any executor.

:func:`serialize_plan` turns a built plan into three things, which together are all a WebGPU runtime needs
(no kernel, no model file): ``plan`` (a JSON-able dict), ``weights`` (one binary: every constant exactly as the
kernels read it, after the plan's re-layout and, for a float16 plan, rounded to float16) and ``shaders`` (the
distinct WGSL sources, by file name). ``tflfuse.js`` (the browser) and :mod:`tflfuse.web.executor` (Python,
wgpu) both execute this data, so they cannot drift from each other.

The plan dict (``format`` :data:`PLAN_FORMAT`, ``version`` :data:`PLAN_VERSION`):

- ``precision``: ``"float32"`` or ``"float16"``; ``requires``: ``features`` (``["shader-f16"]`` for a float16
  plan) and ``limits``, the least WebGPU limits (their JavaScript names) the plan needs: the largest binding,
  buffer, dispatch, workgroup, uniform block, count of storage buffers of one dispatch and workgroup memory of
  one shader (``maxComputeWorkgroupStorageSize``: its ``var<workgroup>`` declarations as WebGPU counts them,
  :func:`~tflfuse.kernels.wgsl.workgroup_storage`). An executor requests them from the adapter and refuses one
  that offers less.
- ``buffers``: ``[{id, size, kind, label}]`` (bytes, a multiple of 16): ``kind`` is ``"weights"`` (filled from
  ``weights`` at ``weights_offset``, ``size`` bytes), ``"io"`` (an input's or an output's own buffer) or
  ``"work"`` (intermediates and scratch, reused by tensors whose lifetimes do not overlap).
- ``tensors``: ``[{index, name, shape, dtype, storage, buffer, nbytes}]``, every runtime tensor and weight the
  GPU holds: ``dtype`` the file's (float32, int32, bool, int64), ``storage`` the WGSL element type it is held as
  (f32, f16, i32: bool as 0/1, int64 narrowed to int32), ``nbytes`` its bytes in ``buffer`` (from offset 0).
- ``inputs``/``outputs``: the same records for the subgraph's inputs and outputs, in order; except that a float16
  plan's float input is written as ``storage`` f32 into a ``buffer`` of its own, which the plan's first dispatches
  (``op`` ``FLOAT16_INPUT``, ``operator`` -1) round to float16 into the buffer its ``tensors`` record names.
- ``signatures``: ``{key: {inputs: {name: tensor name}, outputs: {name: tensor name}}}`` (subgraph 0's).
- ``shaders``: ``[file name]``; ``dispatches``: in order, one compute pass, each
  ``{op, operator, program, shader (index into shaders), entry_point, workgroup_size, dispatch (workgroups x,
  y, z), bindings: [{binding, buffer, offset, size}], uniform: {binding, bytes (hex)} or null}``; storage
  bindings are group 0's bindings 0..n-1 in that order, the uniform block (where there is one) binding n.

Raises of this module name the tensor or the op and what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from ..kernels.half import half_binding_size
from ..kernels.wgsl import workgroup_storage

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "SerializedPlan", "load_serialized", "serialize_plan"]

PLAN_FORMAT = "tflfuse-plan"
PLAN_VERSION = 1
#: The folder layout written by :meth:`SerializedPlan.write`.
PLAN_FILE, WEIGHTS_FILE, SHADER_DIR = "plan.json", "weights.bin", "shaders"


@dataclasses.dataclass
class SerializedPlan:
    """A plan as data (see the module's docstring): ``plan`` (JSON-able dict), ``weights`` (bytes) and
    ``shaders`` (file name -> WGSL text)."""

    plan: dict
    weights: bytes
    shaders: dict[str, str]

    def write(self, out_dir: str | Path) -> list[Path]:
        """Writes ``plan.json``, ``weights.bin`` and ``shaders/*.wgsl`` into ``out_dir`` (made if missing; the
        .wgsl files of an earlier export there are removed).

        Returns:
          the paths written. Raises OSError where the folder cannot be written.
        """
        out = Path(out_dir)
        (out / SHADER_DIR).mkdir(parents=True, exist_ok=True)
        for old in (out / SHADER_DIR).glob("*.wgsl"):   # an earlier export's shaders
            old.unlink()
        written = [out / PLAN_FILE, out / WEIGHTS_FILE]
        written[0].write_text(json.dumps(self.plan, indent=1))
        written[1].write_bytes(self.weights)
        for name, text in self.shaders.items():
            path = out / SHADER_DIR / name
            path.write_text(text)
            written.append(path)
        return written


def load_serialized(folder: str | Path) -> SerializedPlan:
    """Reads what :meth:`SerializedPlan.write` wrote.

    Raises:
      ValueError: not a tflfuse plan, another version, or weights of another size than the plan says.
      OSError: a missing file.
    """
    folder = Path(folder)
    plan = json.loads((folder / PLAN_FILE).read_text())
    if plan.get("format") != PLAN_FORMAT or plan.get("version") != PLAN_VERSION:
        raise ValueError(f"{folder / PLAN_FILE} is not a {PLAN_FORMAT} version {PLAN_VERSION} file "
                         f"(format {plan.get('format')!r}, version {plan.get('version')!r})")
    weights = (folder / WEIGHTS_FILE).read_bytes()
    if len(weights) != plan["weights_size"]:
        raise ValueError(f"{folder / WEIGHTS_FILE} has {len(weights)} bytes; the plan says {plan['weights_size']}")
    shaders = {name: (folder / SHADER_DIR / name).read_text() for name in plan["shaders"]}
    return SerializedPlan(plan, weights, shaders)


def _shader_name(index: int, program: str) -> str:
    return f"{index:03d}_{re.sub(r'[^A-Za-z0-9_]+', '_', program)[:60]}.wgsl"


def _dtype_name(plan, t: int) -> str:
    """The file's dtype of tensor ``t`` as users set and get it."""
    graph = plan.graph
    if t in graph.specs:
        return str(plan.host_dtype(t))
    return "int64" if t in graph.narrowed else str(graph.consts[t].dtype)


def _storage(plan, t: int) -> str:
    graph = plan.graph
    kind = graph.specs[t].dtype if t in graph.specs else ("float32" if graph.consts[t].dtype.kind == "f" else "int32")
    if kind == "float32":
        return "f16" if plan.precision == "float16" else "f32"
    return "i32"


def _input_record(plan, record: dict) -> dict:
    """An input's record as users write it: a float16 plan's float input (:attr:`~tflfuse.runtime.plan.
    ExecutionPlan.input_staging`) is written as float32 into a buffer of its own, which the plan's first dispatches
    round into the tensor's float16 buffer."""
    staging = plan.input_staging.get(record["index"])
    if staging is None:
        return record
    return {**record, "storage": "f32", "buffer": staging,
            "nbytes": 4 * int(np.prod(record["shape"], dtype=np.int64))}


def serialize_plan(plan, signatures: Mapping[str, Mapping] | None = None) -> SerializedPlan:
    """Serialises a built :class:`~tflfuse.runtime.plan.ExecutionPlan` (see the module's docstring): the plan's
    own buffer and dispatch records (from which it made its GPU buffers and bind groups), the constants as their
    buffers hold them (:meth:`~tflfuse.runtime.plan.ExecutionPlan.constant_data`) and the WGSL of its programs.
    Nothing is read from the GPU.

    Args:
      plan: the plan, built on a live device, of a graph without CPU fallback segments.
      signatures: the model's ``signature_defs()`` (``{key: {"subgraph", "inputs": {name: tensor},
        "outputs": {name: tensor}}}``); those of other subgraphs than the plan's are left out.
    Returns:
      a :class:`SerializedPlan`.
    Raises:
      ValueError: the graph has CPU fallback segments (naming their ops), or an output the GPU does not hold
        (a constant folded at load).
    """
    graph = plan.graph
    if graph.segments:
        raise ValueError(f"the plan has CPU fallback segments ({len(graph.segments)}); only GPU plans serialise")
    # The plan's own records (ExecutionPlan lays its buffers and dispatches out as data before it makes GPU
    # objects from them); the weights are the constants as their buffers hold them.
    buffers = [{k: v for k, v in rec.items() if k != "tensor"} for rec in plan.buffer_records]
    weights = bytearray()
    for rec, entry in zip(plan.buffer_records, buffers):
        if rec["kind"] == "weights":
            entry["weights_offset"] = len(weights)
            weights.extend(plan.constant_data(rec["tensor"]))

    tensors: dict[int, dict] = {}
    for t in sorted(plan.tensor_buffer):
        shape = graph.specs[t].shape if t in graph.specs else graph.consts[t].shape
        storage = _storage(plan, t)
        size = int(np.prod(shape, dtype=np.int64))
        nbytes = plan.storage_nbytes(t) if t in graph.specs else half_binding_size(size) if storage == "f16" \
            else size * 4
        tensors[t] = {"index": int(t), "name": graph.names.get(t, f"tensor_{t}"), "shape": [int(d) for d in shape],
                      "dtype": _dtype_name(plan, t), "storage": storage, "buffer": plan.tensor_buffer[t],
                      "nbytes": int(nbytes)}
    for t in graph.outputs:
        if t not in tensors:
            raise ValueError(f"output {graph.describe(t)} is not computed on the GPU (a constant folded at load); "
                             f"a plan with such an output cannot be serialised")

    shader_files: dict[str, str] = {}   # cache key -> file name
    shaders: dict[str, str] = {}
    dispatches = []
    limits = {"maxStorageBufferBindingSize": 0, "maxBufferSize": max([b["size"] for b in buffers] + [16]),
              "maxComputeWorkgroupsPerDimension": 1, "maxStorageBuffersPerShaderStage": 0,
              "maxComputeInvocationsPerWorkgroup": 1, "maxComputeWorkgroupSizeX": 1, "maxComputeWorkgroupSizeY": 1,
              "maxComputeWorkgroupSizeZ": 1, "maxUniformBufferBindingSize": 0, "maxComputeWorkgroupStorageSize": 0}
    shared: dict[str, int] = {}          # file name -> bytes of workgroup memory its shader declares
    for (prog, _, _), rec in zip(plan.steps, plan.dispatches):
        if prog.cache_key not in shader_files:
            name = _shader_name(len(shaders), prog.name)
            shader_files[prog.cache_key] = name
            shaders[name] = prog.source
            shared[name] = workgroup_storage(prog.source, prog.name)
        binds, uniform, wg, grid = rec["bindings"], rec["uniform"], rec["workgroup_size"], rec["dispatch"]
        for b in binds:
            limits["maxStorageBufferBindingSize"] = max(limits["maxStorageBufferBindingSize"], b["size"])
        if uniform is not None:
            limits["maxUniformBufferBindingSize"] = max(limits["maxUniformBufferBindingSize"],
                                                        len(uniform["bytes"]) // 2)
        limits["maxComputeWorkgroupsPerDimension"] = max(limits["maxComputeWorkgroupsPerDimension"], *grid)
        limits["maxStorageBuffersPerShaderStage"] = max(limits["maxStorageBuffersPerShaderStage"], len(binds))
        limits["maxComputeWorkgroupStorageSize"] = max(limits["maxComputeWorkgroupStorageSize"],
                                                       shared[shader_files[prog.cache_key]])
        limits["maxComputeInvocationsPerWorkgroup"] = max(limits["maxComputeInvocationsPerWorkgroup"],
                                                          wg[0] * wg[1] * wg[2])
        for axis, v in zip("XYZ", wg):
            limits[f"maxComputeWorkgroupSize{axis}"] = max(limits[f"maxComputeWorkgroupSize{axis}"], v)
        dispatches.append({"op": rec["op"], "operator": rec["operator"], "program": rec["program"],
                           "shader": list(shaders).index(shader_files[prog.cache_key]),
                           "entry_point": rec["entry_point"], "workgroup_size": wg, "dispatch": grid,
                           "bindings": binds, "uniform": uniform})

    by_index = {t: tensors[t]["name"] for t in tensors}
    sigs = {}
    for key, sd in (signatures or {}).items():
        if sd["subgraph"] == graph.subgraph:
            sigs[key] = {"inputs": {n: by_index.get(t, f"tensor_{t}") for n, t in sd["inputs"].items()},
                         "outputs": {n: by_index.get(t, f"tensor_{t}") for n, t in sd["outputs"].items()}}
    data = {
        "format": PLAN_FORMAT, "version": PLAN_VERSION, "subgraph": int(graph.subgraph),
        "precision": plan.precision,
        "requires": {"features": ["shader-f16"] if plan.precision == "float16" else [], "limits": limits},
        "inputs": [_input_record(plan, tensors[t]) for t in graph.inputs],
        "outputs": [tensors[t] for t in graph.outputs],
        "signatures": sigs, "buffers": buffers, "tensors": [tensors[t] for t in sorted(tensors)],
        "shaders": list(shaders), "dispatches": dispatches,
        "weights_size": len(weights), "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    return SerializedPlan(data, bytes(weights), shaders)

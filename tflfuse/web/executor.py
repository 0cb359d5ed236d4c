"""A Python (wgpu) executor of a serialised plan: what ``tflfuse.js`` does, step for step, on wgpu.

It reads nothing but the data :func:`tflfuse.runtime.serialize.serialize_plan` writes (plan dict, weights,
WGSL files): no model, no kernel. That the values it computes equal the Interpreter's bit for bit on the same
adapter shows the data is complete; ``tflfuse.js`` follows the same steps in the browser.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

from ..runtime.plan import make_bind_group
from ..kernels.wgsl import workgroup_storage
from ..runtime.serialize import SerializedPlan

__all__ = ["PlanDataExecutor"]

#: plan.json dtype name -> the NumPy dtype users give and get.
_HOST = {"float32": np.float32, "int32": np.int32, "bool": np.bool_, "int64": np.int64}


#: A limit of ``requires.limits`` -> what one dispatch needs of it (from its record and its WGSL), to name the
#: dispatch that needs more than a device offers.
_NEEDS = {
    "maxStorageBuffersPerShaderStage": lambda d, wgsl: len(d["bindings"]),
    "maxStorageBufferBindingSize": lambda d, wgsl: max([b["size"] for b in d["bindings"]] + [0]),
    "maxComputeWorkgroupStorageSize": lambda d, wgsl: workgroup_storage(wgsl, d["program"]),
    "maxComputeWorkgroupsPerDimension": lambda d, wgsl: max(d["dispatch"]),
    "maxComputeInvocationsPerWorkgroup": lambda d, wgsl: int(np.prod(d["workgroup_size"])),
}


def _check_limits(data: SerializedPlan, device) -> None:
    """Raises ValueError where the plan's ``requires.limits`` asks more than ``device`` offers: the limit, both
    values and, where one dispatch needs it, that dispatch's op, its index and its program."""
    offered = getattr(device, "limits", {})
    for limit, need in data.plan["requires"]["limits"].items():
        have = offered.get(re.sub(r"[A-Z]", lambda m: "-" + m.group(0).lower(), limit))
        if have is None or need <= have:
            continue
        where = ""
        if limit in _NEEDS:
            for d in data.plan["dispatches"]:
                if _NEEDS[limit](d, data.shaders[data.plan["shaders"][d["shader"]]]) > have:
                    where = f" (op {d['op']}, operator {d['operator']}, program {d['program']})"
                    break
        raise ValueError(f"the plan needs the WebGPU limit {limit} >= {need}{where}; {device.name} offers {have}: "
                         f"run it on an adapter that offers it, or export the model for this one")


class PlanDataExecutor:
    """Runs a :class:`~tflfuse.runtime.serialize.SerializedPlan` on a :class:`tflfuse.runtime.device.Device`.

    Buffers, pipelines and bind groups are made once here; :meth:`run` uploads the inputs, records every
    dispatch into one compute pass of one command buffer, and reads back the outputs.

    Args:
      data: the serialised plan.
      device: the device (its features must include the plan's ``requires.features``).
    Raises:
      ValueError: a feature or limit the plan requires that the device lacks (naming it).
    """

    def __init__(self, data: SerializedPlan, device):
        import wgpu

        self.plan, self.device = data.plan, device
        for feature in self.plan["requires"]["features"]:
            if feature not in device.features:
                raise ValueError(f"the plan needs the WebGPU feature {feature!r}, which {device.name} lacks")
        _check_limits(data, device)
        gpu = device.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self._buffers = []
        for b in self.plan["buffers"]:
            buf = gpu.create_buffer(size=b["size"], usage=usage, label=b["label"])
            if b["kind"] == "weights":
                gpu.queue.write_buffer(buf, 0, data.weights[b["weights_offset"]:b["weights_offset"] + b["size"]])
            self._buffers.append(buf)
        modules = [gpu.create_shader_module(code=data.shaders[name], label=name) for name in self.plan["shaders"]]
        pipelines: dict[tuple[int, str], object] = {}
        self._steps = []
        for d in self.plan["dispatches"]:
            key = (d["shader"], d["entry_point"])
            if key not in pipelines:
                pipelines[key] = gpu.create_compute_pipeline(
                    layout="auto", compute={"module": modules[d["shader"]], "entry_point": d["entry_point"]})
            pipeline = pipelines[key]
            group = make_bind_group(device, pipeline, d, self._buffers)   # as ExecutionPlan binds its records
            self._steps.append((pipeline, group, d["dispatch"]))

    def _upload(self, spec: Mapping, value) -> None:
        want = np.dtype(_HOST[spec["dtype"]])
        value = np.asarray(value)
        if value.dtype != want:
            raise TypeError(f"input {spec['name']!r} must be {spec['dtype']}, got {value.dtype}")
        if list(value.shape) != spec["shape"]:
            raise ValueError(f"input {spec['name']!r} must have shape {spec['shape']}, got {list(value.shape)}")
        if spec["storage"] == "f16":
            raw = value.astype(np.float16).ravel()
            raw = np.concatenate([raw, np.zeros(raw.size % 2, np.float16)])
        else:
            raw = value.astype(np.float32 if spec["storage"] == "f32" else np.int32).ravel()
        if raw.nbytes:
            self.device.device.queue.write_buffer(self._buffers[spec["buffer"]], 0, raw.tobytes())

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs the plan on ``inputs`` (one array per input, in order, of its dtype and shape).

        Returns:
          one array per output, of the output's dtype and shape.
        Raises:
          ValueError / TypeError: a wrong count, shape or dtype of inputs (naming the input).
        """
        specs = self.plan["inputs"]
        if len(inputs) != len(specs):
            raise ValueError(f"the plan takes {len(specs)} inputs ({[s['name'] for s in specs]}), got {len(inputs)}")
        for spec, value in zip(specs, inputs):
            self._upload(spec, value)
        gpu = self.device.device
        encoder = gpu.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        for pipeline, group, grid in self._steps:
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*grid)
        cpass.end()
        gpu.queue.submit([encoder.finish()])
        outs = []
        for spec in self.plan["outputs"]:
            size = int(np.prod(spec["shape"], dtype=np.int64))
            if spec["nbytes"] == 0:
                raw = np.zeros(0, np.float32)
            else:
                raw = np.frombuffer(gpu.queue.read_buffer(self._buffers[spec["buffer"]], 0, spec["nbytes"]),
                                    {"f16": np.float16, "f32": np.float32, "i32": np.int32}[spec["storage"]])
            outs.append(raw[:size].astype(_HOST[spec["dtype"]]).reshape(spec["shape"]))
        return outs

"""``tflfuse.Interpreter``: runs a .tflite on WebGPU with LiteRT's Python Interpreter API."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from ..kernels import UnsupportedOpError
from ..kernels.registry import missing_kernels_error
from ..model import TENSOR_DTYPES, Model
from .device import Device
from .profile import wall_seconds
from .fallback import Partition, litert_runs, log_fallback, partition
from .plan import PRECISIONS, ExecutionPlan, check_supported
from .specialise import SubgraphPlanner

__all__ = ["Interpreter", "SignatureRunner"]


class Interpreter:
    """Runs a .tflite model on a WebGPU adapter; the API of ``ai_edge_litert.interpreter.Interpreter``.

    An op without a tflfuse kernel runs on LiteRT's CPU interpreter (``ai_edge_litert``) within the same
    invoke (``cpu_fallback``, :mod:`tflfuse.runtime.fallback`): a builtin tflfuse lacks, a builtin whose GPU
    kernel refuses its dtype, rank or attributes (the kernel's message is the reason), and any op reading a
    tensor of a type the GPU runtime does not hold (int64, uint8...) that such an op or an input gives; only
    the tensors crossing between GPU and CPU segments move. :attr:`fallback_ops` lists them, and they are
    logged once (absl) when first planned (:meth:`allocate_tensors`). Custom ops without a kernel are refused
    (LiteRT has none either); this is checked when the interpreter is made, before any GPU work. Pipelines,
    bind groups and buffers are built once by :meth:`allocate_tensors`; :meth:`invoke` submits one command
    buffer with every dispatch (recorded during the invoke before) and records the next one while the GPU runs
    (with CPU segments: one submit per run of GPU ops between them, each CPU segment's inputs read back first).

    Shape inputs (SLICE's begin, RESHAPE's shape, MEAN's axis, PAD's paddings, TOPK_V2's k...) computed from
    constants and from the inputs' shapes fold when the plan is made. Where they come from run-time values, the
    plan is specialised on them (:mod:`tflfuse.runtime.specialise`, as LiteRT resizes dynamic tensors): each
    invoke computes them first (a few bytes read back), then runs the plan made for those values, made at the
    first invoke that sees them and kept for the next; outputs then report the shapes of the last invoke.

    Args:
      model_path: path of a .tflite file.
      model_content: the bytes of a .tflite file (exactly one of the two).
      device: a :class:`~tflfuse.runtime.device.Device` to share between interpreters; default: a new one on
        the best adapter (a discrete GPU when present, else the Mesa software Vulkan adapter).
      adapter: substring of an adapter name to pick one (ignored when ``device`` is given).
      experimental_preserve_all_tensors: give every tensor its own buffer so that intermediates can be read
        with :meth:`get_tensor` (as LiteRT's flag of that name); costs memory.
      precision: ``"float32"`` (the default) or ``"float16"``: float tensors (and the tensors a fused op keeps
        in scratch buffers) held as float16 on the GPU, as LiteRT's GPU delegate allows with
        ``precision_loss_allowed`` (its FP16 mode); the tiled matrix products and the fused bottleneck's resident
        form multiply in float16 in runs of at most 16 multiply-adds added into float32 sums; other arithmetic
        and sums run in float32. Inputs are still set and outputs read as float32; an input the GPU reads is
        rounded to float16 (to nearest even) by the first dispatch of each invoke, and carries about 3 significant
        digits (one that only CPU-fallback ops read stays float32). Needs the adapter's ``shader-f16`` feature
        (ValueError at :meth:`allocate_tensors` where it is missing).
      cpu_fallback: True (the default): ops tflfuse has no GPU kernel for, or whose kernel refuses them, run on
        LiteRT's CPU interpreter. False: every op must have a kernel that takes it (UnsupportedOpError, or the
        kernel's KernelError at :meth:`allocate_tensors`, or at :meth:`invoke` where run-time shape values decide).
      num_threads: LiteRT's "number of threads used by the interpreter and available to CPU kernels" (an int
        from 1 to 2**31 - 1, LiteRT's int32; None: LiteRT's default), given to the LiteRT interpreters of the
        CPU fallback (``cpu_fallback``), the only CPU kernels of an invoke. The GPU's command buffers are
        recorded by the thread that calls :meth:`invoke` whatever the value: recording them in other threads measured slower on an NVIDIA H200's
        host (2-3 threads: 1.3-3x the time per invoke, contention in wgpu-native and in Python's interpreter
        lock; README.md).
    Raises:
      ValueError: neither or both of model_path/model_content; a malformed file (``ModelError``); an unknown
        ``precision``; ``num_threads`` not an int from 1 to 2**31 - 1 (as LiteRT; LiteRT also takes a bool).
      UnsupportedOpError: an op without a kernel (with ``cpu_fallback``, only custom ops); the message names
        the op, its index and subgraph.
      NoAdapterError: no WebGPU adapter (raised by :meth:`allocate_tensors`, when the GPU is first needed).

    >>> interp = Interpreter(model_path="model.tflite")        # doctest: +SKIP
    >>> interp.allocate_tensors()                              # doctest: +SKIP
    >>> interp.set_tensor(interp.get_input_details()[0]["index"], x)   # doctest: +SKIP
    >>> interp.invoke(); y = interp.get_tensor(interp.get_output_details()[0]["index"])  # doctest: +SKIP
    """

    def __init__(self, model_path: str | Path | None = None, model_content: bytes | None = None, *,
                 device: Device | None = None, adapter: str | None = None,
                 experimental_preserve_all_tensors: bool = False, precision: str = "float32",
                 cpu_fallback: bool = True, num_threads: int | None = None):
        if (model_path is None) == (model_content is None):
            raise ValueError("give exactly one of model_path and model_content")
        if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                        or not 1 <= num_threads < 2 ** 31):
            raise ValueError(f"num_threads must be an int from 1 to 2**31 - 1 (or None: LiteRT's default), as "
                             f"LiteRT's Interpreter takes it; got {num_threads!r}")
        self._num_threads = num_threads
        self._model = Model.from_path(model_path) if model_path is not None else Model(model_content)
        self._cpu_fallback = bool(cpu_fallback)
        self._partitions: dict[int, Partition | None] = {}
        self._planners: dict[int, SubgraphPlanner] = {}
        self._allocated: set[int] = set()   # subgraphs whose planner has allocated (a plan, or specialised)
        try:
            check_supported(self._model)
        except UnsupportedOpError as e:   # builtins fall back to LiteRT's CPU interpreter, custom ops cannot
            refused = [op for op in e.ops if not litert_runs(op[0])] if cpu_fallback else e.ops   # (but LiteRT's)
            if refused:
                raise missing_kernels_error(refused) from None
        self._device = device
        self._adapter = adapter
        self._preserve = experimental_preserve_all_tensors
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self._precision = precision
        self._resized: dict[int, dict[int, tuple[int, ...]]] = {}
        self._inputs_set: dict[int, set[int]] = {}
        self._lock = threading.Lock()

    # ---- set-up ----------------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        """The WebGPU device (made on first use)."""
        if self._device is None:
            self._device = Device(self._adapter)
        return self._device

    @property
    def model(self) -> Model:
        return self._model

    def _partition(self, subgraph: int) -> Partition | None:
        """The CPU fallback's split of ``subgraph`` (logged once), None where every op runs on the GPU."""
        if subgraph not in self._partitions:
            part = partition(self._model, subgraph) if self._cpu_fallback else None
            if part is not None and part.refused:
                raise missing_kernels_error(part.refused)
            self._partitions[subgraph] = part if part is not None and part.cpu else None
            if self._partitions[subgraph] is not None:
                log_fallback(part)
        return self._partitions[subgraph]

    @property
    def fallback_ops(self) -> list[tuple[int, str, str]]:
        """``(operator index, op name, reason)`` of each op of the main subgraph that runs on LiteRT's CPU
        interpreter, in op order (empty where every op runs on the GPU). The index is that of the subgraph as
        planned: composites without a kernel inlined, as in every other message of the runtime. The reason is
        ``"no GPU kernel"``, the tensor of a type the GPU does not hold, int64 arithmetic, or the message of the GPU
        kernel that refused the op. Needs no GPU (it can be read before :meth:`allocate_tensors`: the graph is
        lowered without one); where the plan is specialised on run-time shape values, an op that only those
        values make its kernel refuse shows from the :meth:`invoke` that plans it (the last invoke's plan).

        Raises:
          KernelError, ModelError: as :meth:`allocate_tensors`, for a file whose main subgraph cannot be planned
            (a composite's decomposition that contains itself, a string input...).
        """
        planner = self._planners.get(0)
        if planner is None:   # decided without a GPU: for the adapter's target where one is made already
            planner = self._new_planner(0)
            planner.decide(self._target() if self._device is not None else "gpu")
        return [(f.index, f.name, f.reason) for f in planner.fallback_ops]

    def allocate_tensors(self) -> None:
        """Builds the execution plan of the main subgraph: shapes, kernels, buffers, pipelines (where run-time
        values decide shapes, the plan for them is made at the first :meth:`invoke` that sees them)."""
        self._planner(0, build=True)

    def _target(self) -> str:
        return "cpu" if self.device.is_software else "gpu"

    def _new_planner(self, subgraph: int) -> SubgraphPlanner:
        self._planners[subgraph] = SubgraphPlanner(
            self._model, subgraph, self._partition(subgraph), fallback=self._cpu_fallback,
            input_shapes=self._resized.get(subgraph), preserve=self._preserve, precision=self._precision,
            device=lambda: self.device, num_threads=self._num_threads)
        self._inputs_set[subgraph] = set()
        return self._planners[subgraph]

    def _planner(self, subgraph: int, build: bool = False) -> SubgraphPlanner:
        """The allocated planner of ``subgraph`` (:mod:`tflfuse.runtime.specialise`)."""
        if subgraph not in self._allocated:
            self._check_subgraph(subgraph)
            if not build and subgraph == 0:
                raise RuntimeError("call allocate_tensors() before invoke(), set_tensor() or get_tensor()")
            planner = self._planners.get(subgraph) or self._new_planner(subgraph)
            planner.allocate(self._target())
            self._allocated.add(subgraph)
        return self._planners[subgraph]

    def _plan(self, subgraph: int, build: bool = False) -> ExecutionPlan:
        """The GPU plan of ``subgraph`` (of its last invoke, where run-time values specialise it).

        Raises:
          RuntimeError: a specialised plan before its first :meth:`invoke`.
        """
        planner = self._planner(subgraph, build)
        if planner.current is None:
            raise RuntimeError(f"subgraph {subgraph}'s plan is specialised on run-time shape values (tensors "
                               f"{planner.runtime}); it is made at invoke(): call invoke() first")
        return planner.current.plan

    def _check_subgraph(self, subgraph: int) -> None:
        n = len(self._model.subgraphs)
        if isinstance(subgraph, bool) or not isinstance(subgraph, (int, np.integer)) or not 0 <= subgraph < n:
            raise ValueError(f"subgraph_index {subgraph!r} is out of range; the model has {n} subgraph(s)")

    def _check_tensor_index(self, subgraph: int, tensor_index: int) -> None:
        n = len(self._model.subgraphs[subgraph].tensors)
        if isinstance(tensor_index, bool) or not isinstance(tensor_index, (int, np.integer)) \
                or not 0 <= tensor_index < n:
            raise ValueError(f"tensor_index {tensor_index!r} is out of range; subgraph {subgraph} has {n} tensors")

    def resize_tensor_input(self, input_index: int, tensor_size: Sequence[int], strict: bool = False) -> None:
        """Sets a new shape for an input; takes effect at the next :meth:`allocate_tensors`. Sizes of 0 are
        valid (an empty batch, as in LiteRT): the ops then compute empty tensors.

        Raises:
          TypeError: ``tensor_size`` is not a 1-D sequence of ints (a str, a scalar, None, a nested list).
          ValueError: not an input, a negative or fractional size, a size past int32, or (``strict``) a size
            that changes a dimension the shape signature fixes.
        """
        self._resize(0, input_index, tensor_size, strict)

    def _resize(self, subgraph: int, input_index: int, tensor_size: Sequence[int], strict: bool = False) -> None:
        sg = self._model.subgraphs[subgraph]
        inputs = [int(i) for i in sg.inputs]
        if input_index not in inputs:
            raise ValueError(f"tensor {input_index} is not an input of subgraph {subgraph}; inputs: {inputs}")
        shape = _shape_arg(tensor_size)
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor_size must not be negative, got {list(shape)}")
        sig = self._model.tensor_shape_signature(subgraph, input_index)
        if strict and (len(sig) != len(shape) or any(s != -1 and s != d for s, d in zip(sig, shape))):
            raise ValueError(f"strict resize of input {input_index}: {list(shape)} disagrees with the "
                             f"shape signature {list(sig)}")
        self._resized.setdefault(subgraph, {})[input_index] = shape
        self._planners.pop(subgraph, None)
        self._allocated.discard(subgraph)

    # ---- details ---------------------------------------------------------------------------------
    def _details(self, subgraph: int, tensors: Sequence[int]) -> list[dict]:
        m = self._model
        planner = self._planners.get(subgraph)
        built = planner.current if planner is not None else None
        plan, runner = (built.plan, built.runner) if built is not None else (None, None)
        resized = self._resized.get(subgraph, {})
        out = []
        for t in tensors:
            if plan and t in plan.graph.specs:
                shape = plan.graph.specs[t].shape
            elif plan and t in plan.graph.consts:   # a constant, or a value folded at load (SHAPE's)
                shape = plan.graph.consts[t].shape
            elif runner and t in runner.shapes:
                shape = runner.shapes[t]   # a tensor held on the host (CPU fallback)
            else:  # as LiteRT, a resized input reports its new shape before allocate_tensors()
                shape = resized.get(t, m.tensor_shape(subgraph, t))
            # As LiteRT: a file without a shape signature (a static model) reports the current shape.
            signature = shape if m.tensor(subgraph, t).shapeSignature is None else \
                m.tensor_shape_signature(subgraph, t)
            q = m.tensor(subgraph, t).quantization
            scales = np.asarray(q.scale if q is not None and q.scale is not None else [], np.float32)
            zps = np.asarray(q.zeroPoint if q is not None and q.zeroPoint is not None else [], np.int32)
            out.append({
                "name": m.tensor_name(subgraph, t),
                "index": int(t),
                "shape": np.array(shape, np.int32),
                "shape_signature": np.array(signature, np.int32),
                "dtype": m.tensor_dtype(subgraph, t).type,
                "quantization": (float(scales[0]) if scales.size == 1 else 0.0,
                                 int(zps[0]) if zps.size == 1 else 0),
                "quantization_parameters": {"scales": scales, "zero_points": zps,
                                            "quantized_dimension": int(q.quantizedDimension) if q else 0,
                                            "block_size": 0},  # blockwise quantization is not read
                "sparsity_parameters": {},
            })
        return out

    def get_input_details(self) -> list[dict]:
        """One dict per model input: name, index, shape, shape_signature, dtype, quantization..."""
        return self._details(0, list(self._model.subgraphs[0].inputs))

    def get_output_details(self) -> list[dict]:
        return self._details(0, list(self._model.subgraphs[0].outputs))

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict]:
        """Details (as :meth:`get_input_details`) of every tensor of a subgraph, in index order, as LiteRT's
        ``get_tensor_details``: constants and intermediates too, with their ``shape_signature``. Tensors of a
        type tflfuse does not read are left out.

        Raises:
          ValueError: ``subgraph_index`` is not the index of a subgraph of the model.
        """
        self._check_subgraph(subgraph_index)
        tensors = self._model.subgraphs[subgraph_index].tensors
        readable = [t for t in range(len(tensors)) if tensors[t].type in TENSOR_DTYPES]
        return self._details(int(subgraph_index), readable)

    # ---- running ---------------------------------------------------------------------------------
    def set_tensor(self, tensor_index: int, value, subgraph_index: int = 0) -> None:
        """Copies ``value`` into an input tensor (any memory layout or byte order of the tensor's dtype).

        Raises:
          ValueError: the tensor is not an input, or the shape disagrees with the allocated shape; or an op reads
            it as indices (GATHER, GATHER_ND, SCATTER_ND) and a value is out of range, where TFLite's invoke would
            stop ("index out of bounds"; the message names the op, its index and the first such value). Nothing
            is written then.
          TypeError: the dtype is not the tensor's dtype (no silent casts, as in LiteRT).
        """
        planner = self._planner(subgraph_index)
        if tensor_index not in planner.inputs:
            raise ValueError(f"tensor {tensor_index} is not an input of subgraph {subgraph_index}; "
                             f"inputs: {planner.inputs}")
        value = np.asarray(value)
        # The file's dtype (bool, int64 held as int32 on the GPU; uint8... for inputs only CPU segments read).
        want, shape = planner.input_dtype(tensor_index), planner.input_shape(tensor_index)
        if value.dtype != want and value.dtype.newbyteorder("=") == want:  # big-endian data (np.load)
            value = value.astype(want)
        if value.dtype != want:
            raise TypeError(f"tensor {tensor_index} ({self._model.tensor_name(subgraph_index, tensor_index)!r}) "
                            f"expects {want}, got {value.dtype}")
        if value.shape != shape:
            raise ValueError(f"tensor {tensor_index} ({self._model.tensor_name(subgraph_index, tensor_index)!r}) "
                             f"has shape {list(shape)}, got {list(value.shape)}; use "
                             f"resize_tensor_input() then allocate_tensors() to change it")
        with self._lock:
            planner.check_values(tensor_index, value)
            planner.write(tensor_index, value)
            self._inputs_set[subgraph_index].add(tensor_index)

    def reset_all_variables(self) -> None:
        """LiteRT's call to reset variable tensors (a builtin LSTM's state, for one): a no-op here, since a
        tflfuse invoke keeps no state from the invoke before (recurrent ops start from zeros, as Keras'
        layers do)."""

    def invoke(self, subgraph_index: int = 0) -> None:
        """Runs the subgraph: one submit of every dispatch and of the outputs' copies to read-back buffers.

        Thread safety: each call is whole (a lock), but the inputs are shared state: threads that share one
        Interpreter hold their own lock around set_tensor/invoke/get_tensor, or each use an Interpreter of
        their own (Interpreters can share one :class:`Device` and its pipeline cache from several threads).

        Raises:
          RuntimeError: an input was never set, or :meth:`allocate_tensors` was not called; a CPU fallback
            segment failed in LiteRT, or gave an output of another shape than planned (the message names its ops).
          ValueError: in a model whose plan follows run-time values (a shape computed from an input), an input
            read as indices holds a value out of range for the plan this invoke picked (:meth:`set_tensor` refuses
            them where one plan runs every invoke).
          DeviceLostError: the device is lost (a RuntimeError naming it): make a new Device and Interpreter.
        """
        planner = self._planner(subgraph_index)
        missing = [t for t in planner.inputs if t not in self._inputs_set[subgraph_index]]
        if missing:
            raise RuntimeError(f"inputs {missing} were never set; call set_tensor() for each input first")
        with self._lock:
            planner.run()

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of an input, output or constant tensor after :meth:`invoke` (a constant that no op reads too). An
        input of a plan specialised on run-time shape values reads as it was last set, before any float16 rounding.

        Raises:
          ValueError: ``tensor_index`` or ``subgraph_index`` out of range, or an intermediate tensor (its
            buffer is reused by later ops, or it stays inside a CPU fallback segment).
          RuntimeError: a tensor the CPU fallback computes, before the first :meth:`invoke`.
        """
        planner = self._planner(subgraph_index)
        self._check_tensor_index(subgraph_index, tensor_index)
        held = planner.host_input(tensor_index) if tensor_index in planner.inputs else None
        if held is not None:   # a plan picked per invoke: the input as set (the plan last run may hold an older one)
            return held.copy()
        if planner.current is None:   # a specialised plan before its first invoke
            return self._tensor_before_invoke(planner, subgraph_index, tensor_index)
        plan, runner = planner.current.plan, planner.current.runner
        if runner is not None and runner.holds(tensor_index):   # computed on the CPU, or a host-only input
            with self._lock:
                return runner.read(tensor_index)
        g = plan.graph
        if tensor_index not in g.consts and tensor_index not in g.inputs + g.outputs and not (
                self._preserve and tensor_index in g.specs):
            if runner is not None and runner.computes(tensor_index):
                raise ValueError(f"tensor {tensor_index} is an intermediate tensor of a CPU fallback segment; only "
                                 f"inputs, outputs and constants can be read (experimental_preserve_all_tensors=True "
                                 f"keeps every tensor)")
            if tensor_index not in g.specs:  # no op reads or writes it: a constant reads as its data
                data = self._model.tensor_data(subgraph_index, tensor_index)
                if data is not None:
                    return data
                raise ValueError(f"tensor {tensor_index} is neither a constant nor computed by the model")
            raise ValueError(f"tensor {tensor_index} is an intermediate tensor whose buffer is reused; "
                             f"only inputs, outputs and constants can be read")
        with self._lock:
            return plan.read(tensor_index)

    # ---- signatures ------------------------------------------------------------------------------
    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {k: {"inputs": list(v["inputs"]), "outputs": list(v["outputs"])}
                for k, v in self._model.signature_defs().items()}

    def get_signature_runner(self, signature_key: str | None = None) -> "SignatureRunner":
        """A callable that runs one signature: ``runner(x=array) -> {"output_0": array}``.

        Raises:
          ValueError: an unknown key (the message lists the known keys), or no key given when the model has
            several signatures.
        """
        sigs = self._model.signature_defs()
        if signature_key is None:
            if len(sigs) != 1:
                raise ValueError(f"the model has {len(sigs)} signatures; name one of {sorted(sigs)}")
            signature_key = next(iter(sigs))
        if signature_key not in sigs:
            raise ValueError(f"no signature {signature_key!r}; the model has {sorted(sigs)}")
        return SignatureRunner(self, sigs[signature_key])

    # ---- facts -----------------------------------------------------------------------------------
    @property
    def adapter_info(self) -> dict:
        """The adapter the interpreter runs on (``device``, ``adapter_type``, ``backend_type``...)."""
        return dict(self.device.info)

    @property
    def dispatch_count(self) -> int:
        """Dispatches one :meth:`invoke` of the main subgraph records."""
        return self._plan(0).dispatch_count

    def time_invoke(self, repeats: int = 10) -> float:
        """Median seconds per invoke with a read-back of the first output (inputs must be set)."""
        with self._lock:
            planner = self._planner(0)
            if not planner.specialised:
                return planner.current.executor.time_run(repeats)
            first = self._model.subgraphs[0].outputs[0]
            return wall_seconds(planner.run, lambda t: planner.current.executor.read(t), first, repeats)

    def _tensor_before_invoke(self, planner: SubgraphPlanner, subgraph: int, t: int) -> np.ndarray:
        """get_tensor of a specialised plan before its first invoke: an input as set, or a constant."""
        if planner.host_input(t) is not None:
            return planner.host_input(t).copy()
        data = self._model.tensor_data(subgraph, t)
        if data is not None:
            return data
        raise RuntimeError(f"tensor {t} is computed by a plan specialised on run-time shape values, made at the "
                           f"first invoke(); call invoke() first")


def _shape_arg(tensor_size) -> tuple[int, ...]:
    """``tensor_size`` of ``resize_tensor_input`` as a tuple of ints; TypeError/ValueError naming it."""
    if isinstance(tensor_size, (str, bytes)) or np.ndim(tensor_size) != 1:
        raise TypeError(f"tensor_size must be a 1-D sequence of ints such as [1, 224, 224, 3], got {tensor_size!r}")
    shape = []
    for d in tensor_size:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer, float, np.floating)):
            raise TypeError(f"tensor_size must hold ints, got {d!r} in {list(tensor_size)}")
        if not float(d).is_integer():
            raise ValueError(f"tensor_size must hold whole numbers, got {d!r} in {list(tensor_size)}")
        if abs(int(d)) >= 1 << 31:
            raise ValueError(f"tensor_size {list(tensor_size)}: {int(d)} does not fit a TFLite dimension (int32)")
        shape.append(int(d))
    return tuple(shape)


class SignatureRunner:
    """Runs one signature of an :class:`Interpreter` (as LiteRT's ``SignatureRunner``)."""

    def __init__(self, interpreter: Interpreter, signature: dict):
        self._interp = interpreter
        self._sig = signature
        self._sg = signature["subgraph"]
        interpreter._planner(self._sg, build=True)

    def get_input_details(self) -> dict[str, dict]:
        names = self._sig["inputs"]
        return dict(zip(names, self._interp._details(self._sg, names.values())))

    def get_output_details(self) -> dict[str, dict]:
        names = self._sig["outputs"]
        return dict(zip(names, self._interp._details(self._sg, names.values())))

    def __call__(self, **inputs) -> dict[str, np.ndarray]:
        """Runs the signature on ``inputs`` (name -> array), resizing inputs whose shape changed (as LiteRT).

        Raises:
          ValueError: an unknown or missing input name, or a shape the model cannot take.
          TypeError: an input of the wrong dtype.
        """
        unknown = sorted(set(inputs) - set(self._sig["inputs"]))
        if unknown:
            raise ValueError(f"unknown inputs {unknown}; the signature takes {sorted(self._sig['inputs'])}")
        interp, sg = self._interp, self._sg
        missing = sorted(set(self._sig["inputs"]) - set(inputs))
        if missing:
            raise ValueError(f"missing input {missing[0]!r}; the signature takes {sorted(self._sig['inputs'])}")
        planner = interp._planner(sg, build=True)
        changed = {t: np.shape(inputs[name]) for name, t in self._sig["inputs"].items()
                   if np.shape(inputs[name]) != planner.input_shape(t)}
        for t, shape in changed.items():  # all at once: one new plan for the new shapes
            interp._resize(sg, t, shape)
        interp._planner(sg, build=True)
        for name, t in self._sig["inputs"].items():
            interp.set_tensor(t, inputs[name], subgraph_index=sg)
        interp.invoke(subgraph_index=sg)
        return {name: interp.get_tensor(t, subgraph_index=sg) for name, t in self._sig["outputs"].items()}

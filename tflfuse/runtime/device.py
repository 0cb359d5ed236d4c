"""The WebGPU device: adapter choice, limits, and the pipeline cache.

One :class:`Device` object is passed to whatever needs the GPU (or made on first use by an Interpreter);
nothing here is a module-level global.
"""

from __future__ import annotations

import os
import threading

from absl import logging

from .._tfload import DRIVER_FILE_VARIABLES, DriversBoundError, isolate_vulkan_drivers
from ..kernels.base import DEFAULT_MAX_STORAGE_BINDING, Program

__all__ = ["BACKENDS", "Device", "DeviceLostError", "NoAdapterError", "ShaderCompileError"]

_ADAPTER_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}
_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "OpenGL": 2}

_INSTALL_HINT = (
    "Install a Vulkan driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers` gives the software "
    "adapter (llvmpipe) on a machine without a GPU; with an NVIDIA/AMD/Intel GPU install its Vulkan driver.")


def _install_hint(backend: str = "wgpu-native") -> str:
    """What to install, and the loader's variables that set its driver search where they are set; for Dawn, that
    it needs a GPU."""
    if backend == "dawn":
        return ("Dawn runs on GPU drivers only (it refuses Mesa's llvmpipe, the software adapter): on a machine "
                "without a GPU use backend='wgpu-native' (WGPU_BACKEND_TYPE=Null gives Dawn's Null backend, which "
                "validates shaders and runs nothing)")
    given = ", ".join(f"{v}={os.environ[v]!r}" for v in DRIVER_FILE_VARIABLES if os.environ.get(v))
    return _INSTALL_HINT + (f" The Vulkan loader's driver search is set by {given}: check that they name the "
                            f"manifests of installed drivers." if given else "")


class NoAdapterError(RuntimeError):
    """No WebGPU adapter could be found or opened."""


class DeviceLostError(RuntimeError):
    """The WebGPU device was lost (destroyed, a driver reset or crash, out of memory): nothing made on it can
    run again. Make a new :class:`Device` and new Interpreters."""


class ShaderCompileError(RuntimeError):
    """A kernel's WGSL did not compile on the device (a bug of tflfuse's or of the driver's, never of the
    model's); the message names the program, and (from a plan) the op, its index and its input shapes."""


class _Guard:
    """:meth:`Device.guard`'s context manager: an exception that reports a lost device marks the device lost and
    leaves as :class:`DeviceLostError`; any other passes through unchanged."""

    __slots__ = ("device", "what")

    def __init__(self, device: "Device", what: str):
        self.device, self.what = device, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or isinstance(error, DeviceLostError) or not isinstance(error, Exception) or \
                not _says_lost(error):
            return False
        self.device.lost = " ".join(str(error).split())
        raise DeviceLostError(self.device._lost_message(self.what)) from error


def _says_lost(error: BaseException) -> bool:
    """Whether a wgpu error reports a lost device (wgpu-native: "Parent device is lost", "Device lost"; Dawn:
    "[Device] is lost.")."""
    text = str(error).lower()
    return any(s in text for s in ("device is lost", "device lost", "device was lost", "device] is lost"))


def _default_runtime_dir() -> None:
    """Sets ``XDG_RUNTIME_DIR`` (to a private folder under the temp dir) where it is unset: Mesa's Vulkan
    driver prints an error for every device it opens without it."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"tflfuse-runtime-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = path
    except OSError as e:
        logging.debug("tflfuse: cannot make %s: %s", path, e)


def _primary_backends_only() -> None:
    """Limits wgpu to its primary backends (Vulkan, Metal, D3D12) before its instance exists.

    Enumerating the OpenGL backend loads Mesa's GL driver with RTLD_GLOBAL, which puts Mesa's libLLVM in
    the process-wide scope; a TensorFlow imported afterwards binds to it and crashes. Compute through GL is
    not used by tflfuse anyway. Once wgpu's instance exists this cannot change, and nothing is done.
    """
    try:
        from wgpu.backends.wgpu_native.extras import set_instance_extras

        set_instance_extras(backends=["Primary"])
    except Exception as e:  # an older wgpu, or an instance already made by the application
        logging.debug("tflfuse: could not limit wgpu to its primary backends: %s", e)


def prepare_wgpu() -> None:
    """Everything done once before wgpu first lists adapters: ``XDG_RUNTIME_DIR``, Mesa's drivers kept from
    TensorFlow's LLVM symbols (``tflfuse/_tfload.py``), and the primary backends only.

    Raises:
      NoAdapterError: Mesa's drivers were loaded against TensorFlow's LLVM before tflfuse could keep them
        apart (the message says what to do).
    """
    _prepare_process()
    _primary_backends_only()


def _prepare_process() -> None:
    """What any WebGPU implementation needs done first in this process: ``XDG_RUNTIME_DIR`` and Mesa's drivers
    kept from TensorFlow's LLVM symbols. Raises NoAdapterError as :func:`prepare_wgpu` does."""
    _default_runtime_dir()
    try:
        isolate_vulkan_drivers()
    except DriversBoundError as e:
        raise NoAdapterError(str(e)) from e


#: The WebGPU implementations a :class:`Device` runs on: wgpu-native (the ``wgpu`` package, the default) and Dawn,
#: Chrome's (the ``wgpudawn`` package, the same Python API; ``pip install tflfuse[dawn]``).
BACKENDS = ("wgpu-native", "dawn")
#: Dawn's feature for the GPU's matrix units (``enable chromium_experimental_subgroup_matrix;`` in WGSL).
SUBGROUP_MATRIX_FEATURE = "chromium-experimental-subgroup-matrix"
#: Dawn's toggles a Dawn device is made with: experimental features (subgroup matrices) need
#: ``allow_unsafe_apis``, and Dawn offers ``shader-f16`` (and f16 subgroup matrices) on NVIDIA's Vulkan driver only
#: with ``vulkan_enable_f16_on_nvidia``.
DAWN_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
#: Dawn's device toggles a Dawn device is made without: ``timestamp_quantization`` (a browser's guard against timing
#: attacks) rounds timestamp queries to multiples of 2**16 ns (65.5 us steps, seen on an H100 on 2026-12-07), too
#: coarse for :mod:`tflfuse.runtime.profile`.
DAWN_DISABLED_TOGGLES = ("timestamp_quantization",)
#: Dawn's feature that makes a device's calls safe from several threads (wgpu-native's are): asked for where the
#: adapter offers it.
DAWN_THREADS_FEATURE = "implicit-device-synchronization"


def _wgpu_native():
    """The ``wgpu`` module (wgpu-native), after :func:`prepare_wgpu`."""
    prepare_wgpu()
    import wgpu

    return wgpu


#: Whether :func:`_dawn` made Dawn's instance (with :data:`DAWN_TOGGLES`) in this process.
_DAWN_INSTANCE_OURS = False


def _dawn():
    """The ``wgpudawn`` module, its instance made with :data:`DAWN_TOGGLES` and the primary backends where this
    process has not made it yet (else as it was made: logged). Raises NoAdapterError where wgpudawn is not
    installed."""
    _prepare_process()
    try:
        import wgpudawn
        from wgpudawn.backends.dawn import _extras_device
    except ImportError as e:
        raise NoAdapterError(f"backend 'dawn' needs the package wgpudawn (pip install tflfuse[dawn]): {e}") from e
    global _DAWN_INSTANCE_OURS
    try:
        # the primary backends, unless WGPU_BACKEND_TYPE picks one (wgpudawn reads it: "Null", Dawn's backend
        # that runs nothing, validates every shader and pipeline as on a GPU)
        backends = ["All"] if os.environ.get("WGPU_BACKEND_TYPE") else ["Primary"]
        _extras_device.set_instance_extras(backends=backends, enable_toggles=list(DAWN_TOGGLES))
        _DAWN_INSTANCE_OURS = True
    except RuntimeError as e:   # the instance exists already (made by the application, or by an earlier Device)
        if _DAWN_INSTANCE_OURS:   # made here, with the toggles, for an earlier Device
            return wgpudawn
        logging.info("tflfuse: Dawn's instance was made before tflfuse's first Dawn device, without the toggles %s "
                     "(no subgroup matrices unless it has them): %s", ", ".join(DAWN_TOGGLES), e)
    return wgpudawn


def adapters_of(wgpu, backend: str) -> list:
    """The adapters of ``wgpu``, the module of ``backend`` (:data:`BACKENDS`; :func:`_wgpu_native` or :func:`_dawn`
    gives it): Dawn lists none of a backend that ``WGPU_BACKEND_TYPE`` forces, so there the one it gives when asked
    for one. Raises whatever the library raises where no backend loads (plain Exceptions)."""
    adapters = list(wgpu.gpu.enumerate_adapters_sync())
    if not adapters and backend == "dawn":
        adapters = [a for a in [wgpu.gpu.request_adapter_sync(power_preference="high-performance")] if a]
    return adapters


def _subgroup_matrix(device: "Device"):
    """The :class:`~tflfuse.kernels.matrix.SubgroupMatrix` of a Dawn device, or None: where it has
    :data:`SUBGROUP_MATRIX_FEATURE` and ``shader-f16``, lists the configuration the kernels use (f16 16 x 16 x 16
    with f32 results) at one subgroup size, that size is the adapter's largest (Dawn's rule for a workgroup's x
    size), and a workgroup holds :data:`~tflfuse.kernels.matrix.MAX_SUBGROUPS` subgroups of it."""
    from ..kernels.matrix import MAX_SUBGROUPS, SUBGROUP_SIZES, SubgroupMatrix

    if not {SUBGROUP_MATRIX_FEATURE, "shader-f16"} <= device.features:
        return None
    try:
        from wgpudawn.backends.dawn import _api
        from wgpudawn.backends.dawn._extras_adapter import get_adapter_properties

        configs = get_adapter_properties(device.adapter).get("subgroup_matrix_configs") or []
        info = _api.new_struct_p("WGPUAdapterInfo *")
        if _api.lib.wgpuAdapterGetInfo(device.adapter._internal, info) != _api.lib.WGPUStatus_Success:
            return None
        largest = int(info.subgroupMaxSize)
        _api.lib.wgpuAdapterInfoFreeMembers(info[0])
    except Exception as e:  # noqa: BLE001  (an older wgpudawn: no matrices rather than no device)
        logging.info("tflfuse: Dawn's subgroup-matrix configurations could not be read (%s)", e)
        return None
    limits = device.limits
    if MAX_SUBGROUPS * largest > min(limits.get("max-compute-invocations-per-workgroup", 256),
                                     limits.get("max-compute-workgroup-size-x", 256)):
        return None   # a tile's subgroups would not fit in a workgroup
    for c in configs:
        if (c["component_type"], c["result_component_type"], c["m"], c["n"], c["k"]) == ("f16", "f32", 16, 16, 16) \
                and c["min_subgroup_size"] == c["max_subgroup_size"] == largest and largest in SUBGROUP_SIZES:
            return SubgroupMatrix(largest, int(limits.get("max-compute-workgroup-storage-size", 16384)))
    return None


def _env_bool(name: str) -> bool:
    """Environment variable ``name`` as a bool: 1/true/yes/on or 0/false/no/off (any case). Raises ValueError
    naming the variable for anything else."""
    value = os.environ[name].strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={os.environ[name]!r}: set it to 1 (on) or 0 (off), or unset it")


def _info(adapter) -> dict:
    return dict(adapter.info)


class Device:
    """A wgpu device on the best available adapter, with a cache of compute pipelines.

    Args:
      adapter: optional case-insensitive substring of the adapter's name (``"llvmpipe"``, ``"H200"``) to
        pick a particular one; default: the environment variable ``TFLFUSE_ADAPTER``, else the best by
        kind (discrete GPU, integrated GPU, ..., software/CPU last) and backend (Vulkan first).
      shader_checks: whether the shaders keep the runtime checks that wgpu's shader translator (naga) adds to
        any WGSL it is given: a clamp of every index into a workgroup or function-local array that it cannot
        prove in bounds, and a counter on every loop that stops it after 2**64 iterations (wgpu's
        ``ShaderRuntimeChecks``). False compiles tflfuse's programs as trusted modules
        (``wgpuDeviceCreateShaderModuleTrusted``, wgpu-native only): they are generated by tflfuse, never
        supplied by a model, and tested against references; storage buffers stay guarded by the driver's
        robust buffer access. True compiles them as any WebGPU shader (a browser always does). Default: the
        environment variable ``TFLFUSE_SHADER_CHECKS`` (``1`` on, ``0`` off) where set, else off on a GPU
        and on for a software adapter, each the faster there (``benchmarks/RESULTS-shader-checks.md``: on an
        H200 the trusted modules took 0.67-0.97x the GPU time of the checked ones; on Mesa's llvmpipe
        0.99-1.15x, ``RESULTS-shader-checks-llvmpipe.md``). On Dawn, off is its device toggle
        ``disable_robustness`` (no index clamping by Tint): MobileNetV2 at batch 32 in float16 took 0.93x and
        0.92x of the GPU time with the checks (990.7 against 1060.5 us unfused, 828.1 against 904.8 fused; an H100,
        2026-12-07, a process each, before :data:`~tflfuse.kernels.matrix.MEASURED_MATRIX_TILES`;
        ``benchmarks/dawn_matrix.py`` under ``TFLFUSE_SHADER_CHECKS=1`` and ``0`` times the same).
      backend: the WebGPU implementation (:data:`BACKENDS`): ``"wgpu-native"`` (the ``wgpu`` package) or
        ``"dawn"`` (Chrome's, through the ``wgpudawn`` package, made with :data:`DAWN_TOGGLES`); default: the
        environment variable ``TFLFUSE_WEBGPU`` where set, else ``"wgpu-native"``. On Dawn, where the adapter has
        f16 subgroup matrices (:attr:`subgroup_matrix`; NVIDIA's tensor cores through Vulkan), a float16 plan runs
        its matrix products on them (:mod:`tflfuse.kernels.matrix`); everything else runs the same WGSL as on
        wgpu-native, recorded through the same compiled loop (:mod:`tflfuse.runtime.record`).
    Raises:
      NoAdapterError: no adapter exists (the message says what to install) or none matches ``adapter``; or
        ``backend="dawn"`` without the ``wgpudawn`` package.
      TypeError: ``shader_checks`` is not a bool or None.
      ValueError: ``backend`` (or ``TFLFUSE_WEBGPU``) is not one of :data:`BACKENDS`.
      ValueError: ``TFLFUSE_SHADER_CHECKS`` is set to something other than 1/0 (true/false, yes/no, on/off).
    """

    def __init__(self, adapter: str | None = None, *, shader_checks: bool | None = None,
                 backend: str | None = None):
        if shader_checks is None and os.environ.get("TFLFUSE_SHADER_CHECKS", "").strip():
            shader_checks = _env_bool("TFLFUSE_SHADER_CHECKS")
        if shader_checks is not None and not isinstance(shader_checks, bool):
            raise TypeError(f"Device(shader_checks=...) takes True, False or None, got {shader_checks!r}")
        if backend is None:
            backend = os.environ.get("TFLFUSE_WEBGPU", "").strip().lower() or "wgpu-native"
            where = f"TFLFUSE_WEBGPU={os.environ.get('TFLFUSE_WEBGPU')!r}"
        else:
            where = "Device(backend=...)"
            backend = backend.strip().lower() if isinstance(backend, str) else backend
        if backend not in BACKENDS:
            raise ValueError(f"{where}: the WebGPU implementation is one of {list(BACKENDS)}, got {backend!r}")
        #: The WebGPU implementation: ``"wgpu-native"`` or ``"dawn"`` (:data:`BACKENDS`).
        self.backend = backend
        wgpu = _dawn() if backend == "dawn" else _wgpu_native()
        self._wgpu = wgpu
        want = adapter if adapter is not None else os.environ.get("TFLFUSE_ADAPTER") or None
        try:
            adapters = adapters_of(wgpu, backend)
        except Exception as e:  # wgpu-native raises plain Exceptions when no backend loads
            raise NoAdapterError(f"WebGPU adapters could not be listed ({e}). {_install_hint(backend)}") from e
        if want:
            names = [_info(a).get("device", "") for a in adapters]
            adapters = [a for a, name in zip(adapters, names) if str(want).lower() in name.lower()]
            if not adapters:
                where = "set by TFLFUSE_ADAPTER" if adapter is None else "the adapter argument"
                raise NoAdapterError(f"no WebGPU adapter matches {want!r} ({where}); the adapters here "
                                     f"are: {', '.join(repr(n) for n in names) or 'none'}")
        if not adapters:
            raise NoAdapterError(f"no WebGPU adapter found. {_install_hint(backend)}")
        adapters.sort(key=lambda a: (_ADAPTER_RANK.get(_info(a).get("adapter_type"), 3),
                                     _BACKEND_RANK.get(_info(a).get("backend_type"), 3)))
        self.adapter = adapters[0]
        self.info = _info(self.adapter)
        #: Whether shaders keep wgpu's runtime checks (see the ``shader_checks`` argument).
        self.shader_checks = self.is_software if shader_checks is None else shader_checks
        limits = dict(self.adapter.limits)
        wanted = {k: limits[k] for k in (
            "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
            "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
            "max-compute-workgroup-size-x", "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
            "max-compute-workgroups-per-dimension") if k in limits}
        # timestamp-query for profiling; shader-f16 and subgroup for kernels that use them where offered; Dawn's
        # subgroup matrices for the float16 plan's products; and on Dawn its implicit device synchronization, so
        # that Interpreters on one device may be invoked from several threads (as on wgpu-native): without it,
        # three threads invoking three MobileNetV2 Interpreters on one Dawn device (its Null backend) crashed the
        # process in every run (2026-12-07)
        features = [f for f in ("timestamp-query", "shader-f16", "subgroup", SUBGROUP_MATRIX_FEATURE,
                                DAWN_THREADS_FEATURE) if f in self.adapter.features]
        if backend == "dawn":
            from wgpudawn.backends.dawn import _extras_device

            self.device = _extras_device.request_device_sync(
                self.adapter, required_limits=wanted, required_features=features,
                enable_toggles=[] if self.shader_checks else ["disable_robustness"],
                disable_toggles=list(DAWN_DISABLED_TOGGLES))
        else:
            self.device = self.adapter.request_device_sync(required_limits=wanted, required_features=features)
        self.limits = dict(self.device.limits)
        self.features = set(self.device.features)
        #: The float16 plan's matrix units (:class:`~tflfuse.kernels.matrix.SubgroupMatrix`), or None: Dawn's
        #: subgroup matrices where the device has them in the one configuration the kernels use
        #: (:func:`_subgroup_matrix`).
        self.subgroup_matrix = _subgroup_matrix(self) if backend == "dawn" else None
        self._pipelines: dict[str, object] = {}
        self._lock = threading.Lock()
        self.lost: str | None = None   # the error that showed the device lost, once one did
        self.loop_limit = self._probe_loop_limit() if self.is_software else None
        logging.debug("tflfuse: WebGPU adapter %s", self.describe())

    def _probe_loop_limit(self) -> int | None:
        """Loop iterations an invocation may run before the driver stops its loops silently, or None.

        Mesa's llvmpipe (22.x) stops all the loops of an invocation after 65,535 iterations in all, without
        an error; one tiny dispatch measures it, so that plans refuse programs that would be cut short.
        """
        import numpy as np

        want = 1 << 20
        src = (f"@group(0) @binding(0) var<storage, read_write> y: array<u32>;\n"
               f"@compute @workgroup_size(1) fn main() {{ var c = 0u; "
               f"for (var i = 0u; i < {want}u; i++) {{ c += 1u; }} y[0] = c; }}")
        prog = Program("loop_limit_probe", src, (1, 1, 1), (1, 1, 1), ())
        buf = self.create_buffer(16, label="loop probe")
        pipeline = self.pipeline(prog)
        group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                              entries=[{"binding": 0, "resource": {"buffer": buf}}])
        enc = self.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(1)
        cpass.end()
        self.device.queue.submit([enc.finish()])
        got = int(np.frombuffer(self.device.queue.read_buffer(buf, 0, 4), np.uint32)[0])
        return None if got >= want else got

    @property
    def name(self) -> str:
        return self.info.get("device", "unknown")

    @property
    def is_software(self) -> bool:
        return self.info.get("adapter_type") == "CPU"

    def describe(self) -> str:
        """E.g. ``"llvmpipe (LLVM 15.0.6, 256 bits) [CPU, Vulkan]"``; ``"NVIDIA H100 80GB HBM3 [DiscreteGPU, Vulkan,
        Dawn, subgroup matrices]"`` on Dawn."""
        extra = "" if self.backend == "wgpu-native" else ", Dawn" + (", subgroup matrices" if self.subgroup_matrix
                                                                       else "")
        return f"{self.name} [{self.info.get('adapter_type')}, {self.info.get('backend_type')}{extra}]"

    def check_alive(self) -> None:
        """Raises (a wgpu error that :meth:`guard` turns into :class:`DeviceLostError`) if the device is lost.

        wgpu-native aborts the process when a command buffer recorded before a loss is submitted after it,
        so a plan calls this before submitting the command buffer it recorded ahead. Creating an empty bind
        group layout is the cheapest device call found that raises on a lost device, whatever the logging
        configuration. With wgpu-native it is made from a descriptor built once, through wgpu's
        error-capturing binding of the C entry point (which raises as wgpu's API does), and released at once:
        about 1.2 microseconds on a 2-core CPU against 4.3 through wgpu's API (2026-12-04)."""
        if self._alive_check is None:
            self._alive_check = _alive_check(self.device)
        self._alive_check()

    _alive_check = None   # set by check_alive on first use

    def guard(self, what: str) -> "_Guard":
        """A context manager running wgpu calls, turning an error that reports a lost device into
        :class:`DeviceLostError`.

        Once the device is known lost, every later guarded call raises at once (without touching wgpu), so
        that nothing returns the stale contents of a dead device's buffers. A class rather than a
        ``contextlib`` generator: every invoke and read-back enters one, and the generator's machinery cost about
        2 us of a 2-core CPU's time per use.

        Args:
          what: the action, for the message (``"invoke()"``).
        Raises:
          DeviceLostError: the device is lost; the message names it and says to make a new Device.
        """
        if self.lost is not None:
            raise DeviceLostError(self._lost_message(what))
        return _Guard(self, what)

    def _lost_message(self, what: str) -> str:
        return (f"{what}: the WebGPU device {self.describe()} was lost ({self.lost}); its buffers and pipelines "
                f"are gone. Make a new tflfuse.Device and new Interpreters on it")

    @property
    def max_storage_binding(self) -> int:
        return int(self.limits.get("max-storage-buffer-binding-size", DEFAULT_MAX_STORAGE_BINDING))

    def pipeline(self, program: Program):
        """The compute pipeline for a program, compiled once per distinct WGSL source.

        Raises:
          ShaderCompileError: the WGSL does not compile; the message names the program.
          DeviceLostError: the device is lost.
        """
        key = program.cache_key
        with self._lock, self.guard(f"compiling {program.name}"):
            p = self._pipelines.get(key)
            if p is None:
                try:
                    module = self.shader_module(program.source, program.name)
                    p = self.device.create_compute_pipeline(
                        layout="auto", compute={"module": module, "entry_point": program.entry_point},
                        label=program.name)
                except Exception as e:
                    if _says_lost(e):
                        raise
                    raise ShaderCompileError(f"WGSL for {program.name} failed to compile: {e}") from e
                self._pipelines[key] = p
        return p

    def shader_module(self, source: str, label: str = ""):
        """A wgpu shader module of WGSL ``source``, compiled as tflfuse's own programs are: trusted where
        :attr:`trusted_shaders` (no runtime checks: an index out of an array's bounds is then undefined behaviour,
        which may crash the process, so pass only WGSL whose every index is in bounds), else with wgpu's checks.

        Raises:
          TypeError: ``source`` or ``label`` is not a str.
          wgpu's error (``GPUValidationError``, naming ``label``): the WGSL is invalid.
        """
        if not isinstance(source, str) or not isinstance(label, str):
            raise TypeError(f"Device.shader_module takes WGSL text and a str label, got {type(source).__name__} "
                            f"and {type(label).__name__}")
        if not self.shader_checks:
            module = _trusted_module(self.device, source, label)   # None where wgpu-native's entry point is absent
            if module is not None:
                return module
        return self.device.create_shader_module(code=source, label=label)

    @property
    def trusted_shaders(self) -> bool:
        """Whether this device compiles shader modules trusted (:meth:`shader_module`): :attr:`shader_checks` is
        off and the backend is wgpu-native with ``wgpuDeviceCreateShaderModuleTrusted``."""
        return not self.shader_checks and _trusted_create(self.device) is not None

    def create_buffer(self, size: int, *, data: bytes | None = None, uniform: bool = False, label: str = ""):
        wgpu = self._wgpu
        usage = (wgpu.BufferUsage.UNIFORM if uniform else wgpu.BufferUsage.STORAGE) | \
            wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        size = max(16, -(-size // 16) * 16)
        if data is not None:
            data = bytes(data) + b"\0" * (size - len(data))
            return self.device.create_buffer_with_data(data=data, usage=usage, label=label)
        return self.device.create_buffer(size=size, usage=usage, label=label)


def _trusted_create(device):
    """wgpu-native's ``wgpuDeviceCreateShaderModuleTrusted`` where ``device`` is a wgpu-native device whose
    library has it, else None."""
    try:
        from wgpu.backends.wgpu_native import _api

        if not isinstance(device, _api.GPUDevice):
            return None
        return _api.libf.wgpuDeviceCreateShaderModuleTrusted
    except (ImportError, AttributeError):
        return None


def _trusted_module(device, source: str, label: str):
    """A wgpu-py shader module of WGSL ``source`` compiled by wgpu-native without runtime checks
    (``wgpuDeviceCreateShaderModuleTrusted`` with ``WGPUShaderRuntimeChecks_None``), or None where ``device``
    is not a wgpu-native device. Raises wgpu's error (from its error-capturing binding) where the WGSL is
    invalid."""
    create = _trusted_create(device)
    if create is None:
        return None
    from wgpu.backends.wgpu_native import _api

    code = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(source))
    code[0].chain.next = _api.ffi.NULL
    code[0].chain.sType = _api.lib.WGPUSType_ShaderSourceWGSL
    descriptor = _api.new_struct_p("WGPUShaderModuleDescriptor *",
                                   nextInChain=_api.ffi.cast("WGPUChainedStruct *", code),
                                   label=_api.to_c_string_view(label))
    handle = create(device._internal, descriptor, _api.lib.WGPUShaderRuntimeChecks_None)
    if handle == _api.ffi.NULL:
        raise RuntimeError(f"shader module {label!r} could not be created")
    return _api.GPUShaderModule(label, handle, device)


def _alive_check(device):
    """A function creating and releasing an empty bind group layout on wgpu device ``device`` (see
    :meth:`Device.check_alive`): through wgpu-native's error-capturing C binding with a descriptor built once,
    or through wgpu's API on another backend."""
    try:
        from wgpu.backends.wgpu_native import _api

        if not isinstance(device, _api.GPUDevice):
            raise TypeError(type(device).__name__)
        descriptor = _api.new_struct_p("WGPUBindGroupLayoutDescriptor *", label=_api.to_c_string_view(""),
                                       entries=_api.ffi.NULL, entryCount=0)
        create, release, handle = (_api.libf.wgpuDeviceCreateBindGroupLayout, _api.lib.wgpuBindGroupLayoutRelease,
                                   device._internal)
    except (ImportError, AttributeError, TypeError):
        return lambda: device.create_bind_group_layout(entries=[])

    def check() -> None:
        release(create(handle, descriptor))
    check.objects = (device, descriptor)   # kept alive with the function
    return check

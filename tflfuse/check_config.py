"""What ``tflfuse check`` checks: options, expectations and manifests (TOML), shards, model sources, inputs.

An expectations file (``--expectations=FILE.toml``) holds the settings of one model::

    samples = 3                 # seeded inputs (uniform [-1, 1] floats, ints in [0, 8))
    atol = 1e-4
    rtol = 1e-3
    allow_ops = []              # ops allowed to stay without a tflfuse kernel
    allow_no_numerics = false   # true: pass on the other checks when no numeric check can run
    [expect]
    fused_bottleneck = 17       # exactly 17
    # fused_lstm = { min = 1 }  # at least 1

A manifest (``--manifest=FILE.toml``) lists models, each with the same keys plus ``name`` and ``source``;
``[defaults]`` applies to every model (a model's own keys win, an ``expectations`` file's keys lose to
both)::

    [defaults]
    samples = 2
    [[model]]
    name = "mobilenet_v2"
    source = "model.py:mobilenet_v2"      # paths are relative to the manifest's folder
    expectations = "expectations.toml"

Keys: ``name``, ``source``, ``expectations``, ``expect``, ``allow_ops``, ``samples``, ``seed``, ``inputs``
(.npy files), ``atol``, ``rtol``, ``perf``, ``perf_slack``, ``repeats``, ``import_modules``,
``allow_no_numerics``. Anything else is refused with :class:`CheckInputError` naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .model import Model

__all__ = ["CheckInputError", "CheckOptions", "DEFAULT_ATOL", "DEFAULT_RTOL", "Expectation", "Source",
           "load_expectations", "load_input", "load_manifest", "load_source", "make_options", "parse_expectation", "parse_shard",
           "select_shard"]

#: Float32 kernels sum in another order than TensorFlow: MobileNetV2's outputs differ by ~1e-6; 1e-4 absolute
#: plus 1e-3 relative leaves margin for deeper models while a wrong kernel (errors of 1e-2 and more) fails.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


class CheckInputError(ValueError):
    """A model source, input file, expectation, manifest or flag value that cannot be used (exit status 2)."""


@dataclasses.dataclass(frozen=True)
class Expectation:
    """Fused ops expected of one composite: exactly ``count``, or at least ``count`` (``at_least``)."""

    composite: str
    count: int
    at_least: bool = False

    def holds(self, found: int) -> bool:
        return found >= self.count if self.at_least else found == self.count

    def __str__(self) -> str:
        return f"{'at least' if self.at_least else 'exactly'} {self.count}"


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """Settings of one model's check (see the module docstring for their meaning)."""

    name: str
    source: str
    expectations: tuple[Expectation, ...] = ()
    allow_ops: tuple[str, ...] = ()
    samples: int = 3
    seed: int = 0
    inputs: tuple[str, ...] = ()
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    perf: bool = False
    perf_slack: float = 0.10
    repeats: int = 5
    adapter: str | None = None
    import_modules: tuple[str, ...] = ()
    allow_no_numerics: bool = False


_EXPECT_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(>=|=)\s*(\d+)\s*\Z")
_KEYS = {"name", "source", "expectations", "expect", "allow_ops", "samples", "seed", "inputs", "atol", "rtol",
         "perf", "perf_slack", "repeats", "import_modules", "allow_no_numerics"}


def parse_expectation(text: str) -> Expectation:
    """``"fused_bottleneck=17"`` (exactly) or ``"fused_bottleneck>=17"`` (at least) -> :class:`Expectation`.

    Raises:
      CheckInputError: any other form.
    """
    m = _EXPECT_RE.match(text) if isinstance(text, str) else None
    if m is None:
        raise CheckInputError(f"--expect={text!r}: write NAME=COUNT (exactly) or NAME>=COUNT (at least), e.g. "
                              f"--expect=fused_bottleneck=17")
    return Expectation(m[1], int(m[3]), m[2] == ">=")


def _expect_table(table: Any, where: str) -> dict[str, Expectation]:
    if not isinstance(table, Mapping):
        raise CheckInputError(f"{where}: 'expect' must be a table such as [expect] fused_bottleneck = 17")
    out = {}
    for name, value in table.items():
        if type(value) is int and value >= 0:
            out[name] = Expectation(name, value)
        elif isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in ("exact", "min") \
                and type(next(iter(value.values()))) is int and next(iter(value.values())) >= 0:
            out[name] = Expectation(name, next(iter(value.values())), "min" in value)
        else:
            raise CheckInputError(f"{where}: expect.{name} = {value!r}; write a count (17, exactly) or "
                                  f"{{ min = 17 }} (at least)")
    return out


def _typed(key: str, value: Any, where: str):
    def bad(want: str):
        return CheckInputError(f"{where}: {key} = {value!r} must be {want}")

    if key in ("name", "source", "expectations"):
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        if key == "name" and (value in (".", "..") or any(c in value for c in "/\\") or value.startswith(".")):
            raise bad("a name without path separators (it names the model's report folder)")
    elif key in ("samples", "repeats"):
        if type(value) is not int or value < 1:
            raise bad("a positive integer")
    elif key == "seed":
        if type(value) is not int or value < 0:
            raise bad("a non-negative integer")
    elif key in ("atol", "rtol", "perf_slack"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise bad("a finite non-negative number")
        value = float(value)
    elif key in ("perf", "allow_no_numerics"):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif key in ("allow_ops", "inputs", "import_modules"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise bad("a list of strings")
        value = tuple(value)
    return value


def _settings(table: Mapping, where: str, base: Path | None) -> dict:
    """Checks a TOML table's keys and types; resolves paths against ``base``; reads an ``expectations`` file."""
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise CheckInputError(f"{where}: unknown key(s) {unknown}; the keys are {sorted(_KEYS)}")
    out: dict = {}
    if "expectations" in table:
        path = _resolve(_typed("expectations", table["expectations"], where), base)
        out.update(load_expectations(path))
    for key, value in table.items():
        if key == "expectations":
            continue
        if key == "expect":
            out["expect"] = {**out.get("expect", {}), **_expect_table(value, where)}
            continue
        value = _typed(key, value, where)
        if key == "inputs":
            value = tuple(_resolve(v, base) for v in value)
        elif key == "source" and base is not None:
            value = _resolve_source(value, base)
        out[key] = value
    return out


def _resolve(path: str, base: Path | None) -> str:
    p = Path(path)
    return str(p if p.is_absolute() or base is None else base / p)


def _resolve_source(source: str, base: Path) -> str:
    """A file or directory path relative to the manifest; ``module:function`` with a module name stays."""
    module, sep, fn = source.rpartition(":")
    if sep and not module.endswith(".py") and "/" not in module and not (base / source).exists():
        return source
    if sep and module.endswith(".py"):
        return f"{_resolve(module, base)}:{fn}"
    return _resolve(source, base)


def _read_toml(path: str | Path, what: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise CheckInputError(f"{what} {str(path)!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise CheckInputError(f"{what} {str(path)!r} is not valid TOML: {e}") from None


def load_expectations(path: str | Path) -> dict:
    """Reads an expectations file into settings (``expect`` is a dict composite -> :class:`Expectation`).

    Raises:
      CheckInputError: a missing or malformed file, an unknown key, a value of the wrong type.
    """
    data = _read_toml(path, "expectations file")
    if "name" in data or "source" in data:
        raise CheckInputError(f"expectations file {str(path)!r}: 'name' and 'source' belong in a manifest")
    return _settings(data, f"expectations file {str(path)!r}", Path(path).parent)


def load_input(path) -> np.ndarray:
    """The array of the ``.npy`` file ``path`` given as ``--input`` (``run`` and ``check``).

    Raises:
      CheckInputError: naming the flag, for a file numpy cannot read as one array (an ``.npz`` archive, another
        format, a missing file).
    """
    try:
        a = np.load(path)
    except (OSError, ValueError) as e:
        raise CheckInputError(f"--input={path}: not a .npy file: {e}") from None
    if not isinstance(a, np.ndarray):   # an .npz archive (np.load opened it: closed before the message)
        a.close()
        raise CheckInputError(f"--input={path}: not a .npy file (an .npz archive of {len(a.files)} array(s)); give "
                              f"one .npy per input (numpy.save)")
    return a


def make_options(settings: Mapping, overrides: Mapping | None = None) -> CheckOptions:
    """Builds :class:`CheckOptions` from settings (as :func:`load_expectations` returns) and command-line
    overrides (``expect`` there is a list of :class:`Expectation` that add to or replace the file's)."""
    merged = dict(settings)
    for key, value in (overrides or {}).items():
        if key == "expect":
            merged["expect"] = {**merged.get("expect", {}), **{e.composite: e for e in value}}
        else:   # the command line's tolerances checked as a file's are (absl's float flags take nan and inf)
            merged[key] = _typed(key, value, f"--{key}") if key in ("atol", "rtol", "perf_slack") else value
    expect = merged.pop("expect", {})
    merged.pop("expectations", None)
    if "source" not in merged:
        raise CheckInputError("a model needs a source")
    merged.setdefault("name", _default_name(merged["source"]))
    return CheckOptions(expectations=tuple(expect.values()), **merged)


def _default_name(source: str) -> str:
    text = source.rstrip("/").rpartition(":")[2] if ":" in source else Path(source.rstrip("/")).stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text) or "model"


def load_manifest(path: str | Path, overrides: Mapping | None = None) -> list[CheckOptions]:
    """Reads a manifest: ``[defaults]`` and one ``[[model]]`` table per model (see the module docstring).

    Returns:
      One :class:`CheckOptions` per model, in file order (names unique: they name the report folders).
    Raises:
      CheckInputError: a missing or malformed file, no models, a model without a source, repeated names,
        an unknown key, a value of the wrong type.
    """
    data = _read_toml(path, "manifest")
    where = f"manifest {str(path)!r}"
    unknown = sorted(set(data) - {"defaults", "model"})
    if unknown:
        raise CheckInputError(f"{where}: unknown top-level key(s) {unknown}; write [defaults] and [[model]] tables")
    models = data.get("model")
    if not isinstance(models, list) or not models or not all(isinstance(m, Mapping) for m in models):
        raise CheckInputError(f"{where}: no [[model]] tables")
    base = Path(path).parent
    defaults = _settings(data.get("defaults", {}), f"{where} [defaults]", base)
    out = []
    for i, table in enumerate(models):
        own = _settings(table, f"{where} model {i + 1}", base)
        if "source" not in own:
            raise CheckInputError(f"{where} model {i + 1}: no 'source'")
        settings = {**defaults, **own, "expect": {**defaults.get("expect", {}), **own.get("expect", {})}}
        out.append(make_options(settings, overrides))
    names = [o.name for o in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CheckInputError(f"{where}: model name(s) {repeated} repeat; give each model its own 'name'")
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (1 <= I <= N, as Jest's and Playwright's ``--shard``) -> ``(I, N)``.

    Raises:
      CheckInputError: any other form.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if m is None or not 1 <= int(m[1]) <= int(m[2]):
        raise CheckInputError(f"--shard={text!r}: write I/N with 1 <= I <= N, e.g. --shard=2/4")
    return int(m[1]), int(m[2])


def select_shard(items: Sequence, shard: tuple[int, int]) -> list:
    """The items of shard I of N: every N-th item from the I-th (so a sorted manifest spreads evenly)."""
    i, n = shard
    return [x for k, x in enumerate(items) if k % n == i - 1]


# ---- model sources -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Source:
    """A loaded model source: ``kind`` and ``obj`` (.tflite bytes, a keras.Model, a SavedModel path or a
    list of concrete functions)."""

    kind: str
    obj: Any


def _import_entry_module(module: str):
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise CheckInputError(f"entry point module {module!r}: no such file")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(f"tflfuse_check_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module)


def load_source(source: str, import_modules: Sequence[str] = ()) -> Source:
    """Loads a model source.

    Args:
      source: a ``.tflite`` file, a SavedModel directory (with ``saved_model.pb``), a ``.keras`` or ``.h5``
        file (``keras.models.load_model``), or ``module:function`` / ``path/file.py:function`` (called with
        no arguments; it returns a ``keras.Model``, a concrete function or a list of them).
      import_modules: modules imported first (those that register a Keras file's custom layers).

    Returns:
      :class:`Source`.

    Raises:
      CheckInputError: a missing file, a source of none of these kinds, an import or the function failing,
        a function returning something else.
    """
    from .kernels.registry import import_modules as import_all

    try:
        import_all(import_modules)
    except ImportError as e:
        raise CheckInputError(f"import_modules: {e}") from None
    path = Path(source)
    if path.suffix == ".tflite" and not path.is_dir():
        if not path.is_file():
            raise CheckInputError(f"model source {source!r}: no such .tflite file")
        try:
            return Source("tflite", path.read_bytes())
        except OSError as e:
            raise CheckInputError(f"model source {source!r}: cannot read it: {e}") from None
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            what = "not a .tflite file" if path.suffix == ".tflite" else "not a SavedModel"
            raise CheckInputError(f"model source {source!r} is a directory without saved_model.pb, {what}")
        return Source("saved_model", str(path))
    if path.suffix in (".keras", ".h5"):
        if not path.is_file():
            raise CheckInputError(f"model source {source!r}: no such Keras file")
        import keras

        try:
            return Source("keras", keras.models.load_model(path, compile=False))
        except Exception as e:
            raise CheckInputError(f"model source {source!r}: keras.models.load_model failed ({type(e).__name__}: "
                                  f"{e}); a custom layer's module must be imported first "
                                  f"(--import_modules=MODULE)") from None
    if ":" in source:
        module, _, fname = source.rpartition(":")
        try:
            fn = getattr(_import_entry_module(module), fname)
        except CheckInputError:
            raise
        except (Exception, SystemExit) as e:   # a module that calls sys.exit() on import checks nothing
            raise CheckInputError(f"entry point {source!r}: {type(e).__name__}: {e}") from None
        if not callable(fn):
            raise CheckInputError(f"entry point {source!r}: {fname} is not callable")
        try:
            obj = fn()
        except (Exception, SystemExit) as e:   # sys.exit() in the entry point must not pass as "no failures"
            raise CheckInputError(f"entry point {source!r} raised {type(e).__name__}: {e}") from None
        return _entry_result(source, obj)
    raise CheckInputError(f"model source {source!r} is none of: a .tflite file, a SavedModel directory, a .keras "
                          f"or .h5 file, module:function")


def _entry_result(source: str, obj) -> Source:
    import tensorflow as tf

    from .conversion import _is_keras_model

    if _is_keras_model(obj):
        return Source("keras", obj)
    funcs = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if funcs and all(isinstance(f, tf.types.experimental.ConcreteFunction) for f in funcs):
        return Source("functions", funcs)
    raise CheckInputError(f"entry point {source!r} returned {type(obj).__name__}; it must return a keras.Model, "
                          f"a concrete function or a list of them")


# ---- signatures and inputs -----------------------------------------------------------------------------
def _signatures(model: Model) -> dict:
    """{key or None: {"subgraph", "inputs": {name: tensor}, "outputs": {name: tensor}}} of a .tflite."""
    sigs = model.signature_defs()
    if sigs:
        return sigs
    sg = model.subgraphs[0]
    return {None: {"subgraph": 0, "inputs": {model.tensor_name(0, int(t)): int(t) for t in sg.inputs},
                   "outputs": {model.tensor_name(0, int(t)): int(t) for t in sg.outputs}}}


def _make_feeds(model: Model, opts: CheckOptions) -> list[dict]:
    """Per sample: {signature key: {input name: array}}; seeded uniform [-1, 1] floats, ints in [0, 8)."""
    sigs = _signatures(model)
    if opts.inputs:
        if len(sigs) != 1:
            raise CheckInputError(f"--input applies to a model with one signature; this one has {sorted(map(str, sigs))}")
        (key, sig), = sigs.items()
        names = list(sig["inputs"])
        if len(opts.inputs) != len(names):
            raise CheckInputError(f"the model has {len(names)} input(s) {names}; got {len(opts.inputs)} --input file(s)")
        arrays = {}
        for name, p in zip(names, opts.inputs):
            t = sig["inputs"][name]
            shape, dtype = model.tensor_shape(sig["subgraph"], t), model.tensor_dtype(sig["subgraph"], t)
            a = load_input(p)
            if a.dtype != dtype:
                raise CheckInputError(f"--input={p}: input {name!r} expects {dtype}, got {a.dtype}")
            if a.shape == shape:
                a = a[None]
            elif a.shape[1:] != shape:
                raise CheckInputError(f"--input={p}: input {name!r} has shape {list(shape)}; give that shape or "
                                      f"[N, {', '.join(map(str, shape))}] for N samples, got {list(a.shape)}")
            arrays[name] = a
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1:
            raise CheckInputError(f"--input files hold different numbers of samples: {sorted(counts)}")
        return [{key: {n: a[i] for n, a in arrays.items()}} for i in range(counts.pop())]
    feeds = []
    for s in range(opts.samples):
        rng = np.random.default_rng([opts.seed, s])
        sample = {}
        for key, sig in sigs.items():
            sample[key] = {}
            for name, t in sig["inputs"].items():
                shape, dtype = model.tensor_shape(sig["subgraph"], t), model.tensor_dtype(sig["subgraph"], t)
                if dtype.kind == "f":
                    sample[key][name] = rng.uniform(-1, 1, shape).astype(dtype)
                elif dtype.kind == "b":
                    sample[key][name] = rng.integers(0, 2, shape).astype(bool)
                else:
                    sample[key][name] = rng.integers(0, 8, shape).astype(dtype)
        feeds.append(sample)
    return feeds

"""``@composite``: mark a TensorFlow function as one fusable op of the converted .tflite.

A composite is a Python function whose TensorFlow ops the TFLite converter replaces by ONE custom op
(its custom code is the composite's name). It is built on
``tf.function(experimental_implements=...)`` with the ``tfl_fusable_op`` attribute, which the converter
(``tf.lite.TFLiteConverter`` with ``allow_custom_ops=True``) turns into a custom op whose inputs are the
function's tensor arguments, in argument order, and whose custom options are a flexbuffer map of the
attributes.

The attributes are encoded so that the converter's quirks do not show (a list attribute makes
conversion fail, a bool arrives as ``-1``, a float as float32): the flexbuffer map holds, per
attribute, one entry, plus the entry ``tflfuse_schema`` that records each attribute's type.

=============  ===========================  ======================================
Python type    flexbuffer entry             example (``attr = value`` -> entry)
=============  ===========================  ======================================
``int``        int                          ``k = 3`` -> ``3``
``bool``       int 0 or 1                   ``residual = True`` -> ``1``
``float``      string, ``repr`` of it       ``eps = 0.001`` -> ``"0.001"``
``str``        string                       ``activation = "relu6"`` -> ``"relu6"``
list of int    string, comma-joined         ``sizes = [1, 2]`` -> ``"1,2"``
list of float  string, comma-joined reprs   ``scales = [0.5, 2.0]`` -> ``"0.5,2.0"``
=============  ===========================  ======================================

``tflfuse_schema`` is ``"v1"`` followed by ``";name:type"`` per attribute in declaration order, with
``type`` one of ``int, float, bool, str, list[int], list[float]``, e.g.
``"v1;expansion:int;stride:int;residual:bool;activation:str"``. :func:`decode_attrs` turns such a map
back into exactly the values written (``True`` stays ``True``, ``0.1`` stays the same double). A list
holds only ints or only floats: ``[1, 0.5]`` is refused rather than silently made ``[1.0, 0.5]``; an
empty list is recorded as ``list[int]`` and decodes to ``[]``. ``None``, tuples, dicts, nested lists,
NumPy values and lists of bool or str are refused with ``TypeError``.

Attributes named like a keyword-only parameter of the function are *per call*: the call's keyword
value (or the decorator's value, the default) goes into that op's attributes and is passed to the body.
The others are fixed for every call. Every argument but ``None`` becomes an op input (a tensor; Python
numbers too), in argument order. The body may not read variables or tensors from outside its arguments
(TensorFlow refuses such an annotated function): Keras layers pass their weights as arguments. Constants
the body makes itself (NumPy arrays it closes over) are not op inputs: the fused kernel never sees them.
Called eagerly, or inside :func:`annotations_disabled`, a composite runs its body directly.

This module imports TensorFlow only when an annotated function is called; :func:`decode_attrs` and
:func:`encode_attrs` never import it (the runtime uses them).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import re
import threading
import types
import weakref
from typing import Any, Callable, Iterator, Mapping

from absl import logging

__all__ = ["CompositeFunction", "CompositeSpec", "FUSABLE_KEY", "SCHEMA_KEY", "annotations_disabled",
           "annotations_enabled", "composite", "count_traced_calls", "decode_attrs", "encode_attrs",
           "implements_signature", "registry"]

#: The custom-option key holding the attribute types (see the module docstring).
SCHEMA_KEY = "tflfuse_schema"
#: The ``experimental_implements`` attribute that asks the TFLite converter to fuse the function.
FUSABLE_KEY = "tfl_fusable_op"
_SCHEMA_VERSION = "v1"
_RESERVED = (SCHEMA_KEY, FUSABLE_KEY)
_ATTR_TYPES = ("int", "float", "bool", "str", "list[int]", "list[float]")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---- names and values --------------------------------------------------------------------------------
def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_name(what: str, name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} {_short(name)}")
    if _NAME_RE.match(name):
        return
    if not name:
        raise ValueError(f"{what} is empty; use letters, digits and underscores, e.g. 'my_op'")
    if name[0].isdigit():
        raise ValueError(f"{what} {name!r} starts with a digit; it must start with a letter or underscore")
    bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c == "_"))})
    raise ValueError(f"{what} {name!r} contains {''.join(bad)!r}; only ASCII letters, digits and "
                     f"underscores are allowed")


def _builtin_names() -> frozenset[str]:
    from ai_edge_litert import schema_py_generated as schema  # no TensorFlow
    return frozenset(k for k in vars(schema.BuiltinOperator) if not k.startswith("_"))


def _check_op_name(name: Any) -> None:
    _check_name("composite name", name)
    if name in _builtin_names():
        raise ValueError(f"composite name {name!r} is the name of a TFLite builtin op; the file could not "
                         f"tell the two apart. Choose another name, e.g. {name.lower()!r}")


def _check_attr_name(name: Any) -> None:
    _check_name("attribute name", name)
    if name in _RESERVED:
        raise ValueError(f"attribute name {name!r} is reserved by tflfuse; choose another name")


def _check_int(attr: str, value: int) -> None:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"attribute {attr!r} = {_short(value)} does not fit in int64")


def _type_of(attr: str, value: Any) -> str:
    """The schema type of an attribute value; TypeError for values that cannot be encoded exactly."""
    if type(value) is bool:
        return "bool"
    if type(value) is int:
        _check_int(attr, value)
        return "int"
    if type(value) is float:
        return "float"
    if type(value) is str:
        return "str"
    if type(value) is list:
        kinds = {type(v) for v in value}
        if not kinds or kinds == {int}:
            for v in value:
                _check_int(attr, v)
            return "list[int]"
        if kinds == {float}:
            return "list[float]"
        names = ", ".join(sorted(k.__name__ for k in kinds))
        hint = " (write 1.0, not 1, in a list of floats)" if kinds == {int, float} else ""
        raise TypeError(f"attribute {attr!r} = {_short(value)}: a list attribute holds only ints or only "
                        f"floats, this one holds {names}{hint}")
    raise TypeError(f"attribute {attr!r} = {_short(value)} has type {type(value).__name__}; attributes are "
                    f"int, float, bool, str, a list of int or a list of float")


def _coerce(attr: str, declared: str, default: Any, value: Any) -> Any:
    """A call's value for an attribute declared as ``declared`` with value ``default``.

    Ints are accepted for a float (and in a list of floats); any list for an empty-list default.
    """
    if declared == "float" and type(value) is int:
        value = float(value)
    elif declared == "list[float]" and type(value) is list and all(type(v) in (int, float) for v in value):
        value = [float(v) for v in value]
    actual = _type_of(attr, value)
    any_list = type(value) is list and declared.startswith("list") and (not value or default == [])
    if actual == declared or any_list:
        return value
    raise TypeError(f"attribute {attr!r} = {_short(value)} is a {actual}; it was declared {declared}")


def _encode_value(type_: str, value: Any) -> int | str:
    if type_ == "int":
        return value
    if type_ == "bool":
        return int(value)
    if type_ == "float":
        return repr(value)
    if type_ == "list[int]":
        return ",".join(str(v) for v in value)
    if type_ == "list[float]":
        return ",".join(repr(v) for v in value)
    return value  # str


def _decode_value(key: str, type_: str, raw: Any) -> Any:
    def bad(expected: str) -> ValueError:
        return ValueError(f"custom option {key!r} = {_short(raw)} should be {expected} for an attribute of "
                          f"type {type_}")

    if type_ in ("int", "bool"):
        if type(raw) is bool:  # a flexbuffer bool, written by another tool
            raw = int(raw)
        if type(raw) is not int:
            raise bad("an int")
        if type_ == "int":
            return raw
        if raw not in (0, 1, -1):  # -1: the converter's encoding of a protobuf bool
            raise bad("0 or 1")
        return raw != 0
    if not isinstance(raw, str):
        raise bad("a string")
    try:
        if type_ == "float":
            return float(raw)
        if type_ == "list[int]":
            return [int(p) for p in raw.split(",")] if raw else []
        if type_ == "list[float]":
            return [float(p) for p in raw.split(",")] if raw else []
    except ValueError:
        expected = "a comma-joined list of numbers" if type_.startswith("list") else "a float literal"
        raise bad(expected) from None
    return raw  # str


def _schema(types_: Mapping[str, str]) -> str:
    return ";".join([_SCHEMA_VERSION] + [f"{k}:{t}" for k, t in types_.items()])


def encode_attrs(attrs: Mapping[str, Any]) -> dict[str, int | str]:
    """The custom-option map that a composite with these attributes gets in the .tflite.

    Args:
      attrs: attribute name -> value (int, float, bool, str, list of int, list of float).

    Returns:
      ``{name: int | str}`` plus :data:`SCHEMA_KEY`, as the TFLite converter writes it into the custom
      op's flexbuffer map (the module docstring gives the encoding).

    Raises:
      TypeError: a value of another type, or a list mixing types.
      ValueError: an attribute name that is not an identifier or is reserved; an int beyond int64.

    >>> encode_attrs({"stride": 2, "residual": True, "scales": [0.5]})["residual"]
    1
    >>> encode_attrs({"stride": 2, "residual": True, "scales": [0.5]})["tflfuse_schema"]
    'v1;stride:int;residual:bool;scales:list[float]'
    """
    types_ = {}
    for key, value in attrs.items():
        _check_attr_name(key)
        types_[key] = _type_of(key, value)
    out: dict[str, int | str] = {k: _encode_value(types_[k], v) for k, v in attrs.items()}
    out[SCHEMA_KEY] = _schema(types_)
    return out


def decode_attrs(options: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes a composite was written with, from its custom op's custom options.

    Args:
      options: the op's flexbuffer map, as decoded (``tflfuse.model.Model.op_attrs``).

    Returns:
      ``{name: value}`` in declaration order, each value of the type it was written with.

    Raises:
      ValueError: the map has no :data:`SCHEMA_KEY` (the op was not made by :func:`composite`), the
        schema is malformed or of an unknown version, an attribute it names is missing, an entry does not
        decode as its type, or the map holds entries the schema does not name.
    """
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping (a decoded flexbuffer map), got {type(options).__name__}")
    schema = options.get(SCHEMA_KEY)
    if schema is None:
        raise ValueError(f"custom options {sorted(options)} carry no {SCHEMA_KEY!r} entry: the op was not "
                         f"made by tflfuse.composite")
    if not isinstance(schema, str):
        raise ValueError(f"custom option {SCHEMA_KEY!r} = {_short(schema)} should be a string")
    version, *fields = schema.split(";")
    if version != _SCHEMA_VERSION:
        raise ValueError(f"attribute schema {schema!r} has version {version!r}; this tflfuse reads "
                         f"{_SCHEMA_VERSION!r}")
    out: dict[str, Any] = {}
    for field in fields:
        key, sep, type_ = field.partition(":")
        if not sep or type_ not in _ATTR_TYPES or not _NAME_RE.match(key):
            raise ValueError(f"attribute schema {schema!r}: malformed field {field!r} (expected name:type "
                             f"with type one of {', '.join(_ATTR_TYPES)})")
        if key not in options:
            raise ValueError(f"attribute {key!r} is in the schema {schema!r} but not in the custom options")
        out[key] = _decode_value(key, type_, options[key])
    extra = sorted(set(options) - set(out) - set(_RESERVED))
    if extra:
        raise ValueError(f"custom options {extra} are not in the attribute schema {schema!r}")
    return out


def implements_signature(name: str, attrs: Mapping[str, Any]) -> str:
    """The ``experimental_implements`` text (a text-format ``NameAttrList``) for a composite call.

    Raises the errors of :func:`encode_attrs`, and ValueError for a name that is not an identifier.
    """
    _check_op_name(name)
    parts = [f"name: '{name}'", f"attr {{ key: '{FUSABLE_KEY}' value {{ b: true }} }}"]
    for key, value in encode_attrs(attrs).items():
        field = f"i: {value}" if isinstance(value, int) else f"s: '{_quote(value)}'"
        parts.append(f"attr {{ key: '{key}' value {{ {field} }} }}")
    return " ".join(parts)


def _quote(text: str) -> str:
    """Escapes a str for a single-quoted protobuf text-format string (UTF-8 bytes as octal escapes)."""
    return "".join(chr(b) if 0x20 <= b < 0x7F and chr(b) not in "'\"\\" else f"\\{b:03o}"
                   for b in text.encode("utf-8"))


# ---- annotation switch and trace counting ------------------------------------------------------------
_ANNOTATE: contextvars.ContextVar[bool] = contextvars.ContextVar("tflfuse_annotate", default=True)
_COUNTERS: contextvars.ContextVar[tuple] = contextvars.ContextVar("tflfuse_counters", default=())


def annotations_enabled() -> bool:
    """Whether composites called now are annotated (traced as fusable functions)."""
    return _ANNOTATE.get()


@contextlib.contextmanager
def annotations_disabled() -> Iterator[None]:
    """Within this context composites run their body inline, unannotated.

    A model traced here converts to the body's ops as plain TFLite builtins (the unfused baseline).
    The switch is read when a composite is called, i.e. while a ``tf.function`` is traced: functions
    traced earlier keep what they were traced with.
    """
    token = _ANNOTATE.set(False)
    try:
        yield
    finally:
        _ANNOTATE.reset(token)


@contextlib.contextmanager
def count_traced_calls() -> Iterator[collections.Counter]:
    """Counts annotated composite calls traced into a graph while the context is open.

    Yields:
      A ``collections.Counter`` {composite name: calls}, filled as calls are traced. Eager calls and calls
      made with annotations disabled are not counted.
    """
    counter: collections.Counter = collections.Counter()
    token = _COUNTERS.set(_COUNTERS.get() + (counter,))
    try:
        yield counter
    finally:
        _COUNTERS.reset(token)


# ---- registry ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CompositeSpec:
    """What :func:`composite` registered.

    Attributes:
      name: the custom op's name (custom code) in the .tflite.
      attrs: attribute name -> declared value (the default of a per-call attribute).
      attr_types: attribute name -> schema type (``int``, ``float``, ``bool``, ``str``, ``list[int]``,
        ``list[float]``).
      call_attrs: the attributes taken from each call's keyword arguments.
      function: the undecorated Python function.
    """

    name: str
    attrs: Mapping[str, Any]
    attr_types: Mapping[str, str]
    call_attrs: tuple[str, ...]
    function: Callable


_REGISTRY: dict[str, CompositeSpec] = {}
_REGISTRY_LOCK = threading.Lock()


def registry() -> Mapping[str, CompositeSpec]:
    """A read-only view {name: CompositeSpec} of every composite defined so far."""
    return types.MappingProxyType(_REGISTRY)


def _register(spec: CompositeSpec) -> None:
    with _REGISTRY_LOCK:
        old = _REGISTRY.get(spec.name)
        if old is not None and dict(old.attr_types) != dict(spec.attr_types):
            raise ValueError(
                f"composite {spec.name!r} is already defined by {old.function.__module__}."
                f"{old.function.__qualname__} with attributes {dict(old.attr_types)}; "
                f"{spec.function.__module__}.{spec.function.__qualname__} declares {dict(spec.attr_types)}. "
                f"One op name must have one set of attributes: rename one of them")
        if old is not None and old.function is not spec.function:
            logging.info("composite %r redefined by %s", spec.name, spec.function.__qualname__)
        _REGISTRY[spec.name] = spec


# ---- the decorator -------------------------------------------------------------------------------------
class CompositeFunction:
    """A function (or method) annotated by :func:`composite`; call it like the function itself.

    Called while a ``tf.function`` is traced, it adds one call of an annotated ``tf.function`` (one per
    distinct set of attribute values and, for a method, per instance), which the converter fuses. Called
    eagerly, or inside :func:`annotations_disabled`, it runs the body directly.

    Attributes:
      spec: the :class:`CompositeSpec`.
    """

    def __init__(self, function: Callable, spec: CompositeSpec):
        functools.update_wrapper(self, function)
        self.spec = spec
        self._functions: dict[tuple, Any] = {}
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return functools.partial(self._call, instance)

    def __call__(self, *args, **kwargs):
        return self._call(None, *args, **kwargs)

    def _attrs(self, kwargs: dict) -> dict[str, Any]:
        spec = self.spec
        attrs = dict(spec.attrs)
        for key in spec.call_attrs:
            if key in kwargs:
                attrs[key] = _coerce(key, spec.attr_types[key], spec.attrs[key], kwargs.pop(key))
        return attrs

    def _call(self, instance, *args, **kwargs):
        attrs = self._attrs(kwargs)
        prefix = () if instance is None else (instance,)
        body_kwargs = {k: attrs[k] for k in self.spec.call_attrs}
        if not _ANNOTATE.get():
            return self.spec.function(*prefix, *args, **kwargs, **body_kwargs)
        import tensorflow as tf

        if not tf.inside_function():  # eager: the annotation matters only to a traced graph
            return self.spec.function(*prefix, *args, **kwargs, **body_kwargs)

        # tf.function(experimental_implements=...) makes every argument a tensor: None ones stay outside.
        nones = tuple(i for i, a in enumerate(args) if a is None)
        shapes = tuple(tuple(getattr(a, "shape", ())) for a in args if a is not None)
        fn = self._traced(instance, attrs, body_kwargs, nones, shapes)
        for counter in _COUNTERS.get():
            counter[self.spec.name] += 1
        try:
            return fn(*(a for a in args if a is not None), **kwargs)
        except AssertionError as e:  # TensorFlow's refusal of an annotated function with captures
            if "_implements" not in str(e):
                raise
            raise ValueError(
                f"composite {self.spec.name!r} ({self.spec.function.__qualname__}) reads a variable or "
                f"tensor that is not one of its arguments; an annotated function may use only its "
                f"arguments. Pass weights as arguments (a Keras layer: fn(x, self.kernel, ...)), or make "
                f"small constants NumPy arrays") from e

    def _traced(self, instance, attrs: dict, body_kwargs: dict, nones: tuple[int, ...], shapes: tuple):
        import tensorflow as tf

        signature = implements_signature(self.spec.name, attrs)
        # One tf.function per static input shapes: TensorFlow would reuse a trace made for a more general
        # shape (a Keras export traces batch None), and the converter would then declare that trace's shapes.
        key = (signature, nones, shapes)
        if instance is None:
            cache, get_self = self._functions, None
        else:
            try:  # per instance, without keeping the instance alive
                cache, get_self = self._bound.setdefault(instance, {}), weakref.ref(instance)
            except TypeError:  # not weak-referenceable or not hashable: trace on every call
                cache, get_self = {}, (lambda: instance)
        fn = cache.get(key)
        if fn is None:
            body = self.spec.function

            def call(*args, **kwargs):
                args = list(args)
                for i in nones:
                    args.insert(i, None)
                prefix = () if get_self is None else (get_self(),)
                return body(*prefix, *args, **kwargs, **body_kwargs)

            call.__name__ = getattr(body, "__name__", "composite")  # no __wrapped__: keep *args signature
            call.__qualname__ = getattr(body, "__qualname__", call.__name__)
            fn = tf.function(call, experimental_implements=signature)
            cache[key] = fn
        return fn

    def __repr__(self) -> str:
        return f"<composite {self.spec.name!r} {self.spec.function.__qualname__}>"


def composite(name: str, /, **attrs: Any) -> Callable[[Callable], CompositeFunction]:
    """Decorates a function (or method) whose TensorFlow ops convert to ONE TFLite custom op ``name``.

    Args:
      name: the custom op's name (its custom code in the .tflite): ASCII letters, digits and underscores,
        not starting with a digit, not a TFLite builtin's name.
      **attrs: the op's attributes (int, float, bool, str, list of int, list of float), stored in the
        op's custom options (decode them with :func:`decode_attrs`). An attribute named like a
        keyword-only parameter of the function is set per call by that keyword (this value is its
        default) and is passed to the body; the others are fixed.

    Returns:
      A decorator that returns a :class:`CompositeFunction` and registers a :class:`CompositeSpec`.

    Raises:
      TypeError: ``name`` or an attribute name is not a str; an attribute value of another type (None,
        tuple, dict, NumPy value, nested list, list mixing ints and floats, list of bool or str); a
        function parameter named like an attribute that is not keyword-only; decorating a
        ``tf.function`` or a non-callable.
      ValueError: a name that is not an identifier, a builtin op's name or reserved
        (``tflfuse_schema``, ``tfl_fusable_op``); an int beyond int64; a composite of the same name with
        other attribute names or types.

    >>> @composite("scaled_add", alpha=1.0)
    ... def scaled_add(x, y, *, alpha):
    ...     return x + alpha * y
    """
    _check_op_name(name)
    attr_types = {}
    for key, value in attrs.items():
        _check_attr_name(key)
        attr_types[key] = _type_of(key, value)
    attrs = {k: list(v) if isinstance(v, list) else v for k, v in attrs.items()}

    def decorate(function: Callable) -> CompositeFunction:
        if not callable(function):
            raise TypeError(f"@composite({name!r}) decorates a function, got {type(function).__name__}")
        if hasattr(function, "get_concrete_function") or isinstance(function, CompositeFunction):
            raise TypeError(f"@composite({name!r}) decorates a plain Python function; {function!r} is "
                            f"already a tf.function or composite")
        call_attrs = []
        for param in inspect.signature(function).parameters.values():
            if param.name not in attrs:
                continue
            if param.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(f"{function.__qualname__}: parameter {param.name!r} is named like an "
                                f"attribute of composite {name!r}, so it must be keyword-only (after '*')")
            call_attrs.append(param.name)
        spec = CompositeSpec(name=name, attrs=types.MappingProxyType(attrs),
                             attr_types=types.MappingProxyType(attr_types), call_attrs=tuple(call_attrs),
                             function=function)
        _register(spec)
        return CompositeFunction(function, spec)

    return decorate

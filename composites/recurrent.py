"""LSTM and GRU layers as ONE op each: ``fused_lstm`` / ``fused_gru`` (or TFLite's builtin LSTM).

Keras 3's ``keras.layers.LSTM`` converts to a WHILE loop over three subgraphs (about 30 ops); the layers
here compute the same values, take the same weights (``layer.set_weights(keras_lstm.get_weights())``) and
convert to one op:

* ``fused_lstm``, lowered by :func:`tflfuse.convert` to TFLite's builtin ``UNIDIRECTIONAL_SEQUENCE_LSTM``
  where the builtin expresses it (tanh/sigmoid, ``return_sequences=True``, no ``return_state``, no initial
  state, not ``go_backwards``; see :mod:`tflfuse.passes.lstm`), so stock LiteRT runs it too;
* ``fused_gru`` (LiteRT has no builtin GRU).

Semantics, for ``x [N, T, F]`` float32, ``kernel [F, G*U]``, ``recurrent_kernel [U, G*U]`` (G = 4 for the
LSTM, gates i, f, c, o; G = 3 for the GRU, gates z, r, h), from ``h = c = 0`` or the initial state, over
the steps ``x[:, 0] .. x[:, T-1]`` (``x[:, T-1] .. x[:, 0]`` with ``go_backwards``)::

    LSTM:  a = x_t @ kernel + h @ recurrent_kernel + bias
           c = ract(a_f) * c + ract(a_i) * act(a_c);   h = ract(a_o) * act(c)
    GRU, reset_after=True (bias [2, 3U]: input bias, recurrent bias):
           xi = x_t @ kernel + bias[0];   hi = h @ recurrent_kernel + bias[1]
           z = ract(xi_z + hi_z);  r = ract(xi_r + hi_r);  h = z * h + (1 - z) * act(xi_h + r * hi_h)
    GRU, reset_after=False (bias [3U]): hi_h = (r * h) @ recurrent_kernel[:, 2U:], no recurrent bias.

The fused ops in the .tflite:

* inputs, in order: ``x`` [N, T, F]; ``kernel``; ``recurrent_kernel``; ``bias`` (when ``use_bias``);
  then, when ``initial_state``: ``h0`` [N, U] and (LSTM) ``c0`` [N, U];
* outputs, only those asked for (an output not asked for is never computed into memory; :func:`tflfuse.convert`
  turns ``return_state`` / ``return_sequences`` off where the model reads none of them,
  :mod:`tflfuse.passes.prune`): ``y``
  ([N, T, U] with ``return_sequences``, in processing order, else the last ``h`` [N, U]); with
  ``return_state``, the last ``h`` [N, U] (only with ``return_sequences``: otherwise it is ``y``) and
  (LSTM) the last ``c`` [N, U];
* attributes (:func:`tflfuse.annotate.decode_attrs`): ``activation``, ``recurrent_activation`` (str, one
  of ``tanh``, ``sigmoid``, ``relu``, ``linear``, ``hard_sigmoid``), ``use_bias``, ``return_sequences``,
  ``return_state``, ``go_backwards``, ``initial_state`` (bool) and, for the GRU, ``reset_after`` (bool).

Masks and stateful layers are refused (``ValueError``), never fused into something else.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflfuse.annotate import composite

__all__ = ["GRU", "LSTM", "fused_gru", "fused_lstm", "gru", "lstm"]

ACTIVATIONS = ("tanh", "sigmoid", "relu", "linear", "hard_sigmoid")
_TF_ACTIVATIONS = {"tanh": tf.tanh, "sigmoid": tf.sigmoid, "relu": tf.nn.relu, "linear": lambda v: v,
                   "hard_sigmoid": lambda v: tf.nn.relu6(v + 3.0) / 6.0}


# ---- the bodies ------------------------------------------------------------------------------------------
def _check(op: str, name: str, t, expected) -> None:
    shape = tuple(t.shape)
    if len(shape) != len(expected) or any(e is not None and d is not None and d != e
                                          for d, e in zip(shape, expected)):
        raise ValueError(f"{op}: {name} has shape {shape}, expected {tuple('?' if e is None else e for e in expected)}")


def _activation(op: str, what: str, name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"{op}: {what} must be one of {ACTIVATIONS}, got {name!r}")
    return _TF_ACTIVATIONS[name]


def _scan(step, x, states, go_backwards: bool):
    """Runs ``h, states = step(x_t, states)`` over the time axis of ``x [N, T, F]``; returns the stacked
    outputs [N, T, U] (in processing order) and the last states. Unrolled when T is static."""
    steps = x.shape[1]
    if steps is not None:
        xs = tf.unstack(x, axis=1)
        outs = []
        for x_t in (xs[::-1] if go_backwards else xs):
            h, states = step(x_t, states)
            outs.append(h)
        return tf.stack(outs, axis=1), states
    xt = tf.transpose(x, [1, 0, 2])
    count = tf.shape(xt)[0]
    ta = tf.TensorArray(x.dtype, size=count)

    def body(s, states, ta):
        h, states = step(xt[count - 1 - s] if go_backwards else xt[s], states)
        return s + 1, states, ta.write(s, h)

    _, states, ta = tf.while_loop(lambda s, *_: s < count, body, (tf.constant(0), states, ta))
    return tf.transpose(ta.stack(), [1, 0, 2]), states


def _common(op, x, kernel, recurrent_kernel, gates):
    x, kernel, recurrent_kernel = (tf.convert_to_tensor(t, tf.float32) for t in (x, kernel, recurrent_kernel))
    _check(op, "x", x, (None, None, None))
    _check(op, "kernel", kernel, (x.shape[-1], None))
    units = recurrent_kernel.shape[0]
    if units is None or kernel.shape[-1] != gates * units:
        raise ValueError(f"{op}: kernel {tuple(kernel.shape)} and recurrent_kernel {tuple(recurrent_kernel.shape)} "
                         f"must be [F, {gates}*units] and [units, {gates}*units]")
    _check(op, "recurrent_kernel", recurrent_kernel, (units, gates * units))
    return x, kernel, recurrent_kernel, units


def _state(op, name, t, x, units):
    if t is None:
        return tf.zeros(tf.stack([tf.shape(x)[0], units]), tf.float32)
    t = tf.convert_to_tensor(t, tf.float32)
    _check(op, name, t, (x.shape[0], units))
    return t


def _outputs(seq, h, c, return_sequences, return_state):
    outs = [seq if return_sequences else h]
    if return_state and return_sequences:
        outs.append(h)
    if return_state and c is not None:
        outs.append(c)
    return outs[0] if len(outs) == 1 else tuple(outs)


@composite("fused_lstm", activation="tanh", recurrent_activation="sigmoid", use_bias=True, return_sequences=False,
           return_state=False, go_backwards=False, initial_state=False)
def fused_lstm(x, kernel, recurrent_kernel, bias=None, h0=None, c0=None, *, activation, recurrent_activation,
               use_bias, return_sequences, return_state, go_backwards, initial_state):
    """Keras' LSTM over a whole sequence, fused into one ``fused_lstm`` op (see the module doc).

    The attributes ``use_bias`` and ``initial_state`` must say whether ``bias`` and ``h0``/``c0`` are given;
    :func:`lstm` sets them from its arguments.

    Args:
      x: [N, T, F] float32.
      kernel: [F, 4U] (gates i, f, c, o), recurrent_kernel: [U, 4U], bias: [4U] or None.
      h0, c0: [N, U] initial state, or both None (zeros).
      activation, recurrent_activation: names in :data:`ACTIVATIONS` (Keras: ``"tanh"``, ``"sigmoid"``).
      use_bias, return_sequences, return_state, go_backwards, initial_state: bools (attributes).

    Returns:
      ``y`` ([N, T, U] with return_sequences, else [N, U]); with return_state a tuple ``(y, h, c)``, or
      ``(y, c)`` without return_sequences (``h`` is ``y`` then).

    Raises:
      ValueError: shapes that disagree, an unknown activation, ``use_bias``/``initial_state`` that
        contradict the arguments given.
    """
    op = "fused_lstm"
    act = _activation(op, "activation", activation)
    ract = _activation(op, "recurrent_activation", recurrent_activation)
    if use_bias != (bias is not None) or initial_state != (h0 is not None) or (h0 is None) != (c0 is None):
        raise ValueError(f"{op}: use_bias={use_bias} and initial_state={initial_state} must match the arguments "
                         f"(bias {'given' if bias is not None else 'None'}, h0 {'given' if h0 is not None else 'None'}"
                         f", c0 {'given' if c0 is not None else 'None'}); call composites.lstm() to set them")
    x, kernel, recurrent_kernel, units = _common(op, x, kernel, recurrent_kernel, 4)
    if bias is not None:
        bias = tf.convert_to_tensor(bias, tf.float32)
        _check(op, "bias", bias, (4 * units,))
    h, c = _state(op, "h0", h0, x, units), _state(op, "c0", c0, x, units)

    def step(x_t, states):
        h, c = states
        a = tf.matmul(x_t, kernel) + tf.matmul(h, recurrent_kernel)
        if bias is not None:
            a = a + bias
        i, f, g, o = tf.split(a, 4, axis=-1)
        c = ract(f) * c + ract(i) * act(g)
        h = ract(o) * act(c)
        return h, (h, c)

    seq, (h, c) = _scan(step, x, (h, c), go_backwards)
    return _outputs(seq, h, c, return_sequences, return_state)


@composite("fused_gru", activation="tanh", recurrent_activation="sigmoid", use_bias=True, return_sequences=False,
           return_state=False, go_backwards=False, initial_state=False, reset_after=True)
def fused_gru(x, kernel, recurrent_kernel, bias=None, h0=None, *, activation, recurrent_activation, use_bias,
              return_sequences, return_state, go_backwards, initial_state, reset_after):
    """Keras' GRU over a whole sequence, fused into one ``fused_gru`` op (see the module doc).

    Args:
      x: [N, T, F] float32.
      kernel: [F, 3U] (gates z, r, h), recurrent_kernel: [U, 3U], bias: [2, 3U] (reset_after) or [3U], or None.
      h0: [N, U] initial state, or None (zeros).
      activation, recurrent_activation: names in :data:`ACTIVATIONS`.
      use_bias, return_sequences, return_state, go_backwards, initial_state, reset_after: bools (attributes).

    Returns:
      ``y`` ([N, T, U] with return_sequences, else [N, U]); ``(y, h)`` with return_state and
      return_sequences (without return_sequences the state is ``y`` itself, returned alone).

    Raises:
      ValueError: as :func:`fused_lstm`.
    """
    op = "fused_gru"
    act = _activation(op, "activation", activation)
    ract = _activation(op, "recurrent_activation", recurrent_activation)
    if use_bias != (bias is not None) or initial_state != (h0 is not None):
        raise ValueError(f"{op}: use_bias={use_bias} and initial_state={initial_state} must match the arguments "
                         f"(bias {'given' if bias is not None else 'None'}, h0 {'given' if h0 is not None else 'None'})"
                         f"; call composites.gru() to set them")
    x, kernel, recurrent_kernel, units = _common(op, x, kernel, recurrent_kernel, 3)
    b_in = b_rec = None
    if bias is not None:
        bias = tf.convert_to_tensor(bias, tf.float32)
        _check(op, "bias", bias, (2, 3 * units) if reset_after else (3 * units,))
        b_in, b_rec = (bias[0], bias[1]) if reset_after else (bias, None)
    h = _state(op, "h0", h0, x, units)

    def step(x_t, states):
        (h,) = states
        xi = tf.matmul(x_t, kernel)
        if b_in is not None:
            xi = xi + b_in
        x_z, x_r, x_h = tf.split(xi, 3, axis=-1)
        if reset_after:
            hi = tf.matmul(h, recurrent_kernel)
            if b_rec is not None:
                hi = hi + b_rec
            h_z, h_r, h_h = tf.split(hi, 3, axis=-1)
            z, r = ract(x_z + h_z), ract(x_r + h_r)
            hh = act(x_h + r * h_h)
        else:
            hi = tf.matmul(h, recurrent_kernel[:, :2 * units])
            z, r = ract(x_z + hi[:, :units]), ract(x_r + hi[:, units:])
            hh = act(x_h + tf.matmul(r * h, recurrent_kernel[:, 2 * units:]))
        h = z * h + (1.0 - z) * hh
        return h, (h,)

    seq, (h,) = _scan(step, x, (h,), go_backwards)
    return _outputs(seq, h, None, return_sequences, return_state)


def _flags(kwargs: dict) -> dict:
    keys = ("activation", "recurrent_activation", "return_sequences", "return_state", "go_backwards")
    return {k: kwargs[k] for k in keys}


def lstm(x, kernel, recurrent_kernel, bias=None, initial_state=None, *, activation="tanh",
         recurrent_activation="sigmoid", return_sequences=False, return_state=False, go_backwards=False):
    """:func:`fused_lstm` with ``use_bias`` and ``initial_state`` set from the arguments.

    Args:
      x: [N, T, F] float32; kernel [F, 4U]; recurrent_kernel [U, 4U]; bias [4U] or None.
      initial_state: ``(h0, c0)``, each [N, U], or None.
      activation, recurrent_activation, return_sequences, return_state, go_backwards: as keras.layers.LSTM.

    Returns:
      As :func:`fused_lstm`.

    Raises:
      ValueError: ``initial_state`` that is not a pair, and the errors of :func:`fused_lstm`.

    >>> y = lstm(x, kernel, recurrent_kernel, bias, return_sequences=True)   # doctest: +SKIP
    """
    h0 = c0 = None
    if initial_state is not None:
        if not isinstance(initial_state, (list, tuple)) or len(initial_state) != 2:
            raise ValueError(f"lstm: initial_state must be a pair (h0, c0), got {type(initial_state).__name__}")
        h0, c0 = initial_state
    return fused_lstm(x, kernel, recurrent_kernel, bias, h0, c0, use_bias=bias is not None,
                      initial_state=initial_state is not None, **_flags(locals()))


def gru(x, kernel, recurrent_kernel, bias=None, initial_state=None, *, activation="tanh",
        recurrent_activation="sigmoid", return_sequences=False, return_state=False, go_backwards=False,
        reset_after=True):
    """:func:`fused_gru` with ``use_bias`` and ``initial_state`` set from the arguments.

    Args:
      x: [N, T, F] float32; kernel [F, 3U]; recurrent_kernel [U, 3U]; bias ([2, 3U] with reset_after, else
        [3U]) or None; initial_state: ``h0`` [N, U] (or a one-element list of it) or None.
      activation, recurrent_activation, return_sequences, return_state, go_backwards, reset_after: as
        keras.layers.GRU.

    Returns:
      As :func:`fused_gru`.
    """
    if isinstance(initial_state, (list, tuple)):
        if len(initial_state) != 1:
            raise ValueError(f"gru: initial_state must be h0 or [h0], got {len(initial_state)} tensors")
        initial_state = initial_state[0]
    return fused_gru(x, kernel, recurrent_kernel, bias, initial_state, use_bias=bias is not None,
                     initial_state=initial_state is not None, reset_after=reset_after, **_flags(locals()))


# ---- Keras layers ----------------------------------------------------------------------------------------
class _Recurrent(keras.layers.Layer):
    gates = 4
    kind = "LSTM"

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
                 return_sequences=False, return_state=False, go_backwards=False, stateful=False, time_major=False,
                 unroll=False, dropout=0.0, recurrent_dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        kind = self.kind
        if type(units) is not int or units < 1:
            raise ValueError(f"{kind}: units must be a positive int, got {units!r}")
        for what, name in (("activation", activation), ("recurrent_activation", recurrent_activation)):
            if name not in ACTIVATIONS:
                raise ValueError(f"{kind}: {what}={name!r} is not supported; use one of {ACTIVATIONS} "
                                 f"(a name, as keras.layers.{kind} takes it)")
        if stateful:
            raise ValueError(f"{kind}: stateful=True is not supported: the fused op starts every call from "
                             f"the initial state (zeros or initial_state). Pass the previous call's state "
                             f"as initial_state (with return_state=True) instead")
        if time_major:
            raise ValueError(f"{kind}: time_major=True is not supported; give x as [batch, time, features]")
        if dropout or recurrent_dropout:
            raise ValueError(f"{kind}: dropout={dropout!r}, recurrent_dropout={recurrent_dropout!r}: dropout is "
                             f"not supported (it would be skipped in training); use keras.layers.{kind} to train "
                             f"with dropout and copy its weights with set_weights")
        self.units, self.activation, self.recurrent_activation = units, activation, recurrent_activation
        self.use_bias = bool(use_bias)
        self.return_sequences, self.return_state = bool(return_sequences), bool(return_state)
        self.go_backwards, self.unroll, self.seed = bool(go_backwards), bool(unroll), seed
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.recurrent_initializer = keras.initializers.get(recurrent_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = False

    def build(self, sequences_shape, initial_state_shape=None):
        if len(sequences_shape) != 3 or sequences_shape[-1] is None:
            raise ValueError(f"{self.kind} {self.name}: input must be [batch, time, features] with known "
                             f"features, got {tuple(sequences_shape)}")
        f, u, g = int(sequences_shape[-1]), self.units, self.gates
        self.kernel = self.add_weight(name="kernel", shape=(f, g * u), initializer=self.kernel_initializer)
        self.recurrent_kernel = self.add_weight(name="recurrent_kernel", shape=(u, g * u),
                                                initializer=self.recurrent_initializer)
        self.bias = self.add_weight(name="bias", shape=self._bias_shape(), initializer=self._bias_init()) \
            if self.use_bias else None

    def _bias_shape(self):
        return (self.gates * self.units,)

    def _bias_init(self):
        return self.bias_initializer

    def _refuse_mask(self, mask):
        if mask is not None:
            raise ValueError(
                f"{self.kind} {self.name}: its input carries a Keras mask (from keras.layers.Masking, an "
                f"Embedding with mask_zero=True, or mask=...), and masked time steps are not supported by the "
                f"fused op (it would process them as data). Remove the mask, or use keras.layers.{self.kind}")

    def _state_shapes(self, n):
        return [(n, self.units)]

    def compute_output_shape(self, sequences_shape, initial_state_shape=None):
        n, t = sequences_shape[0], sequences_shape[1]
        out = (n, t, self.units) if self.return_sequences else (n, self.units)
        if not self.return_state:
            return out
        return [out] + self._state_shapes(n)

    def compute_mask(self, sequences, mask=None):
        return None

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "recurrent_activation": self.recurrent_activation, "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": keras.initializers.serialize(self.recurrent_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "return_sequences": self.return_sequences, "return_state": self.return_state,
                "go_backwards": self.go_backwards, "unroll": self.unroll, "seed": self.seed}


@keras.saving.register_keras_serializable(package="tflfuse")
class LSTM(_Recurrent):
    """A drop-in for ``keras.layers.LSTM`` whose call is the ``fused_lstm`` composite (one op).

    Weights as Keras': ``kernel`` [F, 4U], ``recurrent_kernel`` [U, 4U], ``bias`` [4U] (gates i, f, c, o), in
    that order, so ``layer.set_weights(keras_lstm.get_weights())`` works both ways.

    Args:
      units: U. activation, recurrent_activation: names in :data:`ACTIVATIONS`. use_bias: bool.
      kernel_initializer, recurrent_initializer, bias_initializer, unit_forget_bias: as Keras (the forget
        gate's bias starts at 1 with unit_forget_bias).
      return_sequences, return_state, go_backwards: as Keras.
      stateful, time_major, dropout, recurrent_dropout: only their defaults (False, False, 0, 0); others
        raise ValueError. unroll, seed, use_cudnn: accepted, without effect on the values.

    Call: ``layer(x, initial_state=None)`` with ``x`` [N, T, F], ``initial_state`` ``[h0, c0]`` (each [N, U]).
    Returns [N, T, U] with return_sequences, else [N, U]; with return_state ``[output, h, c]``.

    Raises:
      ValueError: unsupported arguments (above); at call, an input that carries a Keras mask.
    """

    kind = "LSTM"
    gates = 4

    def __init__(self, units, *args, unit_forget_bias=True, use_cudnn="auto", **kwargs):
        super().__init__(units, *args, **kwargs)
        self.unit_forget_bias = bool(unit_forget_bias)

    def _bias_init(self):
        if not self.unit_forget_bias:
            return self.bias_initializer
        init, u = self.bias_initializer, self.units

        def initializer(shape, dtype=None):
            return keras.ops.concatenate([init((u,), dtype=dtype), keras.initializers.get("ones")((u,), dtype=dtype),
                                          init((2 * u,), dtype=dtype)])

        return initializer

    def _state_shapes(self, n):
        return [(n, self.units), (n, self.units)]

    def call(self, sequences, initial_state=None, mask=None, training=False):
        self._refuse_mask(mask)
        if initial_state is not None and (not isinstance(initial_state, (list, tuple)) or len(initial_state) != 2):
            raise ValueError(f"LSTM {self.name}: initial_state must be [h0, c0], got {initial_state!r}")
        out = lstm(sequences, self.kernel, self.recurrent_kernel, self.bias,
                   None if initial_state is None else list(initial_state), activation=self.activation,
                   recurrent_activation=self.recurrent_activation, return_sequences=self.return_sequences,
                   return_state=self.return_state, go_backwards=self.go_backwards)
        if not self.return_state:
            return out
        if self.return_sequences:
            y, h, c = out
            return [y, h, c]
        y, c = out
        return [y, y, c]

    def get_config(self):
        return {**super().get_config(), "unit_forget_bias": self.unit_forget_bias}


@keras.saving.register_keras_serializable(package="tflfuse")
class GRU(_Recurrent):
    """A drop-in for ``keras.layers.GRU`` whose call is the ``fused_gru`` composite (one op).

    Weights as Keras': ``kernel`` [F, 3U], ``recurrent_kernel`` [U, 3U], ``bias`` ([2, 3U] with
    reset_after, else [3U]; gates z, r, h), so ``layer.set_weights(keras_gru.get_weights())`` works.

    Args:
      as :class:`LSTM` (without unit_forget_bias), and reset_after (bool, default True as Keras).

    Call: ``layer(x, initial_state=None)``, ``initial_state`` ``h0`` or ``[h0]`` ([N, U]). Returns [N, T, U]
    with return_sequences, else [N, U]; with return_state ``[output, h]``.

    Raises:
      ValueError: unsupported arguments; at call, an input that carries a Keras mask.
    """

    kind = "GRU"
    gates = 3

    def __init__(self, units, *args, reset_after=True, use_cudnn="auto", **kwargs):
        super().__init__(units, *args, **kwargs)
        self.reset_after = bool(reset_after)

    def _bias_shape(self):
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def call(self, sequences, initial_state=None, mask=None, training=False):
        self._refuse_mask(mask)
        out = gru(sequences, self.kernel, self.recurrent_kernel, self.bias, initial_state,
                  activation=self.activation, recurrent_activation=self.recurrent_activation,
                  return_sequences=self.return_sequences, return_state=self.return_state,
                  go_backwards=self.go_backwards, reset_after=self.reset_after)
        if not self.return_state:
            return out
        if self.return_sequences:
            return list(out)
        return [out, out]

    def get_config(self):
        return {**super().get_config(), "reset_after": self.reset_after}


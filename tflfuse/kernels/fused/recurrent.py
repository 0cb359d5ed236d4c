"""Recurrent layers as one op: ``fused_lstm``, ``fused_gru`` and TFLite's ``UNIDIRECTIONAL_SEQUENCE_LSTM``.

Semantics (Keras 3's ``keras.layers.LSTM`` / ``keras.layers.GRU``, ``composites.recurrent``), for
``x [N, T, F]`` and weights in Keras' layout (``kernel [F, G*U]``, ``recurrent_kernel [U, G*U]``, gates in
Keras' order), starting from ``h = c = 0`` or the initial state, over the steps ``s = 0 .. T-1`` in order
(reversed inputs ``x[:, T-1-s]`` with ``go_backwards``)::

    LSTM (G = 4, gates i, f, c, o):  a = x_t @ kernel + h @ recurrent_kernel + bias
        c = ract(a_f) * c + ract(a_i) * act(a_c);   h = ract(a_o) * act(c)
    GRU (G = 3, gates z, r, h), reset_after (bias [2, 3U]: input bias, recurrent bias):
        xi = x_t @ kernel + bias[0];   hi = h @ recurrent_kernel + bias[1]
        z = ract(xi_z + hi_z);  r = ract(xi_r + hi_r);  hh = act(xi_h + r * hi_h);  h = z * h + (1 - z) * hh
    GRU, reset_after=False (bias [3U]): as above with hi_h = (r * h) @ recurrent_kernel[:, 2U:], no
        recurrent bias.

Op inputs: ``x``, ``kernel``, ``recurrent_kernel``, ``bias`` (when ``use_bias``), then the initial state
(when ``initial_state``: ``h0 [N, U]`` and, for the LSTM, ``c0 [N, U]``). Outputs, only those asked for:
``y`` (``[N, T, U]`` with ``return_sequences``, the outputs in processing order, else the last ``h [N, U]``);
with ``return_state``: the last ``h [N, U]`` (only with ``return_sequences``: otherwise it is ``y``) and,
for the LSTM, the last ``c [N, U]``. Attributes (:func:`tflfuse.annotate.decode_attrs`): ``activation``,
``recurrent_activation`` (``tanh``, ``sigmoid``, ``relu``, ``linear``, ``hard_sigmoid``), ``use_bias``,
``return_sequences``, ``return_state``, ``go_backwards``, ``initial_state`` and (GRU) ``reset_after``.

``UNIDIRECTIONAL_SEQUENCE_LSTM`` (LiteRT's semantics, as :mod:`tflfuse.passes.lstm` writes it): 24 inputs,
per-gate weights ``[U, F]`` and ``[U, U]``, gate biases ``[U]``, the state tensors 18 and 19 (variable
tensors: zero at the start of every invoke; read as the initial state where given as tensors), sigmoid
gates, ``fused_activation_function`` for the cell input and output, ``cell_clip`` (0: none), ``time_major``.
CIFG, peephole, projection and layer-norm inputs are refused. Its weights are first packed by three small
dispatches into one buffer in Keras' layout, so the recurrence below is shared.

Two strategies (the same values):

* ``single``: ONE dispatch, one workgroup of U invocations per batch row (unit j on invocation j) that walks
  the T steps; ``h`` lives in workgroup memory between barriers, ``c`` in a register. Used for U <= 256
  when its loop iterations per invocation (about ``T * (F + U) / 4``) stay far below the software adapter's
  cap (any T on a GPU: ``target="gpu"``).
* ``stepwise``: the input projection ``x @ kernel + bias`` for every step in one dispatch, then one
  dispatch per step (two for GRU without ``reset_after``) over ``N * U`` invocations; ``h`` alternates
  between two slots of a scratch buffer. The step dispatches share one pipeline (the step index is a
  uniform).

The ``strategy`` attribute (``auto``, ``single``, ``stepwise``) overrides the choice.
"""

from __future__ import annotations

from ..base import (MAX_WORKGROUPS_PER_DIM, Binding, CompositeKernel, Kernel, Program, TensorSpec, Uniform,
                    linear_dispatch)
from ..registry import register
from ..wgsl import activation_fn, elementwise_program, fmt_f32, linear_main, prelude

__all__ = ["FusedGRU", "FusedLSTM", "UnidirectionalSequenceLSTM"]

_MAX_UNITS_SINGLE = 256         # WebGPU's default maxComputeInvocationsPerWorkgroup
_CPU_SINGLE_TRIPS = 1 << 15     # half the software adapter's loop cap: the single dispatch's budget there
_WG = 64
#: Keras activation names the fused ops take.
ACTIVATION_NAMES = ("tanh", "sigmoid", "relu", "linear", "hard_sigmoid")
_HARD_SIGMOID = "return clamp(v + 3.0, 0.0, 6.0) / 6.0;"   # Keras 3: relu6(v + 3) / 6


def _act(name: str, fn_name: str, declared: str = "") -> str:
    if str(name).lower() == "hard_sigmoid":
        return f"fn {fn_name}(v: f32) -> f32 {{ {_HARD_SIGMOID} }}\n"
    return activation_fn(name, fn_name, declared=declared)


def _acts(act: str, ract: str) -> str:
    first = _act(act, "act")
    return first + _act(ract, "ract", declared=first)


def _mdot(n: int, vec: str, cols, unroll: int = 4) -> str:
    """WGSL adding ``sum_k vec(k) * m(k)`` to each ``acc`` of ``cols`` (pairs ``(acc, m)``), ``k < n``;
    ``vec`` and ``m`` format strings over ``{k}``. One loop of ``n // unroll`` iterations for every column."""
    main, lines = n - n % unroll, []
    if main:
        body = " ".join(f"let e{u} = {vec.format(k=f'k + {u}u')};" for u in range(unroll))
        for acc, m in cols:
            body += f" {acc} += " + " + ".join(f"e{u} * {m.format(k=f'k + {u}u')}" for u in range(unroll)) + ";"
        lines.append(f"for (var k = 0u; k < {main}u; k += {unroll}u) {{ {body} }}")
    for u in range(n % unroll):
        k = f"{main + u}u"
        lines.append(f"{{ let e = {vec.format(k=k)}; " + " ".join(f"{acc} += e * {m.format(k=k)};" for acc, m in cols)
                     + " }")
    return "\n    ".join(lines)


class _Recurrent(Kernel):
    """The shared recurrence; subclasses describe their inputs, outputs and weight sources."""

    cell = "lstm"
    extra_attrs = ("strategy",)

    # ---- set by subclasses' check() ------------------------------------------------------------------
    n = t = f = u = 0
    act = "tanh"
    ract = "sigmoid"
    seq = True
    rstate = False
    backwards = False
    time_major = False
    reset_after = True
    cell_clip = 0.0
    h0_input: int | None = None
    c0_input: int | None = None

    @property
    def gates(self) -> int:
        return 4 if self.cell == "lstm" else 3

    def _choose(self) -> None:
        """Validates the sizes and picks the strategy."""
        if min(self.n, self.t, self.f, self.u) < 1:
            raise self.fail(f"batch, steps, features and units must be >= 1, got N={self.n}, T={self.t}, "
                            f"F={self.f}, U={self.u}")
        strategy = str(self.attrs.get("strategy") or "auto")
        if strategy not in ("auto", "single", "stepwise"):
            raise self.fail(f"strategy must be 'auto', 'single' or 'stepwise', got {strategy!r}")
        fits = self.u <= _MAX_UNITS_SINGLE and self.n <= MAX_WORKGROUPS_PER_DIM
        if strategy == "single" and not fits:
            raise self.fail(f"the single-dispatch strategy needs U <= {_MAX_UNITS_SINGLE} and N <= "
                            f"{MAX_WORKGROUPS_PER_DIM}, got U={self.u}, N={self.n}")
        if strategy == "auto":
            target = str(self.attrs.get("target") or "gpu")
            strategy = "single" if fits and (target == "gpu" or self._single_trips() < _CPU_SINGLE_TRIPS) \
                else "stepwise"
        self.strategy = strategy
        self.has_init = self.h0_input is not None or self.c0_input is not None

    # ---- weight sources (overridden by the builtin, which packs its weights first) -------------------
    def weight_bindings(self) -> tuple[Binding, ...]:
        """Bindings of the weights, in the order the generated code names them."""
        raise NotImplementedError

    def W(self, k: str, col: str) -> str:
        return f"w[({k}) * {self.gates * self.u}u + {col}]"

    def R(self, k: str, col: str) -> str:
        return f"r[({k}) * {self.gates * self.u}u + {col}]"

    def bias_in(self, col: str) -> str:
        """The input-side bias of column ``col`` (a WGSL expression), or ``0.0``."""
        return "0.0"

    def bias_rec(self, col: str) -> str:
        """The recurrent-side bias (GRU with reset_after), or ``0.0``."""
        return "0.0"

    def pre_programs(self) -> list[Program]:
        return []

    def extra_scratch(self) -> list[tuple[str, int]]:
        return []

    # ---- outputs and scratch -------------------------------------------------------------------------
    def output_specs(self):
        seq_shape = (self.t, self.n, self.u) if self.time_major else (self.n, self.t, self.u)
        outs = [TensorSpec(seq_shape if self.seq else (self.n, self.u))]
        if self.rstate and self.seq:
            outs.append(TensorSpec((self.n, self.u)))
        if self.rstate and self.cell == "lstm":
            outs.append(TensorSpec((self.n, self.u)))
        return tuple(outs)

    def _scratch_list(self) -> list[tuple[str, int]]:
        nu = self.n * self.u
        state = (3 if self.cell == "lstm" else 2) * nu * 4   # h in two slots, then c
        out = list(self.extra_scratch())
        if self.strategy == "stepwise":
            out.append(("st", state))
            out.append(("xp", self.n * self.t * self.gates * self.u * 4))
            if self.cell == "gru" and not self.reset_after:
                out.append(("gr", 2 * nu * 4))
        elif self.has_init:
            out.append(("st", state))
        return out

    def scratch_sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size in self._scratch_list())

    def _scratch(self, name: str, access: str = "read_write") -> Binding:
        for i, (n, size) in enumerate(self._scratch_list()):
            if n == name:
                return self.binding(name, "scratch", i, size, access=access)
        raise AssertionError(name)

    def _outputs(self) -> dict[str, Binding]:
        specs = self.output_specs()
        names = ["y"] + (["hT"] if self.rstate and self.seq else []) + \
            (["cT"] if self.rstate and self.cell == "lstm" else [])
        return {name: self.binding(name, "output", i, s) for i, (name, s) in enumerate(zip(names, specs))}

    # ---- index helpers -------------------------------------------------------------------------------
    def _xbase(self, n: str, t: str) -> str:
        if self.time_major:
            return f"(({t}) * {self.n}u + ({n})) * {self.f}u"
        return f"(({n}) * {self.t}u + ({t})) * {self.f}u"

    def _ybase(self, n: str, s: str) -> str:
        if self.time_major:
            return f"(({s}) * {self.n}u + ({n})) * {self.u}u"
        return f"(({n}) * {self.t}u + ({s})) * {self.u}u"

    def _tx(self, s: str) -> str:
        return f"({self.t - 1}u - {s})" if self.backwards else s

    # ---- the cell ------------------------------------------------------------------------------------
    def _cell(self, xin, hvec: str, hprev: str, cprev: str, rh_store: str | None = None,
              rh_vec: str | None = None, xdot: str = "") -> str:
        """WGSL computing ``hn`` (and ``cn`` for the LSTM) of unit ``j``.

        ``xin(g)``: the statements/expression giving gate g's input-side pre-activation (bias included);
        ``hvec``: h_prev[k] over ``{k}``; ``hprev``/``cprev``: this unit's previous h and c. For GRU without
        reset_after, the code is split at ``// PHASE`` where the caller synchronizes (``rh_store`` then
        stores ``r * h``; ``rh_vec`` reads it over ``{k}``). ``xdot`` follows the declarations of the
        input-side sums ``a0..``.
        """
        u, gates = self.u, self.gates
        col = lambda g: f"{g * u}u + j" if g else "j"  # noqa: E731
        lines = [f"var a{g} = {xin(g)};" for g in range(gates)] + ([xdot] if xdot else [])
        if self.cell == "lstm":
            lines.append(_mdot(u, hvec, [(f"a{g}", self.R("{k}", col(g))) for g in range(4)]))
            lines += ["let gi = ract(a0);", "let gf = ract(a1);", "let gg = act(a2);", "let go = ract(a3);",
                      f"var cn = gf * {cprev} + gi * gg;"]
            if self.cell_clip > 0:
                clip = fmt_f32(self.cell_clip)
                lines.append(f"cn = clamp(cn, -{clip}, {clip});")
            lines.append("let hn = go * act(cn);")
            return "\n    ".join(lines)
        if self.reset_after:
            lines += [f"var i{g} = {self.bias_rec(col(g))};" for g in range(3)]
            lines.append(_mdot(u, hvec, [(f"i{g}", self.R("{k}", col(g))) for g in range(3)]))
            lines += ["let z = ract(a0 + i0);", "let rg = ract(a1 + i1);", "let hh = act(a2 + rg * i2);",
                      f"let hn = z * {hprev} + (1.0 - z) * hh;"]
            return "\n    ".join(lines)
        lines += ["var i0 = 0.0;", "var i1 = 0.0;",
                  _mdot(u, hvec, [(f"i{g}", self.R("{k}", col(g))) for g in range(2)]),
                  "let z = ract(a0 + i0);", "let rg = ract(a1 + i1);", f"{rh_store} = rg * {hprev};",
                  "// PHASE", "var i2 = 0.0;", _mdot(u, rh_vec, [("i2", self.R("{k}", col(2)))]),
                  f"let hn = z * {hprev} + (1.0 - z) * act(a2 + i2);"]
        return "\n    ".join(lines)

    def _finals(self, hn: str, cn: str, n: str = "n") -> str:
        out = []
        if not self.seq:
            out.append(f"y[{n} * {self.u}u + j] = {hn};")
        if self.rstate and self.seq:
            out.append(f"hT[{n} * {self.u}u + j] = {hn};")
        if self.rstate and self.cell == "lstm":
            out.append(f"cT[{n} * {self.u}u + j] = {cn};")
        return " ".join(out)

    # ---- programs ------------------------------------------------------------------------------------
    def _single_trips(self) -> int:
        per_step = 1 + self.f // 4 + self.u // 4
        if self.cell == "gru" and not self.reset_after:
            per_step += self.u // 4
        return self.t * per_step + 1

    def _init_program(self) -> Program:
        """Copies the initial state (or zeros) into the state scratch: h in slot 0, then c."""
        nu = self.n * self.u
        binds, body = [], []
        if self.h0_input is not None:
            binds.append(self.binding("h0", "input", self.h0_input, self.inputs[self.h0_input]))
        body.append(f"  st[idx] = {'h0[idx]' if self.h0_input is not None else '0.0'};")
        if self.cell == "lstm":
            if self.c0_input is not None:
                binds.append(self.binding("c0", "input", self.c0_input, self.inputs[self.c0_input]))
            body.append(f"  st[{2 * nu}u + idx] = {'c0[idx]' if self.c0_input is not None else '0.0'};")
        binds.append(self._scratch("st"))
        return elementwise_program(f"{self.key}_init", tuple(binds), nu, "\n".join(body))

    def _single(self) -> list[Program]:
        u, nu = self.u, self.n * self.u
        outs = self._outputs()
        binds = (self.binding("x", "input", 0, self.inputs[0]),) + self.weight_bindings() + \
            ((self._scratch("st", "read"),) if self.has_init else ()) + tuple(outs.values())
        gates = self.gates

        def xin(g):
            return self.bias_in(f"{g * u}u + j" if g else "j")

        xdot = _mdot(self.f, "x[xb + {k}]", [(f"a{g}", self.W("{k}", f"{g * u}u + j" if g else "j"))
                                             for g in range(gates)])
        cell = self._cell(xin, "hs[{k}]", "hs[j]", "c", "rh[j]", "rh[{k}]", xdot)
        cell = cell.replace("// PHASE", "workgroupBarrier();")   # GRU without reset_after: r * h shared first
        lstm = self.cell == "lstm"
        init_h = f"st[n * {u}u + j]" if self.has_init else "0.0"
        init_c = f"st[{2 * nu}u + n * {u}u + j]" if self.has_init else "0.0"
        seq_write = f"y[{self._ybase('n', 's')} + j] = hn;" if self.seq else ""
        rh_decl = f"var<workgroup> rh: array<f32, {u}>;\n" if self.cell == "gru" and not self.reset_after else ""
        source = prelude(binds) + _acts(self.act, self.ract) + f"""
var<workgroup> hs: array<f32, {u}>;
{rh_decl}
@compute @workgroup_size({u})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) j: u32) {{
  let n = wid.x;
  hs[j] = {init_h};
  var c = {init_c if lstm else '0.0'};
  workgroupBarrier();
  for (var s = 0u; s < {self.t}u; s++) {{
    let xb = {self._xbase('n', self._tx('s'))};
    {cell}
    workgroupBarrier();
    hs[j] = hn;{' c = cn;' if lstm else ''}
    {seq_write}
    workgroupBarrier();
  }}
  {self._finals('hs[j]', 'c')}
}}
"""
        main = Program(self.key, source, (u, 1, 1), (self.n, 1, 1), binds, loop_trips=self._single_trips())
        return ([self._init_program()] if self.has_init else []) + [main]

    def _stepwise(self) -> list[Program]:
        u, t, nu, gu = self.u, self.t, self.n * self.u, self.gates * self.u
        x = self.binding("x", "input", 0, self.inputs[0])
        wb = self.weight_bindings()
        xp_w = self._scratch("xp")
        body = (f"  let col = idx % {gu}u;\n  let s = (idx / {gu}u) % {t}u;\n  let n = idx / {gu * t}u;\n"
                f"  let xb = {self._xbase('n', self._tx('s'))};\n  var v = {self.bias_in('col')};\n  "
                + _mdot(self.f, "x[xb + {k}]", [("v", self.W("{k}", "col"))]) + "\n  xp[idx] = v;")
        proj = tuple(b for b in wb if b.name != "r")   # the projection reads the kernel and the input bias
        progs = [elementwise_program(f"{self.key}_input_projection", (x,) + proj + (xp_w,), self.n * t * gu, body,
                                     loop_trips=self.f // 4)]
        progs.append(self._init_program())
        xp, st = self._scratch("xp", "read"), self._scratch("st")
        outs = self._outputs()
        lstm = self.cell == "lstm"
        head = (f"  let j = idx % {u}u;\n  let n = idx / {u}u;\n  let s = params.step;\n"
                f"  let hp = (s % 2u) * {nu}u + n * {u}u;\n  let hq = ((s + 1u) % 2u) * {nu}u + n * {u}u;\n"
                f"  let xo = (n * {t}u + s) * {gu}u;\n  ")

        def xin(g):
            return f"xp[xo + {g * u}u + j]" if g else "xp[xo + j]"

        cprev = f"st[{2 * nu}u + n * {u}u + j]"
        cell = self._cell(xin, "st[hp + {k}]", "st[hp + j]", cprev, f"gr[{nu}u + n * {u}u + j]",
                          f"gr[{nu}u + n * {u}u + {{k}}]")
        seq_write = f"y[{self._ybase('n', 's')} + j] = hn;" if self.seq else ""
        finals = f"if (s == {t - 1}u) {{ {self._finals('hn', 'cn')} }}"
        # The step reads the recurrent weights, and the recurrent bias of a GRU with reset_after (the input
        # bias is in xp): only bindings the shader uses may be bound.
        rec = tuple(b for b in wb if b.name not in ("w", "b") or (b.name == "b" and self.bias_rec("j") != "0.0"))
        acts = _acts(self.act, self.ract)
        if "// PHASE" in cell:   # GRU without reset_after: z and r * h first, then the candidate and h
            first, _, second = cell.partition("// PHASE")
            gr = self._scratch("gr")
            first += f"gr[n * {u}u + j] = z;"
            second = "let z = gr[n * {u}u + j];\n    var a2 = {a2};\n    ".format(u=u, a2=xin(2)) + second
            step_a = (xp, *rec, st, gr)
            step_b = (xp, *rec, st, self._scratch("gr", "read"), *outs.values())
            bodies = [(f"{self.key}_step_gates", step_a, head + first),
                      (f"{self.key}_step", step_b,
                       head + second + f"\n    st[hq + j] = hn;\n  {seq_write}\n  {finals}")]
        else:
            store_c = f"{cprev} = cn;" if lstm else ""
            bodies = [(f"{self.key}_step", (xp, *rec, st, *outs.values()),
                       head + cell + f"\n  {store_c}\n  st[hq + j] = hn;\n  {seq_write}\n  {finals}")]
        for s in range(t):
            for name, binds, text in bodies:
                uniforms = (Uniform("step", "u32", s),)
                source = prelude(binds, uniforms) + acts + linear_main(_WG, nu, text)
                progs.append(Program(name, source, (_WG, 1, 1), linear_dispatch(nu, _WG), binds, uniforms,
                                     loop_trips=u // 4))
        return progs

    def programs(self) -> list[Program]:
        pre = self.pre_programs()
        return pre + (self._single() if self.strategy == "single" else self._stepwise())


class _FusedBase(CompositeKernel, _Recurrent):
    """The custom ops made by the composites: Keras-layout weights, attributes from the composite."""

    extra_attrs = ("strategy",)

    def check(self):
        x = self.expect_rank(0, 3)
        self.n, self.t, self.f = x.shape
        self.use_bias = bool(self.attr("use_bias"))
        self.has_init_attr = bool(self.attr("initial_state"))
        n_state = 2 if self.cell == "lstm" else 1
        want = 3 + int(self.use_bias) + (n_state if self.has_init_attr else 0)
        if len(self.inputs) != want:
            raise self.fail(f"expects {want} inputs (x, kernel, recurrent_kernel{', bias' if self.use_bias else ''}"
                            f"{', initial state' if self.has_init_attr else ''}), got {len(self.inputs)}")
        g = self.gates
        kernel = self.expect_rank(1, 2).shape
        rec = self.expect_rank(2, 2).shape
        if kernel[0] != self.f or kernel[1] % g or kernel[1] == 0:
            raise self.fail(f"kernel must be [F={self.f}, {g}*units], got {list(kernel)}")
        self.u = kernel[1] // g
        if rec != (self.u, g * self.u):
            raise self.fail(f"recurrent_kernel must be [{self.u}, {g * self.u}], got {list(rec)}")
        self.reset_after = bool(self.attr("reset_after")) if self.cell == "gru" else True
        if self.use_bias:
            bias = self.expect_rank(3, 1, 2).shape
            want_b = (2, g * self.u) if self.cell == "gru" and self.reset_after else (g * self.u,)
            if bias != want_b:
                raise self.fail(f"bias must be {list(want_b)}, got {list(bias)}")
        first_state = 3 + int(self.use_bias)
        if self.has_init_attr:
            for i in range(first_state, first_state + n_state):
                if self.expect_rank(i, 2).shape != (self.n, self.u):
                    raise self.fail(f"initial state (input {i}) must be [{self.n}, {self.u}], "
                                    f"got {list(self.inputs[i].shape)}")
            self.h0_input = first_state
            self.c0_input = first_state + 1 if self.cell == "lstm" else None
        self.act, self.ract = str(self.attr("activation")), str(self.attr("recurrent_activation"))
        for what, name in (("activation", self.act), ("recurrent_activation", self.ract)):
            if name not in ACTIVATION_NAMES:
                raise self.fail(f"{what} {name!r} is not supported; supported: {list(ACTIVATION_NAMES)}")
        self.seq = bool(self.attr("return_sequences"))
        self.rstate = bool(self.attr("return_state"))
        self.backwards = bool(self.attr("go_backwards"))
        self._choose()

    def weight_bindings(self):
        names = ["w", "r"] + (["b"] if self.use_bias else [])
        return tuple(self.binding(nm, "input", i + 1, self.inputs[i + 1]) for i, nm in enumerate(names))

    def bias_in(self, col):
        return f"b[{col}]" if self.use_bias else "0.0"

    def bias_rec(self, col):
        if self.use_bias and self.cell == "gru" and self.reset_after:
            return f"b[{self.gates * self.u}u + {col}]"
        return "0.0"


_COMMON = {"activation": "tanh", "recurrent_activation": "sigmoid", "use_bias": True, "return_sequences": False,
           "return_state": False, "go_backwards": False, "initial_state": False, "target": "gpu"}


@register("fused_lstm")
class FusedLSTM(_FusedBase):
    """``x [N, T, F]``, ``kernel [F, 4U]``, ``recurrent_kernel [U, 4U]``, ``bias [4U]``, ``h0``, ``c0``
    -> ``y`` (+ ``h``, ``c``): Keras' LSTM (see the module doc). Raises KernelError for shapes that disagree."""

    cell = "lstm"
    input_names = ("x", "kernel", "recurrent_kernel", "bias", "h0", "c0")
    attr_defaults = dict(_COMMON)


@register("fused_gru")
class FusedGRU(_FusedBase):
    """``x [N, T, F]``, ``kernel [F, 3U]``, ``recurrent_kernel [U, 3U]``, ``bias`` ([2, 3U] with reset_after,
    else [3U]), ``h0`` -> ``y`` (+ ``h``): Keras' GRU (see the module doc)."""

    cell = "gru"
    input_names = ("x", "kernel", "recurrent_kernel", "bias", "h0")
    attr_defaults = {**_COMMON, "reset_after": True}


_ABSENT = {9: "cell_to_input_weights (peephole)", 10: "cell_to_forget_weights (peephole)",
           11: "cell_to_output_weights (peephole)", 16: "projection_weights", 17: "projection_bias",
           20: "input_layer_norm_coefficients", 21: "forget_layer_norm_coefficients",
           22: "cell_layer_norm_coefficients", 23: "output_layer_norm_coefficients"}


@register("UNIDIRECTIONAL_SEQUENCE_LSTM")
class UnidirectionalSequenceLSTM(_Recurrent):
    """TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM (float, no CIFG/peephole/projection/layer norm): ``input``
    ``[N, T, F]`` (``[T, N, F]`` when time_major) -> ``[N, T, U]``. Raises KernelError for the variants
    it does not run, naming them."""

    cell = "lstm"
    input_names = ("input", "input_to_input_weights", "input_to_forget_weights", "input_to_cell_weights",
                   "input_to_output_weights", "recurrent_to_input_weights", "recurrent_to_forget_weights",
                   "recurrent_to_cell_weights", "recurrent_to_output_weights", "cell_to_input_weights",
                   "cell_to_forget_weights", "cell_to_output_weights", "input_gate_bias", "forget_gate_bias",
                   "cell_gate_bias", "output_gate_bias", "projection_weights", "projection_bias",
                   "output_state", "cell_state", "input_layer_norm_coefficients",
                   "forget_layer_norm_coefficients", "cell_layer_norm_coefficients",
                   "output_layer_norm_coefficients")
    optional_inputs = frozenset({1, 5, 9, 10, 11, 12, 16, 17, 18, 19, 20, 21, 22, 23})
    #: variable tensors holding the state: the planner passes them as absent (zero at each invoke)
    state_inputs = frozenset({18, 19})
    attr_defaults = {"fused_activation_function": "TANH", "cell_clip": 0.0, "proj_clip": 0.0, "time_major": False,
                     "asymmetric_quantize_inputs": False, "diagonal_recurrent_tensors": False, "target": "gpu"}

    def check(self):
        x = self.expect_rank(0, 3)
        self.time_major = bool(self.attr("time_major"))
        if self.time_major:
            self.t, self.n, self.f = x.shape
        else:
            self.n, self.t, self.f = x.shape
        for i in (1, 5, 12):
            if not self.has_input(i):
                raise self.fail(f"input {i} ({self.input_names[i]}) is absent: the CIFG variant (coupled input "
                                f"and forget gates) is not supported")
        present = [name for i, name in _ABSENT.items() if self.has_input(i)]
        if present:
            raise self.fail(f"unsupported LSTM variant: {', '.join(present)} given")
        if bool(self.attr("diagonal_recurrent_tensors")):
            raise self.fail("diagonal_recurrent_tensors is not supported")
        self.u = self.expect_rank(2, 2).shape[0]
        for i in range(1, 5):
            if self.expect_rank(i, 2).shape != (self.u, self.f):
                raise self.fail(f"input {i} ({self.input_names[i]}) must be [{self.u}, {self.f}], "
                                f"got {list(self.inputs[i].shape)}")
        for i in range(5, 9):
            if self.expect_rank(i, 2).shape != (self.u, self.u):
                raise self.fail(f"input {i} ({self.input_names[i]}) must be [{self.u}, {self.u}], "
                                f"got {list(self.inputs[i].shape)}")
        for i in range(12, 16):
            if self.expect_rank(i, 1).shape != (self.u,):
                raise self.fail(f"input {i} ({self.input_names[i]}) must be [{self.u}], got "
                                f"{list(self.inputs[i].shape)}")
        for i in (18, 19):
            if self.has_input(i) and self.expect_rank(i, 2).shape != (self.n, self.u):
                raise self.fail(f"input {i} ({self.input_names[i]}) must be [{self.n}, {self.u}], got "
                                f"{list(self.inputs[i].shape)}")
        self.h0_input = 18 if self.has_input(18) else None
        self.c0_input = 19 if self.has_input(19) else None
        self.act = str(self.attr("fused_activation_function") or "NONE").lower()
        self.ract = "sigmoid"
        self.cell_clip = float(self.attr("cell_clip") or 0.0)
        if self.cell_clip < 0:
            raise self.fail(f"cell_clip must be >= 0, got {self.cell_clip}")
        self.seq, self.rstate, self.backwards = True, False, False
        self._choose()

    # Weights packed into one scratch buffer in Keras' layout: kernel [F, 4U], recurrent [U, 4U], bias [4U].
    def _offsets(self):
        gu = 4 * self.u
        return self.f * gu, self.f * gu + self.u * gu, (self.f + self.u + 1) * gu

    def extra_scratch(self):
        return [("pk", self._offsets()[2] * 4)]

    def weight_bindings(self):
        return (self._scratch("pk", "read"),)

    def W(self, k, col):
        return f"pk[({k}) * {4 * self.u}u + {col}]"

    def R(self, k, col):
        return f"pk[{self._offsets()[0]}u + ({k}) * {4 * self.u}u + {col}]"

    def bias_in(self, col):
        return f"pk[{self._offsets()[1]}u + {col}]"

    def pre_programs(self):
        """Three dispatches packing the per-gate weights and biases into ``pk`` (Keras layout)."""
        u, f = self.u, self.f
        r_off, b_off, _ = self._offsets()
        pk = self._scratch("pk")
        progs = []
        for first, rows, off, what in ((1, f, 0, "input_weights"), (5, u, r_off, "recurrent_weights"),
                                       (12, 1, b_off, "biases")):
            binds = tuple(self.binding(f"g{g}", "input", first + g, self.inputs[first + g]) for g in range(4)) + (pk,)
            src = "j" if rows == 1 else f"j * {rows}u + k"
            body = (f"  let k = idx / {4 * u}u;\n  let g = (idx / {u}u) % 4u;\n  let j = idx % {u}u;\n"
                    f"  var v = g3[{src}];\n"
                    f"  if (g == 0u) {{ v = g0[{src}]; }} else if (g == 1u) {{ v = g1[{src}]; }} "
                    f"else if (g == 2u) {{ v = g2[{src}]; }}\n  pk[{off}u + idx] = v;")
            progs.append(elementwise_program(f"{self.key}_pack_{what}", binds, rows * 4 * u, body))
        return progs

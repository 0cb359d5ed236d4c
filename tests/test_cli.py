"""The ``tflfuse`` command: each subcommand's output and exit status (0 ok, 1 failed, 2 bad usage or input)."""

import functools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tflfuse import zoo

TFLFUSE = [sys.executable, "-m", "tflfuse.cli"]


def tflfuse(*args, cwd=None):
    return subprocess.run([*TFLFUSE, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def face_model():
    return zoo.fetch("face_detection_short_range")


def test_no_command_prints_usage_and_exits_2():
    r = tflfuse()
    assert r.returncode == 2
    assert "tflfuse run MODEL.tflite" in r.stderr


def _help_blocks(text: str) -> dict[str, list[str]]:
    """``tflfuse --help``'s flag blocks: command -> the flag names listed under ``tflfuse COMMAND flags:``."""
    blocks, current = {}, None
    for line in text.splitlines():
        if line.startswith("tflfuse ") and line.endswith(" flags:"):
            current = blocks.setdefault(line.split()[1], [])
        elif current is not None and line.startswith("  --"):
            current.append(line.split(":")[0].strip()[2:])
        elif not line.startswith("      "):
            current = None
    return blocks


def test_adapters_lists_wgpu_natives_then_dawns():
    # wgpu-native's adapters (llvmpipe here), then Dawn's where wgpudawn is installed (a [test] dependency): none on a
    # machine without a GPU, which the line says; Dawn's Null backend where WGPU_BACKEND_TYPE picks it
    import tflfuse as tflfuse_module

    info = tflfuse_module.Device(backend="wgpu-native").info
    for env, dawn_line in (({}, "Dawn (backend='dawn'): no adapter here"), ({"WGPU_BACKEND_TYPE": "Null"},
                                                                          "  [Unknown, Null, Dawn")):
        r = subprocess.run([*TFLFUSE, "adapters"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert f"{info['device']}  [{info['adapter_type']}, {info['backend_type']}]" in lines, lines
        assert any(dawn_line in line for line in lines[1:]), lines


def test_help_lists_each_commands_flags_and_exits_0():
    from tflfuse import cli

    r = tflfuse("--help")
    assert r.returncode == 0, r.stderr
    assert "tflfuse shader KEY" in r.stdout and "Exit status:" in r.stdout
    blocks = _help_blocks(r.stdout)
    assert set(blocks) == set(cli._COMMANDS) - {"adapters"}   # adapters takes no flag
    assert "tflfuse adapters: no flags" in r.stdout
    # Every tflfuse flag is listed under exactly the commands it applies to; absl's own stay behind --helpfull.
    ours = {f.name for f in cli.FLAGS.get_flags_for_module("tflfuse.cli")}
    assert {n for names in blocks.values() for n in names} == ours
    for command, names in blocks.items():
        assert set(names) == {n for n, (cmds, _) in cli._FLAG_COMMANDS.items() if command in cmds}, command
    assert blocks["unfuse"] == ["output", "keep_custom_ops", "import_modules"]
    assert "patterns" in blocks["fuse"] and "patterns" not in blocks["run"]
    for command in ("convert", "run", "ops", "shader", "fuse", "unfuse", "check"):
        assert "import_modules" in blocks[command], command
    assert "--verbosity" not in r.stdout and "--helpfull" in r.stdout
    # One command's help: its synopsis and its flags only.
    r = tflfuse("run", "--help")
    assert r.returncode == 0, r.stderr
    assert list(_help_blocks(r.stdout)) == ["run"] and "tflfuse run MODEL.tflite" in r.stdout
    assert "tflfuse shader KEY" not in r.stdout
    # absl's full listing is still there, and its XML; both are help, exit 0.
    r = tflfuse("--helpfull")
    assert r.returncode == 0 and "--verbosity" in r.stdout and "tflfuse run MODEL.tflite" in r.stdout, r.stderr
    r = tflfuse("--helpxml")
    assert r.returncode == 0 and r.stdout.startswith("<?xml") and "<name>import_modules</name>" in r.stdout
    r = tflfuse("--adapter", "llvmpipe", "run", "--help")   # a flag's value is not taken for the command
    assert r.returncode == 0 and list(_help_blocks(r.stdout)) == ["run"], r.stderr


@pytest.mark.parametrize("args", [("frobnicate", "--help"), ("--help", "frobnicate"), ("frobnicate", "--helpfull"),
                                  ("frobnicate", "--helpxml"), ("frobnicate",)])
def test_an_unknown_command_is_named_even_with_help(args):
    r = tflfuse(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("error: unknown command 'frobnicate'; the commands are demo, convert, run, ops")
    assert "Exit status" not in r.stdout


def test_ops_lists_every_op_of_a_supported_model(face_model):
    r = tflfuse("ops", face_model)
    assert r.returncode == 0, r.stderr
    assert "every op has a kernel" in r.stdout
    assert r.stdout.count("supported") == 164


def test_run_matches_litert_and_saves_outputs(face_model, tmp_path):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    x = zoo.sample_photo((128, 128))
    np.save(tmp_path / "x.npy", x)
    r = tflfuse("run", face_model, f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'out.npz'}")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npz")
    cpu = LiteRT(model_path=str(face_model))
    cpu.allocate_tensors()
    cpu.set_tensor(cpu.get_input_details()[0]["index"], x)
    cpu.invoke()
    for d in cpu.get_output_details():
        want = cpu.get_tensor(d["index"])
        # same tolerance as tests/test_end_to_end.py for this model
        np.testing.assert_allclose(got[d["name"]], want, atol=1e-5 * np.abs(want).max(), rtol=1e-4)


@pytest.mark.parametrize("make_input, message", [
    (lambda p: np.save(p, np.zeros((1, 64, 64, 3), np.float32)), "has shape [1, 64, 64, 3]; the model's input "
     "'input' takes [1, 128, 128, 3]"),
    (lambda p: p.write_text("not numpy"), "not a .npy file"),
    (lambda p: np.save(p, np.zeros((1, 128, 128, 3), np.float64)), "expects float32, got float64"),
    # np.load reads an .npz archive whatever the file's name: refused as such, not as an array
    (lambda p: (np.savez(p.with_suffix(".npz"), x=np.zeros((1, 128, 128, 3), np.float32)),
                p.with_suffix(".npz").rename(p)), "not a .npy file (an .npz archive"),
])
def test_run_refuses_bad_inputs_in_one_line(face_model, tmp_path, make_input, message):
    make_input(tmp_path / "x.npy")
    r = tflfuse("run", face_model, f"--input={tmp_path / 'x.npy'}")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flag, message", [
    ("--atol=nan", "--atol: atol = nan must be a finite non-negative number"),
    ("--rtol=inf", "--rtol: rtol = inf must be a finite non-negative number"),
    ("--perf_slack=nan", "--perf_slack: perf_slack = nan must be a finite non-negative number"),
])
def test_check_refuses_tolerances_that_compare_nothing(face_model, flag, message):
    # absl's lower bound lets nan and inf through, and such a tolerance passes every comparison: refused before
    # anything runs, as in an expectations file.
    r = tflfuse("check", face_model, flag)
    assert r.returncode == 2, r.stdout
    assert message in r.stderr and "Traceback" not in r.stderr


def test_check_refuses_a_report_dir_that_cannot_be_a_folder_before_checking(face_model, tmp_path):
    (tmp_path / "taken").write_text("a file")
    r = tflfuse("check", face_model, f"--report_dir={tmp_path / 'taken'}")
    assert r.returncode == 2 and f"--report_dir={tmp_path / 'taken'}: cannot be made a folder" in r.stderr, r.stderr
    assert "passed" not in r.stdout   # refused before any check ran: no verdict, nothing lost
    assert (tmp_path / "taken").read_text() == "a file"


def test_run_names_the_npz_it_writes(face_model, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 128, 128, 3), np.float32))
    r = tflfuse("run", face_model, f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'out'}")
    assert r.returncode == 0 and f"wrote {tmp_path / 'out.npz'}" in r.stdout, r.stderr   # numpy adds .npz
    assert len(np.load(tmp_path / "out.npz").files) == 2
    for folder in (f"{tmp_path}/", str(tmp_path)):   # not a hidden ".npz" inside it
        r = tflfuse("run", face_model, f"--input={tmp_path / 'x.npy'}", f"--output={folder}")
        assert r.returncode == 2 and f"--output={folder}: a folder" in r.stderr, r.stderr
    assert not (tmp_path / ".npz").exists()


def test_fuse_refuses_an_empty_patterns_flag(face_model, tmp_path):
    r = tflfuse("fuse", face_model, f"--output={tmp_path / 'f.tflite'}", "--patterns=")
    assert r.returncode == 2 and "--patterns= names no pattern" in r.stderr, r.stderr
    assert not (tmp_path / "f.tflite").exists()


def test_check_refuses_an_npz_input(face_model, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 128, 128, 3), np.float32))
    r = tflfuse("check", face_model, f"--input={tmp_path / 'x.npz'}")
    assert r.returncode == 2, r.stdout
    out = r.stdout + r.stderr   # check reports a model's error in its report (stdout)
    assert "not a .npy file (an .npz archive of 1 array(s))" in out and "Traceback" not in out


def test_run_resizes_open_dimensions_and_names_the_fixed_ones(tmp_path):
    # A stock conversion keeps the batch open (shape signature [-1, 4]): run takes any batch, as LiteRT's
    # resize_tensor_input does, and refuses a size the model fixes, naming what it takes.
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    (tmp_path / "m.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    x = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = tflfuse("run", tmp_path / "m.tflite", f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'o.npz'}")
    assert r.returncode == 0, r.stderr
    (got,) = np.load(tmp_path / "o.npz").values()
    # 4-term dot products: ELEMENTWISE-scale rounding (conftest), 1e-6 absolute on unit-scale values.
    np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-6, rtol=1e-5)
    np.save(tmp_path / "x.npy", x[:, :3])
    r = tflfuse("run", tmp_path / "m.tflite", f"--input={tmp_path / 'x.npy'}")
    assert r.returncode == 2 and "takes [1, 4] (its shape signature [-1, 4]" in r.stderr, r.stderr
    assert "resize_tensor_input" not in r.stderr


def test_ops_into_a_closed_pipe_stops_quietly(face_model):
    # `tflfuse ops MODEL | head -1`: the reader leaves early; no error line, and SIGPIPE's status (141) where the
    # pipe closed before the listing ended (0 where it all fit in the pipe's buffer first).
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {' '.join(map(str, TFLFUSE))} ops {face_model} | head -1; "
                        "echo status=${PIPESTATUS[0]}"], capture_output=True, text=True, timeout=300)
    assert r.stdout.splitlines()[0].startswith("subgraph 0 op    0"), r.stdout
    assert r.stdout.splitlines()[-1] in ("status=141", "status=0"), r.stdout + r.stderr
    assert r.stderr == "", r.stderr


def test_run_without_inputs_names_the_inputs_plainly(face_model):
    r = tflfuse("run", face_model)
    assert r.returncode == 2
    assert "input[1, 128, 128, 3]" in r.stderr


def test_missing_and_malformed_files_exit_2(tmp_path):
    (tmp_path / "bad.tflite").write_bytes(b"not a model at all")
    for args in (("ops", tmp_path / "missing.tflite"), ("run", tmp_path / "bad.tflite"), ("ops", tmp_path / "bad.tflite")):
        r = tflfuse(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_shader_prints_wgsl_and_json():
    r = tflfuse("shader", "CONV_2D", "--shapes=[[1,9,9,5],[7,3,3,5],[7]]", "--attrs=padding=SAME,stride_h=2,stride_w=2")
    assert r.returncode == 0, r.stderr
    assert "@compute" in r.stdout
    r = tflfuse("shader", "CONV_2D", "--shapes=[[1,9,9,5],[7,3,3,5],[7]]", "--attrs=padding=SAME", "--json")
    info = json.loads(r.stdout)
    assert info["key"] == "CONV_2D" and info["output_shapes"] == [[1, 9, 9, 7]]
    assert [b["name"] for b in info["bindings"]] == ["x", "w", "b", "y"]


def test_shader_errors_exit_2():
    assert tflfuse("shader", "NOT_AN_OP", "--shapes=[[1]]").returncode == 2
    assert tflfuse("shader", "CONV_2D", "--shapes=[[1,2").returncode == 2
    r = tflfuse("shader", "CONV_2D", "--shapes=[[1,9,9,5],[7,3,3,5]]", "--attrs=padding")
    assert r.returncode == 2 and "not key=value" in r.stderr


@pytest.fixture(scope="module")
def small_mobilenet():
    import composites

    return composites.mobilenet_v2(input_shape=(32, 32, 3), alpha=0.35, seed=0, batch_size=1)


def test_convert_an_exported_saved_model(small_mobilenet, tmp_path):
    small_mobilenet.export(str(tmp_path / "sm"))
    r = tflfuse("convert", tmp_path / "sm", f"--output={tmp_path / 'm.tflite'}")
    assert r.returncode == 0, r.stderr
    assert "fused_bottleneck      17  17" in r.stdout
    assert (tmp_path / "m.tflite").stat().st_size > 0


#: Lines TensorFlow's and LiteRT's C++ write to stderr: absl-style (I0000 ..., W0000 ...), the CPU-feature
#: banner, and LiteRT's ``INFO: Created TensorFlow Lite XNNPACK delegate``.
_NATIVE_LOG = re.compile(r"^([IWE]\d{4} |INFO: |WARNING: All log messages|To enable the following instructions)", re.M)


def test_convert_and_check_are_quiet_unless_asked(small_mobilenet, tmp_path):
    small_mobilenet.export(str(tmp_path / "sm"))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}   # a user's shell
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=600, env=env)
    r = run([*TFLFUSE, "convert", tmp_path / "sm", f"--output={tmp_path / 'm.tflite'}"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = run([*TFLFUSE, "check", tmp_path / "sm", "--expect=fused_bottleneck=17", "--samples=1"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert not _NATIVE_LOG.search(r.stderr) and not _NATIVE_LOG.search(r.stdout), r.stderr
    # --verbosity=0 (absl's INFO) brings TensorFlow's INFO lines back, and so does the user's own setting.
    r = run([*TFLFUSE, "convert", tmp_path / "sm", f"--output={tmp_path / 'm.tflite'}", "--verbosity=0"])
    assert r.returncode == 0 and "Reading SavedModel" in r.stderr, r.stderr
    r = run([*TFLFUSE, "convert", tmp_path / "sm", f"--output={tmp_path / 'm.tflite'}"],
            env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert r.returncode == 0 and "Reading SavedModel" in r.stderr, r.stderr


def test_convert_composite_format_imports_the_composites(small_mobilenet, tmp_path):
    # The composite format traces each composite's body: the CLI process must import the module defining it.
    small_mobilenet.export(str(tmp_path / "sm"))
    out = tmp_path / "m.tflite"
    r = tflfuse("convert", tmp_path / "sm", f"--output={out}", "--fused_op_format=composite")
    assert r.returncode == 1 and "--import_modules" in r.stderr, r.stderr
    r = tflfuse("convert", tmp_path / "sm", f"--output={out}", "--fused_op_format=composite",
                "--import_modules=composites")
    assert r.returncode == 0, r.stderr
    from tflfuse.model import Model

    assert Model(out.read_bytes()).op_names(0).count("STABLEHLO_COMPOSITE") == 17
    # The documented pipeline goes on: ops and check run the composite file (its fused kernels by name).
    r = tflfuse("ops", out)
    assert r.returncode == 0 and r.stdout.endswith("every op has a kernel\n"), r.stdout + r.stderr
    assert r.stdout.count("STABLEHLO_COMPOSITE fused_bottleneck supported: its fused kernel") == 17, r.stdout
    r = tflfuse("check", out, "--expect=fused_bottleneck=17", "--samples=1")
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("PASS  expect fused_bottleneck", "PASS  kernels", "PASS  parity tflfuse vs litert",
                 "PASS  per-op tflfuse vs litert"):
        assert line in r.stdout, r.stdout

    # ops says how each composite runs: a name without a kernel runs its decomposition, whose ops then need
    # kernels; a decomposition that no composite runs needs none.
    from ai_edge_litert import schema_py_generated as schema

    def custom_op(model_t, sg, oi, name):
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
        code.customCode = name.encode()
        model_t.operatorCodes.append(code)
        model_t.subgraphs[sg].operators[oi].opcodeIndex = len(model_t.operatorCodes) - 1

    m = Model(out.read_bytes())
    decs = [m.composite(0, i).decomposition if m.composite(0, i) else None for i in range(len(m.op_names(0)))]
    first = next(i for i, d in enumerate(decs) if d is not None)
    dec = decs[first]
    other = next(d for d in decs if d is not None and d != dec)
    custom_op(m.m, other, 0, "test_cli_unneeded_op")
    (tmp_path / "unneeded.tflite").write_bytes(m.to_bytes())
    r = tflfuse("ops", tmp_path / "unneeded.tflite")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"subgraph {other} op    0  test_cli_unneeded_op         no kernel, not needed: this decomposition's " \
           f"composites run their fused kernels" in r.stdout, r.stdout
    assert "every op that runs has a kernel (1 op(s) of decompositions that no composite runs have none)" in r.stdout
    m.m.subgraphs[0].operators[first].builtinOptions2.name = b"test_cli_no_kernel"
    custom_op(m.m, dec, 0, "test_cli_missing_op")
    (tmp_path / "missing.tflite").write_bytes(m.to_bytes())
    r = tflfuse("ops", tmp_path / "missing.tflite")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"subgraph 0 op {first:4d}  STABLEHLO_COMPOSITE test_cli_no_kernel supported: its decomposition " \
           f"(subgraph {dec}) op by op" in r.stdout, r.stdout
    assert f"subgraph {dec} op    0  test_cli_missing_op          NO KERNEL" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("1 op(s) without a kernel: register one for an op of your own "
                                                "(docs/custom_kernels.md)")


def test_convert_refuses_unfrozen_weights(small_mobilenet, tmp_path):
    import tensorflow as tf

    tf.saved_model.save(small_mobilenet, str(tmp_path / "sm"))   # keeps resource variables in the .tflite
    r = tflfuse("convert", tmp_path / "sm", f"--output={tmp_path / 'm.tflite'}")
    assert r.returncode == 1
    assert "model.export" in r.stderr and "VAR_HANDLE" in r.stderr
    assert not (tmp_path / "m.tflite").exists()


def test_shader_list_names_every_key_and_its_attributes():
    from tflfuse.kernels import supported_ops

    r = tflfuse("shader", "--list")
    assert r.returncode == 0, r.stderr
    keys = [line.split()[0] for line in r.stdout.splitlines()]
    assert keys == supported_ops()
    assert "filter_height" in next(line for line in r.stdout.splitlines() if line.startswith("MAX_POOL_2D"))
    entries = json.loads(tflfuse("shader", "--list", "--json").stdout)
    assert {e["key"] for e in entries} == set(supported_ops())


def test_shader_model_writes_distinct_shaders_and_a_manifest(face_model, tmp_path):
    from tflfuse.model import Model
    from tflfuse.runtime.plan import lower

    r = tflfuse("shader", f"--model={face_model}", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    files = {p.name for p in tmp_path.glob("*.wgsl")}
    used = {d["shader"] for op in manifest["ops"] for d in op["dispatches"]}
    assert used == files and len(files) < sum(len(op["dispatches"]) for op in manifest["ops"])  # shared shaders
    assert sum(len(op["dispatches"]) for op in manifest["ops"]) == lower(Model.from_path(face_model)).dispatch_count
    conv = next(op for op in manifest["ops"] if op["op"] == "CONV_2D")
    d = conv["dispatches"][0]
    assert "@compute" in (tmp_path / d["shader"]).read_text()
    assert [b["tensor"] for b in d["bindings"] if b["role"] == "output"] == conv["outputs"]
    # every binding is a tensor of the file, in the file's layout (no weights re-laid out for a GPU plan)
    n_tensors = len(Model.from_path(face_model).subgraphs[0].tensors)
    assert all(b["tensor"] < n_tensors for op in manifest["ops"] for x in op["dispatches"] for b in x["bindings"]
               if b.get("tensor") is not None)
    assert tflfuse("shader", f"--model={face_model}").returncode == 2   # --out is needed


# ---- a user's kernels, from the command line -------------------------------------------------------------
#: A module that registers a kernel for the custom op ``test_cli_double`` (docs/custom_kernels.md's way 2).
KERNEL_MODULE = """from tflfuse.kernels.compose import register_elementwise

register_elementwise("test_cli_double", "2.0 * x")
"""


def _custom_op_model(ops) -> bytes:
    """A chain of [2, 3] float32 ops, ``ops`` (op names, custom ones written as tflfuse composites would) in
    order, then MINIMUM(., 1.5) and MAXIMUM(., -1) (a clip that ``fuse`` turns into fused_clip)."""
    from flatbuffers import flexbuffers
    from tflite_builder import build, t

    from tflfuse.annotate import encode_attrs

    custom = flexbuffers.Dumps(encode_attrs({}))
    n = len(ops)
    tensors = [t((2, 3)) for _ in range(n + 2)] + [t((), data=np.float32(1.5)), t((), data=np.float32(-1.0))]
    chain = [dict(op=name, inputs=[i], outputs=[i + 1], custom=custom) for i, name in enumerate(ops)]
    chain += [dict(op="MINIMUM", inputs=[n, n + 2], outputs=[n + 1]),
              dict(op="MAXIMUM", inputs=[n + 1, n + 3], outputs=[len(tensors)])]
    return build(tensors + [t((2, 3))], chain, [0], [len(tensors)])


@pytest.fixture(scope="module")
def user_kernel(tmp_path_factory):
    """A folder holding ``cli_kernels.py`` (run the CLI there), a model with the custom op, and an input."""
    folder = tmp_path_factory.mktemp("user_kernel")
    (folder / "cli_kernels.py").write_text(KERNEL_MODULE)
    (folder / "m.tflite").write_bytes(_custom_op_model(["test_cli_double"]))
    np.save(folder / "x.npy", np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3))
    return folder


def test_import_modules_gives_ops_run_shader_and_fuse_a_users_kernel(user_kernel):
    d, use = user_kernel, "--import_modules=cli_kernels"
    r = tflfuse("ops", "m.tflite", cwd=d)
    assert r.returncode == 1 and "test_cli_double              NO KERNEL" in r.stdout, r.stdout + r.stderr
    r = tflfuse("ops", "m.tflite", use, cwd=d)
    assert r.returncode == 0 and "every op has a kernel" in r.stdout, r.stdout + r.stderr
    assert "test_cli_double              supported" in r.stdout

    r = tflfuse("run", "m.tflite", "--input=x.npy", cwd=d)
    assert r.returncode == 2 and "'test_cli_double' at operator 0 of subgraph 0" in r.stderr, r.stderr
    r = tflfuse("run", "m.tflite", "--input=x.npy", "--output=out.npz", use, cwd=d)
    assert r.returncode == 0, r.stderr
    x = np.load(d / "x.npy")
    (got,) = np.load(d / "out.npz").values()
    np.testing.assert_array_equal(got, np.clip(2 * x, -1.0, 1.5))   # 2x, min and max are exact in float32

    r = tflfuse("shader", "test_cli_double", "--shapes=[[2,3]]", use, cwd=d)
    assert r.returncode == 0 and "@compute" in r.stdout and "2.0 * " in r.stdout, r.stderr
    r = tflfuse("shader", "--model=m.tflite", "--out=shaders", use, cwd=d)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((d / "shaders" / "manifest.json").read_text())
    assert [op["op"] for op in manifest["ops"]] == ["test_cli_double", "MINIMUM", "MAXIMUM"]
    assert (d / "shaders" / manifest["ops"][0]["dispatches"][0]["shader"]).read_text().count("@compute") == 1

    r = tflfuse("fuse", "m.tflite", "--output=fused.tflite", use, cwd=d)   # fuse plans the model: the kernel
    assert r.returncode == 0 and "clip: 1 fused" in r.stdout, r.stderr
    from tflfuse.model import Model

    assert Model((d / "fused.tflite").read_bytes()).op_names(0) == ["test_cli_double", "fused_clip"]

    r = tflfuse("ops", "m.tflite", "--import_modules=no_such_module_xyz", cwd=d)
    assert r.returncode == 2 and "--import_modules: cannot import 'no_such_module_xyz'" in r.stderr, r.stderr
    assert "(give a module name, e.g. pkg.mod for pkg/mod.py, importable from the current folder or " \
           "PYTHONPATH)" in r.stderr


def test_import_modules_names_what_cannot_be_imported_and_skips_empty_names(face_model, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("")
    (tmp_path / "exits_on_import.py").write_text("import sys\n\nsys.exit(3)\n")
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_xyz  # noqa: F401\n")
    for value in (",,", ",pkg.mod,"):
        r = tflfuse("ops", face_model, f"--import_modules={value}", cwd=tmp_path)
        assert r.returncode == 0 and "every op has a kernel" in r.stdout, (value, r.stderr)
    r = tflfuse("ops", face_model, "--import_modules=pkg/mod.py", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == ("error: --import_modules: cannot import 'pkg/mod.py': a file path, not a module name; give "
                        "a module name ('pkg.mod' for this file), importable from the current folder or PYTHONPATH\n")
    r = tflfuse("ops", face_model, "--import_modules=needs_dep", cwd=tmp_path)   # the module is there: no hint
    assert r.returncode == 2 and "No module named 'no_such_dependency_xyz'" in r.stderr, r.stderr
    assert "give a module name" not in r.stderr
    # A module that calls sys.exit() while imported: an import error naming it, not a silent exit 3.
    r = tflfuse("ops", face_model, "--import_modules=exits_on_import", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == "error: --import_modules: cannot import 'exits_on_import': it called sys.exit(3) while " \
                       "being imported\n"
    r = tflfuse("check", face_model, "--import_modules=exits_on_import", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot import 'exits_on_import': it called sys.exit(3) while being imported" in r.stdout


def test_missing_kernels_are_all_named_at_once_with_what_to_do(tmp_path):
    from tflfuse import Interpreter
    from tflfuse.kernels import KernelError, UnsupportedOpError

    model = _custom_op_model(["op_a", "op_b", "op_a"])
    with pytest.raises(UnsupportedOpError) as err:
        Interpreter(model_content=model)   # refused at construction, before any GPU work
    assert err.value.ops == (("op_a", 0, 0), ("op_b", 0, 1), ("op_a", 0, 2))
    assert isinstance(err.value, KernelError)
    msg = str(err.value)
    assert "3 op(s) of the model have no tflfuse kernel: 'op_a' at operators 0, 2 of subgraph 0; 'op_b' at " \
           "operator 1 of subgraph 0." in msg
    assert "docs/custom_kernels.md" in msg and "--import_modules" in msg and "`tflfuse ops MODEL`" in msg
    assert "CONV_2D" not in msg   # no list of every supported op
    (tmp_path / "m.tflite").write_bytes(model)
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    r = tflfuse("run", tmp_path / "m.tflite", f"--input={tmp_path / 'x.npy'}")
    assert r.returncode == 2 and r.stderr.startswith("error: 3 op(s)") and r.stderr.count("\n") == 1, r.stderr
    assert "'op_b' at operator 1 of subgraph 0" in r.stderr


def test_unfuse_names_the_custom_ops_it_cannot_expand_and_writes_nothing(user_kernel, face_model):
    from tflfuse.model import Model
    from tflfuse.passes.unfuse import UnfuseError, unexpandable_ops, unfuse

    d = user_kernel
    r = tflfuse("fuse", "m.tflite", "--output=f.tflite", "--import_modules=cli_kernels", cwd=d)
    assert r.returncode == 0, r.stderr
    fused = (d / "f.tflite").read_bytes()
    r = tflfuse("unfuse", "f.tflite", "--output=u.tflite", cwd=d)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "'test_cli_double' at operator 0 of subgraph 0" in r.stderr and "--keep_custom_ops" in r.stderr
    assert "annotations=False" in r.stderr and not (d / "u.tflite").exists()
    with pytest.raises(UnfuseError, match="'test_cli_double' at operator 0 of subgraph 0") as err:
        unfuse(fused)
    assert err.value.ops == (("test_cli_double", 0, 0),) and unexpandable_ops(fused) == [("test_cli_double", 0, 0)]
    # Kept on request: the fused op is expanded, the custom op stays (its kernel plans the file).
    r = tflfuse("unfuse", "f.tflite", "--output=u.tflite", "--keep_custom_ops", "--import_modules=cli_kernels",
                cwd=d)
    assert r.returncode == 0, r.stderr
    assert "fused_clip: 1 expanded into builtins" in r.stdout
    assert "test_cli_double (operator 0 of subgraph 0): kept as a custom op" in r.stdout
    assert Model((d / "u.tflite").read_bytes()).op_names(0) == ["test_cli_double", "MINIMUM", "MAXIMUM"]
    # Custom ops LiteRT runs itself (MediaPipe's transposed conv) and files without custom ops are no problem.
    assert unexpandable_ops(zoo.fetch("selfie_segmentation").read_bytes()) == []
    assert unexpandable_ops(face_model.read_bytes()) == []

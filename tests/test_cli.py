"""The ``tflfuse`` command: each subcommand's output and exit status (0 ok, 1 failed, 2 bad usage or input)."""

import json
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


def test_help_lists_the_commands_and_flags():
    r = tflfuse("--help")   # absl's --help exits 1, as every absl app (TensorFlow's tools among them) does
    assert "tflfuse shader KEY" in r.stdout and "--adapter" in r.stdout


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
    (lambda p: np.save(p, np.zeros((1, 64, 64, 3), np.float32)), "has shape [1, 128, 128, 3], got [1, 64, 64, 3]"),
    (lambda p: np.save(p, np.zeros((1, 128, 128, 3), np.float64)), "expects float32, got float64"),
])
def test_run_refuses_bad_inputs_in_one_line(face_model, tmp_path, make_input, message):
    make_input(tmp_path / "x.npy")
    r = tflfuse("run", face_model, f"--input={tmp_path / 'x.npy'}")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


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

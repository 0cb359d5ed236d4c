"""Tests for tflfuse.zoo: fetching MediaPipe's .tflite files from the PyPI wheel, and the sample photo."""

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tflfuse import zoo


@pytest.fixture(scope="module")
def real_models():
    """Every model of the wheel, fetched for real (one wheel download on a fresh machine, then the cache)."""
    return {name: zoo.fetch(name) for name in zoo.ALL_MODELS}


def _fake_wheel(path: Path, sources: dict, corrupt: str | None = None) -> Path:
    """A zip laid out like the mediapipe wheel, holding the given model files (one altered if asked)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mediapipe/__init__.py", "")
        for name, src in sources.items():
            data = Path(src).read_bytes()
            if name == corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            zf.writestr(zoo.ALL_MODELS[name].member, data)
    return path


@pytest.fixture
def fake_download(tmp_path, monkeypatch, real_models):
    """Replaces the pip download with a copy of a locally built wheel; counts the calls."""
    calls = []

    def install(corrupt=None):
        wheel = _fake_wheel(tmp_path / "mediapipe-0.10.14-cp311-cp311-manylinux_2_17_x86_64.whl",
                            real_models, corrupt)

        def download(dest):
            calls.append(dest)
            target = Path(dest) / wheel.name
            target.write_bytes(wheel.read_bytes())
            return target

        monkeypatch.setattr(zoo, "_download_wheel", download)
        return calls

    return install


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_real_fetch_matches_recorded_sha256(real_models):
    for name, path in real_models.items():
        assert path.name == f"{name}.tflite"
        assert _sha256(path) == zoo.ALL_MODELS[name].sha256, name
        assert path.read_bytes()[4:8] == b"TFL3", name  # the flatbuffer file identifier of a .tflite


def test_models_declare_their_real_input_shapes(real_models):
    from ai_edge_litert.interpreter import Interpreter

    for name, path in real_models.items():
        (inp,) = Interpreter(model_path=str(path)).get_input_details()
        assert tuple(inp["shape"]) == zoo.ALL_MODELS[name].input_shape, name
        assert inp["dtype"] == np.float32, name


def test_fetch_downloads_once_then_uses_cache(tmp_path, monkeypatch, fake_download):
    calls = fake_download()
    cache = tmp_path / "cache"
    path = zoo.fetch("face_detection_short_range", cache_dir=cache)
    assert path == cache / "face_detection_short_range.tflite"
    assert _sha256(path) == zoo.MODELS["face_detection_short_range"].sha256
    assert len(calls) == 1
    # One download extracted every model of the wheel; nothing but .tflite files was written.
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{n}.tflite" for n in zoo.ALL_MODELS)

    def no_download(dest):
        raise AssertionError("fetch downloaded although the model is cached")

    monkeypatch.setattr(zoo, "_download_wheel", no_download)
    assert zoo.fetch("face_detection_short_range.tflite", cache_dir=cache) == path
    assert zoo.fetch("iris_landmark", cache_dir=str(cache)) == cache / "iris_landmark.tflite"


def test_fetch_refills_only_a_missing_model(tmp_path, fake_download):
    calls = fake_download()
    cache = tmp_path / "cache"
    zoo.fetch("selfie_segmentation", cache_dir=cache)
    (cache / "palm_detection_lite.tflite").unlink()
    path = zoo.fetch("palm_detection_lite", cache_dir=cache)
    assert len(calls) == 2
    assert _sha256(path) == zoo.MODELS["palm_detection_lite"].sha256


def test_changed_package_is_refused_and_leaves_no_file(tmp_path, fake_download):
    fake_download(corrupt="face_detection_short_range")
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="SHA-256"):
        zoo.fetch("face_detection_short_range", cache_dir=cache)
    assert not (cache / "face_detection_short_range.tflite").exists()
    assert not list(cache.glob("*.part")) and not list(cache.glob(".*"))


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo.os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        zoo._atomic_write(tmp_path / "model.tflite", b"TFL3" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_env_var_sets_the_cache(tmp_path, monkeypatch, fake_download):
    fake_download()
    monkeypatch.setenv("TFLFUSE_CACHE", str(tmp_path / "env_cache"))
    assert zoo.default_cache_dir() == tmp_path / "env_cache"
    assert zoo.fetch("hand_landmark_lite") == tmp_path / "env_cache" / "hand_landmark_lite.tflite"
    monkeypatch.delenv("TFLFUSE_CACHE")
    assert zoo.default_cache_dir() == Path.home() / ".cache" / "tflfuse" / "models"


def test_pip_failure_names_the_command(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies ...")

    monkeypatch.setattr(zoo.subprocess, "run", failing_run)
    with pytest.raises(RuntimeError) as info:
        zoo.fetch("face_detection_short_range", cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "pip download" in message and "mediapipe==0.10.14" in message and "--abi cp311" in message
    assert "Could not find a version" in message
    assert not list((tmp_path / "cache").iterdir())


def test_pip_command_targets_the_cp311_manylinux_x86_64_wheel(tmp_path):
    cmd = zoo._pip_command(tmp_path)
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:", "mediapipe==0.10.14"):
        assert flag in cmd
    pairs = list(zip(cmd, cmd[1:]))
    assert ("--python-version", "3.11") in pairs and ("--abi", "cp311") in pairs
    assert ("--platform", "manylinux_2_17_x86_64") in pairs  # the tag that release's wheel carries
    assert ("-d", str(tmp_path)) in pairs


def test_unknown_name_lists_known_models(tmp_path):
    with pytest.raises(ValueError, match="face_detection_short_range") as info:
        zoo.fetch("blazeface_v9", cache_dir=tmp_path)
    assert "blazeface_v9" in str(info.value)
    with pytest.raises(TypeError, match="name"):
        zoo.fetch(None, cache_dir=tmp_path)


def test_import_pulls_in_no_heavy_package():
    code = ("import sys, tflfuse.zoo, tflfuse.face_detection; "
            "print(sorted(m for m in ('tensorflow', 'mediapipe', 'skimage') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.stdout.strip().splitlines()[-1] == "[]"


class TestSamplePhoto:
    @pytest.mark.parametrize("name", ["astronaut", "chelsea"])
    @pytest.mark.parametrize("size", [(128, 128), (192, 256), (1, 3)])
    def test_shape_dtype_range(self, name, size):
        x = zoo.sample_photo(size, name=name)
        assert x.shape == (1, *size, 3)
        assert x.dtype == np.float32
        assert x.min() >= -1.0 and x.max() <= 1.0

    def test_native_size_is_the_photo_scaled(self):
        import skimage.data

        x = zoo.sample_photo((512, 512))
        # Same size: no resampling, only [0, 255] -> [-1, 1]; float32 rounding is the only error.
        np.testing.assert_allclose(x[0], skimage.data.astronaut() / 127.5 - 1.0, atol=1e-6)

    @pytest.mark.parametrize("name", ["astronaut", "chelsea"])
    @pytest.mark.parametrize("size", [(128, 128), (192, 256)])
    def test_matches_tf_antialiased_bilinear_resize(self, name, size):
        import skimage.data
        import tensorflow as tf

        photo = getattr(skimage.data, name)().astype(np.float32)
        ref = tf.image.resize(photo[None], size, method="bilinear", antialias=True).numpy() / 127.5 - 1.0
        x = zoo.sample_photo(size, name=name)
        # Both are antialiased bilinear but with different prefilters (Gaussian vs. triangle), which
        # differ only at sharp edges: the mean difference stays under 1% of the [-1, 1] range.
        assert np.abs(x - ref).mean() < 0.02
        assert abs(float(x.mean() - ref.mean())) < 1e-3

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="size"):
            zoo.sample_photo(128)
        with pytest.raises(TypeError, match="size"):
            zoo.sample_photo((128.0, 128))
        with pytest.raises(ValueError, match="size"):
            zoo.sample_photo((0, 128))
        with pytest.raises(ValueError, match="chelsea"):
            zoo.sample_photo((128, 128), name="coffee")

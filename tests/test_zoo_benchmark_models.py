"""tflfuse.zoo.BENCHMARK_MODELS: the five models the benchmark times beside MODELS, fetched from the same wheel.

The other tests iterate over MODELS only. These check the second mapping with a fake wheel for fetch(), and
the five real files, fetched from the same wheel."""

import dataclasses
import hashlib
import zipfile

import numpy as np
import pytest

from tflfuse import zoo

EXTRA = ("hand_landmark_full", "hand_recrop", "palm_detection_full", "pose_landmark_full",
         "selfie_segmentation_landscape")


def test_benchmark_models_hold_models_and_the_five_more():
    assert set(zoo.BENCHMARK_MODELS) == set(zoo.MODELS) | set(EXTRA)
    assert all(zoo.BENCHMARK_MODELS[name] is m for name, m in zoo.MODELS.items())
    assert len({m.member for m in zoo.BENCHMARK_MODELS.values()}) == len(zoo.BENCHMARK_MODELS)
    for m in zoo.BENCHMARK_MODELS.values():
        assert m.member.startswith("mediapipe/modules/") and m.member.endswith(f"/{m.name}.tflite")
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert len(m.input_shape) == 4 and m.input_shape[0] == 1 and m.input_shape[3] == 3


@pytest.fixture
def fake_zoo(tmp_path, monkeypatch):
    """Every benchmark model as a few distinct bytes in a fake wheel (SHA-256s recorded to match); pip replaced
    by a copy of that wheel."""
    models = {}
    wheel = tmp_path / "mediapipe-0.10.14-cp311-cp311-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, m in zoo.BENCHMARK_MODELS.items():
            data = b"TFL3" + name.encode()
            zf.writestr(m.member, data)
            models[name] = dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(zoo, "MODELS", {k: models[k] for k in zoo.MODELS})
    monkeypatch.setattr(zoo, "BENCHMARK_MODELS", models)

    def download(dest):
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(zoo, "_download_wheel", download)


def test_fetch_of_a_test_model_extracts_only_models(tmp_path, fake_zoo):
    cache = tmp_path / "cache"
    zoo.fetch("iris_landmark", cache_dir=cache)
    assert sorted(p.stem for p in cache.iterdir()) == sorted(zoo.MODELS)


def test_fetch_of_a_benchmark_model_extracts_every_missing_one(tmp_path, fake_zoo):
    cache = tmp_path / "cache"
    path = zoo.fetch("hand_recrop.tflite", cache_dir=cache)
    assert path == cache / "hand_recrop.tflite" and path.read_bytes() == b"TFL3hand_recrop"
    assert sorted(p.stem for p in cache.iterdir()) == sorted(zoo.BENCHMARK_MODELS)


def test_unknown_name_lists_the_benchmark_models_too(tmp_path):
    with pytest.raises(ValueError, match="pose_landmark_full"):
        zoo.fetch("pose_landmark_heavy", cache_dir=tmp_path)


@pytest.mark.parametrize("name", EXTRA)
def test_real_file_matches_its_record(name):
    """The real file, fetched as the benchmark fetches it (the first of these downloads the wheel once and
    extracts the five; fetch checks each SHA-256): its input is the recorded float32 shape."""
    from ai_edge_litert.interpreter import Interpreter

    path = zoo.fetch(name)
    m = zoo.BENCHMARK_MODELS[name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256
    (inp,) = Interpreter(model_path=str(path)).get_input_details()
    assert tuple(inp["shape"]) == m.input_shape and inp["dtype"] == np.float32

"""tflfuse.zoo.BENCHMARK_MODELS and OTHER_MODELS: the five models the benchmark times beside MODELS and the three
it does not, fetched from the same wheel (ALL_MODELS holds the 14).

These check the mappings with a fake wheel for fetch(), and the eight real files, fetched from the same wheel."""

import dataclasses
import hashlib
import zipfile

import numpy as np
import pytest

from tflfuse import zoo

EXTRA = ("hand_landmark_full", "hand_recrop", "palm_detection_full", "pose_landmark_full",
         "selfie_segmentation_landscape")
OTHER = ("face_detection_full_range_sparse", "face_landmark_with_attention", "pose_detection")


def test_benchmark_models_hold_models_and_the_five_more():
    assert set(zoo.BENCHMARK_MODELS) == set(zoo.MODELS) | set(EXTRA)
    assert all(zoo.BENCHMARK_MODELS[name] is m for name, m in zoo.MODELS.items())
    assert len({m.member for m in zoo.BENCHMARK_MODELS.values()}) == len(zoo.BENCHMARK_MODELS)
    assert set(zoo.OTHER_MODELS) == set(OTHER) and zoo.ALL_MODELS == {**zoo.BENCHMARK_MODELS, **zoo.OTHER_MODELS}
    assert len({m.member for m in zoo.ALL_MODELS.values()}) == len(zoo.ALL_MODELS) == 14
    for m in zoo.ALL_MODELS.values():
        assert m.member.startswith("mediapipe/modules/") and m.member.endswith(f"/{m.name}.tflite")
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        assert len(m.input_shape) == 4 and m.input_shape[0] == 1 and m.input_shape[3] == 3


@pytest.fixture
def fake_zoo(tmp_path, monkeypatch):
    """Every model of the wheel as a few distinct bytes in a fake wheel (SHA-256s recorded to match); pip replaced
    by a copy of that wheel."""
    models = {}
    wheel = tmp_path / "mediapipe-0.10.14-cp311-cp311-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, m in zoo.ALL_MODELS.items():
            data = b"TFL3" + name.encode()
            zf.writestr(m.member, data)
            models[name] = dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(zoo, "MODELS", {k: models[k] for k in zoo.MODELS})
    monkeypatch.setattr(zoo, "BENCHMARK_MODELS", {k: models[k] for k in zoo.BENCHMARK_MODELS})
    monkeypatch.setattr(zoo, "ALL_MODELS", models)

    def download(dest):
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(zoo, "_download_wheel", download)


@pytest.mark.parametrize("name", ["iris_landmark", "hand_recrop.tflite", "pose_detection"])
def test_one_fetch_extracts_every_missing_model(tmp_path, fake_zoo, name):
    cache = tmp_path / "cache"
    stem = name.removesuffix(".tflite")
    path = zoo.fetch(name, cache_dir=cache)
    assert path == cache / f"{stem}.tflite" and path.read_bytes() == b"TFL3" + stem.encode()
    assert sorted(p.stem for p in cache.iterdir()) == sorted(zoo.ALL_MODELS)


def test_unknown_name_lists_the_benchmark_models_too(tmp_path):
    with pytest.raises(ValueError, match="pose_landmark_full"):
        zoo.fetch("pose_landmark_heavy", cache_dir=tmp_path)


@pytest.mark.parametrize("name", EXTRA + OTHER)
def test_real_file_matches_its_record(name):
    """The real file, fetched as the benchmark fetches it (a fresh cache downloads the wheel once and extracts
    all 14; fetch checks each SHA-256): its input is the recorded float32 shape."""
    from ai_edge_litert.interpreter import Interpreter

    path = zoo.fetch(name)
    m = zoo.ALL_MODELS[name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256
    (inp,) = Interpreter(model_path=str(path)).get_input_details()
    assert tuple(inp["shape"]) == m.input_shape and inp["dtype"] == np.float32

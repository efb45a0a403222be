"""Programs the tests run that come from Debian packages (Prometheus): found on PATH, or downloaded with
`apt-get download` and unpacked into a cache directory, which needs no root and installs nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qwen3-tts-tests" / "debian"


def debian_program(package: str, program: str) -> Path:
    """`program` from PATH or from the unpacked Debian `package`. Skips the test where apt cannot supply it,
    except on CI (the CI variable set), where that is a failure."""
    found = shutil.which(program)
    if found is not None:
        return Path(found)
    unpacked = CACHE / package / "usr" / "bin" / program
    if not unpacked.is_file():
        error = _download_and_unpack(package, CACHE / package)
        if error is not None:
            message = f"{program} is not on PATH and the Debian package {package!r} could not be fetched: {error}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    return unpacked


def _download_and_unpack(package: str, destination: Path) -> str | None:
    """None on success, else why it failed."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "apt-get and dpkg-deb are not available (not a Debian system)"
    with tempfile.TemporaryDirectory() as download:
        fetched = _apt_get_download(package, download)
        if fetched.returncode != 0 and os.geteuid() == 0:
            # A fresh image may have no package lists yet; as root we can fetch them.
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300)
            fetched = _apt_get_download(package, download)
        if fetched.returncode != 0:
            return fetched.stderr.strip()[-500:]
        archive = next(Path(download).glob(f"{package}_*.deb"))
        staging = destination.with_name(destination.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(archive), str(staging)], check=True, timeout=300)
        shutil.rmtree(destination, ignore_errors=True)
        staging.rename(destination)
    return None


def _apt_get_download(package: str, directory: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "download", "-q", package], cwd=directory, capture_output=True, text=True,
                          timeout=600)

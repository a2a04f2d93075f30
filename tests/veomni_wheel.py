"""VeOmni's package for the tests that build verl's VeOmni engine: verl pins no VeOmni and its
release environments hold none, so the release the forecast cites (memory/veomni.py
VEOMNI_RELEASE) is fetched once by its hash, unpacked as data, and handed to the probe, which
puts it first on the path of the release's own interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pytest_verl_compat.memory.veomni import VEOMNI_RELEASE

# sha256 of veomni-0.1.12-py3-none-any.whl on PyPI
WHEEL_SHA256 = {"0.1.12": "682c0ae21b2a7835c928fb378ca740746778f5bcf5d7a64ca15718c58bf2316f"}
PACKAGE = "veomni/"


def veomni_folder(cache: Path) -> Path:
    """``cache/veomni-VERSION``: the unpacked ``veomni`` package of the pinned wheel, fetched by
    pip with its hash required on first use; assembled beside it and renamed into place (two
    test workers may race: the first rename wins, both read the same files)."""
    folder = cache / f"veomni-{VEOMNI_RELEASE}"
    if (folder / "veomni" / "__init__.py").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text(
            f"veomni=={VEOMNI_RELEASE} --hash=sha256:{WHEEL_SHA256[VEOMNI_RELEASE]}\n",
            encoding="utf-8",
        )
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--only-binary=:all:", "--require-hashes", "-r", str(requirements), "-d", work),
            ],
            check=True,
            timeout=600,
        )
        (wheel,) = Path(work).glob("veomni-*.whl")
        unpacked = Path(work) / "unpacked"
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.startswith(PACKAGE) and ".." not in member:
                    archive.extract(member, unpacked)
        try:
            os.rename(unpacked, folder)
        except OSError:
            if not (folder / "veomni" / "__init__.py").is_file():
                raise
        shutil.rmtree(unpacked, ignore_errors=True)
    return folder

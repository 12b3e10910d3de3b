"""The built wheel carries what an installed llmserve needs outside Python modules, and its license."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_and_data(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheel = next(tmp_path.glob("llmserve-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (REPO / "templates").rglob("*.j2"):
        assert f"llmserve/templates/{template.relative_to(REPO / 'templates').as_posix()}" in names
    assert "llmserve/compat/data/matrix.yaml" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "llmserve = llmserve.cli.app:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # The license pyproject.toml declares, as a file (PEP 639: .dist-info/licenses/) and in the metadata.
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert zipfile.ZipFile(wheel).read(license_file) == (REPO / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0" in (REPO / "LICENSE").read_bytes()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()

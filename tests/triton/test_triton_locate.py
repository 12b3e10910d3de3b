"""Finding tritonserver: $LLMSERVE_TRITONSERVER, /opt/tritonserver, PATH, then the nvidia-pytriton wheel in the
Triton Python environment; a clear error listing every place when none holds it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from llmserve.errors import ExitCode
from llmserve.serve.triton import (
    BINARY_ENV,
    TritonNotFoundError,
    TritonPythonEnvError,
    locate_tritonserver,
)
from llmserve.serve.triton.locate import check_wheel_python_env, probe_python_env


def _fake_image(root: Path) -> Path:
    """An NVIDIA-image layout: <root>/bin/tritonserver, <root>/backends/python, <root>/lib."""
    (root / "bin").mkdir(parents=True)
    (root / "backends" / "python").mkdir(parents=True)
    (root / "lib").mkdir()
    binary = root / "bin" / "tritonserver"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


def test_the_wheel_in_the_triton_env_is_found_with_what_its_python_backend_needs(triton_install, triton_env):
    found = triton_install
    assert found.layout == "wheel"
    assert found.binary.name == "tritonserver" and os.access(found.binary, os.X_OK)
    assert found.binary.is_relative_to(triton_env.resolve()) or found.binary.is_relative_to(triton_env)
    env = found.python_env
    assert env is not None and env.root == triton_env
    assert int(env.numpy.split(".")[0]) < 2  # Triton 2.51's Python backend needs numpy<2
    assert (env.libdir / f"libpython{env.version}.so.1.0").is_file()
    names = [p.name for p in found.python_backend]
    assert names == ["libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"]
    assert found.python_backend[2].parent.name == env.version  # the stub built for the env's Python
    assert all(d.is_dir() for d in found.lib_dirs)
    run_env = found.environment({"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere"})
    assert run_env["PATH"].split(os.pathsep)[0] == str(triton_env / "bin")
    assert "PYTHONPATH" not in run_env
    assert run_env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(d) for d in found.lib_dirs]


def test_the_assembled_backend_dir_holds_the_python_backend(triton_install, tmp_path):
    backends = triton_install.write_backend_dir(tmp_path / "backends")
    python = backends / "python"
    assert sorted(p.name for p in python.iterdir()) == sorted(p.name for p in triton_install.python_backend)
    assert os.access(python / "triton_python_backend_stub", os.X_OK)


def test_the_variable_wins_and_may_name_the_wheel_binary(triton_install, tmp_path):
    found = locate_tritonserver(environ={BINARY_ENV: str(triton_install.binary), "PATH": ""}, image_root=tmp_path)
    assert found.found_by == f"${BINARY_ENV}"
    assert found.layout == "wheel" and found.binary == triton_install.binary
    assert found.python_env is not None and found.python_env.root.resolve() == triton_install.python_env.root.resolve()


def test_the_variable_may_name_an_install_folder(tmp_path):
    binary = _fake_image(tmp_path / "triton")
    found = locate_tritonserver(environ={BINARY_ENV: str(tmp_path / "triton"), "PATH": ""}, image_root=tmp_path / "no")
    assert (found.found_by, found.layout, found.binary) == (f"${BINARY_ENV}", "image", binary.resolve())
    assert found.backend_dir == (tmp_path / "triton" / "backends").resolve()
    assert found.lib_dirs == ((tmp_path / "triton" / "lib").resolve(),)
    assert found.write_backend_dir(tmp_path / "unused") == found.backend_dir


def test_an_image_install_comes_before_path(tmp_path):
    _fake_image(tmp_path / "opt")
    other = _fake_image(tmp_path / "other")
    found = locate_tritonserver(environ={"PATH": str(other.parent)}, image_root=tmp_path / "opt")
    assert found.found_by == str(tmp_path / "opt") and found.layout == "image"


def test_path_comes_before_the_wheel(tmp_path, triton_env):
    binary = _fake_image(tmp_path / "onpath")
    found = locate_tritonserver(triton_env, environ={"PATH": str(binary.parent)}, image_root=tmp_path / "no")
    assert found.found_by == "PATH" and found.binary == binary.resolve()
    assert found.python_env is not None and found.python_env.root == triton_env  # the stubs' env still applies


def test_nothing_found_lists_every_place_and_the_next_step(tmp_path):
    with pytest.raises(TritonNotFoundError) as info:
        locate_tritonserver(tmp_path / "noenv", environ={"PATH": str(tmp_path)}, image_root=tmp_path / "opt")
    err = info.value
    assert err.exit_code == ExitCode.NOT_FOUND
    assert "make triton-env" in err.hint and BINARY_ENV in err.hint
    places = [row[0] for row in err.details[0].rows]
    assert places == [
        f"${BINARY_ENV}",
        str(tmp_path / "opt" / "bin" / "tritonserver"),
        "PATH",
        f"nvidia-pytriton wheel in {tmp_path / 'noenv'}",
    ]
    assert all(row[1] for row in err.details[0].rows)


def test_a_variable_naming_nothing_is_reported(tmp_path):
    with pytest.raises(TritonNotFoundError) as info:
        locate_tritonserver(environ={BINARY_ENV: str(tmp_path / "nope"), "PATH": ""}, image_root=tmp_path)
    assert info.value.details[0].rows[0] == [f"${BINARY_ENV}={tmp_path / 'nope'}", "not there"]


def test_an_env_with_numpy_2_is_refused_for_the_wheel(triton_install):
    # This test process runs in the vLLM environment, which has numpy 2.
    env = probe_python_env(Path(sys.prefix))
    assert env.numpy.startswith("2.")
    with pytest.raises(TritonPythonEnvError, match=r"numpy 2\.\S+ there; .*BYTES.*numpy<2"):
        check_wheel_python_env(env)
    with pytest.raises(TritonPythonEnvError, match="numpy"):
        locate_tritonserver(Path(sys.prefix), environ={BINARY_ENV: str(triton_install.binary), "PATH": ""})


def test_a_folder_that_is_no_python_env_is_refused(triton_install, tmp_path):
    with pytest.raises(TritonPythonEnvError, match="no bin/python3") as info:
        locate_tritonserver(tmp_path, environ={BINARY_ENV: str(triton_install.binary), "PATH": ""})
    assert "make triton-env" in info.value.hint

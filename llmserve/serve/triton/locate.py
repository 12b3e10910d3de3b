"""Find a Triton Inference Server to host packages, and what it needs to run.

Places, in order (the first that holds a `tritonserver` wins):

1. ``$LLMSERVE_TRITONSERVER``: the binary, or a Triton install folder holding ``bin/tritonserver``;
2. ``/opt/tritonserver``: NVIDIA's Triton images;
3. ``tritonserver`` on PATH;
4. the ``nvidia-pytriton`` wheel installed in the Triton Python environment (``python_env``, else
   ``$LLMSERVE_TRITON_ENV``; ``make triton-env`` builds one at ``.venv-triton``).

Two layouts exist. An *image* install (``<root>/bin/tritonserver``, ``<root>/backends``, ``<root>/lib``) runs as it
is. The *wheel* layout (``site-packages/pytriton/tritonserver/{bin,backends/python,python_backend_stubs/3.X}``, shared
libraries in ``site-packages/nvidia_pytriton.libs``) has no ready backend folder: the Python backend folder is
assembled from ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub built for the environment's
Python (see `TritonInstall.write_backend_dir`). The stub links ``libpython3.X.so.1.0`` and runs Python isolated,
finding its environment through ``python3`` on PATH, so the environment's ``bin/`` goes first on Triton's PATH and
its Python's LIBDIR onto LD_LIBRARY_PATH. Triton 2.51's Python-backend utilities mis-read BYTES tensors under numpy 2:
a wheel environment with numpy 2 is refused here, before any model runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmserve.errors import Detail
from llmserve.serve.triton.errors import TritonNotFoundError, TritonPythonEnvError

BINARY_ENV = "LLMSERVE_TRITONSERVER"
PYTHON_ENV_ENV = "LLMSERVE_TRITON_ENV"
IMAGE_ROOT = Path("/opt/tritonserver")
BINARY = "tritonserver"
STUB = "triton_python_backend_stub"
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
# Triton 2.51's triton_python_backend_utils (the one in nvidia-pytriton 0.7.0) needs numpy < 2.
WHEEL_NUMPY_BELOW = 2

# What the Triton Python environment's own interpreter says about itself (run isolated, as the stub runs it).
_PROBE = """\
import json, sys, sysconfig
from importlib import metadata
try:
    numpy = metadata.version("numpy")
except metadata.PackageNotFoundError:
    numpy = None
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "libdir": sysconfig.get_config_var("LIBDIR"),
                  "prefix": sys.prefix, "numpy": numpy}))
"""


@dataclass(frozen=True)
class PythonEnv:
    """The Python environment Triton's Python-backend stubs run in."""

    root: Path
    version: str  # "3.11"
    libdir: Path  # holds libpython3.X.so.1.0
    numpy: str | None

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"


@dataclass(frozen=True)
class TritonInstall:
    """A `tritonserver` and what it needs: how to run it (environment) and its backend folder."""

    binary: Path
    found_by: str  # the place that held it, as listed in the module docstring
    layout: Literal["image", "wheel"]
    lib_dirs: tuple[Path, ...] = ()
    backend_dir: Path | None = None  # image layout: a ready --backend-directory
    python_backend: tuple[Path, ...] = ()  # wheel layout: files of <backends>/python (library, utils, stub)
    python_env: PythonEnv | None = None

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The process environment for `tritonserver`: shared libraries, and the stubs' Python first on PATH."""
        env = {k: v for k, v in base.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
        if self.lib_dirs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(d) for d in self.lib_dirs] + ([base["LD_LIBRARY_PATH"]] if base.get("LD_LIBRARY_PATH") else [])
            )
        if not any("utf-8" in base.get(v, "").lower().replace("utf8", "utf-8") for v in ("LC_ALL", "LC_CTYPE", "LANG")):
            # The stub's Python runs isolated (PYTHONUTF8 is ignored) and reads files in the locale's encoding:
            # under the C locale, ASCII, and torch's own templates fail to load.
            env["LC_CTYPE"] = "C.UTF-8"
            env.pop("LC_ALL", None)
        if self.python_env is not None:
            env["PATH"] = os.pathsep.join([str(self.python_env.bin_dir)] + ([base["PATH"]] if base.get("PATH") else []))
            env["VIRTUAL_ENV"] = str(self.python_env.root)
        return env

    def write_backend_dir(self, dest: Path) -> Path:
        """A --backend-directory for this install: the image's own, or (wheel) one assembled under dest."""
        if self.layout == "image":
            return self.backend_dir or dest
        python = dest / "python"
        python.mkdir(parents=True, exist_ok=True)
        for src in self.python_backend:
            target = python / src.name
            shutil.copyfile(src, target)
            target.chmod(0o755 if src.name == STUB else 0o644)
        write_vllm_backend_shim(dest)
        return dest


# A Python-based Triton backend is a folder <backends>/<name> holding model.py; Triton runs it on the Python
# backend's library and stub. The wheel has no vLLM backend: llmserve's (llmserve.serve.triton.vllm_model) is
# installed under the stock backend's name, so `backend: "vllm"` packages load unchanged.
VLLM_BACKEND_SHIM = """\
# llmserve's vLLM backend for Triton, installed by llmserve (see llmserve/serve/triton/vllm_model.py).
from llmserve.serve.triton.vllm_model import TritonPythonModel  # noqa: F401
"""


def write_vllm_backend_shim(backends: Path) -> Path:
    folder = backends / "vllm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(VLLM_BACKEND_SHIM, encoding="utf-8")
    return folder


def locate_tritonserver(
    python_env: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    image_root: Path = IMAGE_ROOT,
) -> TritonInstall:
    """The first usable `tritonserver` in the places of the module docstring; TritonNotFoundError lists them all.

    A Triton found with a Python environment that cannot run its Python backend raises TritonPythonEnvError
    rather than falling through to a later place: that Triton is the one asked for.
    """
    environ = os.environ if environ is None else environ
    env_root = python_env or (Path(environ[PYTHON_ENV_ENV]) if environ.get(PYTHON_ENV_ENV) else None)
    # absolute: its bin/ goes on Triton's PATH, and Triton runs in its own working folder
    env_root = env_root.absolute() if env_root is not None else None
    tried: list[list[str]] = []

    given = environ.get(BINARY_ENV)
    if given:
        path = Path(given)
        binary = path / "bin" / BINARY if path.is_dir() else path
        found = _from_binary(binary, f"${BINARY_ENV}", env_root)
        if isinstance(found, TritonInstall):
            return found
        tried.append([f"${BINARY_ENV}={given}", found])
    else:
        tried.append([f"${BINARY_ENV}", "not set"])

    found = _from_binary(image_root / "bin" / BINARY, str(image_root), env_root)
    if isinstance(found, TritonInstall):
        return found
    tried.append([str(image_root / "bin" / BINARY), found])

    on_path = shutil.which(BINARY, path=environ.get("PATH", ""))
    if on_path:
        found = _from_binary(Path(on_path), "PATH", env_root)
        if isinstance(found, TritonInstall):
            return found
        tried.append([on_path, found])
    else:
        tried.append(["PATH", f"no {BINARY} on PATH"])

    if env_root is None:
        tried.append(["nvidia-pytriton wheel", f"no Triton Python environment given (python_env or ${PYTHON_ENV_ENV})"])
    else:
        wheel = _wheel_binary(env_root)
        found = _from_binary(wheel, f"nvidia-pytriton in {env_root}", env_root) if wheel else "not installed there"
        if isinstance(found, TritonInstall):
            return found
        tried.append([f"nvidia-pytriton wheel in {env_root}", found])

    raise TritonNotFoundError(
        "no tritonserver found to host the model",
        details=[Detail("Where llmserve looked for tritonserver, in order", ["place", "result"], tried)],
    )


def _wheel_binary(env_root: Path) -> Path | None:
    for site in sorted(env_root.glob("lib/python3.*/site-packages")):
        binary = site / "pytriton" / "tritonserver" / "bin" / BINARY
        if binary.is_file():
            return binary
    return None


def _from_binary(binary: Path, found_by: str, env_root: Path | None) -> TritonInstall | str:
    """The install around `binary`, or why there is none."""
    if not binary.exists():
        return "not there"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return "not an executable file"
    real = binary.resolve()
    root = real.parent.parent
    if (root / "python_backend_stubs").is_dir():
        return _wheel_install(real, root, found_by, env_root)
    backends = root / "backends"
    lib = root / "lib"
    return TritonInstall(
        binary=real,
        found_by=found_by,
        layout="image",
        lib_dirs=(lib,) if lib.is_dir() else (),
        backend_dir=backends if backends.is_dir() else None,
        python_env=probe_python_env(env_root) if env_root is not None else None,
    )


def _wheel_install(binary: Path, root: Path, found_by: str, env_root: Path | None) -> TritonInstall:
    """The nvidia-pytriton layout: root = site-packages/pytriton/tritonserver."""
    site = root.parent.parent
    if env_root is None:
        # The environment the wheel is installed in: <env>/lib/python3.X/site-packages.
        env_root = site.parent.parent.parent
    env = probe_python_env(env_root)
    check_wheel_python_env(env)
    stub = root / "python_backend_stubs" / env.version / STUB
    if not stub.is_file():
        have = sorted(p.name for p in (root / "python_backend_stubs").iterdir() if (p / STUB).is_file())
        raise TritonPythonEnvError(
            f"{env.root}: Python {env.version} has no Triton Python-backend stub in {root} (stubs for {', '.join(have)})"
        )
    files = [root / "backends" / "python" / name for name in PYTHON_BACKEND_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise TritonPythonEnvError(f"{root}: the Python backend is incomplete: {', '.join(missing)} missing")
    return TritonInstall(
        binary=binary,
        found_by=found_by,
        layout="wheel",
        lib_dirs=(env.libdir, site / "nvidia_pytriton.libs"),
        python_backend=(*files, stub),
        python_env=env,
    )


def probe_python_env(root: Path) -> PythonEnv:
    """Ask the environment's own `python3` (isolated, as Triton's stub runs it) for what the stub needs."""
    python = root / "bin" / "python3"
    if not python.is_file():
        raise TritonPythonEnvError(f"{root}: not a Python environment (no bin/python3)")
    try:
        out = subprocess.run(
            [str(python), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        facts = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise TritonPythonEnvError(f"{python}: cannot run it: {exc}") from exc
    return PythonEnv(root=root, version=facts["version"], libdir=Path(facts["libdir"] or ""), numpy=facts["numpy"])


def check_wheel_python_env(env: PythonEnv) -> None:
    """The wheel's stubs link the environment's libpython, and its Python-backend utilities need numpy<2."""
    python = env.root / "bin" / "python3"
    if not (env.libdir / f"libpython{env.version}.so.1.0").is_file():
        raise TritonPythonEnvError(
            f"{python}: Python {env.version} has no shared library libpython{env.version}.so.1.0 in {env.libdir}, "
            "which Triton's Python-backend stub links",
            hint="Build the Triton environment from a Python built with --enable-shared (Debian's, pyenv's with "
            "PYTHON_CONFIGURE_OPTS=--enable-shared, or the python Docker images).",
        )
    if env.numpy is None:
        raise TritonPythonEnvError(f"{env.root}: numpy is not installed there; Triton's Python backend imports it")
    if int(env.numpy.split(".")[0]) >= WHEEL_NUMPY_BELOW:
        raise TritonPythonEnvError(
            f"{env.root}: numpy {env.numpy} there; Triton 2.51's Python backend mis-reads BYTES tensors under numpy 2 "
            f"and needs numpy<{WHEEL_NUMPY_BELOW}"
        )

"""Render a build context: Dockerfile (templates/build/Dockerfile.j2), the lock, its pip export, the
package, llmserve's own wheel and, with a wheelhouse, the wheels pip installs from.

    CONTEXT/
      Dockerfile          rendered; FROM the locked target's base
      llmserve.lock       the lock the image was built from (its sha256 is the lock-digest label)
      requirements.txt    local-cpu: the lock's export, `name==version --hash=...` per package
      wheels/             llmserve-<version>-<tags>.whl, built from this checkout (or --llmserve-wheel)
      wheelhouse/         with --wheelhouse: the wheels pip installs from (--no-index)
      package/<id>-<v>.llmpkg
      build.json          what `llmserve build` will tag and label (also the dry run's report)

The context is written to a temporary folder next to the destination and renamed into place, so a
failed render leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmserve import __version__
from llmserve.build.errors import BuildInputError, CompatCheckFailedError
from llmserve.compat import CheckReport, export_requirements, run_checks
from llmserve.errors import Detail
from llmserve.formats.lock import Lock, load_lock
from llmserve.formats.manifest import Manifest, parse_manifest
from llmserve.packaging import read_index
from llmserve.packaging.archive import read_member
from llmserve.templating import render

CONTEXT_REPORT = "build.json"
UID = 10001
HTTP_PORT = 8000
GRPC_PORT = 8001
PACKAGE_DIR = "/opt/llmserve/package"
LABEL_PREFIX = "dev.llmserve."


def default_base(lock: Lock) -> str:
    """The base image of the locked target: the Triton vLLM image of the line, or a Python base for local-cpu."""
    if lock.target.kind == "triton":
        if not lock.target.image:
            raise BuildInputError(
                f"the lock's target {lock.target.name} names no image",
                hint="Give the Triton image with --base, or relock: `llmserve lock --stack <line> --upgrade`.",
            )
        return lock.target.image
    return f"docker.io/library/python:{lock.stack.python}-slim-bookworm"


@dataclass
class RenderedContext:
    path: Path
    base: str
    manifest: Manifest
    package_digest: str  # sha256 hex of the package's digest index
    lock: Lock
    lock_digest: str  # sha256:<hex> of the lock file's bytes
    labels: dict[str, str]
    entrypoint: list[str]
    health_path: str
    llmserve_wheel: str
    wheelhouse_files: int
    check: CheckReport | None = None
    checked_against: str | None = None
    tags: list[str] = field(default_factory=list)

    @property
    def repository(self) -> str:
        return self.manifest.modelId

    def to_dict(self) -> dict:
        return {
            "context": str(self.path),
            "dockerfile": str(self.path / "Dockerfile"),
            "base": self.base,
            "modelId": self.manifest.modelId,
            "modelVersion": self.manifest.modelVersion,
            "packageDigest": f"sha256:{self.package_digest}",
            "lockDigest": self.lock_digest,
            "target": self.lock.target.name,
            "tags": self.tags,
            "labels": self.labels,
            "entrypoint": self.entrypoint,
            "healthPath": self.health_path,
            "llmserveWheel": self.llmserve_wheel,
            "wheelhouseFiles": self.wheelhouse_files,
            "checkCompat": None
            if self.check is None
            else {"fits": self.check.fits, "against": self.checked_against, **self.check.to_dict()},
        }


def _pins(lock: Lock) -> str:
    s = lock.stack
    parts = [f"{s.vllm.distribution} {s.vllm.version}"]
    if s.torch:
        parts.append(f"torch {s.torch}")
    if s.tritonclient:
        parts.append(f"tritonclient {s.tritonclient}")
    return ", ".join(parts)


def _quote(value: str) -> str:
    """A Dockerfile double-quoted string (LABEL values)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def checkout_root() -> Path | None:
    """The source checkout this llmserve runs from (an editable install), or None for an installed wheel."""
    import llmserve

    root = Path(llmserve.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "llmserve"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def build_llmserve_wheel(dest: Path) -> Path:
    """llmserve's wheel, built from the checkout this llmserve runs from (the native core compiled in)."""
    root = checkout_root()
    if root is None:
        raise BuildInputError(
            "this llmserve is not a source checkout, so its wheel cannot be built here",
            hint="Give the wheel to install in the image: `--llmserve-wheel dist/llmserve-<version>-<tags>.whl`.",
        )
    dest.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(root)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wheels = sorted(dest.glob("llmserve-*.whl"))
    if p.returncode != 0 or not wheels:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise BuildInputError(
            f"building llmserve's wheel from {root} failed (pip wheel exit {p.returncode}):\n{tail}",
            hint="Fix the build (`pip wheel --no-deps --no-build-isolation .`), or give one with --llmserve-wheel.",
        )
    return wheels[-1]


def _triton_requirements(lock: Lock) -> list[str]:
    """What llmserve needs beside a Triton vLLM image: its own base dependencies and the locked client."""
    reqs = [r.split(";")[0].strip() for r in (md.requires("llmserve") or []) if "extra ==" not in r]
    if lock.stack.tritonclient:
        reqs.append(f"tritonclient[grpc,http]=={lock.stack.tritonclient}")
    return [f"'{r}'" for r in reqs]


def _entrypoint(manifest: Manifest, lock: Lock, package_file: str) -> tuple[list[str], str]:
    """(ENTRYPOINT, the HTTP path the health check asks)."""
    cmd = ["llmserve", "serve", f"{PACKAGE_DIR}/{package_file}", "--host", "0.0.0.0"]
    cmd += ["--port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT)]
    if manifest.executionMode == "standalone":
        # Triton's own KServe v2 endpoints serve it: no llmserve frontend, Triton's readiness route.
        return [*cmd, "--engine", "triton"], "/v2/health/ready"
    if lock.target.kind == "triton" or manifest.backend == "python":
        cmd += ["--engine", "triton"]
    return [*cmd, "--openai"], "/health"


def _labels(manifest: Manifest, lock: Lock, lock_digest: str, package_digest: str) -> dict[str, str]:
    s = lock.stack
    labels = {
        "org.opencontainers.image.title": manifest.modelId,
        "org.opencontainers.image.version": str(manifest.modelVersion),
        f"{LABEL_PREFIX}model-id": manifest.modelId,
        f"{LABEL_PREFIX}model-version": str(manifest.modelVersion),
        f"{LABEL_PREFIX}backend": manifest.backend,
        f"{LABEL_PREFIX}execution-mode": manifest.executionMode,
        f"{LABEL_PREFIX}package-digest": f"sha256:{package_digest}",
        f"{LABEL_PREFIX}lock-digest": lock_digest,
        f"{LABEL_PREFIX}target": lock.target.name,
        f"{LABEL_PREFIX}vllm": f"{s.vllm.distribution}=={s.vllm.version}",
        f"{LABEL_PREFIX}python": s.python,
        f"{LABEL_PREFIX}llmserve": __version__,
    }
    if s.torch:
        labels[f"{LABEL_PREFIX}torch"] = s.torch
    if s.tritonclient:
        labels[f"{LABEL_PREFIX}tritonclient"] = s.tritonclient
    if lock.target.release:
        labels[f"{LABEL_PREFIX}triton-release"] = lock.target.release
    if lock.packages:
        labels[f"{LABEL_PREFIX}packages-digest"] = lock.packages.digest
    if manifest.plugins:
        labels[f"{LABEL_PREFIX}plugins"] = ",".join(p.name for p in manifest.plugins)
    return labels


def _read_package(package: Path) -> tuple[Manifest, str]:
    if package.is_dir():
        raise BuildInputError(
            f"{package} is a folder; an image carries a built package",
            hint=f"Package it first: `llmserve package {package}`, then build the .llmpkg.",
        )
    if not package.is_file():
        raise BuildInputError(f"{package}: no package here", hint="Build one with `llmserve package SRC`.")
    index = read_index(package, verify=True)
    manifest = parse_manifest(read_member(package, "llmserve.yaml").decode("utf-8"), f"{package}:llmserve.yaml")
    return manifest, index.digest


def _check_wheel_python(wheel: Path, lock: Lock) -> None:
    """llmserve's wheel carries a native module: its CPython tag must be the image's Python."""
    parts = wheel.name[: -len(".whl")].split("-")
    python_tag = parts[-3] if len(parts) >= 5 else ""
    want = "cp" + lock.stack.python.replace(".", "")
    tags = python_tag.split(".")
    if python_tag and not any(t == want or t.startswith("py3") for t in tags):
        raise BuildInputError(
            f"{wheel.name} is built for {python_tag}, the image of {lock.target.name} runs Python {lock.stack.python}",
            hint=f"Build llmserve's wheel with python{lock.stack.python} (`python{lock.stack.python} -m pip wheel "
            "--no-deps .`) and pass it with --llmserve-wheel.",
        )


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where src and dst share a filesystem (a full stack's wheelhouse is ~1 GB: no second
    copy on disk, no minutes spent writing one), else a copy. The context only ever reads it."""
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)


def _prepare_destination(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / CONTEXT_REPORT).is_file())):
        raise BuildInputError(
            f"{out} exists and is not a build context written by llmserve (no {CONTEXT_REPORT})",
            hint="Give an empty or new folder with --context.",
        )


def _default_vllm(lock: Lock, wheelhouse: Path | None) -> str | None:
    """Where check-compat reads the image's vLLM from: its wheel in the wheelhouse, else (local-cpu) the
    installed one; a Triton line's vLLM lives in its image, so it must be given (--vllm)."""
    if wheelhouse is not None:
        stem = lock.stack.vllm.distribution.replace("-", "_")
        wheels = sorted(wheelhouse.glob(f"{stem}-{lock.stack.vllm.version}-*.whl"))
        if wheels:
            return str(wheels[0])
    return "installed" if lock.target.kind == "local-cpu" else None


def check_context(ctx: RenderedContext, vllm: str | None, wheelhouse: Path | None) -> CheckReport:
    """check-compat on the rendered context: its lock, its requirements file and its package."""
    spec = vllm if vllm is not None else _default_vllm(ctx.lock, wheelhouse)
    requirements = ctx.path / "requirements.txt"
    report = run_checks(
        ctx.lock,
        str(ctx.path / "llmserve.lock"),
        vllm=spec,
        package=ctx.path / "package" / f"{ctx.manifest.package_name}.llmpkg",
        check_env=False,
        requirements=requirements if requirements.is_file() else None,
    )
    ctx.check, ctx.checked_against = report, report.vllm or spec
    if not report.fits:
        failed = [r for r in report.rows if r.status == "fail"]
        raise CompatCheckFailedError(
            f"check-compat on the build context {ctx.path} failed ({len(failed)} check(s)); the image was not built",
            details=[
                Detail(
                    "check-compat (failed rows)",
                    ["check", "subject", "detail", "what to do"],
                    [[r.check, r.subject, r.detail, r.fix] for r in failed],
                )
            ],
        )
    return report


def render_context(
    package: Path,
    lock_path: Path,
    out: Path,
    *,
    base: str | None = None,
    wheelhouse: Path | None = None,
    llmserve_wheel: Path | None = None,
) -> RenderedContext:
    """Write the build context for PACKAGE under LOCK into OUT (replacing an earlier context there)."""
    package, out = Path(package), Path(out)
    lock = load_lock(lock_path)
    lock_bytes = Path(lock_path).read_bytes()
    lock_digest = "sha256:" + hashlib.sha256(lock_bytes).hexdigest()
    manifest, package_digest = _read_package(package)
    base = base or default_base(lock)
    if wheelhouse is not None and not Path(wheelhouse).is_dir():
        raise BuildInputError(f"--wheelhouse {wheelhouse}: not a folder", hint="Give a folder of .whl files.")
    if llmserve_wheel is not None and not Path(llmserve_wheel).is_file():
        raise BuildInputError(f"--llmserve-wheel {llmserve_wheel}: no such file")
    _prepare_destination(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "llmserve.lock").write_bytes(lock_bytes)
        if lock.target.kind == "local-cpu":
            (tmp / "requirements.txt").write_text(export_requirements(lock), encoding="utf-8")
        (tmp / "package").mkdir()
        package_file = f"{manifest.package_name}.llmpkg"
        shutil.copyfile(package, tmp / "package" / package_file)
        wheel = Path(llmserve_wheel) if llmserve_wheel else build_llmserve_wheel(tmp / ".llmserve-wheel")
        _check_wheel_python(wheel, lock)
        (tmp / "wheels").mkdir()
        shutil.copyfile(wheel, tmp / "wheels" / wheel.name)
        shutil.rmtree(tmp / ".llmserve-wheel", ignore_errors=True)
        count = 0
        if wheelhouse is not None:
            (tmp / "wheelhouse").mkdir()
            for f in sorted(Path(wheelhouse).iterdir()):
                if f.is_file() and f.suffix == ".whl":
                    _link_or_copy(f, tmp / "wheelhouse" / f.name)
                    count += 1
        entrypoint, health_path = _entrypoint(manifest, lock, package_file)
        labels = _labels(manifest, lock, lock_digest, package_digest)
        python = "/opt/llmserve/venv/bin/python" if lock.target.kind == "local-cpu" else "python3"
        dockerfile = render(
            "build/Dockerfile.j2",
            lock=lock,
            manifest=manifest,
            base=base,
            pins=_pins(lock),
            package_digest=package_digest,
            excluded=", ".join(sorted(lock.packages.excluded)) if lock.packages else "",
            wheelhouse=wheelhouse is not None,
            triton_requirements=_triton_requirements(lock) if lock.target.kind == "triton" else [],
            llmserve_wheel=wheel.name,
            python=python,
            package_file=package_file,
            plugins=", ".join(p.name for p in manifest.plugins),
            uid=UID,
            env=sorted(lock.env.items()),
            labels=[(k, _quote(v)) for k, v in labels.items()],
            http_port=HTTP_PORT,
            grpc_port=GRPC_PORT,
            entrypoint=entrypoint,
            health_path=health_path,
        )
        (tmp / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        ctx = RenderedContext(
            path=out,
            base=base,
            manifest=manifest,
            package_digest=package_digest,
            lock=lock,
            lock_digest=lock_digest,
            labels=labels,
            entrypoint=entrypoint,
            health_path=health_path,
            llmserve_wheel=wheel.name,
            wheelhouse_files=count,
            tags=[f"{manifest.modelId}:{manifest.modelVersion}", f"{manifest.modelId}:{package_digest[:12]}"],
        )
        (tmp / CONTEXT_REPORT).write_text(json.dumps(ctx.to_dict(), indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ctx


def write_report(ctx: RenderedContext) -> None:
    """Rewrite build.json after check-compat ran (so the dry run's report carries its result)."""
    (ctx.path / CONTEXT_REPORT).write_text(json.dumps(ctx.to_dict(), indent=2) + "\n", encoding="utf-8")


__all__ = [
    "CONTEXT_REPORT",
    "RenderedContext",
    "build_llmserve_wheel",
    "check_context",
    "default_base",
    "render_context",
    "write_report",
]

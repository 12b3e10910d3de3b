"""`llmserve lock`: resolve a target into a Lock, keep it stable, move it only on --upgrade.

Determinism: the lock's content is a pure function of the knowledge base, the target and the
package set; `resolved.at` is SOURCE_DATE_EPOCH when set, else the current time, and a lock whose
content did not change is left untouched on disk (its old timestamp stays).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from llmserve import __version__
from llmserve.compat.errors import LockChangeError, LockFileError
from llmserve.compat.kb import LOCAL_CPU, KnowledgeBase, ResolvedTarget, load_knowledge_base, resolve_target
from llmserve.errors import EngineVersionOverrideError, IncompatibleError, InvalidInputError
from llmserve.formats.lock import (
    ImportSurface,
    Interfaces,
    Lock,
    LockTarget,
    Packages,
    ProcessorPin,
    Resolution,
    Stack,
    StructuredOutputsPin,
    VllmPin,
    dump_lock,
    normalize,
    packages_digest,
)

# Never part of a locked package set: the tool itself (installed from the working tree) and the installer.
_NEVER_LOCKED = {"llmserve", "pip"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*$")


@dataclass
class LockOutcome:
    lock: Lock
    action: str  # created | unchanged | upgraded
    changes: list[str] = field(default_factory=list)
    path: Path | None = None


def timestamp() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            moment = datetime.fromtimestamp(int(epoch), tz=UTC)
        except ValueError as exc:
            raise InvalidInputError(f"SOURCE_DATE_EPOCH={epoch!r} is not an integer number of seconds") from exc
    else:
        moment = datetime.now(UTC).replace(microsecond=0)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def read_requirements(path: Path) -> list[tuple[str, str]]:
    """(name, version) of every `name==version` line; anything looser is refused."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise LockFileError(f"{path}: no such requirements file") from exc
    pins = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        m = _PIN.match(line)
        if not m:
            raise InvalidInputError(
                f"{path}:{no}: '{line}' is not an exact pin (name==version); a lock holds exact versions only",
                hint="Produce the file with `pip freeze` in a resolved environment.",
            )
        pins.append((m.group(1), m.group(2)))
    return pins


def environment_packages(site_paths: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, version) of every distribution installed in the environment (first on the path wins)."""
    seen: dict[str, tuple[str, str]] = {}
    for dist in md.distributions(path=site_paths) if site_paths is not None else md.distributions():
        name = dist.metadata["Name"]
        if name and normalize(name) not in seen:
            seen[normalize(name)] = (name, dist.version)
    return list(seen.values())


def _package_set(target: ResolvedTarget, pins: list[tuple[str, str]], kb: KnowledgeBase, source: str) -> Packages:
    extras = kb.breaking_extras.get(target.name, {})
    kept: dict[str, tuple[str, str]] = {}
    excluded = {name: why for name, why in sorted(extras.items())}
    for name, version in pins:
        key = normalize(name)
        if key in _NEVER_LOCKED or key in extras:
            continue
        if key in kept and kept[key][1] != version:
            raise InvalidInputError(f"{source}: {name} is pinned twice ({kept[key][1]} and {version})")
        kept[key] = (name, version)
    expected = {normalize(target.vllm_distribution): target.vllm_version, "torch": target.torch}
    for key, want in expected.items():
        got = kept.get(key)
        if got is None or got[1] != want:
            have = f"{got[0]}=={got[1]}" if got else "nothing"
            raise IncompatibleError(
                f"{source} has {have} where target {target.name} pins {key}=={want}",
                hint=f"Install the pinned stack first (`pip install --no-deps {key}=={want}`), or give a "
                "requirements file that pins it: `llmserve lock --stack local-cpu --requirements FILE`.",
            )
    lines = [f"{n}=={v}" for _, (n, v) in sorted(kept.items())]
    return Packages(digest=packages_digest(lines), excluded=excluded, requirements=lines)


def _diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        where = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, where + ".")
        elif a != b:
            if isinstance(a, list) and isinstance(b, list):
                gone, added = sorted(set(map(str, a)) - set(map(str, b))), sorted(set(map(str, b)) - set(map(str, a)))
                out.append(
                    f"{where}: -{len(gone)} +{len(added)} ({', '.join((['-' + g for g in gone] + ['+' + x for x in added])[:6])})"
                )
            else:
                out.append(f"{where}: {a} -> {b}")
    return out


def resolve_lock(
    target: str | None = None,
    *,
    existing: Lock | None = None,
    upgrade: bool = False,
    vllm_version: str | None = None,
    requirements: Path | None = None,
    site_paths: list[str] | None = None,
    kb: KnowledgeBase | None = None,
) -> LockOutcome:
    kb = kb or load_knowledge_base()
    if target is None:
        if existing is None:
            raise InvalidInputError(
                "no target: this folder has no llmserve.lock yet",
                hint=f"Name one: `llmserve lock --stack local-cpu` (targets: {', '.join(kb.target_names())}).",
            )
        target = existing.target.name
    t = resolve_target(target, kb)
    inputs = [f"knowledge-base {t.name}"]

    vllm = VllmPin(distribution=t.vllm_distribution, version=t.vllm_version or "0", source="knowledge-base")
    if t.later_than_known:
        if not vllm_version:
            if existing is not None and existing.target.name == t.name and not upgrade:
                vllm_version = existing.stack.vllm.version
            else:
                raise IncompatibleError(
                    f"{t.name} is newer than the knowledge base: its image is built on NVIDIA's vLLM image and "
                    "the vLLM version must be read from the image",
                    hint=f'Read it: `docker run --rm {t.image} python3 -c "import vllm; print(vllm.__version__)"`, '
                    f"then `llmserve lock --stack {t.name} --vllm-version X`; prove the backend fits with "
                    "`llmserve check-compat --vllm vllm-X.whl`.",
                )
        vllm = VllmPin(distribution="vllm", version=vllm_version, source="from-image")
        inputs.append(f"--vllm-version {vllm_version} (read from {t.image})")
    elif vllm_version and vllm_version != t.vllm_version:
        raise EngineVersionOverrideError(
            f"target {t.name} pins vLLM {t.vllm_version}; --vllm-version {vllm_version} would override it",
            hint="Pick the release line that ships that vLLM (`llmserve lock --list`), or drop --vllm-version.",
        )

    packages = None
    if t.kind == "local-cpu":
        if (
            existing is not None
            and existing.packages is not None
            and existing.target.name == t.name
            and not upgrade
            and requirements is None
        ):
            packages = existing.packages
            inputs.append("packages kept from the existing lock")
        elif requirements is not None:
            packages = _package_set(t, read_requirements(requirements), kb, str(requirements))
            inputs.append(f"requirements {Path(requirements).as_posix()}")
        else:
            where = "site-packages " + os.pathsep.join(site_paths) if site_paths else "the running environment"
            packages = _package_set(t, environment_packages(site_paths), kb, where)
            inputs.append(f"installed distributions of {'the running environment' if not site_paths else where}")

    lock = Lock(
        target=LockTarget(name=t.name, kind=t.kind, release=t.release, image=t.image),
        stack=Stack(python=t.python, vllm=vllm, torch=t.torch, tritonclient=t.tritonclient),
        interfaces=Interfaces(
            structuredOutputs=StructuredOutputsPin(key=t.structured_outputs.key, params=t.structured_outputs.params),
            logitsProcessor=ProcessorPin(name=t.processor_interface, module=t.processor.module, base=t.processor.base),
            importSurface=ImportSurface(
                id=t.surface_id, files={f: dict(sorted(m.items())) for f, m in sorted(t.surface.items())}
            ),
        ),
        env=dict(sorted(t.env.items())),
        packages=packages,
        resolved=Resolution(
            by=f"llmserve {__version__}", at=timestamp(), knowledgeBase=f"sha256:{kb.digest}", inputs=inputs
        ),
    )

    if existing is None:
        return LockOutcome(lock, "created")
    changes = _diff(existing.content_key(), lock.content_key())
    if any(c.startswith("interfaces.importSurface.id:") for c in changes):
        changes = [c for c in changes if not c.startswith("interfaces.importSurface.files.")]
    if not changes:
        return LockOutcome(existing, "unchanged")
    if not upgrade:
        raise LockChangeError(
            f"resolving {t.name} would change the lock ({len(changes)} change{'s' if len(changes) > 1 else ''}): "
            + "; ".join(changes[:5]),
            hint=f"Review the changes, then move the lock on purpose: `llmserve lock --stack {t.name} --upgrade`.",
        )
    return LockOutcome(lock, "upgraded", changes)


def write_lock(outcome: LockOutcome, path: Path) -> LockOutcome:
    """Write atomically (temp file + rename); an unchanged lock is not rewritten."""
    outcome.path = Path(path)
    if outcome.action == "unchanged":
        return outcome
    _atomic_write(Path(path), dump_lock(outcome.lock))
    return outcome


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_requirements(lock: Lock) -> str:
    """A pip requirements file holding exactly the lock's package set (install it with --no-deps)."""
    if lock.packages is None:
        raise InvalidInputError(
            f"the lock's target {lock.target.name} carries no package set (the engine lives in {lock.target.image})",
            hint="Export requirements from a local-cpu lock: `llmserve lock --stack local-cpu`.",
        )
    p = lock.packages
    lines = [
        "# Generated from llmserve.lock by `llmserve lock --export requirements`: do not edit; change the lock.",
        f"# Target {lock.target.name}: {lock.stack.vllm.distribution} {lock.stack.vllm.version} on torch {lock.stack.torch}; "
        f"packages {p.digest}.",
        "# Install with `pip install --no-deps -r <this file>`: the set is complete, and --no-deps keeps pip from",
        "# pulling what the lock deliberately leaves out:",
        *[f"#   {name}: {why}" for name, why in p.excluded.items()],
    ]
    if lock.env:
        lines.append("# Run with: " + " ".join(f"{k}={v}" for k, v in lock.env.items()))
    return "\n".join(lines + p.requirements) + "\n"


def write_export(text: str, path: Path) -> None:
    _atomic_write(Path(path), text)


__all__ = [
    "LOCAL_CPU",
    "LockOutcome",
    "export_requirements",
    "read_requirements",
    "resolve_lock",
    "timestamp",
    "write_export",
    "write_lock",
]

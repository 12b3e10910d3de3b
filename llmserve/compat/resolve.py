"""`llmserve lock`: resolve a target into a Lock, keep it stable, move it only on --upgrade.

Determinism: the lock's content is a pure function of the knowledge base, the target and the
package set (pins and hashes, both sorted); `resolved.at` is SOURCE_DATE_EPOCH when set, else the
current time, and a lock whose content did not change is left untouched on disk (its old timestamp stays).

Hashes (local-cpu): for every pin, the sha256 of the distribution file pip installs for it. They come
from any of, merged (a pin may carry several: one per platform's file):
- `--hash=sha256:...` options in the requirements file (an exported lock reads back unchanged);
- pip installation reports (`pip install --dry-run --ignore-installed --no-deps --report R.json -r F`):
  `download_info.archive_info.hashes` is the index's hash of the chosen file (PEP 658 metadata, nothing
  downloaded) or, for a local file such as the torch +cpu wheel, the hash pip computed of it;
- running that pip report here (`--pip-hashes`), with `pip download` + sha256 for a file the report
  gives no hash for (an index that publishes none).
Once any source gives hashes, every pin needs one: `pip --require-hashes` refuses a file with a gap.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
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
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")
_HASH = re.compile(r"^(sha256):([0-9a-fA-F]{64})$")
_COMMENT = re.compile(r"(^|\s)#.*$")
PIP_REPORT_VERSION = "1"


@dataclass(frozen=True)
class Pin:
    """One `name==version` line of a requirements file, with its `--hash` values (`sha256:hex`)."""

    name: str
    version: str
    hashes: tuple[str, ...] = ()


@dataclass
class HashSource:
    """Hashes for pins: normalized name -> version -> {sha256:hex}, and where they came from."""

    hashes: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)

    def add(self, name: str, version: str, value: str) -> None:
        self.hashes.setdefault(normalize(name), {}).setdefault(version, set()).add(value)

    def merge(self, other: HashSource) -> None:
        for key, versions in other.hashes.items():
            for version, values in versions.items():
                self.hashes.setdefault(key, {}).setdefault(version, set()).update(values)
        self.inputs += other.inputs


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


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, text) of each requirement, comments dropped and `\\` continuations joined."""
    start, parts = 0, list[str]()
    for no, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw).rstrip()
        if not parts:
            start = no
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        joined = " ".join(p.strip() for p in parts).strip()
        parts = []
        if joined:
            yield start, joined
    if parts and " ".join(parts).strip():
        yield start, " ".join(p.strip() for p in parts).strip()


def read_pins(path: Path) -> list[Pin]:
    """Every `name==version [--hash=sha256:...]` requirement; anything looser, or another option, is refused."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise LockFileError(f"{path}: no such requirements file") from exc
    pins = []
    for no, line in _logical_lines(text):
        tokens = line.split()
        m = _PIN.match(tokens[0])
        if not m:
            raise InvalidInputError(
                f"{path}:{no}: '{line}' is not an exact pin (name==version); a lock holds exact versions only",
                hint="Produce the file with `pip freeze` in a resolved environment.",
            )
        hashes, rest = [], tokens[1:]
        while rest:
            opt = rest.pop(0)
            value = opt.removeprefix("--hash=") if opt.startswith("--hash=") else None
            if opt == "--hash" and rest:
                value = rest.pop(0)
            h = _HASH.match(value or "")
            if not h:
                raise InvalidInputError(
                    f"{path}:{no}: '{opt}' in '{tokens[0]}': only --hash=sha256:<64 hex digits> may follow a pin",
                    hint="Give other hash algorithms as sha256, and pip options on the command line.",
                )
            hashes.append(f"sha256:{h.group(2).lower()}")
        pins.append(Pin(m.group(1), m.group(2), tuple(sorted(set(hashes)))))
    return pins


def read_requirements(path: Path) -> list[tuple[str, str]]:
    """(name, version) of every `name==version` line (hashes allowed); anything looser is refused."""
    return [(p.name, p.version) for p in read_pins(path)]


def read_pip_report(path: Path, python: str | None = None) -> tuple[HashSource, list[tuple[str, str, str]]]:
    """Hashes from a pip installation report (`pip install --dry-run --report`), and the (name, version,
    url) of the files it gives no sha256 for. `python` (e.g. '3.11'): refuse a report of another Python."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidInputError(f"{path}: no such pip report") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path}: not a pip installation report (not JSON: {exc})") from exc
    how = "Write one: `pip install --dry-run --ignore-installed --no-deps --report R.json -r FILE`."
    if not isinstance(data, dict) or not isinstance(data.get("install"), list):
        raise InvalidInputError(f"{path}: not a pip installation report (no 'install' list)", hint=how)
    if str(data.get("version")) != PIP_REPORT_VERSION:
        raise InvalidInputError(
            f"{path}: pip report version {data.get('version')!r}; this llmserve reads version {PIP_REPORT_VERSION}",
            hint=how,
        )
    env = data.get("environment") or {}
    if python and env.get("python_version") and env["python_version"] != python:
        raise IncompatibleError(
            f"{path} was made on Python {env['python_version']}; the stack pins Python {python}, whose files differ",
            hint=f"Make the report with a Python {python} pip (`python{python} -m pip install --dry-run ...`).",
        )
    source, unhashed = HashSource(), []
    for item in data["install"]:
        try:
            meta, info = item["metadata"], item["download_info"]
            name, version, url = meta["name"], meta["version"], info["url"]
        except (KeyError, TypeError) as exc:
            raise InvalidInputError(f"{path}: an 'install' entry lacks {exc}", hint=how) from exc
        value = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if value and re.fullmatch(r"[0-9a-fA-F]{64}", value):
            source.add(name, version, f"sha256:{value.lower()}")
        else:
            unhashed.append((name, version, url))
    where = " ".join(
        str(env.get(k))
        for k in ("platform_python_implementation", "python_version", "sys_platform", "platform_machine")
        if env.get(k)
    )
    source.inputs.append(f"hashes: pip report {Path(path).as_posix()}" + (f" ({where})" if where else ""))
    return source, unhashed


def _pip(python: str, *args: str) -> None:
    r = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-8:])
        raise IncompatibleError(
            f"`pip {args[0]}` failed (exit {r.returncode}):\n{tail}",
            hint="Fix pip's access to the index (pip config debug), or pass a report: --hashes-from R.json.",
        )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def download_hashes(missing: list[tuple[str, str, str]], python: str = sys.executable) -> HashSource:
    """sha256 of the file `pip download` picks for each (name, version, url): for the few a report gives no hash."""
    source = HashSource()
    with tempfile.TemporaryDirectory(prefix="llmserve-hash-") as tmp:
        for i, (name, version, _url) in enumerate(sorted(missing)):
            dest = Path(tmp) / str(i)
            _pip(python, "download", "--quiet", "--no-deps", "-d", str(dest), f"{name}=={version}")
            for file in sorted(dest.iterdir()):
                source.add(name, version, sha256_file(file))
    if missing:
        source.inputs.append(f"hashes: pip download + sha256 of {len(missing)} file(s) the report has no hash for")
    return source


def pip_hashes(pins: list[Pin], python: str = sys.executable) -> HashSource:
    """Run pip's dry-run installation report for `pins` (nothing installed, files not downloaded where the
    index serves metadata) and take the hashes of the files it picks; download and hash the rest."""
    with tempfile.TemporaryDirectory(prefix="llmserve-report-") as tmp:
        req, report = Path(tmp) / "pins.txt", Path(tmp) / "report.json"
        req.write_text("".join(f"{p.name}=={p.version}\n" for p in pins), encoding="utf-8")
        _pip(
            python,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--quiet",
            "--report",
            str(report),
            "-r",
            str(req),
        )
        source, unhashed = read_pip_report(report)
    source.inputs = [
        i.replace(f"pip report {report.as_posix()}", "`pip install --dry-run --report` run by llmserve")
        for i in source.inputs
    ]
    source.merge(download_hashes(unhashed, python))
    return source


def environment_packages(site_paths: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, version) of every distribution installed in the environment (first on the path wins)."""
    seen: dict[str, tuple[str, str]] = {}
    for dist in md.distributions(path=site_paths) if site_paths is not None else md.distributions():
        name = dist.metadata["Name"]
        if name and normalize(name) not in seen:
            seen[normalize(name)] = (name, dist.version)
    return list(seen.values())


def _package_set(
    target: ResolvedTarget, pins: list[Pin], kb: KnowledgeBase, source: str, extra: HashSource | None = None
) -> Packages:
    extras = kb.breaking_extras.get(target.name, {})
    kept: dict[str, Pin] = {}
    excluded = {name: why for name, why in sorted(extras.items())}
    for pin in pins:
        key = normalize(pin.name)
        if key in _NEVER_LOCKED or key in extras:
            continue
        if key in kept and kept[key].version != pin.version:
            raise InvalidInputError(f"{source}: {pin.name} is pinned twice ({kept[key].version} and {pin.version})")
        kept[key] = pin
    expected = {normalize(target.vllm_distribution): target.vllm_version, "torch": target.torch}
    for key, want in expected.items():
        got = kept.get(key)
        if got is None or got.version != want:
            have = f"{got.name}=={got.version}" if got else "nothing"
            raise IncompatibleError(
                f"{source} has {have} where target {target.name} pins {key}=={want}",
                hint=f"Install the pinned stack first (`pip install --no-deps {key}=={want}`), or give a "
                "requirements file that pins it: `llmserve lock --stack local-cpu --requirements FILE`.",
            )
    ordered = [pin for _, pin in sorted(kept.items())]
    lines = [f"{p.name}=={p.version}" for p in ordered]
    hashes = _hashes_for(ordered, extra, source)
    return Packages(digest=packages_digest(lines, hashes), excluded=excluded, requirements=lines, hashes=hashes)


def _hashes_for(pins: list[Pin], extra: HashSource | None, source: str) -> dict[str, list[str]] | None:
    """name -> sorted sha256 values (inline --hash values and the extra source merged); None when no
    source gives any. Once one does, every pin needs a hash: pip --require-hashes refuses a gap."""
    found = {
        p.name: set(p.hashes) | ((extra.hashes.get(normalize(p.name)) or {}).get(p.version, set()) if extra else set())
        for p in pins
    }
    if not any(found.values()):
        if extra is not None:
            raise IncompatibleError(
                f"no hash for any of the {len(pins)} pins of {source} (versions differ from the report?)"
            )
        return None
    missing = [p for p in pins if not found[p.name]]
    if missing:

        def why(p: Pin) -> str:
            other = sorted((extra.hashes.get(normalize(p.name)) or {}) if extra else {})
            return f"{p.name}=={p.version}" + (f" (hashes for {', '.join(other)} only)" if other else "")

        raise IncompatibleError(
            f"{len(missing)} pin(s) of {source} have no hash: "
            + ", ".join(why(p) for p in missing[:6])
            + (", ..." if len(missing) > 6 else ""),
            hint="Take them from pip: `llmserve lock --stack local-cpu --requirements FILE --pip-hashes`, or pass a "
            "report that covers them (`--hashes-from R.json`, from `pip install --dry-run --ignore-installed "
            "--no-deps --report R.json -r FILE`).",
        )
    return {name: sorted(values) for name, values in found.items()}


def _diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        where = f"{prefix}{key}"
        if where == "packages.hashes" and isinstance(a or b, dict):
            out += _diff(a or {}, b or {}, where + ".")
        elif isinstance(a, dict) and isinstance(b, dict):
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


def _summarize_hashes(changes: list[str]) -> list[str]:
    """One line for all per-package hash changes (a first lock with hashes touches every package)."""
    prefix = "packages.hashes."
    names = [c[len(prefix) :].split(":", 1)[0] for c in changes if c.startswith(prefix)]
    if not names:
        return changes
    rest = [c for c in changes if not c.startswith(prefix)]
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
    return [*rest, f"packages.hashes: {len(names)} package{'s' if len(names) > 1 else ''} ({shown})"]


def resolve_lock(
    target: str | None = None,
    *,
    existing: Lock | None = None,
    upgrade: bool = False,
    vllm_version: str | None = None,
    requirements: Path | None = None,
    site_paths: list[str] | None = None,
    kb: KnowledgeBase | None = None,
    hashes_from: list[Path] | None = None,
    pip_hashes: bool = False,
) -> LockOutcome:
    """Resolve `target` into a lock. local-cpu hashes: `--hash` values in `requirements`, pip reports
    (`hashes_from`) and, with `pip_hashes`, pip's own dry-run report run here (see the module docstring)."""
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
        locked = existing.packages if existing is not None and existing.target.name == t.name else None
        packages, more = _local_packages(t, kb, locked, upgrade, requirements, site_paths, hashes_from, pip_hashes)
        inputs += more
    elif hashes_from or pip_hashes:
        raise InvalidInputError(
            f"target {t.name} carries no package set to hash (its engine lives in {t.image})",
            hint="Hashes belong to a local-cpu lock: `llmserve lock --stack local-cpu --requirements FILE --pip-hashes`.",
        )

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
    changes = _summarize_hashes(_diff(existing.content_key(), lock.content_key()))
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


def _local_packages(
    t: ResolvedTarget,
    kb: KnowledgeBase,
    locked: Packages | None,
    upgrade: bool,
    requirements: Path | None,
    site_paths: list[str] | None,
    hashes_from: list[Path] | None,
    pip_hashes: bool,
) -> tuple[Packages, list[str]]:
    """The local-cpu package set and the inputs it came from: pins from the requirements file, else the
    existing lock (kept as is unless hashes are asked for), else (--upgrade) the installed distributions."""
    hashes = _hash_sources(t, hashes_from)
    if requirements is not None:
        pins, source = read_pins(requirements), str(requirements)
        inputs = [f"requirements {Path(requirements).as_posix()}"]
        inline = "hashes: --hash options of the requirements"
    elif locked is not None and (not upgrade or hashes is not None or pip_hashes):
        if hashes is None and not pip_hashes:
            return locked, ["packages kept from the existing lock"]
        pins, source = _pins_of(locked), "the existing lock"
        inputs, inline = ["packages kept from the existing lock"], "hashes kept from the existing lock"
    else:
        source = "site-packages " + os.pathsep.join(site_paths) if site_paths else "the running environment"
        pins = [Pin(n, v) for n, v in environment_packages(site_paths)]
        inputs, inline = [f"installed distributions of {source}"], ""
    hashes = _with_pip(t, pins, hashes, pip_hashes)
    packages = _package_set(t, pins, kb, source, hashes)
    if packages.hashes and inline and any(p.hashes for p in pins):
        inputs.append(inline)
    return packages, inputs + (hashes.inputs if hashes else [])


def _pins_of(packages: Packages) -> list[Pin]:
    hashes = packages.hashes or {}
    return [Pin(n, v, tuple(hashes.get(n, ()))) for n, v in (line.split("==", 1) for line in packages.requirements)]


def _hash_sources(t: ResolvedTarget, reports: list[Path] | None) -> HashSource | None:
    """The pip reports given with --hashes-from, merged (files without a hash there: downloaded and hashed)."""
    if not reports:
        return None
    merged = HashSource()
    for report in reports:
        source, unhashed = read_pip_report(report, python=t.python)
        merged.merge(source)
        merged.merge(download_hashes(unhashed))
    return merged


def _with_pip(t: ResolvedTarget, pins: list[Pin], hashes: HashSource | None, run_pip: bool) -> HashSource | None:
    """`hashes`, plus (with --pip-hashes) those of pip's own dry-run report for `pins`, made here."""
    if not run_pip:
        return hashes
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if t.python and running != t.python:
        raise IncompatibleError(
            f"--pip-hashes runs pip on Python {running}; the stack pins Python {t.python}, whose files differ",
            hint=f"Run llmserve from a Python {t.python} environment, or pass a report made there: --hashes-from R.json.",
        )
    merged = hashes or HashSource()
    merged.merge(pip_hashes([p for p in pins if normalize(p.name) not in _NEVER_LOCKED]))
    return merged


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
    """A pip requirements file holding exactly the lock's package set (install it with --no-deps, and
    --require-hashes when the lock carries hashes: one `name==version --hash=sha256:...` line per package)."""
    if lock.packages is None:
        raise InvalidInputError(
            f"the lock's target {lock.target.name} carries no package set (the engine lives in {lock.target.image})",
            hint="Export requirements from a local-cpu lock: `llmserve lock --stack local-cpu`.",
        )
    p = lock.packages
    install = (
        "pip install --no-deps --require-hashes -r <this file>" if p.hashes else "pip install --no-deps -r <this file>"
    )
    lines = [
        "# Generated from llmserve.lock by `llmserve lock --export requirements`: do not edit; change the lock.",
        f"# Target {lock.target.name}: {lock.stack.vllm.distribution} {lock.stack.vllm.version} on torch {lock.stack.torch}; "
        f"packages {p.digest}.",
        f"# Install with `{install}`: the set is complete, and --no-deps keeps pip from",
        "# pulling what the lock deliberately leaves out:",
        *[f"#   {name}: {why}" for name, why in p.excluded.items()],
    ]
    if p.hashes:
        lines.append("# Hashes: sha256 of the distribution files pip may install for each pin; it refuses any other.")
    if lock.env:
        lines.append("# Run with: " + " ".join(f"{k}={v}" for k, v in lock.env.items()))
    return "\n".join(lines + p.pip_lines()) + "\n"


def write_export(text: str, path: Path) -> None:
    _atomic_write(Path(path), text)


__all__ = [
    "LOCAL_CPU",
    "HashSource",
    "LockOutcome",
    "Pin",
    "download_hashes",
    "export_requirements",
    "pip_hashes",
    "read_pins",
    "read_pip_report",
    "read_requirements",
    "resolve_lock",
    "timestamp",
    "write_export",
    "write_lock",
]

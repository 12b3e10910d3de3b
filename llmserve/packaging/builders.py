"""Build a `.llmpkg` from a source folder holding llmserve.yaml and the model's weights.

The artifact's model repository follows Triton's conventions exactly
(`<repo>/<modelId>/config.pbtxt`, `<repo>/<modelId>/<version>/...`), so a Triton server can load
it unchanged:

- vLLM backend: config.pbtxt (backend "vllm", no tensor spec: the backend generates it) and
  `<version>/model.json` with the engine arguments, pointing at the packaged weights.
- Python backend: config.pbtxt with the frozen tensor spec and `<version>/model.py`, checked at
  package time against the request contract of the frontend that will call it.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmserve.errors import InvalidInputError, ManifestError, NotFoundError
from llmserve.formats.lock_at_packaging import find_lock, load_manifest_under_lock
from llmserve.formats.manifest import MANIFEST_NAME, Manifest, dump_manifest
from llmserve.formats.tensors import TRITON_DATA_TYPE, check_against_contract
from llmserve.packaging.archive import PICKLE_SUFFIXES, PackageIndex, Source, write_archive
from llmserve.templating import render

REPOSITORY_DIR = "model_repository"
PLUGINS_DIR = "plugins"
# Where images and Kubernetes pods mount the model repository; model.json names weights under it
# because Triton's vLLM backend hands `model` to the engine verbatim (no relative-path resolution).
REPOSITORY_MOUNT = "/models"
PACKAGE_SUFFIX = ".llmpkg"

_SKIP_NAMES = {"__pycache__", ".git", ".DS_Store"}


@dataclass(frozen=True)
class BuildResult:
    path: Path
    manifest: Manifest
    index: PackageIndex


def version_dir(manifest: Manifest) -> str:
    return f"{REPOSITORY_DIR}/{manifest.modelId}/{manifest.modelVersion}"


def weights_dir_in_package(manifest: Manifest) -> str:
    return f"{version_dir(manifest)}/weights"


@dataclass(frozen=True)
class _Walk:
    src: Path  # the source folder, resolved: links may not leave it unless follow_external_links
    follow_external_links: bool


def _check_link(p: Path, walk: _Walk) -> None:
    target = p.resolve()
    if not walk.follow_external_links and not target.is_relative_to(walk.src):
        raise InvalidInputError(
            f"{p}: symbolic link to {target}, outside the source folder {walk.src}",
            hint="Copy the file into the source folder and package again "
            "(build_package(..., follow_external_links=True) embeds it as it is).",
        )


def _tree(root: Path, walk: _Walk) -> list[tuple[str, Path]]:
    """(posix relative path, file) for every file under root, sorted.

    Symbolic links to files are followed and packaged as the files they point to (a Hugging Face
    cache snapshot is made of such links), as long as they stay inside the source folder; dangling
    links and links to folders are errors (os.walk would silently skip the latter).
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            if d not in _SKIP_NAMES and (Path(dirpath) / d).is_symlink():
                raise InvalidInputError(
                    f"{Path(dirpath) / d}: symbolic link to a folder; its files would be left out",
                    hint="Replace the link with a real folder (or links to its files), then package again.",
                )
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_NAMES)
        for fn in filenames:
            p = Path(dirpath) / fn
            if fn in _SKIP_NAMES or fn.endswith(".pyc"):
                continue
            if not p.is_file():
                if p.is_symlink():
                    raise InvalidInputError(
                        f"{p}: dangling symbolic link", hint="Fix or remove the link, then package again."
                    )
                continue  # sockets, FIFOs: not content
            if p.is_symlink():
                _check_link(p, walk)
            out.append((p.relative_to(root).as_posix(), p))
    return sorted(out)


def _resolve_inside(src: Path, rel: str, what: str) -> Path:
    path = (src / rel).resolve()
    if not path.is_relative_to(src.resolve()):
        raise ManifestError(f"{src / MANIFEST_NAME}: {what} '{rel}' points outside the package folder")
    return path


def _weights_members(src: Path, manifest: Manifest, walk: _Walk) -> dict[str, Source]:
    wdir = _resolve_inside(src, manifest.weights, "weights")
    if not wdir.is_dir():
        raise NotFoundError(
            f"{wdir}: weights folder not found (from `weights: {manifest.weights}`)",
            hint="Point `weights` at a folder with config.json, *.safetensors and the tokenizer files.",
        )
    files = _tree(wdir, walk)
    names = {rel for rel, _ in files}
    if "config.json" not in names:
        raise InvalidInputError(f"{wdir}: no config.json; this is not a Hugging Face model folder")
    pickled = sorted(rel for rel in names if rel.lower().endswith(PICKLE_SUFFIXES))
    if pickled:
        raise InvalidInputError(
            f"{wdir}: pickled weights ({pickled[0]}) can run code when loaded and are not packaged",
            hint="Convert them to safetensors (transformers: model.save_pretrained(dir, safe_serialization=True)).",
        )
    if not any(rel.endswith(".safetensors") for rel in names):
        raise InvalidInputError(f"{wdir}: no *.safetensors weights found")
    prefix = weights_dir_in_package(manifest)
    return {f"{prefix}/{rel}": p for rel, p in files}


def _plugin_members(src: Path, manifest: Manifest, walk: _Walk) -> dict[str, Source]:
    members: dict[str, Source] = {}
    for plugin in manifest.plugins:
        pdir = _resolve_inside(src, plugin.source, f"plugin '{plugin.name}' source")
        if not pdir.is_dir():
            raise NotFoundError(f"{pdir}: source folder of plugin '{plugin.name}' not found")
        module = plugin.entryPoint.split(":", 1)[0].split(".")[0]
        if not ((pdir / module).is_dir() or (pdir / f"{module}.py").is_file()):
            raise ManifestError(
                f"{src / MANIFEST_NAME}: plugin '{plugin.name}': module '{module}' of entryPoint "
                f"'{plugin.entryPoint}' is not in {pdir}"
            )
        for rel, p in _tree(pdir, walk):
            members[f"{PLUGINS_DIR}/{plugin.name}/{rel}"] = p
    return members


def _model_json(manifest: Manifest) -> bytes:
    weights = f"{REPOSITORY_MOUNT}/{manifest.modelId}/{manifest.modelVersion}/weights"
    body = {"model": weights, "tokenizer": weights, **manifest.engine_args}
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def _check_model_py(path: Path) -> None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        raise InvalidInputError(f"{path}:{exc.lineno}: model.py does not parse ({exc.msg})") from exc
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel":
            methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "execute" not in methods:
                raise InvalidInputError(f"{path}: TritonPythonModel has no execute() method")
            return
    raise InvalidInputError(f"{path}: no class TritonPythonModel (Triton's Python backend looks for it)")


def _python_members(src: Path, manifest: Manifest) -> dict[str, Source]:
    assert manifest.python is not None
    spec = manifest.python
    if spec.frontend != "none":
        check_against_contract(spec.tensors, spec.frontend, str(src / MANIFEST_NAME))
    if spec.modelPy:
        model_py = _resolve_inside(src, spec.modelPy, "modelPy")
        if not model_py.is_file():
            raise NotFoundError(f"{model_py}: model.py not found (from `python.modelPy`)")
        _check_model_py(model_py)
        code: Source = model_py
    else:
        if spec.frontend != "llm-text":
            raise ManifestError(
                f"{src / MANIFEST_NAME}: python.modelPy is required when python.frontend is '{spec.frontend}' "
                "(the built-in template implements the llm-text contract only)"
            )
        code = render("model.py.j2", manifest=manifest).encode()
    return {f"{version_dir(manifest)}/model.py": code}


def collect_members(src: Path, manifest: Manifest, *, follow_external_links: bool = False) -> dict[str, Source]:
    walk = _Walk(src.resolve(), follow_external_links)
    members: dict[str, Source] = {"llmserve.yaml": dump_manifest(manifest).encode()}
    config = render("config.pbtxt.j2", manifest=manifest, triton_type=TRITON_DATA_TYPE)
    members[f"{REPOSITORY_DIR}/{manifest.modelId}/config.pbtxt"] = config.encode()
    if manifest.backend == "vllm":
        members[f"{version_dir(manifest)}/model.json"] = _model_json(manifest)
    else:
        members.update(_python_members(src, manifest))
    members.update(_weights_members(src, manifest, walk))
    members.update(_plugin_members(src, manifest, walk))
    return members


def build_package(
    src: Path,
    out: Path | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    lock: Path | None = None,
    follow_external_links: bool = False,
) -> BuildResult:
    """Validate SRC/llmserve.yaml and write the package; `out` is a file path or a folder.
    `lock` (default: SRC/llmserve.lock when present) is read so that an engine-version override is
    refused with the versions the lock pins. Links that leave SRC are refused unless
    `follow_external_links`: packaging embeds what a link points to, and a package gets shared."""
    src = Path(src)
    if not src.is_dir():
        raise NotFoundError(f"{src}: not a folder", hint="Pass the folder that holds llmserve.yaml.")
    manifest, _lock = load_manifest_under_lock(src / MANIFEST_NAME, find_lock(src, lock))
    members = collect_members(src, manifest, follow_external_links=follow_external_links)
    if on_total:
        on_total(sum(len(m) if isinstance(m, bytes) else m.stat().st_size for m in members.values()))
    name = manifest.package_name + PACKAGE_SUFFIX
    if out is None:
        dest = Path("dist") / name
    elif out.suffix == PACKAGE_SUFFIX:
        dest = out
    else:
        dest = out / name
    index = write_archive(dest, members, progress=progress)
    return BuildResult(dest, manifest, index)

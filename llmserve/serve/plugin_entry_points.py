"""Register a package's vLLM plugins through Python entry points, the way vLLM discovers them.

vLLM 0.32 reads `importlib.metadata.entry_points(group=...)` for two groups a package may use:
`vllm.general_plugins` (called in every process: this one and the engine core) and
`vllm.logits_processors` (V1 logits-processor classes, loaded by the V1 sampler). For each plugin we
write a minimal `.dist-info` (METADATA + entry_points.txt) into a per-server site folder and put that
folder and the plugin's source folder on `sys.path` and `PYTHONPATH` (spawned engine processes
inherit both). vLLM swallows a plugin that fails to load (it only logs), so `load_check` imports
every entry point here first and turns any failure into a startup error.

llmserve's own engine-process fixes (llmserve/serve/vllm_patches.py) travel the same way, as one
general plugin every server installs: it must run inside the engine-core process, which vLLM
starts with `spawn` on CPU, and entry points are how vLLM runs code there.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from llmserve.packaging.opened import OpenedPackage
from llmserve.serve.errors import PluginInstallError
from llmserve.serve.vllm_patches import PLUGIN_ENTRY_POINT, PLUGIN_NAME

HONOURED_GROUPS = ("vllm.general_plugins", "vllm.logits_processors")
# Installed for every server, before the package's own plugins (name, group, entry point).
BUILTIN_PLUGINS = ((PLUGIN_NAME, "vllm.general_plugins", PLUGIN_ENTRY_POINT),)


@dataclass(frozen=True)
class InstalledPlugin:
    name: str
    group: str
    entry_point: str
    source: Path | None  # the package's plugin folder; None for llmserve's own (importable already)


def _dist_name(plugin_name: str) -> str:
    return "llmserve_plugin_" + re.sub(r"[^A-Za-z0-9]", "_", plugin_name)


def _prepend_path(entries: list[Path]) -> None:
    for entry in reversed(entries):
        text = str(entry)
        if text not in sys.path:
            sys.path.insert(0, text)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(e) for e in entries if str(e) not in current] + current)


def install_plugins(package: OpenedPackage, site_dir: Path) -> list[InstalledPlugin]:
    """Write entry-point metadata for llmserve's own plugins and every plugin of the package; make them discoverable."""
    installed = [InstalledPlugin(name, group, entry, None) for name, group, entry in BUILTIN_PLUGINS]
    for plugin in package.manifest.plugins:
        if plugin.group not in HONOURED_GROUPS:
            raise PluginInstallError(f"plugin '{plugin.name}': group '{plugin.group}' is not loaded by this vLLM build")
        if plugin.name in {p.name for p in installed}:
            raise PluginInstallError(f"plugin '{plugin.name}': the name is taken (llmserve's own plugin)")
        source = package.plugin_source(plugin.name)
        if not source.is_dir():
            raise PluginInstallError(f"plugin '{plugin.name}': source folder {source} is missing from the package")
        installed.append(InstalledPlugin(plugin.name, plugin.group, plugin.entryPoint, source))
    if site_dir.exists():
        shutil.rmtree(site_dir)
    site_dir.mkdir(parents=True)
    for entry in installed:
        dist = site_dir / f"{_dist_name(entry.name)}-0.0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {_dist_name(entry.name)}\nVersion: 0.0.0\n")
        (dist / "entry_points.txt").write_text(f"[{entry.group}]\n{entry.name} = {entry.entry_point}\n")
    _prepend_path([site_dir, *[p.source for p in installed if p.source is not None]])
    _check_discoverable(installed)
    return installed


def _check_discoverable(installed: list[InstalledPlugin]) -> None:
    allow = os.environ.get("VLLM_PLUGINS")
    allowed = None if allow is None else {n.strip() for n in allow.split(",")}
    for plugin in installed:
        found = [ep for ep in metadata.entry_points(group=plugin.group) if ep.name == plugin.name]
        if not found or found[0].value != plugin.entry_point:
            raise PluginInstallError(f"plugin '{plugin.name}': entry point not discoverable in group {plugin.group}")
        if plugin.group == "vllm.general_plugins" and allowed is not None and plugin.name not in allowed:
            raise PluginInstallError(
                f"plugin '{plugin.name}': VLLM_PLUGINS={allow!r} excludes it, so vLLM would not call it",
                hint=f"Add '{plugin.name}' to VLLM_PLUGINS or unset VLLM_PLUGINS.",
            )
        if plugin.group == "vllm.logits_processors" and os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
            raise PluginInstallError(
                f"plugin '{plugin.name}': V1 logits processors are rejected by the V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1)",
                hint="Unset VLLM_USE_V2_MODEL_RUNNER; llmserve pins the V1 runner when serving logits-processor plugins.",
            )


def load_check(installed: list[InstalledPlugin]) -> None:
    """Import every entry point now: vLLM would only log a failure and run without the plugin."""
    for plugin in installed:
        ep = next(ep for ep in metadata.entry_points(group=plugin.group) if ep.name == plugin.name)
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginInstallError(
                f"plugin '{plugin.name}': cannot load {plugin.entry_point}: {type(exc).__name__}: {exc}"
            ) from exc
        if plugin.group == "vllm.general_plugins" and not callable(obj):
            raise PluginInstallError(f"plugin '{plugin.name}': {plugin.entry_point} is not callable")
        if plugin.group == "vllm.logits_processors":
            # deferred: vLLM is imported only by a package that ships a logits processor, at startup
            from vllm.v1.sample.logits_processor import LogitsProcessor

            if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
                raise PluginInstallError(
                    f"plugin '{plugin.name}': {plugin.entry_point} is not a vLLM V1 LogitsProcessor subclass"
                )

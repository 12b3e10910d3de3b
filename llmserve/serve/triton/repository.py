"""The model repositories one Triton hosts: each package's own, and one llmserve assembles for versions of a model.

A package is a model repository holding one version of one model (`<modelId>/config.pbtxt` with
`version_policy: specific [modelVersion]`, and `<modelId>/<modelVersion>/`). Triton holds one configuration per
model, so several versions of one model served together (`llmserve serve m-1.llmpkg m-2.llmpkg --engine triton`)
are assembled into a repository of links: `<modelId>/<version>` -> each package's version folder, and the
packages' common config.pbtxt with `version_policy: specific [every version]`. Clients then pick a version
(KServe v2 `model_version`); without one Triton answers with the highest. Versions whose configurations differ
otherwise (tensors, backend, batching) cannot share one Triton model and are refused: that is a versioned
deployment (a new modelId), not a version.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmserve.errors import InvalidInputError

_POLICY = re.compile(r"^version_policy:.*$", re.MULTILINE)


class VersionConfigError(InvalidInputError):
    """Versions of one model whose Triton configurations differ beyond their version."""

    code = "triton-versions"


def _config(package: Any) -> str:
    return (package.repository_dir / package.manifest.modelId / "config.pbtxt").read_text(encoding="utf-8")


def hosting_repositories(packages: Sequence[Any], workdir: Path) -> list[Path]:
    """The --model-repository folders for `packages` (opened, unpacked packages): each package's own, except for
    models given in several versions, which are linked into one repository under `workdir` (rebuilt each time)."""
    by_model: dict[str, list[Any]] = {}
    for package in packages:
        by_model.setdefault(package.manifest.modelId, []).append(package)
    repositories = []
    assembled = workdir / "model_repository"
    shutil.rmtree(assembled, ignore_errors=True)
    for model, versions in by_model.items():
        if len(versions) == 1:
            repositories.append(versions[0].repository_dir)
            continue
        numbers = sorted(p.manifest.modelVersion for p in versions)
        if len(set(numbers)) != len(numbers):
            raise InvalidInputError(f"model '{model}' version {numbers} is given twice")
        configs = {_POLICY.sub("", _config(p)) for p in versions}
        if len(configs) != 1:
            raise VersionConfigError(
                f"versions {', '.join(map(str, numbers))} of model '{model}' have different Triton configurations "
                "(config.pbtxt differs beyond version_policy); Triton holds one configuration per model",
                hint="Serve them as separate models (a new modelId: a versioned deployment), or package the "
                "versions with the same backend, tensors and settings.",
            )
        folder = assembled / model
        folder.mkdir(parents=True)
        for package in versions:
            version = str(package.manifest.modelVersion)
            (folder / version).symlink_to(package.repository_dir / model / version, target_is_directory=True)
        policy = f"version_policy: {{ specific: {{ versions: [ {', '.join(map(str, numbers))} ] }} }}"
        (folder / "config.pbtxt").write_text(_POLICY.sub(policy, _config(versions[-1])), encoding="utf-8")
    if assembled.is_dir():
        repositories.append(assembled)
    return repositories

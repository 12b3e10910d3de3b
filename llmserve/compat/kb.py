"""The compatibility knowledge base (data/matrix.yaml) as typed data, and target resolution.

A target is `local-cpu` or a Triton release line: `triton-25.09` (also accepted: `25.09`,
`triton:25.09`). Lines after the last known one resolve with `vllm: from-image`: their vLLM version
must be read from the image and given explicitly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmserve.compat.errors import UnknownTargetError
from llmserve.errors import InvalidInputError
from llmserve.formats.safe_yaml import load_yaml

# file -> module -> symbols
Surface = dict[str, dict[str, list[str]]]

LOCAL_CPU = "local-cpu"
_RELEASE = re.compile(r"^(?:triton[-:])?(\d{2})\.(\d{2})$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StructuredOutputs(_Strict):
    key: str
    params: str


class ProcessorInterface(_Strict):
    module: str | None
    base: str | None
    description: str


class VllmDist(_Strict):
    distribution: str
    version: str


class LocalCpuTarget(_Strict):
    kind: Literal["local-cpu"]
    description: str
    python: str
    vllm: VllmDist
    torch: str
    tritonclient: str
    structured_outputs: StructuredOutputs
    processor_interface: str
    surface: str
    env: dict[str, str] = Field(default_factory=dict)
    packages_from: Literal["requirements"]


class TritonRelease(_Strict):
    vllm: str
    torch: str
    tritonclient: str
    structured_outputs: StructuredOutputs
    processor_interface: str
    surface: str
    env: dict[str, str] = Field(default_factory=dict)


class TritonLater(_Strict):
    after: str
    vllm: Literal["from-image"]
    torch: Literal["from-image"]
    structured_outputs: StructuredOutputs
    processor_interface: str
    surface: str
    env: dict[str, str] = Field(default_factory=dict)


class TritonTargets(_Strict):
    image: str
    python: str
    releases: dict[str, TritonRelease]
    later: TritonLater


class Targets(_Strict):
    local_cpu: LocalCpuTarget = Field(alias="local-cpu")
    triton: TritonTargets


class KnowledgeBase(_Strict):
    schema_: Literal["llmserve-compat/v1"] = Field(alias="schema")
    surfaces: dict[str, Surface]
    processor_interfaces: dict[str, ProcessorInterface]
    breaking_extras: dict[str, dict[str, str]]
    targets: Targets
    digest: str = ""

    def target_names(self) -> list[str]:
        return [LOCAL_CPU] + [f"triton-{r}" for r in sorted(self.targets.triton.releases)]


@dataclass(frozen=True)
class ResolvedTarget:
    """Everything the knowledge base says about one target, flattened for the lock."""

    name: str
    kind: Literal["local-cpu", "triton"]
    release: str | None
    image: str | None
    python: str
    vllm_distribution: str
    vllm_version: str | None  # None: from the image, not known here
    torch: str | None
    tritonclient: str | None
    structured_outputs: StructuredOutputs
    processor_interface: str
    processor: ProcessorInterface
    surface_id: str
    surface: Surface
    env: dict[str, str] = field(default_factory=dict)
    later_than_known: bool = False


@lru_cache(maxsize=1)
def load_knowledge_base() -> KnowledgeBase:
    raw = (Path(__file__).parent / "data" / "matrix.yaml").read_bytes()
    return parse_knowledge_base(raw, "llmserve/compat/data/matrix.yaml")


def parse_knowledge_base(raw: bytes, source: str) -> KnowledgeBase:
    data = load_yaml(raw, source)  # InvalidInputError naming the file and line
    try:
        kb = KnowledgeBase.model_validate(data)
    except ValidationError as exc:
        raise InvalidInputError(f"{source}: the compatibility knowledge base is malformed ({exc})") from exc
    used = {kb.targets.local_cpu.surface, kb.targets.triton.later.surface}
    used |= {r.surface for r in kb.targets.triton.releases.values()}
    missing = sorted(used - set(kb.surfaces))
    if missing:
        raise InvalidInputError(f"{source}: surfaces referenced but not defined: {', '.join(missing)}")
    return kb.model_copy(update={"digest": hashlib.sha256(raw).hexdigest()})


def _release_key(release: str) -> tuple[int, int]:
    yy, mm = release.split(".")
    return int(yy), int(mm)


def resolve_target(name: str, kb: KnowledgeBase | None = None) -> ResolvedTarget:
    """Look a target up; raise UnknownTargetError naming the known ones when it is not there."""
    kb = kb or load_knowledge_base()
    known = ", ".join(kb.target_names())
    if name == LOCAL_CPU:
        t = kb.targets.local_cpu
        return ResolvedTarget(
            name=LOCAL_CPU,
            kind="local-cpu",
            release=None,
            image=None,
            python=t.python,
            vllm_distribution=t.vllm.distribution,
            vllm_version=t.vllm.version,
            torch=t.torch,
            tritonclient=t.tritonclient,
            structured_outputs=t.structured_outputs,
            processor_interface=t.processor_interface,
            processor=kb.processor_interfaces[t.processor_interface],
            surface_id=t.surface,
            surface=kb.surfaces[t.surface],
            env=dict(t.env),
        )
    m = _RELEASE.match(name)
    if not m or not (1 <= int(m.group(2)) <= 12):
        raise UnknownTargetError(
            f"'{name}' is not a target: use local-cpu or a Triton release line such as triton-25.09",
            hint=f"Known targets: {known}.",
        )
    release = f"{m.group(1)}.{m.group(2)}"
    tri = kb.targets.triton
    image = tri.image.format(release=release)
    if release in tri.releases:
        r = tri.releases[release]
        return ResolvedTarget(
            name=f"triton-{release}",
            kind="triton",
            release=release,
            image=image,
            python=tri.python,
            vllm_distribution="vllm",
            vllm_version=r.vllm,
            torch=r.torch,
            tritonclient=r.tritonclient,
            structured_outputs=r.structured_outputs,
            processor_interface=r.processor_interface,
            processor=kb.processor_interfaces[r.processor_interface],
            surface_id=r.surface,
            surface=kb.surfaces[r.surface],
            env=dict(r.env),
        )
    if _release_key(release) > _release_key(tri.later.after):
        later = tri.later
        yy, mm = _release_key(release)
        # Server versions advance one minor a month (see [TC] in matrix.yaml): 24.12 = 2.53.
        client = f"2.{53 + (yy - 24) * 12 + (mm - 12)}.0"
        return ResolvedTarget(
            name=f"triton-{release}",
            kind="triton",
            release=release,
            image=image,
            python=tri.python,
            vllm_distribution="vllm",
            vllm_version=None,
            torch=None,
            tritonclient=client,
            structured_outputs=later.structured_outputs,
            processor_interface=later.processor_interface,
            processor=kb.processor_interfaces[later.processor_interface],
            surface_id=later.surface,
            surface=kb.surfaces[later.surface],
            env=dict(later.env),
            later_than_known=True,
        )
    raise UnknownTargetError(
        f"Triton release {release} is not in the compatibility knowledge base "
        f"(known lines: {', '.join(sorted(tri.releases))}; later lines read vLLM from the image)",
        hint=f"Pick a known line, e.g. `llmserve lock --stack triton-{max(tri.releases, key=_release_key)}`. Known targets: {known}.",
    )


def release_for_vllm(version: str, kb: KnowledgeBase | None = None) -> list[str]:
    """Triton release lines whose image pins exactly this vLLM version."""
    kb = kb or load_knowledge_base()
    return [f"triton-{r}" for r, rel in sorted(kb.targets.triton.releases.items()) if rel.vllm == version]


def lines_with_module(module: str, kb: KnowledgeBase | None = None) -> list[str]:
    """Triton release lines whose backend surface imports `module` (for hints)."""
    kb = kb or load_knowledge_base()
    out = []
    for r, rel in sorted(kb.targets.triton.releases.items(), key=lambda kv: _release_key(kv[0])):
        if any(module in mods for mods in kb.surfaces[rel.surface].values()):
            out.append(f"triton-{r}")
    return out

"""The manifest's and the lock's rule tables, through the formats' public functions (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmserve.errors import EngineVersionOverrideError, ExitCode, ManifestError
from llmserve.formats.lock import LOCK_NAME, LOCK_VERSION, LockFileError, dump_lock, load_lock, parse_lock
from llmserve.formats.manifest import MANIFEST_NAME, engine_key_problem, parse_manifest

REPO = Path(__file__).resolve().parents[2]
GOOD = "modelId: tiny-chat\nmodelVersion: 1\nbackend: vllm\nengine:\n  max_model_len: 512\n"

# Keys a model developer might use to pick the engine: refused with an explanation, never "unknown key".
VERSION_KEYS = [
    "engineVersion",
    "engine_version",
    "vllmVersion",
    "vllm_version",
    "vllm",
    "tritonVersion",
    "triton_version",
    "torchVersion",
    "torch_version",
    "image",
    "baseImage",
]
# Engine arguments that point at the packaged weights: the packager sets them.
PACKAGER_OWNED = ["model", "tokenizer", "served_model_name", "download_dir", "revision", "tokenizer_revision"]


@pytest.mark.parametrize("key", VERSION_KEYS)
def test_version_keys_are_refused_at_the_top_level(key):
    with pytest.raises(EngineVersionOverrideError) as caught:
        parse_manifest(GOOD.replace("engine:\n", f"{key}: '1.0'\nengine:\n"))
    assert f"{MANIFEST_NAME}:4: '{key}'" in caught.value.message
    assert caught.value.exit_code == ExitCode.INCOMPATIBLE


@pytest.mark.parametrize("key", [*VERSION_KEYS, "version"])
def test_version_keys_are_refused_inside_engine_args(key):
    with pytest.raises(EngineVersionOverrideError, match=f"'engine.{key}'"):
        parse_manifest(GOOD + f"  {key}: '1.0'\n")


@pytest.mark.parametrize("key", PACKAGER_OWNED)
def test_packager_owned_engine_args_are_refused(key):
    assert "set by the packager" in (engine_key_problem(key) or "")
    with pytest.raises(ManifestError, match=f"{MANIFEST_NAME}:6: engine.{key}: "):
        parse_manifest(GOOD + f"  {key}: x\n")


@pytest.mark.parametrize("key", ["MaxLen", "max-model-len", "1st", ""])
def test_engine_arg_names_are_snake_case(key):
    assert "not an engine argument name" in (engine_key_problem(key) or "")


@pytest.mark.parametrize("key", ["max_model_len", "dtype", "enforce_eager", "max_num_seqs"])
def test_ordinary_engine_args_pass(key):
    assert engine_key_problem(key) is None


def test_the_projects_lock_is_in_canonical_form():
    text = (REPO / LOCK_NAME).read_text(encoding="utf-8")
    lock = load_lock(REPO / LOCK_NAME)
    assert lock.lockVersion == LOCK_VERSION
    assert dump_lock(lock) == text
    assert parse_lock(text) == lock


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (f"lockVersion: {LOCK_VERSION}", f"lockVersion: {LOCK_VERSION + 1}"),
        ("target:", "colour: blue\ntarget:"),
        ("lockVersion:", "lockversion:"),
    ],
)
def test_the_lock_refuses_other_versions_and_unknown_keys(old, new):
    text = (REPO / LOCK_NAME).read_text(encoding="utf-8")
    assert old in text
    with pytest.raises(LockFileError) as caught:
        parse_lock(text.replace(old, new, 1))
    assert caught.value.exit_code == ExitCode.INVALID_INPUT

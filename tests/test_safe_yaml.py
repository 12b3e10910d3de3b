"""Every YAML file llmserve reads refuses anchors, aliases, oversized and deeply nested input (issue #11)."""

import time

import pytest

from llmserve.errors import ExitCode, InvalidInputError, ManifestError
from llmserve.formats.lock import LockFileError, parse_lock
from llmserve.formats.manifest import parse_manifest
from llmserve.formats.safe_yaml import MAX_YAML_DEPTH, dump_yaml, load_yaml

# The 635-byte shape from the issue: nine levels of nine aliases each, ~387 million strings expanded.
BILLION_LAUGHS = (
    'modelId: x\nmodelVersion: 1\nbackend: vllm\nengine:\n  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"  {cur}: &{cur} [{','.join(['*' + prev] * 9)}]\n" for prev, cur in zip("abcdefgh", "bcdefghi", strict=True)
    )
)


def _timed(fn, *args):
    start = time.monotonic()
    with pytest.raises(InvalidInputError) as info:
        fn(*args)
    assert time.monotonic() - start < 2, "refusal must not expand the aliases first"
    return info.value


def test_billion_laughs_manifest_refused_at_once():
    assert len(BILLION_LAUGHS) < 1000
    err = _timed(parse_manifest, BILLION_LAUGHS, "llmserve.yaml")
    assert isinstance(err, ManifestError) and err.exit_code == ExitCode.INVALID_INPUT
    assert "llmserve.yaml:5: YAML anchor '&a' refused" in err.message


def test_billion_laughs_lock_refused_at_once():
    err = _timed(parse_lock, BILLION_LAUGHS.replace("modelId: x", "lockVersion: 1"), "llmserve.lock")
    assert isinstance(err, LockFileError)
    assert "llmserve.lock:5:" in err.message and "anchor" in err.message


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &x 1\nb: 2\n", "anchor '&x'"),
        ("a: *x\n", r"alias '\*x'"),  # an alias to nothing is refused the same way, not as a parse error
        ("a: &x {k: 1}\nb:\n  <<: *x\n", "anchor '&x'"),
    ],
)
def test_anchors_and_aliases_refused(text, words):
    with pytest.raises(InvalidInputError, match=words):
        load_yaml(text, "f.yaml")
    with pytest.raises(ManifestError, match=words):
        parse_manifest("modelId: x\n" + text.replace("a:", "c:").replace("b:", "d:"), "llmserve.yaml")


def test_deep_nesting_refused_without_recursion_error():
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(InvalidInputError, match=f"deeper than {MAX_YAML_DEPTH}"):
        load_yaml(deep, "f.yaml")
    with pytest.raises(ManifestError, match="deeper than"):
        parse_manifest("engine:\n  x: " + deep + "\n")


def test_oversized_yaml_refused_before_parsing():
    with pytest.raises(InvalidInputError, match="over the 100-byte limit"):
        load_yaml("a: " + "x" * 200, "f.yaml", max_bytes=100)


def test_plain_yaml_still_loads_like_safe_load():
    text = "a: 1\nb: [x, {c: true}]\nd: null\ne: 2024-01-01\n"
    import yaml

    assert load_yaml(text, "f.yaml") == yaml.safe_load(text)
    assert load_yaml("", "f.yaml") is None
    with pytest.raises(InvalidInputError, match="not valid YAML"):
        load_yaml("a: [", "f.yaml")
    with pytest.raises(InvalidInputError, match="not valid YAML"):
        load_yaml("a: !!python/object:os.system x\n", "f.yaml")


def test_dump_never_writes_aliases():
    shared = [1, 2]
    text = dump_yaml({"a": shared, "b": shared})
    assert "&" not in text and "*" not in text
    assert load_yaml(text, "f.yaml") == {"a": [1, 2], "b": [1, 2]}

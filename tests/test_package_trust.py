"""Issue #11, package trust: a cache entry is re-checked on reuse, and code-loading engine arguments are listed."""

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from llmserve.errors import ExitCode, UntrustedCodeError
from llmserve.formats.engine_trust import code_executing_engine_args, require_code_trust
from llmserve.formats.manifest import parse_manifest
from llmserve.packaging import build_package
from llmserve.packaging.archive import RECORD_NAME
from llmserve.packaging.inspection import inspect_package
from llmserve.packaging.opened import VERIFIED_BY_UNPACK, open_package

GENUINE = "def register():\n    pass\n"
FOREIGN = "import os\nos.system('touch /tmp/pwned')\ndef register():\n    pass\n"
PLUGIN = "plugins/p/plugmod.py"
WEIGHTS = "model_repository/tiny-chat/2/weights/model.safetensors"


@pytest.fixture
def pkg(tmp_path) -> Path:
    src = tmp_path / "src"
    (src / "model").mkdir(parents=True)
    (src / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (src / "model" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + b"\x00" * 4096)
    (src / "plug").mkdir()
    (src / "plug" / "plugmod.py").write_text(GENUINE)
    (src / "llmserve.yaml").write_text(
        textwrap.dedent("""\
        modelId: tiny-chat
        modelVersion: 2
        backend: vllm
        plugins:
          - name: p
            source: plug
            entryPoint: plugmod:register
        """)
    )
    return build_package(src, tmp_path / "dist").path


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def _first_open(pkg, cache):
    first = open_package(pkg, cache=cache)
    assert not first.from_cache
    return first.root


def _reopen_is_genuine(pkg, cache, words):
    again = open_package(pkg, cache=cache)
    assert (again.root / PLUGIN).read_text() == GENUINE, "foreign code from the cache would run"
    assert not again.from_cache and again.verification == VERIFIED_BY_UNPACK
    assert again.discarded and words in again.discarded, again.discarded
    # The rebuilt entry is reused from then on.
    third = open_package(pkg, cache=cache)
    assert third.from_cache and third.discarded is None and third.verification.startswith("cache: ")
    return again


def test_planted_plugin_code_in_cache_is_not_run(pkg, cache):
    root = _first_open(pkg, cache)
    (root / PLUGIN).write_text(FOREIGN)
    _reopen_is_genuine(pkg, cache, "changed since it was unpacked")


def test_planted_code_of_the_same_size_and_date_is_caught(pkg, cache):
    root = _first_open(pkg, cache)
    st = (root / PLUGIN).stat()
    (root / PLUGIN).write_text(GENUINE.replace("pass", "exit"))
    os.utime(root / PLUGIN, ns=(st.st_atime_ns, st.st_mtime_ns))
    _reopen_is_genuine(pkg, cache, "changed since it was unpacked")


def test_planted_entry_from_scratch_is_not_trusted(pkg, cache, tmp_path):
    # The shape: a folder under the right name holding the genuine index and foreign code.
    genuine = _first_open(pkg, cache)
    planted = tmp_path / "planted"
    shutil.copytree(genuine, planted)
    (planted / PLUGIN).write_text(FOREIGN)
    (planted / RECORD_NAME).unlink(missing_ok=True)  # as an attacker (or an older llmserve) would leave it
    shutil.rmtree(genuine)
    planted.rename(genuine)
    _reopen_is_genuine(pkg, cache, RECORD_NAME)


def test_extra_file_in_cache_entry_discards_it(pkg, cache):
    root = _first_open(pkg, cache)
    (root / "plugins" / "p" / "sitecustomize.py").write_text(FOREIGN)
    again = _reopen_is_genuine(pkg, cache, "not part of the package")
    assert not (again.root / "plugins" / "p" / "sitecustomize.py").exists()


def test_missing_file_in_cache_entry_discards_it(pkg, cache):
    root = _first_open(pkg, cache)
    (root / PLUGIN).unlink()
    _reopen_is_genuine(pkg, cache, "is missing")


def test_link_in_cache_entry_discards_it(pkg, cache, tmp_path):
    root = _first_open(pkg, cache)
    (tmp_path / "evil.py").write_text(FOREIGN)
    (root / PLUGIN).unlink()
    (root / PLUGIN).symlink_to(tmp_path / "evil.py")
    _reopen_is_genuine(pkg, cache, "not a regular file")


def test_cache_entry_writable_by_others_discarded(pkg, cache):
    root = _first_open(pkg, cache)
    root.chmod(0o777)
    _reopen_is_genuine(pkg, cache, "writable by other users")


def test_cache_entry_replaced_by_a_link_discarded(pkg, cache, tmp_path):
    root = _first_open(pkg, cache)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root, elsewhere)
    (elsewhere / PLUGIN).write_text(FOREIGN)
    shutil.rmtree(root)
    root.symlink_to(elsewhere, target_is_directory=True)
    _reopen_is_genuine(pkg, cache, "not a plain folder")
    assert (elsewhere / PLUGIN).read_text() == FOREIGN  # the link's target is not ours to delete


def test_planted_bytecode_is_removed_before_use(pkg, cache):
    # Python prefers a matching .pyc over the source; one planted beside verified code would run instead.
    root = _first_open(pkg, cache)
    pycache = root / "plugins" / "p" / "__pycache__"
    pycache.mkdir()
    (pycache / "plugmod.cpython-311.pyc").write_bytes(b"planted")
    again = open_package(pkg, cache=cache)
    assert not pycache.exists()
    assert again.from_cache and again.discarded is None


def test_weights_rehashed_only_when_their_metadata_moved(pkg, cache):
    root = _first_open(pkg, cache)
    reused = open_package(pkg, cache=cache)
    assert reused.from_cache and "1 safetensors file(s) unchanged" in reused.verification
    # Same bytes rewritten (a copy-up, a restore): metadata moves, the hash still matches, the entry stays.
    data = (root / WEIGHTS).read_bytes()
    (root / WEIGHTS).unlink()
    (root / WEIGHTS).write_bytes(data)
    again = open_package(pkg, cache=cache)
    assert again.from_cache and again.discarded is None and "0 safetensors" in again.verification
    record = json.loads((root / RECORD_NAME).read_text())
    assert record["files"][WEIGHTS]["ino"] == (root / WEIGHTS).stat().st_ino  # refreshed for next time


def test_changed_weights_discard_the_entry(pkg, cache):
    root = _first_open(pkg, cache)
    with open(root / WEIGHTS, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x01")
    again = open_package(pkg, cache=cache)
    assert (again.root / WEIGHTS).read_bytes()[100] == 0, "altered weights from the cache would be served"
    assert again.discarded and "changed since it was unpacked" in again.discarded


def test_inspect_reports_the_cache_it_did_not_verify(pkg, cache):
    report = inspect_package(pkg, cache=cache)
    assert report.to_dict()["cache"]["state"] == "absent"
    root = _first_open(pkg, cache)
    assert inspect_package(pkg, cache=cache).cache.state == "matches"
    (root / PLUGIN).write_text(FOREIGN)
    report = inspect_package(pkg, cache=cache)
    data = report.to_dict()
    assert data["verified"] is True  # the archive itself is genuine
    assert data["cache"]["state"] == "does-not-match" and "plugmod.py" in data["cache"]["detail"]
    assert "discards and rebuilds" in report.cache.describe()
    assert (root / PLUGIN).read_text() == FOREIGN  # inspect only reads


# --- engine arguments that load code ---------------------------------------------------------------


@pytest.mark.parametrize(
    "engine, keys",
    [
        ({"max_model_len": 512, "trust_remote_code": False, "worker_cls": "auto", "scheduler_cls": None}, []),
        ({"trust_remote_code": True}, ["trust_remote_code"]),
        ({"worker_extension_cls": "pkg.ext.Ext", "worker_cls": "pkg.W"}, ["worker_cls", "worker_extension_cls"]),
        ({"scheduler_cls": "pkg.S", "logits_processors": ["pkg:P"]}, ["scheduler_cls", "logits_processors"]),
        ({"reasoning_parser_plugin": "/x/parser.py"}, ["reasoning_parser_plugin"]),
        ({"logging_config": {"pylogging_config_file": "x.json"}}, ["logging_config"]),
        (
            {"kv_transfer_config": {"kv_connector_module_path": "evil"}, "ec_transfer_config": {"kv_role": "x"}},
            ["kv_transfer_config.kv_connector_module_path"],
        ),
        ({"compilation_config": {"backend": "inductor"}}, []),
        ({"compilation_config": {"backend": "evil.backend"}}, ["compilation_config.backend"]),
    ],
)
def test_code_executing_engine_args_listed(engine, keys):
    assert [a.key for a in code_executing_engine_args(engine)] == keys


def test_trust_required_for_code_loading_manifest():
    manifest = parse_manifest("modelId: m\nmodelVersion: 1\nbackend: vllm\nengine:\n  trust_remote_code: true\n")
    with pytest.raises(UntrustedCodeError) as info:
        require_code_trust(manifest.engine, trusted=False, source="m-1.llmpkg")
    assert "engine.trust_remote_code" in info.value.message and "--trust-remote-code" in info.value.hint
    assert info.value.exit_code == ExitCode.INTEGRITY
    assert [a.key for a in require_code_trust(manifest.engine, trusted=True, source="x")] == ["trust_remote_code"]
    assert require_code_trust({"max_model_len": 8}, trusted=False, source="x") == []

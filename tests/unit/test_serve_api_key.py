"""The server's API key sources: one at a time, and options copied after the file was read stay valid."""

from __future__ import annotations

import dataclasses

import pytest

from llmserve.serve.options import API_KEY_ENV, ApiKeyError, ServeOptions


@pytest.fixture()
def key_file(tmp_path):
    path = tmp_path / "key"
    path.write_text("file-key\n")
    path.chmod(0o600)
    return path


def test_a_copy_of_options_read_from_a_key_file_is_still_valid(key_file, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    opts = ServeOptions(package="p", api_key_file=key_file)
    assert opts.api_key == "file-key"
    # serve copies its options once packages are resolved (a store reference becomes a cached path)
    assert dataclasses.replace(opts, package="q").api_key == "file-key"


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_key_file_and_another_source_are_refused(key_file, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv(API_KEY_ENV, "env-key")
        kwargs = {}
    else:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
        kwargs = {"api_key": "flag-key"}
    with pytest.raises(ApiKeyError, match="given twice"):
        ServeOptions(package="p", api_key_file=key_file, **kwargs)

"""Issue #11 (constraint part): the constraint caches are bounded in bytes, and a bad cache file
can neither disable a constraint nor crash the engine."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from transformers import AutoTokenizer

from llmserve.constraints import Vocab, compile_constraint, load_cached
from llmserve.constraints import compiler as compiler_mod
from llmserve.constraints.disk_cache import checksum, checksum_numpy
from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.memory_cache import MemoryCache
from llmserve.constraints.native import native


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)))


@pytest.fixture(scope="module")
def wide_vocab(vocab):
    """The same tokens in a 100k-wide logits row (12.5 KB a mask row), as a real model's would be."""
    return Vocab(list(vocab.tokens), vocab.eos_ids, 100_000)


@pytest.fixture
def limits_of():
    yield lambda **kw: set_limits(Limits(**kw))
    set_limits(None)
    compiler_mod._MEMORY.clear()


def distinct(i: int) -> dict:
    return {"regex": f"item-{i}-[a-z]{{1,{3 + i % 5}}}"}


# ---- 2. bounded caches ------------------------------------------------------------------------


def test_memory_cache_is_bounded_in_bytes_least_recently_used_first():
    cache = MemoryCache(lambda: 100)
    for k in "abc":
        cache.put(k, [k], 40)
    assert "a" not in cache and cache.nbytes == 80  # a went first
    cache.get("b")  # b is now the most recent
    cache.put("d", ["d"], 40)
    assert "c" not in cache and "b" in cache and "d" in cache
    cache.put("huge", ["h"], 1000)  # over the whole budget: not kept, nothing evicted for it
    assert "huge" not in cache and cache.nbytes == 80


def test_memory_cache_counts_shared_arrays_once_for_all_values_naming_them():
    cache = MemoryCache(lambda: 1000)
    common, other = np.zeros(50, np.uint32), np.zeros(25, np.uint32)  # 200 and 100 bytes
    cache.put("a", ["a"], 100, shared=[common])
    cache.put("b", ["b"], 100, shared=[common, other, common])  # named twice: still one array
    assert cache.nbytes == 100 + 100 + 200 + 100
    cache.put("b", ["b"], 150, shared=[other])  # replaced: b no longer names common
    assert cache.nbytes == 100 + 150 + 200 + 100
    cache.discard("a")  # the last value naming common
    assert cache.nbytes == 150 + 100
    for k in "cdefgh":
        cache.put(k, [k], 150, shared=[other])
    assert "b" not in cache and cache.nbytes == 6 * 150 + 100  # b evicted; other still counted, once
    cache.put("huge", ["h"], 900, shared=[common])  # with its shared array over the budget: not kept
    assert "huge" not in cache and cache.nbytes == 1000
    cache.clear()
    assert cache.nbytes == 0


def test_an_evicted_form_in_use_is_shared_not_recompiled():
    """A running request holds its form: eviction drops only the cache's reference, and the same
    constraint asked again finds that very object (no second copy) until the request lets go."""

    class Form:
        pass

    cache = MemoryCache(lambda: 100)
    held = Form()  # the processor's reference (ConstraintLogitsProcessor.constrained)
    cache.put("held", held, 80, weak=True)
    cache.put("other", Form(), 80, weak=True)
    assert "held" not in cache  # evicted from the budgeted part...
    assert cache.get("held") is held  # ...but found while in use
    del held
    gc.collect()
    assert cache.get("held") is None


def test_compiled_forms_in_memory_stay_within_the_budget(wide_vocab, limits_of):
    vocab = wide_vocab
    limits_of(cache_mb=1)
    compiler_mod._MEMORY.clear()
    per_form = compile_constraint(distinct(0), vocab, cache_dir=False).nbytes
    n = (1 << 20) // per_form + 10  # more than the budget holds
    kept = []
    for i in range(n):
        kept.append(compile_constraint(distinct(i), vocab, cache_dir=False))
    assert compiler_mod._MEMORY.nbytes <= 1 << 20
    assert sum(k.nbytes for k in kept) > 1 << 20  # the budget did bound something
    # the most recent stays cached; an evicted one still in use (held in `kept`) is the same object
    assert compile_constraint(distinct(n - 1), vocab, cache_dir=False) is kept[n - 1]
    assert compile_constraint(distinct(0), vocab, cache_dir=False) is kept[0]


def test_a_lazy_form_counts_the_rows_it_computed(wide_vocab, limits_of):
    """A lazy form's mask buffer is allocated whole but only the rows requests reach are ever
    written (and backed by memory): the cache counts those, again at each use, not S x V bits."""
    limits_of()
    form = compile_constraint({"regex": "[a-z]{1,40}@[a-z]{1,40}"}, wide_vocab, cache_dir=False)
    row = wide_vocab.words * 4
    # the automaton as the native construction gives it: byte classes, not a 1 KB-per-state table
    assert form.transitions is not None
    classes, columns = form.transitions
    assert columns.shape == (form.num_states, int(classes.max()) + 1) and columns.shape[1] < 16
    automaton = classes.nbytes + columns.nbytes + form.accept.nbytes
    assert not form.compressed and form.num_states > 40
    assert form.nbytes == automaton + form.native.ready_rows * row  # the start row and the dead row
    assert form.dense_bytes == automaton + (form.num_states + 1) * row
    assert compiler_mod._MEMORY.nbytes == form.nbytes
    for state in range(1, 11):
        form.allowed(state)
    assert form.native.ready_rows >= 12
    grown = form.nbytes
    assert grown == automaton + form.native.ready_rows * row
    assert compile_constraint({"regex": "[a-z]{1,40}@[a-z]{1,40}"}, wide_vocab, cache_dir=False) is form
    assert compiler_mod._MEMORY.nbytes == grown  # counted again at this use


def _anon_rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def test_a_lazy_form_holds_only_the_rows_it_computed(wide_vocab, limits_of):
    """What the cache counts is what the process holds: rows written far apart in a lazy form's
    buffer back a few pages each, not a huge page (2 MiB, ~160 rows here) each, as a numpy array
    this large would (numpy asks the kernel for huge pages)."""
    limits_of()
    form = compile_constraint(
        {"regex": "[a-z]{1000}[0-9]{1000}[A-Z]{1000}"}, wide_vocab, cache_dir=False
    )  # 3,001 rows of 12.5 KB: a 37 MB buffer
    assert not form.compressed and form.num_states == 3001
    before = _anon_rss_kb()
    for state in range(1, 3001, 300):  # ten rows 3.7 MB apart
        form.allowed(state)
    grown_kb = _anon_rss_kb() - before
    assert grown_kb < 4 * 1024, f"ten computed rows (125 KB) grew the process by {grown_kb} KiB"


def test_disk_cache_is_bounded_in_bytes(wide_vocab, tmp_path, limits_of):
    vocab = wide_vocab
    limits_of(disk_cache_mb=1)
    # compressed forms are a few KB each: write until twice the budget went through the folder
    forms, written = [], 0
    while written <= 2 << 20:
        forms.append(compile_constraint(distinct(len(forms)), vocab, cache_dir=tmp_path).complete())
        written += (tmp_path / f"{forms[-1].key}.bin").stat().st_size  # the newest file is never trimmed
    files = list(tmp_path.glob("*.bin"))  # the forms, and the automata validation keeps (dfa-*.bin)
    assert sum(f.stat().st_size for f in files) <= 1 << 20
    assert (tmp_path / f"{forms[-1].key}.bin").exists()  # the newest is kept
    assert not (tmp_path / f"{forms[0].key}.bin").exists()  # the least recently used went


# ---- 3. verified cache files --------------------------------------------------------------------


def test_checksum_native_equals_numpy():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 63, 64, 1000, 4099):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        for seed in (0, 12345, (1 << 64) - 1):
            assert native.checksum(data, seed) == checksum_numpy(data, seed) == checksum(data.tobytes(), seed)
    a = rng.integers(0, 256, 4096, dtype=np.uint8)
    b = a.copy()
    b[[100, 200]] = b[[200, 100]] + 1  # any change, moved words included
    assert checksum(a) != checksum(b)


def _poison(path, offset_from_end: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end : -offset_from_end + len(value)] = value
    path.write_bytes(bytes(data))


def test_poisoned_file_is_ignored_with_a_warning_and_rewritten(vocab, tmp_path, caplog):
    spec = {"regex": "[0-9]{3}-[a-z]{2}"}
    first = compile_constraint(spec, vocab, cache_dir=tmp_path).complete()
    good = np.array(first.masks)
    path = tmp_path / f"{first.key}.bin"
    before = path.read_bytes()
    # every mask bit cleared but the file's size and header intact: it used to load, disabling the constraint
    _poison(path, good.nbytes + 64, b"\0" * good.nbytes)
    compiler_mod._MEMORY.clear()
    with caplog.at_level(logging.WARNING, logger="llmserve.constraints.disk_cache"):
        assert load_cached(spec, vocab, tmp_path) is None
        rebuilt = compile_constraint(spec, Vocab(list(vocab.tokens), vocab.eos_ids, vocab.size), cache_dir=tmp_path)
    assert "checksum mismatch" in caplog.text and "it will be rebuilt" in caplog.text
    np.testing.assert_array_equal(rebuilt.complete().masks, good)
    assert path.read_bytes() == before  # rewritten (atomically: no temporary file left)
    assert not list(tmp_path.glob(".tmp-*"))
    # stored under another key (a file copied or renamed over this one): ignored too
    other = tmp_path / ("0" * 64 + ".bin")
    other.write_bytes(before)
    with caplog.at_level(logging.WARNING, logger="llmserve.constraints.disk_cache"):
        from llmserve.constraints.disk_cache import read_cache

        assert read_cache(other, vocab) is None
    assert "stored under another key" in caplog.text


def test_file_truncated_or_rewritten_while_in_use_cannot_crash(tmp_path, tiny_model_dir):
    """The form from a cache hit is a copy in memory: truncating the file (which used to be mapped:
    SIGBUS on the next fill) or rewriting it changes nothing for the running request."""
    code = f"""
        import os, numpy as np
        from transformers import AutoTokenizer
        from llmserve.constraints import Vocab, compile_constraint, load_cached
        from llmserve.constraints.native import native, native_vocab
        vocab = Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained({str(tiny_model_dir)!r}))
        spec = {{"regex": "[a-z]{{2,9}}@[a-z]{{2,9}}[.](com|org)"}}
        first = compile_constraint(spec, vocab, cache_dir={str(tmp_path)!r}).complete()
        hit = load_cached(spec, vocab, {str(tmp_path)!r})
        assert hit is not None
        path = os.path.join({str(tmp_path)!r}, first.key + ".bin")
        with open(path, "r+b") as f:
            f.truncate(100)
        batch = native.Batch(native_vocab(vocab))
        batch.set_row(0, hit.native, [])
        batch.sync(1)
        out = np.zeros((1, vocab.words), np.uint32)
        batch.fill(out)
        assert (out[0] == first.masks[hit.start]).all()
        assert (hit.masks == first.masks).all()
        with open(path, "wb") as f:
            f.write(b"x" * 5000)
        batch.fill(out)
        assert (out[0] == first.masks[hit.start]).all()
        print("ok")
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "ok"


def test_cache_hit_is_a_private_copy(vocab, tmp_path):
    spec = {"regex": "[0-9]+"}
    first = compile_constraint(spec, vocab, cache_dir=tmp_path).complete()
    hit = load_cached(spec, vocab, tmp_path)
    assert hit is not None and hit.masks.flags.writeable
    np.testing.assert_array_equal(hit.masks, first.masks)
    os.unlink(tmp_path / f"{first.key}.bin")
    assert hit.allowed(hit.start).any()

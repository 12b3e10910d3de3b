"""The native core (``_core``: C++ in csrc/, built by the package build through CMakeLists.txt, typed
in ``_core.pyi``).

The only module that imports the extension. A missing build fails the call that needs the core with
a ConstraintError that says how to build it, while the pure-Python reference (``reference.py``,
``backend="python"``) keeps working without it.
"""

from __future__ import annotations

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.vocab import Vocab

NATIVE_IMPORT_ERROR: ImportError | None
try:
    from llmserve.constraints import _core as native
except ImportError as exc:  # pragma: no cover - only when the extension was not built
    # typed as the module (the stub) for every caller; require_native() guards the None at runtime
    native = None  # type: ignore[assignment]
    NATIVE_IMPORT_ERROR = exc
else:
    NATIVE_IMPORT_ERROR = None


def require_native() -> None:
    """Raise a ConstraintError that says how to build the core when it was not built."""
    if native is None:
        raise ConstraintError(
            f"the native constraint core is not built ({NATIVE_IMPORT_ERROR})",
            hint="Reinstall llmserve from source: pip install --no-deps --no-build-isolation -e .",
        )


def native_vocab(vocab: Vocab) -> native.Vocab:
    """The ``_core.Vocab`` for ``vocab``, built once per Vocab object (building it sorts every token
    into the trie)."""
    nv = getattr(vocab, "_native", None)
    if nv is None:
        require_native()
        offsets, data = vocab.packed()
        nv = native.Vocab(offsets, data, list(vocab.eos_ids), vocab.size)
        object.__setattr__(vocab, "_native", nv)
    return nv

"""Compatibility of engine stacks: the knowledge base (data/matrix.yaml), lock resolution, and the
static checks behind `llmserve check-compat`.

Public surface:
    load_knowledge_base()        the version matrix as typed data
    resolve_lock(...)            a Lock for a target (llmserve lock)
    write_lock / export_requirements
    run_checks(...)              CheckReport (llmserve check-compat)
    open_vllm_source(...)        a read-only view of a vLLM distribution (installed or wheel), never imported
    check_surface(...)           resolve an import surface statically

Nothing here imports vLLM or torch: distributions are read as files (AST), so the checks are cheap,
safe against a broken environment, and work against wheels for platforms this machine cannot run.
"""

from __future__ import annotations

from llmserve.compat.check import CheckReport, CheckRow, run_checks
from llmserve.compat.kb import KnowledgeBase, load_knowledge_base
from llmserve.compat.resolve import LockOutcome, export_requirements, resolve_lock, write_lock
from llmserve.compat.surface import SymbolResult, VllmSource, check_surface, open_vllm_source

__all__ = [
    "CheckReport",
    "CheckRow",
    "KnowledgeBase",
    "LockOutcome",
    "SymbolResult",
    "VllmSource",
    "check_surface",
    "export_requirements",
    "load_knowledge_base",
    "open_vllm_source",
    "resolve_lock",
    "run_checks",
    "write_lock",
]

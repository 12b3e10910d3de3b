"""An engine is shut down once: AsyncLLM.__del__ would shut it down again when collected, at
interpreter teardown when something still holds it, and fail there on vLLM's cleared globals."""

from __future__ import annotations

import gc
from typing import ClassVar

from llmserve.serve.engine import EngineHandle, shut_down


class FakeEngine:
    """AsyncLLM's shape here: shutdown(), and a __del__ that shuts down again."""

    calls: ClassVar[list[str]] = []

    def shutdown(self) -> None:
        FakeEngine.calls.append("shutdown")

    def __del__(self) -> None:
        FakeEngine.calls.append("__del__")
        self.shutdown()


def test_an_engine_shut_down_is_not_shut_down_again_when_collected():
    FakeEngine.calls = []
    engine = FakeEngine()
    handle = EngineHandle(
        engine=engine, state=None, model_name="m", supported_tasks=(), max_model_len=1, constraints=None
    )
    handle.shutdown()
    assert FakeEngine.calls == ["shutdown"]
    assert isinstance(engine, FakeEngine) and type(engine).__name__ == "FakeEngine"
    del engine, handle
    gc.collect()
    assert FakeEngine.calls == ["shutdown"]


def test_an_engine_not_shut_down_still_shuts_down_when_collected():
    FakeEngine.calls = []
    engine = FakeEngine()
    del engine
    gc.collect()
    assert FakeEngine.calls == ["__del__", "shutdown"]


def test_engines_shut_down_share_one_class_per_engine_class():
    first, second = FakeEngine(), FakeEngine()
    shut_down(first)
    shut_down(second)
    assert type(first) is type(second) and issubclass(type(first), FakeEngine)

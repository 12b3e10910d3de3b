"""Deploy state and routing tables without processes: the SQLite state, the journal, red-black step tables."""

from __future__ import annotations

from llmserve.deploy.local_target import without
from llmserve.deploy.rollout import step_routes
from llmserve.deploy.state import Member, Routes, StateStore


def test_state_survives_reopen_and_journal(tmp_path):
    s = StateStore(tmp_path / "st")
    s.create_deployment("d", "m", "127.0.0.1", 1234, {"idle_timeout_s": 5})
    inst = s.add_instance("d", 1, "/p.llmpkg", "abc", {"io": "x"}, "red-black", 4321)
    r = s.begin_rollout("d", "red-black", "/p.llmpkg", None, [10, 100], Routes("m"))
    s.journal(r.id, to_instance=inst.id, step_index=0, phase="shifting", event="step 1")
    gen = s.set_routes("d", Routes("m", [inst.member(100)], {1: [inst.member()]}))
    s.close()
    s2 = StateStore(tmp_path / "st")
    assert s2.open_rollout("d").step_index == 0 and s2.open_rollout("d").to_instance == inst.id
    g2, routes = s2.routes("d")
    assert g2 == gen and routes.weights() == {inst.id: 100} and list(routes.pinned) == [1]
    assert s2.require("d").config == {"idle_timeout_s": 5}
    assert any("step 1" in e["message"] for e in s2.events("d"))


def test_weights_and_without():
    class New:
        id, model_version = 3, 2

        def member(self, w=0):
            return Member(3, 2, "http://n", w)

    good = Routes("m", [Member(1, 1, "http://a", 100)], {1: [Member(1, 1, "http://a")]})
    step = step_routes(good, [m for m in good.default], New(), 25)
    assert step.weights() == {1: 75, 3: 25} and sorted(step.pinned) == [1, 2]
    assert step_routes(good, good.default, New(), 100).weights() == {3: 100}
    back = without(step, {3})
    assert back.weights() == {1: 100} and sorted(back.pinned) == [1]

"""Filter and prioritize read the pod in the request body once (``PodView.of``): the
routing (a pod of no GPU or not) and the demand take the same view."""

from __future__ import annotations

from typing import Any

import pytest
from extender_builders import args, make_app, node, training

from contracts.pod import PodView


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pod names read from a decoded body (a view passed on is not a read)."""
    calls: list[str] = []
    real = PodView.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[PodView], pod: Any) -> PodView:
        if not isinstance(pod, PodView):
            calls.append(str((pod.get("metadata") or {}).get("name")))
        return real(cls, pod)
    monkeypatch.setattr(PodView, "of", classmethod(counted))
    return calls


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_each_verb_reads_the_pod_once(reads: list[str], verb: str) -> None:
    app, _, _, _ = make_app([node("n1", 4), node("n2", 4)])
    p = training("p", util=25, mem=12000, uid="p")
    with app.test_client() as c:
        reads.clear()
        answer = c.post(verb, json=args(p, ["n1", "n2"]))
    assert answer.status_code == 200
    assert reads == ["p"]


def test_a_pod_of_no_gpu_is_read_once_too(reads: list[str]) -> None:
    app, _, _, _ = make_app([node("n1", 4)])
    p = training("cpu-only", util=25, mem=12000, uid="c")
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    with app.test_client() as c:
        reads.clear()
        assert c.post("/filter", json=args(p, ["n1"])).status_code == 200
    assert reads == ["cpu-only"]

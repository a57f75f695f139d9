"""The connection budget on its own: per-client shares inside a total."""

from __future__ import annotations

from webhook.connections import ClientBudget


def test_a_client_gets_its_share_and_the_total_caps_everyone() -> None:
    budget = ClientBudget(total=5, per_client=2)
    assert [budget.admit("a") for _ in range(3)] == [None, None, "client"]
    assert [budget.admit("b") for _ in range(2)] == [None, None]
    assert budget.admit("c") is None
    assert budget.admit("d") == "full"  # 5 open: nobody else
    budget.release("a")
    assert budget.held_by("a") == 1
    assert budget.admit("d") is None
    for client in ("a", "b", "b", "c", "d"):
        budget.release(client)
    assert budget.open == 0
    assert budget.held_by("b") == 0

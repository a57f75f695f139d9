"""What a refused pod's FailedScheduling event says, on two nodes and on a thousand.

kube-scheduler counts identical FailedNodes reasons and joins ``"<count>
<reason>"`` in sorted order (``framework.FitError.Error``); the event is cut
at 1,024 bytes. :func:`scheduler_message` rebuilds that message here so the
tests read what a user reads.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest

from plugin.extender import reasons
from plugin.extender.protocol import parse_args
from plugin.extender.reasons import REASONS_BUDGET, node_reasons
from plugin.extender.service import ExtenderCore
from plugin.placement.pod import ContainerRequest
from plugin.placement.refusals import (
    HELD,
    NO_SINGLE_GPU,
    REUSE,
    SHORT,
    WHOLE,
    RefusalKey,
    range_words,
    refusal_words,
)
from tests.extender.builders import RESOURCE, ledger, pod

EVENT_LIMIT = 1024
"""validation.NoteLengthLimit: kube-scheduler's truncateMessage cuts the event here."""

APP = (ContainerRequest("main", "app", 70),)


def scheduler_message(failed: Mapping[str, str], nodes: int) -> str:
    """``FitError.Error()`` for nodes refused by the extender alone."""
    counted = sorted(f"{count} {reason}" for reason, count in Counter(failed.values()).items())
    return f"0/{nodes} nodes are available: {', '.join(counted)}."


def fragmented(rnd: random.Random, name: str) -> str:
    """A node of 8 GPUs, none with 70 free units, each with its own figures."""
    return ledger([rnd.choice(range(40, 101, 10)) for _ in range(8)], node=name).model_dump_json()


def test_a_few_nodes_keep_their_own_figures() -> None:
    core = ExtenderCore(resource=RESOURCE)
    core.ledger.set_node("a", ledger([60, 60], node="a").model_dump_json())
    core.ledger.set_node("b", ledger([70, 50], node="b").model_dump_json())
    failed = core.filter(parse_args({"Pod": pod(70), "NodeNames": ["a", "b"]}))["FailedNodes"]
    assert scheduler_message(failed, 2) == (
        "0/2 nodes are available: "
        "1 no single GPU has 70 free units (largest 40; 80 free in total), "
        "1 no single GPU has 70 free units (largest 50; 80 free in total)."
    )


@pytest.mark.parametrize("bulk", [True, False], ids=["every node at once", "node by node"])
def test_a_thousand_fragmented_nodes_read_as_one_reason_with_ranges(bulk: bool) -> None:
    rnd = random.Random(14)
    core = ExtenderCore(resource=RESOURCE, bulk=bulk)
    names = [f"node-{n:04d}" for n in range(1000)]
    for name in names:
        core.ledger.set_node(name, fragmented(rnd, name))
    failed = core.filter(parse_args({"Pod": pod(70), "NodeNames": names}))["FailedNodes"]
    assert len(failed) == 1000
    message = scheduler_message(failed, 1000)
    # Each node's own words would be dozens of distinct reasons, cut mid-list.
    assert message == (
        "0/1000 nodes are available: "
        "1000 no single GPU has 70 free units (largest 20 to 60; 80 to 420 free in total)."
    )
    assert len(message) < EVENT_LIMIT


def test_both_paths_summarise_alike_with_several_rules() -> None:
    rnd = random.Random(7)
    cores = [ExtenderCore(resource=RESOURCE, bulk=bulk) for bulk in (True, False)]
    names = [f"n{n}" for n in range(300)]
    for name in names:
        used = [rnd.choice(range(0, 101, 10)) for _ in range(4)]
        unhealthy = [i for i in range(4) if rnd.random() < 0.1]
        for core in cores:
            core.ledger.set_node(
                name, ledger(used, unhealthy=unhealthy, node=name).model_dump_json()
            )
    # 2.7 GPUs: two completely free GPUs and 70 units on a third
    args = parse_args({"Pod": pod(270), "NodeNames": names})
    bulk, plain = (core.filter(args) for core in cores)
    assert bulk == plain
    message = scheduler_message(bulk["FailedNodes"], len(names))
    assert len(message) < EVENT_LIMIT
    assert 'container "c0" needs 2 completely free GPUs and 0 to 1 are (' in message
    assert 'container "c0" needs 270 units, 0 to 260 free on healthy GPUs; up to 2 GPUs' in message
    # one node of this kind: its own figures
    assert "1 no single GPU has 70 free units (largest 100; 270 free in total)" in message


def spanned(keys: list[RefusalKey]) -> str:
    """range_words over ``keys`` (one kind, one container), as node_reasons calls it."""
    columns = list(zip(*(key[2:] for key in keys), strict=True))
    kind, index = keys[0][:2]
    return range_words(kind, index, [min(c) for c in columns], [max(c) for c in columns], APP)


def test_each_figure_spans_what_the_nodes_quote() -> None:
    keys: list[RefusalKey] = [(NO_SINGLE_GPU, 0, 70, 10, 80, 0), (NO_SINGLE_GPU, 0, 70, 60, 230, 0)]
    assert spanned(keys) == (
        "no single GPU has 70 free units (largest 10 to 60; 80 to 230 free in total)"
    )
    same: list[RefusalKey] = [(NO_SINGLE_GPU, 0, 70, 40, 80, 0)] * 2
    assert spanned(same) == refusal_words(same[0], APP)


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        pytest.param(
            [(SHORT, 0, 70, 20, 0, 0), (SHORT, 0, 70, 40, 2, 0)],
            'container "main" needs 70 units, 20 to 40 free on healthy GPUs; '
            "up to 2 GPUs unhealthy",
            id="short, some unhealthy",
        ),
        pytest.param(
            [(SHORT, 0, 70, 20, 1, 0), (SHORT, 0, 70, 40, 1, 0)],
            'container "main" needs 70 units, 20 to 40 free on healthy GPUs; 1 GPU unhealthy',
            id="short, one unhealthy each",
        ),
        pytest.param(
            [(WHOLE, 0, 1, 0, 30, 0), (WHOLE, 0, 1, 0, 90, 0)],
            'container "main" needs 1 completely free GPU and 0 are (30 to 90 units free in total)',
            id="whole",
        ),
        pytest.param(
            [(WHOLE, 0, 2, 1, 130, 0), (WHOLE, 0, 2, 1, 190, 0)],
            'container "main" needs 2 completely free GPUs and 1 is '
            "(130 to 190 units free in total)",
            id="whole, one free each",
        ),
        pytest.param(
            [(HELD, 0, 20, 50, 30, 90), (HELD, 0, 20, 50, 40, 120)],
            'container "main": the GPU holding its 20 reused units has no room for 50 more '
            "(largest free 30 to 40; 90 to 120 free in total)",
            id="held",
        ),
        pytest.param(
            [(REUSE, 0, 50, 150, 2, 0), (REUSE, 0, 50, 150, 3, 0)],
            'container "main" would reuse 50 of the 150 units its pod\'s init containers hold '
            "on 2 to 3 GPUs, and the kubelet picks reused units in no fixed order; give the "
            "init containers a share of one GPU, or the container at least as many units",
            id="reuse",
        ),
    ],
)
def test_every_rule_has_words_for_a_range(keys: list[RefusalKey], words: str) -> None:
    assert spanned(keys) == words


def test_refusals_of_different_rules_are_never_merged() -> None:
    keys: list[RefusalKey] = [(SHORT, 0, 70, free, 0, 0) for free in range(20)]
    keys += [(WHOLE, 0, 1, 0, free, 0) for free in range(20)]
    words = node_reasons(keys, APP)
    assert set(words) == {
        'container "main" needs 70 units, 0 to 19 free on healthy GPUs',
        'container "main" needs 1 completely free GPU and 0 are (0 to 19 units free in total)',
    }
    assert words[0] != words[-1]


def test_many_amounts_become_a_range_when_even_groups_do_not_fit() -> None:
    containers = tuple(ContainerRequest(f"c{i}", "app", 70) for i in range(3))
    keys: list[RefusalKey] = [
        (SHORT, index, need, free, 0, 0)
        for index in range(3)
        for need in range(50, 70)
        for free in (10, 20)
    ]
    words = node_reasons(keys, containers)
    assert set(words) == {
        f'container "c{i}" needs 50 to 69 units, 10 to 20 free on healthy GPUs' for i in range(3)
    }


def test_own_words_up_to_the_budget_and_not_one_reason_more() -> None:
    keys: list[RefusalKey] = [(NO_SINGLE_GPU, 0, 70, largest, 80, 0) for largest in range(60)]
    own = [refusal_words(key, APP) for key in keys]
    fit = 0
    while sum(len(w) + 7 for w in own[: fit + 1]) <= REASONS_BUDGET:
        fit += 1
    assert 2 < fit < len(keys)
    assert node_reasons(keys[:fit], APP) == own[:fit]
    summarised = node_reasons(keys[: fit + 1], APP)
    assert set(summarised) == {
        f"no single GPU has 70 free units (largest 0 to {fit}; 80 free in total)"
    }


def test_words_that_fill_the_budget_exactly_still_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    keys: list[RefusalKey] = [(NO_SINGLE_GPU, 0, 70, largest, 80, 0) for largest in range(5)]
    own = [refusal_words(key, APP) for key in keys]
    exact = sum(len(w) + 7 for w in own)
    monkeypatch.setattr(reasons, "REASONS_BUDGET", exact)
    assert node_reasons(keys, APP) == own
    monkeypatch.setattr(reasons, "REASONS_BUDGET", exact - 1)
    assert node_reasons(keys, APP) != own


def test_the_budget_leaves_room_for_the_schedulers_own_words() -> None:
    # What the scheduler adds: its head, and a failed preemption's sentence.
    head = len("0/5000 nodes are available: .")
    preemption = len(
        " preemption: 0/5000 nodes are available: 5000 No preemption victims found for "
        "incoming pod."
    )
    assert head + REASONS_BUDGET + preemption < EVENT_LIMIT - 200

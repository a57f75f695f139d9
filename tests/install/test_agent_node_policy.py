"""The ValidatingAdmissionPolicy that docs/agent.md offers to narrow the agent's
``nodes patch``: its CEL, taken from the document, admits exactly the label
changes the agent makes and nothing else (evaluated with cel-python, with
``has()`` as strict as cel-go's)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from tests.install.cel import compile_condition
from tests.install.chart import NAMESPACE, component, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
AGENT = "system:serviceaccount:metagpu:metagpu-agent"
"""The agent's ServiceAccount in the chart rendered with its defaults (checked below)."""
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def policy() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    for block in blocks:
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "ValidatingAdmissionPolicy":
                return doc
    raise AssertionError("docs/agent.md has no ValidatingAdmissionPolicy")


def _run(expression: str, activation: dict[str, Any]) -> Any:
    result = compile_condition(expression).evaluate(activation)
    assert not isinstance(result, celpy.evaluation.CELEvalError), f"{expression}: {result!r}"
    return result


def admitted(request: dict[str, Any]) -> list[str]:
    """The messages of the validations ``request`` fails ([] = admitted), or ["not matched"]."""
    spec = policy()["spec"]
    activation: dict[str, Any] = {
        "object": json_to_cel(request["object"]),
        "oldObject": json_to_cel(request["oldObject"]),
        "request": json_to_cel(request),
    }
    if not all(_run(c["expression"], activation) for c in spec["matchConditions"]):
        return ["not matched"]
    variables = {v["name"]: _run(v["expression"], activation) for v in spec["variables"]}
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    return [v["message"] for v in spec["validations"] if not _run(v["expression"], activation)]


def node(labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "node-a"}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {}, **extra}


def review(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    user: str = AGENT,
    node_name: str | None = "node-a",
) -> dict[str, Any]:
    extra = {NODE_CLAIM: [node_name]} if node_name else {}
    return {
        "operation": "UPDATE",
        "userInfo": {"username": user, "extra": extra},
        "object": new,
        "oldObject": old,
    }


BASE = {"kubernetes.io/hostname": "node-a", "metagpu.io/gpu-count": "2"}


def ledger_node(ledger: str, *, other: str | None = None) -> dict[str, Any]:
    """A Node carrying the agent's GPU ledger annotations, the ledger and its promised
    refresh period, as the agent writes them in one patch (and maybe someone else's)."""
    obj = node(BASE)
    notes = {"metagpu.io/gpu-ledger": ledger, "metagpu.io/gpu-ledger-refresh-s": "300"}
    if other is not None:
        notes["example.com/note"] = other
    obj["metadata"]["annotations"] = notes
    return obj


@pytest.mark.parametrize(
    ("old", "new", "kw", "expected"),
    [
        pytest.param(
            node(BASE),
            node({**BASE, "metagpu.io/largest-free-units": "40"}),
            {},
            [],
            id="agent-sets-its-label",
        ),
        pytest.param(
            node(BASE),
            node({"kubernetes.io/hostname": "node-a"}),
            {},
            [],
            id="agent-removes-its-label",
        ),
        pytest.param(node(None), node({"metagpu.io/gpu-count": "0"}), {}, [], id="no-labels-yet"),
        pytest.param(
            node(BASE),
            node({**BASE, "team": "ml"}),
            {},
            ["the metagpu agent may change only metagpu.io/* labels"],
            id="adds-another-label",
        ),
        pytest.param(
            node(BASE),
            node({"metagpu.io/gpu-count": "2"}),
            {},
            ["the metagpu agent may change only metagpu.io/* labels"],
            id="removes-another-label",
        ),
        pytest.param(
            node(BASE),
            node(BASE, spec={"unschedulable": True}),
            {},
            ["the metagpu agent may not change a Node's spec"],
            id="cordons",
        ),
        pytest.param(
            node(BASE, **{}),
            ledger_node('{"v": 1}'),
            {},
            [],
            id="agent-writes-its-ledger",
        ),
        pytest.param(
            ledger_node('{"v": 1}'),
            ledger_node('{"v": 2}'),
            {},
            [],
            id="agent-updates-its-ledger",
        ),
        pytest.param(
            ledger_node('{"v": 1}'),
            node(BASE),
            {},
            [],
            id="agent-removes-its-ledger",
        ),
        pytest.param(
            ledger_node('{"v": 1}'),
            ledger_node('{"v": 1}', other="x"),
            {},
            ["the metagpu agent may change only its metagpu.io/gpu-ledger annotations"],
            id="adds-another-annotation",
        ),
        pytest.param(
            ledger_node('{"v": 1}', other="x"),
            ledger_node('{"v": 1}'),
            {},
            ["the metagpu agent may change only its metagpu.io/gpu-ledger annotations"],
            id="removes-another-annotation",
        ),
        pytest.param(
            node(BASE),
            node({**BASE, "metagpu.io/gpu-count": "3"}),
            {"node_name": "node-b"},
            ["the metagpu agent may change only the Node it runs on"],
            id="another-nodes-agent",
        ),
        pytest.param(
            node(BASE),
            node({**BASE, "metagpu.io/gpu-count": "3"}),
            {"node_name": None},
            ["the metagpu agent may change only the Node it runs on"],
            id="token-without-node-claim",
        ),
        pytest.param(
            node(BASE),
            node({**BASE, "team": "ml"}, spec={"unschedulable": True}),
            {"user": "system:admin"},
            ["not matched"],
            id="someone-else-is-not-judged",
        ),
    ],
)
def test_the_documented_policy(
    old: dict[str, Any], new: dict[str, Any], kw: dict[str, Any], expected: list[str]
) -> None:
    assert admitted(review(copy.deepcopy(old), copy.deepcopy(new), **kw)) == expected


def test_the_policy_names_the_agents_service_account_and_no_other() -> None:
    # The agent has its own ServiceAccount (the device plugin's has no RBAC):
    # the policy must judge that one, or it silently stops applying.
    account = component(render(), "DaemonSet", "agent")["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    assert f"system:serviceaccount:{NAMESPACE}:{account}" == AGENT
    conditions = " ".join(c["expression"] for c in policy()["spec"]["matchConditions"])
    assert f'"{AGENT}"' in conditions
    plugin = component(render(), "DaemonSet", "plugin")["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    assert f":{plugin}" not in conditions
    assert admitted(review(node(BASE), node({**BASE, "team": "ml"}), user=AGENT)) != []

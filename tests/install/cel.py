"""Evaluate admission ``matchConditions`` the way the API server does, but stricter about has().

cel-python's ``has(a.b.c)`` answers false when ``a.b`` itself is missing.
cel-go, which the API server runs, raises "no such key" there, and under
``failurePolicy: Fail`` an evaluation error rejects the request. So a chart
expression that is fine in cel-python could still block pods in a cluster;
:class:`StrictHasEvaluator` makes ``has()`` fail like cel-go does, so the tests
catch every unguarded field.
"""

from __future__ import annotations

from typing import Any

import celpy
import lark
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, Context, Evaluator


class StrictHasEvaluator(Evaluator):
    """``has(e.f)`` evaluates ``e`` first and propagates its error, as cel-go does."""

    def macro_has_eval(self, exprlist: lark.Tree[Any]) -> Any:
        node: Any = exprlist
        while isinstance(node, lark.Tree) and node.data != "member_dot" and len(node.children) == 1:
            node = node.children[0]
        if not (isinstance(node, lark.Tree) and node.data == "member_dot"):
            return CELEvalError("has() argument must be a field selection")
        operand = self.visit(node.children[0])
        if isinstance(operand, CELEvalError):
            return operand
        return super().macro_has_eval(exprlist)

    def sub_evaluator(self, ast: lark.Tree[Any]) -> Evaluator:
        # Macro bodies (exists, all) get the same strictness.
        return StrictHasEvaluator(ast, activation=self.activation)


class StrictRunner(celpy.InterpretedRunner):
    """An interpreted runner that uses :class:`StrictHasEvaluator`."""

    def evaluate(self, context: Context) -> celpy.celtypes.Value:
        evaluator = StrictHasEvaluator(ast=self.ast, activation=self.new_activation())
        return evaluator.evaluate(context)


class MatchConditionError(AssertionError):
    """A matchCondition that errors (the API server would apply the failure policy)."""


def compile_condition(expression: str) -> celpy.Runner:
    """Parse and prepare one matchCondition expression."""
    environment = celpy.Environment(runner_class=StrictRunner)
    return environment.program(environment.compile(expression))


def evaluate(program: celpy.Runner, request: dict[str, Any], *, expression: str = "") -> bool:
    """Evaluate like the API server does, with ``object``, ``oldObject`` and ``request``.

    ``request`` is the ``request`` member of an AdmissionReview. The result
    must be a bool; anything else (an error, a non-bool) is a
    :class:`MatchConditionError` naming the object.
    """
    activation = {
        "object": json_to_cel(request.get("object")),
        "oldObject": json_to_cel(request.get("oldObject")),
        "request": json_to_cel(request),
    }
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        raise MatchConditionError(f"{_describe(request)}: {exc}\n{expression}") from exc
    if isinstance(result, CELEvalError):
        raise MatchConditionError(f"{_describe(request)}: {result}\n{expression}")
    if not isinstance(result, celpy.celtypes.BoolType):
        raise MatchConditionError(f"{_describe(request)}: not a bool: {result!r}")
    return bool(result)


def _describe(request: dict[str, Any]) -> str:
    obj = request.get("object") or {}
    return f"{obj.get('kind', '?')} {obj.get('metadata', {}).get('name', '?')}"

"""The chart's PrometheusRules are the plain rules files, unchanged, and only when asked for."""

from __future__ import annotations

import yaml

from tests.install.chart import find, one, render
from tests.monitoring.catalog import RULES_FILE, USAGE_RULES_FILE

ON = {"monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}}


def test_the_default_render_has_no_prometheusrule() -> None:
    assert find(render(), "PrometheusRule") == []


def test_each_prometheusrule_spec_is_its_plain_rules_file() -> None:
    objects = render(ON)
    assert len(find(objects, "PrometheusRule")) == 2
    for name, path in (("metagpu-alerts", RULES_FILE), ("metagpu-usage", USAGE_RULES_FILE)):
        rule = one(objects, "PrometheusRule", name)
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["namespace"] == "metagpu"
        assert rule["metadata"]["labels"]["release"] == "prom"
        assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "metagpu"
        assert rule["spec"] == yaml.safe_load(path.read_text())
    # Prometheus' own templates reach the cluster as written, not eaten by helm.
    alerts = one(objects, "PrometheusRule", "metagpu-alerts")
    first = alerts["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
    assert "{{ $labels.gpu_index }}" in first

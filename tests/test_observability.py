"""The dashboard and the alert rules query only metrics and labels the monitor exports.

The exported names come from a real `Metrics` registry, scraped, so renaming a metric in the
code without fixing `observability/` fails here. `promtool` checks the rule syntax and runs
observability/alerts_test.yml when it is installed (Debian: `apt-get install prometheus`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.shell.metrics import INTERVENTION_OUTCOMES, Metrics

OBSERVABILITY = Path(__file__).resolve().parent.parent / "observability"
ALERTS = OBSERVABILITY / "alerts.yml"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"job", "instance"}
METRIC = re.compile(r"\b((?:opencode_loop_monitor|process)_[a-z_]+)\b")
SELECTOR = re.compile(r"\b((?:opencode_loop_monitor|process)_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Every sample name the monitor exports, with its label names."""
    metrics = Metrics(lambda: True, lambda: 1, lambda: 0.0, clock=lambda: 1.0)
    metrics.frame("server.heartbeat")
    metrics.loop(2)  # labelled counters show no sample before their first use
    text = metrics_text(metrics)
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def metrics_text(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def alert_rules() -> dict[str, str]:
    """alert name -> expr, read line by line (each expr is written on one line)."""
    rules: dict[str, str] = {}
    name = None
    for line in ALERTS.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"\s*- alert: (\S+)", line):
            name = match.group(1)
        elif (match := re.match(r"\s*expr: (.+)", line)) and name is not None:
            rules[name] = match.group(1)
    return rules


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [
        variable["query"]["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return queries


def check_query(query: str, names: dict[str, set[str]]) -> None:
    used = METRIC.findall(query)
    assert used, f"no monitor metric in {query!r}"
    for metric in used:
        assert metric in names, f"{metric} is not exported (in {query!r})"
    known_labels = TARGET_LABELS.union(*(names[metric] for metric in used))
    for metric, matchers in SELECTOR.findall(query):
        for label, value in MATCHER.findall(matchers):
            assert label in names[metric] | TARGET_LABELS, f"{metric} has no label {label}"
            if label == "outcome":
                assert value in INTERVENTION_OUTCOMES, f"no outcome {value!r}"
    for grouping in GROUPING.findall(query):
        for label in (part.strip() for part in grouping.split(",")):
            assert label in known_labels, f"grouping by unknown label {label} in {query!r}"


def test_alert_rules_cover_what_an_operator_must_hear_about() -> None:
    assert set(alert_rules()) == {
        "OpencodeLoopMonitorDown",
        "OpencodeLoopMonitorDisconnected",
        "OpencodeLoopMonitorStreamSilent",
        "OpencodeLoopsFrequent",
        "OpencodeSessionHeld",
        "OpencodeInterventionsFailing",
    }


@pytest.mark.parametrize("alert", sorted(alert_rules()))
def test_alert_queries_use_exported_metrics(alert: str) -> None:
    expr = alert_rules()[alert]
    if alert == "OpencodeLoopMonitorDown":
        assert expr == 'up{job="opencode-loop-monitor"} == 0'  # Prometheus' own series
        return
    check_query(expr, exported())


def test_dashboard_queries_use_exported_metrics() -> None:
    names = exported()
    queries = dashboard_queries()
    assert len(queries) == 13  # 12 panel targets and the instance variable
    for query in queries:
        check_query(query, names)


def test_the_check_itself_rejects_a_wrong_name_and_label() -> None:
    names = exported()
    with pytest.raises(AssertionError, match="not exported"):
        check_query("opencode_loop_monitor_loops_total", names)
    with pytest.raises(AssertionError, match="no outcome 'dry_run'"):
        check_query('opencode_loop_monitor_interventions_total{outcome="dry_run"}', names)
    with pytest.raises(AssertionError, match="unknown label session"):
        check_query("sum by (session) (opencode_loop_monitor_frames_total)", names)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
@pytest.mark.parametrize(
    "command", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]]
)
def test_promtool_accepts_the_rules(command: list[str]) -> None:
    result = subprocess.run(
        ["promtool", *command],
        cwd=OBSERVABILITY,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr

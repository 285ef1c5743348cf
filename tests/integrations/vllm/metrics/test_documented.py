"""Every series is documented (``docs/guides/watch.md``'s metric table is :data:`METRICS`),
and the Grafana examples (``examples/grafana/``) query only documented series: each panel's
and each alert rule's expression is parsed as PromQL (``promql-parser``) and every metric it
selects is one of kvplan's documented samples or one of vLLM's own series."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from kvplan.integrations.vllm.metrics import METRICS

ROOT = Path(__file__).resolve().parents[4]
DOC = ROOT / "docs" / "guides" / "watch.md"
DASHBOARD = ROOT / "examples" / "grafana" / "kvplan-dashboard.json"
ALERTS = ROOT / "examples" / "grafana" / "kvplan-alerts.yml"
KVPLAN_SAMPLES = {name for m in METRICS for name in m.sample_names}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
PANEL_TYPES = {"row", "timeseries", "table", "stat", "gauge", "bargauge"}


def doc_table() -> dict[str, list[str]]:
    """``docs/guides/watch.md``'s metric table: ``{name: [type, labels, meaning, from]}``."""
    text = DOC.read_text()
    start = text.index("| metric | type | labels |")
    rows: dict[str, list[str]] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_metric_table_is_the_catalog() -> None:
    table = doc_table()
    assert list(table) == [m.name for m in METRICS]
    for m in METRICS:
        kind, labels, meaning, source = table[m.name]
        assert kind == m.kind, m.name
        assert labels == ", ".join(f"`{label}`" for label in m.labels), m.name
        assert meaning == m.help and source == m.source, m.name


def test_names_follow_prometheus_conventions() -> None:
    for m in METRICS:
        assert re.fullmatch(r"kvplan_(kv|group)_[a-z_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        if m.kind == "histogram":
            assert m.name.endswith("_seconds"), m.name
        elif m.kind == "gauge":
            assert m.name.endswith(("_bytes", "_blocks", "_seconds", "_status")), m.name
        assert "request" not in m.labels and "block" not in m.labels  # bounded cardinality


def vllm_series() -> set[str]:
    """The series vLLM's own Prometheus stat logger defines (its source, this vLLM)."""
    import vllm.v1.metrics.loggers as loggers

    names = re.findall(r'name="(vllm:[a-z_:]+)"', Path(loggers.__file__).read_text())
    assert "vllm:num_requests_waiting" in names
    return set(names)


def selected(node: Any) -> Iterator[str]:
    """The metric names a parsed PromQL expression selects."""
    if isinstance(node, promql_parser.VectorSelector):
        yield str(node.name)
        return
    for attr in ("args", "expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        for item in child if isinstance(child, list) else [child]:
            if item is not None and not isinstance(item, str | int | float):
                yield from selected(item)


def names_in(expr: str) -> set[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return set(selected(promql_parser.parse(expr)))


def check_names(names: set[str], where: str) -> None:
    assert names, where
    vllm = vllm_series()
    for name in names:
        if name.startswith("kvplan_"):
            assert name in KVPLAN_SAMPLES, f"{where}: {name} is not a documented series"
        else:
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert base in vllm, f"{where}: {name} is neither kvplan's nor vLLM's"


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


def test_the_dashboard_is_a_grafana_dashboard_model() -> None:
    dash = dashboard()
    for key, kind in (
        ("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
        ("templating", dict), ("time", dict),
    ):  # fmt: skip
        assert isinstance(dash[key], kind), key
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "model_name", "engine", "group"} <= variables
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def panel_queries() -> list[tuple[str, str]]:
    found = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard()["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            inner = re.fullmatch(r"label_values\((.+), \w+\)", query["query"])
            assert inner, variable["name"]
            found.append((f"variable {variable['name']}", inner.group(1)))
    return found


@pytest.mark.parametrize(("where", "expr"), panel_queries(), ids=lambda x: str(x)[:60])
def test_every_dashboard_query_names_only_documented_series(where: str, expr: str) -> None:
    check_names(names_in(expr), where)


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    queried = {name for _, expr in panel_queries() for name in names_in(expr)}
    for needed in (
        "kvplan_kv_mapped_bytes", "kvplan_kv_reserved_bytes", "vllm:kv_cache_usage_perc",
        "kvplan_group_charged_bytes", "kvplan_group_budget_bytes", "kvplan_group_claim_bytes",
        "kvplan_kv_map_step_seconds_bucket",
    ):  # fmt: skip
        assert needed in queried, needed


def test_every_alert_rule_is_well_formed_and_names_only_documented_series() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    seen = set()
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"]) and rule["alert"] not in seen
            seen.add(rule["alert"])
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"]
            if "for" in rule:
                assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), rule["alert"]
            check_names(names_in(rule["expr"]), f"alert {rule['alert']}")
    assert {"KvplanClaimWaiting", "KvplanMappedAtLimitWithRequestsWaiting"} <= seen

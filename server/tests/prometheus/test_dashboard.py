"""The Grafana dashboard (deploy/grafana/reprise.json) against a real Prometheus scraping a real gateway: every panel
query, with Grafana's variables substituted as Grafana would, returns data after ordinary traffic; the dashboard is
importable anywhere (its datasource an `__inputs` variable); and the recording and alerting rules of
deploy/prometheus/ evaluate cleanly against the gateway's real series."""

import json
import math
import re

import pytest

from conftest import DASHBOARD, JOB, SCRAPE_S

SCHEMA_VERSION = 39  # Grafana 10.4 and 11.0 write this version; README, "Operate with Prometheus and Grafana".
DASH = json.loads(DASHBOARD.read_text())


def panels():
    """Every panel, those inside collapsed rows too."""
    for p in DASH["panels"]:
        yield p
        yield from p.get("panels", [])


def targets():
    return [(p, t) for p in panels() for t in p.get("targets", [])]


def substitute(expr: str, variables: dict[str, str], window_s: float) -> str:
    """Grafana's interpolation for a Prometheus datasource: the global interval variables (at a 1 s step and scrape
    interval) and the dashboard's own variables, multi-valued ones as a regex alternation."""
    rate_interval = max(1 + SCRAPE_S, 4 * SCRAPE_S)
    out = (expr.replace("$__rate_interval", f"{rate_interval}s")
               .replace("$__range", f"{math.ceil(window_s)}s")
               .replace("$__interval", "1s"))
    for name, value in variables.items():
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in out, f"an unsubstituted variable in {out}"
    return out


@pytest.fixture(scope="session")
def variables(stack, traffic):
    """The dashboard's variables, each resolved by its own query (`label_values(metric, label)`) the way Grafana runs
    it, after the variables before it; the gateway's job and instance must be among the values offered."""
    _, prom = stack
    start, end = traffic
    resolved: dict[str, str] = {}
    for var in DASH["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert m, var
        match = substitute(m.group(1), resolved, end - start)
        values = prom.get(f"/api/v1/label/{m.group(2)}/values", **{"match[]": match, "start": start, "end": end})
        assert values, f"variable {var['name']} offers nothing for {match}"
        resolved[var["name"]] = "|".join(grafana_regex_escape(v) for v in values)
    assert grafana_regex_escape(JOB) in resolved["job"].split("|"), resolved
    return resolved


def grafana_regex_escape(value: str) -> str:
    """How Grafana's Prometheus datasource escapes a multi-value variable's value inside a `=~"..."` string: a regex
    escape whose backslash is itself escaped for the PromQL string."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def target_id(pt) -> str:
    p, t = pt
    return f"{p['title']} [{t['refId']}]"


@pytest.mark.parametrize("panel_target", targets(), ids=target_id)
def test_every_panel_query_returns_data(stack, traffic, variables, panel_target):
    """A query that returns nothing, or only NaN (a quantile of nothing), draws an empty panel: a name or label the
    gateway does not export, or a selector that never matches."""
    panel, target = panel_target
    _, prom = stack
    start, end = traffic
    expr = substitute(target["expr"], variables, end - start)
    if target.get("instant"):
        result = prom.query(expr, end)
        values = [float(r["value"][1]) for r in result]
    else:
        result = prom.query_range(expr, start, end, 1)
        values = [float(v) for r in result for _, v in r["values"]]
    finite = [v for v in values if math.isfinite(v)]
    assert finite, f"panel {panel['title']!r} ({target['refId']}) has no data: {expr} -> {result}"


def test_panels_with_data_show_what_the_traffic_did(stack, traffic, variables):
    """Not only some data, the right data: over the window, the hit rate is the gateway's own, and the guard panel
    names the numbers guard."""
    gw, prom = stack
    start, end = traffic
    by_title = {p["title"]: p for p in panels()}
    hit_rate = prom.query(substitute(by_title["Hit rate"]["targets"][0]["expr"], variables, end - start), end)
    # The gateway started just before the window, so its lifetime hit rate is the window's.
    stats = gw.admin("/admin/stats")
    # increase() extrapolates to the window's edges, but every series has a sample in each scrape (the counters
    # exist at 0 from the start, and a scrape of the zeros is in the window), so a ratio of two increases is
    # exact up to rounding. A series that appeared mid-window would lose its first scrape's count.
    assert float(hit_rate[0]["value"][1]) == pytest.approx(stats["rates"]["hit"], abs=0.01), (hit_rate, stats)
    guards = prom.query_range(substitute(by_title["Guard refusals"]["targets"][0]["expr"], variables, end - start),
                              start, end, 1)
    assert [r["metric"].get("guard") for r in guards] == ["numbers"], guards


def test_the_dashboard_imports_anywhere():
    """Its datasource is an `__inputs` variable, chosen at import, and every panel and target uses it; ids are unique
    and panels do not overlap; the schema version is the one the README states."""
    assert DASH["schemaVersion"] == SCHEMA_VERSION
    assert DASH["id"] is None and DASH["uid"] == "reprise-gateway"
    inputs = {i["name"]: i for i in DASH["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource" and inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for p in panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            assert p["datasource"] == ds, p["title"]
            assert p["targets"], p["title"]
    for p, t in targets():
        assert t["datasource"] == ds, p["title"]
        # Every query is scoped by the dashboard's variables, so one Prometheus can hold several deployments.
        assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
    for var in DASH["templating"]["list"]:
        assert var["datasource"] == ds, var["name"]


def test_the_savings_panels_read_the_savings_metrics():
    """The savings counters keep their names and labels: tokens by kind, dollars by route."""
    exprs = " ".join(t["expr"] for _, t in targets())
    assert "sum by (kind) (rate(reprise_tokens_saved_total{" in exprs
    assert "sum by (route) (rate(reprise_cost_saved_total{" in exprs


def test_the_rules_evaluate_cleanly_against_the_gateway(stack, traffic):
    """Prometheus loaded deploy/prometheus/reprise.rules.yml; every rule evaluated without error against the live
    series, and the recording rules produced the hit rate and the TTFT quantiles by outcome."""
    _, prom = stack
    _, end = traffic
    groups = prom.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules if r["type"] == "alerting"} == {
        "RepriseHitRateCollapsed", "RepriseStoreDegraded", "RepriseFeedBehind", "RepriseEmbeddingSkipsHigh",
        "RepriseUpstreamErrors", "RepriseJudgeErrors"}
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    ratio = prom.query(f'job_route:reprise_hit_ratio:rate5m{{job="{JOB}"}}', end)
    assert [r["metric"]["route"] for r in ratio] == ["chat.completions"], ratio
    assert 0 < float(ratio[0]["value"][1]) < 1, ratio
    ttft = prom.query(f'job_cache:reprise_ttft_seconds:p99_rate5m{{job="{JOB}"}}', end)
    assert {"hit", "miss"} <= {r["metric"]["cache"] for r in ttft}, ttft
    # Healthy traffic pages nobody: the store is fine, the feed is caught up (no alert is even pending).
    alerts = prom.get("/api/v1/alerts")["alerts"]
    assert not [a for a in alerts if a["labels"]["alertname"] in ("RepriseStoreDegraded", "RepriseFeedBehind")], alerts

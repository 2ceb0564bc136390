"""Turns the `reprise-client bench --json` reports of a peer run into Markdown tables; computes nothing the driver did not measure.

run-gptcache.sh writes one JSON report per scenario and a manifest (tab-separated: scenario id,
title, target names joined by `,`, report path); MANIFEST may also be a bundle this script wrote
earlier (a .json file), to re-render committed results. Sub-commands:

  summary MANIFEST   headline tables: TTFT by outcome side by side, hit rates, hit throughput
  tables MANIFEST    one section per scenario with the driver's per-target and per-outcome numbers
  bundle MANIFEST    every report in one JSON document, keyed by scenario id (kept beside the .md)

Standard library only, so it runs with any python3.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("hit", "semantic-hit", "coalesced", "miss")


@dataclass
class Scenario:
    ident: str
    title: str
    names: list[str]
    report: dict[str, Any]

    def target(self, name: str) -> dict[str, Any] | None:
        """The report's target measured under this name (the order of --url, --compare)."""
        if name not in self.names:
            return None
        return self.report["targets"][self.names.index(name)]


def load(manifest: Path) -> list[Scenario]:
    """Reads a run's manifest, or a bundle this script wrote earlier (to re-render committed results)."""
    if manifest.suffix == ".json":
        doc = json.loads(manifest.read_text())
        return [Scenario(ident, s["title"], s["targets"], s["report"]) for ident, s in doc.items()]
    scenarios = []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        ident, title, names, path = line.split("\t")
        report = json.loads(Path(path).read_text())
        names_list = names.split(",")
        if len(names_list) != len(report["targets"]):
            raise SystemExit(f"{path}: {len(report['targets'])} targets, manifest names {names_list}")
        scenarios.append(Scenario(ident, title, names_list, report))
    return scenarios


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def pct(p: dict[str, float] | None, key: str) -> float | None:
    return None if p is None else p.get(key)


def ttft_cell(target: dict[str, Any] | None, outcome: str) -> str:
    if target is None:
        return "-"
    summary = target["by_outcome"].get(outcome)
    if summary is None:
        return "-"
    ttft = summary.get("ttft_ms")
    return f"{ms(pct(ttft, 'p50'))} / {ms(pct(ttft, 'p99'))} (n={summary['count']})"


def hit_rate(target: dict[str, Any] | None) -> str:
    if target is None:
        return "-"
    outcomes = target["outcomes"]
    served = sum(outcomes.values())
    if served == 0:
        return "-"
    exact, semantic = outcomes.get("hit", 0), outcomes.get("semantic-hit", 0)
    rate = 100.0 * (exact + semantic) / served
    extra = f", {outcomes['coalesced']} coalesced" if outcomes.get("coalesced") else ""
    errors = f", {target['errors']} errors" if target.get("errors") else ""
    return f"{rate:.0f}% ({exact} exact + {semantic} semantic of {served}{extra}{errors})"


def summary(scenarios: list[Scenario]) -> str:
    out = []
    compared = [s for s in scenarios if s.names == ["Reprise", "GPTCache"]]
    out.append("### Time to first token by outcome, ms: p50 / p99 (n)\n")
    out.append("| scenario | outcome | Reprise | GPTCache |")
    out.append("| --- | --- | --- | --- |")
    for s in compared:
        for outcome in OUTCOMES:
            cells = [ttft_cell(s.target(n), outcome) for n in ("Reprise", "GPTCache")]
            if cells != ["-", "-"]:
                out.append(f"| {s.title} | {outcome} | {cells[0]} | {cells[1]} |")
    out.append("\n### Hit rates (exact + semantic hits over answered requests)\n")
    out.append("| scenario | Reprise | GPTCache |")
    out.append("| --- | --- | --- |")
    for s in compared:
        out.append(f"| {s.title} | {hit_rate(s.target('Reprise'))} | {hit_rate(s.target('GPTCache'))} |")
    alone = [s for s in scenarios if len(s.names) == 1]
    if alone:
        out.append("\n### Hit throughput, each gateway measured alone (requests/s, closed loop)\n")
        out.append(
            "| scenario | Reprise req/s | GPTCache req/s | Reprise / GPTCache | Reprise TTFT p50 / p99 | GPTCache TTFT p50 / p99 |"
        )
        out.append("| --- | --- | --- | --- | --- | --- |")
        by_title: dict[str, dict[str, dict[str, Any]]] = {}
        for s in alone:
            by_title.setdefault(s.title, {})[s.names[0]] = s.report["targets"][0]
        for title, targets in by_title.items():
            r, g = targets.get("Reprise"), targets.get("GPTCache")
            rps = [t["requests_per_s"] if t else None for t in (r, g)]
            ratio = f"{rps[0] / rps[1]:.1f}x" if rps[0] and rps[1] else "-"
            ttft = [
                f"{ms(pct(t.get('ttft_ms'), 'p50'))} / {ms(pct(t.get('ttft_ms'), 'p99'))}" if t else "-" for t in (r, g)
            ]
            cells = [f"{v:.0f}" if v is not None else "-" for v in rps]
            out.append(f"| {title} | {cells[0]} | {cells[1]} | {ratio} | {ttft[0]} | {ttft[1]} |")
    return "\n".join(out) + "\n"


def tables(scenarios: list[Scenario]) -> str:
    out = []
    for s in scenarios:
        alone = f", {s.names[0]} alone" if len(s.names) == 1 else ""
        out.append(f"### {s.title}{alone}\n")
        out.append("| target | outcome | requests | errors | TTFT p50 | p90 | p99 | total p50 | p90 | p99 | req/s |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, t in zip(s.names, s.report["targets"]):
            ttft, total = t.get("ttft_ms"), t.get("total_ms")
            out.append(
                f"| {name} | all | {t['requests']} | {t['errors']} | "
                + " | ".join(ms(pct(ttft, k)) for k in ("p50", "p90", "p99"))
                + " | "
                + " | ".join(ms(pct(total, k)) for k in ("p50", "p90", "p99"))
                + f" | {t['requests_per_s']:.1f} |"
            )
            for outcome, o in t["by_outcome"].items():
                out.append(
                    f"| {name} | {outcome} | {o['count']} | | "
                    + " | ".join(ms(pct(o.get("ttft_ms"), k)) for k in ("p50", "p90", "p99"))
                    + " | "
                    + " | ".join(ms(pct(o.get("total_ms"), k)) for k in ("p50", "p90", "p99"))
                    + " | |"
                )
        notes = []
        for name, t in zip(s.names, s.report["targets"]):
            if t.get("hit_speedup_p50"):
                notes.append(f"{name} hit TTFT speed-up (miss p50 / hit p50): {t['hit_speedup_p50']:.0f}x")
        comparison = s.report.get("comparison")
        if comparison:
            diff = comparison.get("paired_ttft_diff_ms")
            if diff:
                notes.append(
                    "paired TTFT difference per prompt, Reprise minus GPTCache, ms: "
                    f"p50 {diff['p50']:.2f}, p90 {diff['p90']:.2f}, p99 {diff['p99']:.2f}, mean {diff['mean']:.2f}"
                )
            if comparison.get("ttft_p50_ratio"):
                notes.append(f"TTFT p50 ratio, GPTCache / Reprise: {comparison['ttft_p50_ratio']:.2f}")
        notes.append(f"wall time {s.report['wall_s']:.1f} s")
        out.append("")
        out.extend(f"- {n}" for n in notes)
        out.append("")
    return "\n".join(out)


def bundle(scenarios: list[Scenario]) -> str:
    doc = {s.ident: {"title": s.title, "targets": s.names, "report": s.report} for s in scenarios}
    return json.dumps(doc, indent=1) + "\n"


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("summary", "tables", "bundle"):
        raise SystemExit("usage: render_results.py summary|tables|bundle MANIFEST")
    scenarios = load(Path(sys.argv[2]))
    render = {"summary": summary, "tables": tables, "bundle": bundle}[sys.argv[1]]
    sys.stdout.write(render(scenarios))


if __name__ == "__main__":
    main()

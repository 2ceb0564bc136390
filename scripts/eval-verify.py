#!/usr/bin/env python3
"""Verify-stage section for scripts/eval.sh: reads the results.jsonl of the same pairs through a gateway
without a verifier and through gateways with a sync judge (reprise-sim at a stated accuracy), and prints
a Markdown section: per category the shares served with no verifier and with the judge at each accuracy,
the judge calls per lookup, and what a verified hit adds to the time to the response head.

Usage: eval-verify.py [--judge-latency-ms MS] BASELINE_DIR ACCURACY=DIR...
(each DIR holds a reprise-client eval report; DIR/sim-stats.json, when present, is the simulator's /stats)
"""
import json
import math
import os
import sys
from collections import defaultdict

VERDICTS = ("same", "different", "unsure")
# `x-reprise-verify: unsure; reason=R` of a judge that was never asked.
NOT_ASKED = ("over_budget", "too_long", "not_configured")


def load(path):
    """The measured pairs of a report (not failed, not skipped), as the client counts them."""
    with open(f"{path}/results.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if not r.get("error") and r["outcome"] != "skipped"]


def percentile(samples, q):
    """Nearest rank, as reprise-client computes it."""
    if not samples:
        return None
    s = sorted(samples)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def pct(part, whole):
    return "-" if whole == 0 else f"{100 * part / whole:.1f}% ({part}/{whole})"


def ms(x):
    return "-" if x is None else f"{x:.1f}"


def spread(samples):
    if not samples:
        return "-"
    return f"{ms(percentile(samples, 0.5))} / {ms(percentile(samples, 0.99))}"


def served_cell(rows):
    hits = [r for r in rows if r["same_answer"]]
    traps = [r for r in rows if not r["same_answer"]]
    cells = []
    if hits:
        cells.append(pct(sum(r["served"] for r in hits), len(hits)))
    if traps:
        cells.append(("traps " if hits else "") + pct(sum(r["served"] for r in traps), len(traps)))
    return " · ".join(cells)


def judged(r):
    return r.get("verify") in VERDICTS and r.get("verify_reason") not in NOT_ASKED


def semantic_hit_ttft(rows, verified):
    """Times to the head of served semantic hits: vetted by the judge on that request, or not judged."""
    return [
        r["ttft_ms"]
        for r in rows
        if r["outcome"] == "semantic-hit"
        and r.get("ttft_ms") is not None
        and ((r.get("verified") == "judge" and judged(r)) if verified else not judged(r))
    ]


args = sys.argv[1:]
latency = None
if args[:1] == ["--judge-latency-ms"]:
    latency, args = args[1], args[2:]
baseline = load(args[0])
runs = [(acc, load(path), path) for acc, path in (a.split("=", 1) for a in args[1:])]
if not runs:
    print("## Verified semantic hits: no judge runs (no accuracies given)")
    sys.exit(0)

categories = defaultdict(lambda: defaultdict(list))
for name, rows in [("none", baseline)] + [(acc, rows) for acc, rows, _ in runs]:
    for r in rows:
        categories[r["category"]][name].append(r)
# Should-hit categories first, then traps, each by size: the order of the data set's own summary.
order = sorted(
    categories,
    key=lambda c: (not any(r["same_answer"] for r in categories[c]["none"]), -len(categories[c]["none"]), c),
)

print("## Verified semantic hits: a sync judge of stated accuracy (single questions)")
print()
print(
    "The same pairs through gateways with `--verify judge --verify-mode sync --judge-model sim-judge "
    "--judge-rate 0` (otherwise defaults: floor 0.75, error budget 1%, which a namespace per pair never clears; no judge rate limit), one per accuracy. The judge is `reprise-sim` answering "
    "from the same labels (`--judge-labels pairs.jsonl`, ambiguous pairs `different`), each labeled "
    "pair's verdict flipped with probability 1 − accuracy by a seeded per-pair draw"
    + (
        ""
        if latency is None
        else ", answering at once" if float(latency) == 0 else f", answering after {latency} ms"
    )
    + ". This measures the gateway's path with a judge of that accuracy; the accuracy of a real "
    "judge model is not measured here."
)
print()
print(
    "Cells: should-hit pairs served for a should-hit category (saved calls), traps served for a trap "
    "category (wrong answers); the overall row gives both."
)
print()
accs = [acc for acc, _, _ in runs]
print("| category | no verifier | " + " | ".join(f"judge {a}" for a in accs) + " |")
print("|---|" + "---:|" * (1 + len(accs)))
overall = {"none": baseline, **{acc: rows for acc, rows, _ in runs}}
print("| **overall** | " + " | ".join(served_cell(overall[n]) for n in ["none"] + accs) + " |")
for c in order:
    print(f"| {c} | " + " | ".join(served_cell(categories[c][n]) for n in ["none"] + accs) + " |")
print()
print("Judge calls per lookup (lookups on which the judge gave a verdict, over lookups measured):")
print()
print("| category | " + " | ".join(f"judge {a}" for a in accs) + " |")
print("|---|" + "---:|" * len(accs))


def calls(rows):
    return "-" if not rows else f"{sum(map(judged, rows)) / len(rows):.2f} ({sum(map(judged, rows))}/{len(rows)})"


print("| **overall** | " + " | ".join(calls(overall[a]) for a in accs) + " |")
for c in order:
    print(f"| {c} | " + " | ".join(calls(categories[c][a]) for a in accs) + " |")
print()
print(
    "What a verified hit adds, p50 / p99 in ms: the judge's own time (`Server-Timing: judge`); the time to "
    "the response head of a hit the judge vetted on that request, and of the semantic hits the same "
    "gateway served without a judge call (at or above its threshold), side by side in one run; added: "
    "the first minus the second, quantile by quantile."
)
print()
print("| judge accuracy | verdicts same / different / unsure | verified hits | judge | verified hit TTFT | unjudged hit TTFT | added TTFT | judge calls seen by the sim |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for acc, rows, path in runs:
    verdicts = [sum(r.get("verify") == v and judged(r) for r in rows) for v in VERDICTS]
    not_asked = sum(r.get("verify") == "unsure" and not judged(r) for r in rows)
    verified = [r for r in rows if r["served"] and r.get("verified")]
    judge_ms = [r["judge_ms"] for r in rows if judged(r) and r.get("judge_ms") is not None]
    hit_ttft = semantic_hit_ttft(rows, verified=True)
    other_ttft = semantic_hit_ttft(rows, verified=False)
    added = "-"
    if hit_ttft and other_ttft:
        added = " / ".join(
            ms(percentile(hit_ttft, q) - percentile(other_ttft, q)) for q in (0.5, 0.99)
        )
    sim_calls = "-"
    stats_path = os.path.join(path, "sim-stats.json")
    if os.path.exists(stats_path):
        with open(stats_path) as f:
            sim_calls = str(json.load(f).get("judge", {}).get("calls", "-"))
    print(
        f"| {acc} | {' / '.join(map(str, verdicts))}{f' (not asked {not_asked})' if not_asked else ''} | {len(verified)} | {spread(judge_ms)} | "
        f"{spread(hit_ttft)} ({len(hit_ttft)}) | {spread(other_ttft)} ({len(other_ttft)}) | {added} | {sim_calls} |"
    )
print()
print(
    "The last column is the simulator's own count of the judge calls it answered (lookups the eval "
    "asked again included); the verdict columns count each pair's measured lookup once."
)

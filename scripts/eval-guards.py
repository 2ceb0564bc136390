#!/usr/bin/env python3
"""Guard ablation for scripts/eval.sh: reads the results.jsonl of runs of the same pairs through gateways
with different guard sets and prints a Markdown section: every guard's refusals per category (defaults),
the should-hit pairs each guard refuses (by id), then what each guard buys (traps served) and costs (should-hit pairs served) when it alone is switched off.

Usage: eval-guards.py DEFAULTS_DIR NAME=DIR...   (each DIR holds a reprise-client eval report)
"""
import json
import sys
from collections import Counter, defaultdict


def load(path):
    with open(f"{path}/results.jsonl") as f:
        return [r for r in map(json.loads, f) if not r.get("error")]


def shares(rows):
    traps = [r for r in rows if not r["same_answer"]]
    hits = [r for r in rows if r["same_answer"]]
    served = lambda rs: sum(r["served"] for r in rs) / len(rs) if rs else float("nan")
    return served(traps), served(hits), best_within(rows, 0.01)


def best_within(rows, max_wrong):
    """The largest share of should-hit pairs any threshold serves with at most max_wrong of traps
    served: a pair is served at threshold t when it is an exact hit, or its candidate scored >= t and
    no guard refused it (as the gateway decides)."""
    traps = [r for r in rows if not r["same_answer"]]
    hits = [r for r in rows if r["same_answer"]]
    if not traps or not hits:
        return None
    def served(r, t):
        return r["outcome"] == "hit" or (r.get("similarity") is not None and r["similarity"] >= t and not r.get("guard"))
    best = None
    for t in sorted({r["similarity"] for r in rows if r.get("similarity") is not None}):
        wrong = sum(served(r, t) for r in traps) / len(traps)
        if wrong <= max_wrong:
            hit = sum(served(r, t) for r in hits) / len(hits)
            if best is None or hit > best[0]:
                best = (hit, t)
    return best


def pct(x):
    return "n/a" if x != x else f"{100 * x:.1f}%"


defaults = load(sys.argv[1])
runs = [arg.split("=", 1) for arg in sys.argv[2:]]

guards = sorted({r["guard"] for r in defaults if r.get("guard")})
by_cat = defaultdict(Counter)
sizes = Counter()
for r in defaults:
    sizes[r["category"]] += 1
    if r.get("guard"):
        by_cat[r["category"]][r["guard"]] += 1
print("### Guard refusals per category (defaults)")
print()
print("Pairs whose stored candidate a guard refused, at any similarity, by the first guard that refused.")
print()
print("| category | pairs | " + " | ".join(guards) + " |")
print("|---|---:|" + "---:|" * len(guards))
for cat in sorted(sizes):
    print(f"| {cat} | {sizes[cat]} | " + " | ".join(str(by_cat[cat][g]) for g in guards) + " |")
print()
# The refusals that cost a saving: should-hit pairs, by guard, named by their id in the data set (the
# texts stay in target/eval-last/, outside the repository).
lost = defaultdict(list)
for r in defaults:
    if r.get("guard") and r["same_answer"]:
        lost[r["guard"]].append(r["id"])
total = sum(len(ids) for ids in lost.values())
print(f"Should-hit pairs the guards refuse (at any similarity): {total}.")
print()
if lost:
    print("| guard | should-hit refused | pairs |")
    print("|---|---:|---|")
    for g in sorted(lost):
        print(f"| {g} | {len(lost[g])} | {', '.join(sorted(lost[g]))} |")
    print()
print("### What each guard buys and costs")
print()
print("The same pairs through gateways that differ only in their guards, in the same run. Traps served are")
print("wrong answers; should-hit served are saved upstream calls; the last column is the best should-hit share")
print("any threshold reaches with at most 1% of traps served.")
print()
print("| guards | traps served | should-hit served | best hit share at ≤1% traps |")
print("|---|---:|---:|---:|")
for name, rows in [("defaults (all)", defaults)] + [(n, load(d)) for n, d in runs]:
    trap, hit, best = shares(rows)
    best_text = "none" if best is None else f"{pct(best[0])} (threshold {best[1]:.4f})"
    print(f"| {name} | {pct(trap)} | {pct(hit)} | {best_text} |")

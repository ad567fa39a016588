#!/usr/bin/env python3
"""Keep the tasks of a research-world task file that share no entity with any training task:
an evaluation set for `eval.sets` (issue 25).

The world's own held-out file has 16 tasks over 8 lineages, so a greedy held-out score moves
in steps of one lineage and its seed-to-seed spread (0.087 over four seeds, BENCHMARKS.md
session 29) is as wide as the effects twelve RL steps make. Lineages that neither the SFT nor
RL trains on (split off with split-tasks-by-lineage.py) give a larger set, but their tasks
share the world's training city pool, and the report tasks also name a tissue and a year from
small shared lists. This script drops every pool task that shares a key term with a training
task, so what is left is as strict as the world's held-out file: no gene, protein, compound,
institute, city, tissue or year of a kept task appears in a training task's rubrics or answer.

A task's entities are its rubrics' key terms plus its answer when `answer_format` is "exact";
the gene named only in the query is unique to its lineage and not compared.

usage: disjoint-eval-tasks.py POOL OUT --train TRAIN.jsonl [TRAIN.jsonl ...]
Standard library only. Prints how many pool tasks were kept, by hops, and over how many
lineages.
"""
import argparse
import collections
import sys

from world_tasks import lineages, rows


def entities(task: dict) -> set:
    out = {t.strip().lower() for r in task.get("rubrics", []) for t in r.get("key_terms", [])}
    if task.get("answer_format") == "exact" and task.get("answer"):
        out.add(task["answer"].strip().lower())
    out.discard("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pool")
    ap.add_argument("out")
    ap.add_argument("--train", nargs="+", required=True)
    a = ap.parse_args()
    seen, train_lineages = set(), set()
    for path in a.train:
        for _, t in rows(path):
            seen |= entities(t)
            train_lineages |= lineages(t)
    kept, dropped = [], collections.Counter()
    hops, kept_lineages = collections.Counter(), set()
    for line, t in rows(a.pool):
        li = lineages(t)
        if li & train_lineages:
            raise SystemExit(
                f"{a.pool}: task {t.get('id')!r} is about lineage {sorted(li)}, "
                "which a training file also covers; split the lineages first"
            )
        if entities(t) & seen:
            dropped[t.get("hops")] += 1
            continue
        kept.append(line if line.endswith("\n") else line + "\n")
        hops[t.get("hops")] += 1
        kept_lineages |= li
    if not kept:
        raise SystemExit(f"{a.pool}: every task shares an entity with the training tasks")
    with open(a.out, "w") as f:
        f.writelines(kept)
    by = lambda c: ", ".join(f"{h} hops: {n}" for h, n in sorted(c.items()))  # noqa: E731
    print(
        f"kept {len(kept)} tasks over {len(kept_lineages)} lineages ({by(hops)}) -> {a.out}; "
        f"dropped {sum(dropped.values())} sharing an entity with a training task ({by(dropped)})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

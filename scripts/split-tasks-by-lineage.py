#!/usr/bin/env python3
"""Split a research world's training tasks (tasks.jsonl) into two files by lineage, so that the
SFT warm start and the RL phase see different genes, proteins, compounds and institutes
(issue 25: does RL on lineages the warm start never saw train a skill that transfers to the
held-out lineages, where RL on the SFT's own tasks may only reinforce recall?).

A task's lineage is the number in its rubrics' evidence ids (world_tasks.py). Lineage L goes
to the second file when L % MOD == REM, else to the first. Cities are shared between the two halves (the world draws them from one pool for all
training lineages); held-out tasks keep their own lineages and cities, untouched here.

usage: split-tasks-by-lineage.py TASKS FIRST_OUT SECOND_OUT [--mod 3] [--rem 2]
Standard library only. Prints the counts of tasks and lineages on each side.
"""
import argparse
import sys

from world_tasks import lineages, rows


def lineage(task: dict) -> int:
    found = lineages(task)
    if len(found) != 1:
        raise SystemExit(
            f"task {task.get('id')!r}: evidence names lineages {sorted(found)}; expected one"
        )
    return found.pop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks")
    ap.add_argument("first_out")
    ap.add_argument("second_out")
    ap.add_argument("--mod", type=int, default=3)
    ap.add_argument("--rem", type=int, default=2)
    a = ap.parse_args()
    if a.mod < 2 or not 0 <= a.rem < a.mod:
        raise SystemExit(f"--mod {a.mod} --rem {a.rem}: need mod >= 2 and 0 <= rem < mod")
    sides = ([], [])
    covered = (set(), set())
    for line, t in rows(a.tasks):
        li = lineage(t)
        side = 1 if li % a.mod == a.rem else 0
        sides[side].append(line if line.endswith("\n") else line + "\n")
        covered[side].add(li)
    for path, side_rows in zip((a.first_out, a.second_out), sides):
        with open(path, "w") as out:
            out.writelines(side_rows)
    print(
        f"first: {len(sides[0])} tasks over {len(covered[0])} lineages -> {a.first_out}; "
        f"second: {len(sides[1])} tasks over {len(covered[1])} lineages -> {a.second_out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

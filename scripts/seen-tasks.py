#!/usr/bin/env python3
"""The rows of a task file that an experiment's runs trained on (issue 25).

Evaluation sets may not overlap a run's training tasks, so a policy's gain on the tasks it
trained on is measured by a separate probe: write those tasks to a file here, then score it as
an `[[eval.sets]]` set of a short run whose own training tasks are other ones, once from the
warm start and once from each published version (BENCHMARKS.md, issue 25 session 47).

Reads the tasks of the experiment's trajectories (their `external_id`, which is the task file's
`id`) and keeps the rows of TASKS trained on by every run of the experiment (default: the same
tasks for every run's weights) or by any run (--any).

  usage: seen-tasks.py EXPERIMENT TASKS.jsonl OUT.jsonl [--any]
         [--db postgres://postgres@127.0.0.1:5432/rubricem]

Needs psql on PATH (one query over a validated UUID). Standard library only.
"""
import argparse
import json
import subprocess
import sys
import uuid


def seen(db, experiment, every):
    having = "count(DISTINCT t.run_id) = (SELECT count(*) FROM runs WHERE experiment_id = "\
        f"'{experiment}')" if every else "true"
    sql = f"""
        SELECT tk.external_id
        FROM trajectories t JOIN runs r ON r.id = t.run_id JOIN tasks tk ON tk.id = t.task_id
        WHERE r.experiment_id = '{experiment}'
        GROUP BY tk.external_id HAVING {having}"""
    out = subprocess.run(["psql", db, "-At", "-c", sql], check=True,
                         capture_output=True, text=True).stdout
    return set(out.split())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", help="experiment id")
    ap.add_argument("tasks", help="the task file the runs trained on (JSONL with `id`)")
    ap.add_argument("out", help="where the rows trained on go")
    ap.add_argument("--any", action="store_true", help="trained on by any run, not every run")
    ap.add_argument("--db", default="postgres://postgres@127.0.0.1:5432/rubricem")
    a = ap.parse_args()
    try:
        experiment = str(uuid.UUID(a.experiment))
    except ValueError as e:
        sys.exit(f"seen-tasks: the experiment id is not a UUID ({e})")
    ids = seen(a.db, experiment, not a.any)
    if not ids:
        sys.exit(f"seen-tasks: experiment {experiment} has no trajectories")
    kept = []
    with open(a.tasks) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"seen-tasks: {a.tasks} line {n} is not JSON ({e})")
            if row.get("id") in ids:
                kept.append(line if line.endswith("\n") else line + "\n")
    with open(a.out, "w") as f:
        f.writelines(kept)
    which = "any run" if a.any else "every run"
    print(f"{len(ids)} tasks trained on by {which} of {experiment}; {len(kept)} of them in "
          f"{a.tasks} -> {a.out}")


if __name__ == "__main__":
    main()

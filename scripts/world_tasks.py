"""What the research-world task scripts share: reading a task file and naming a task's lineages.

A task's lineage is the number in its rubrics' evidence ids (`gene-00012`, `protein-00012`,
... all name lineage 12). Imported by split-tasks-by-lineage.py and disjoint-eval-tasks.py
(their directory is first on sys.path when they run). Standard library only.
"""
import json
import re

LINEAGE = re.compile(r"^(?:gene|protein|compound|institute)-(\d+)$")


def rows(path: str):
    """Yield (line, task) for each non-blank line of a JSONL task file; a line that is not
    JSON stops the script with its file and line number."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line, json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON ({e})")


def lineages(task: dict) -> set:
    """Every lineage the task's rubric evidence names."""
    return {
        int(m.group(1))
        for r in task.get("rubrics", [])
        for e in r.get("evidence", [])
        if (m := LINEAGE.match(e))
    }

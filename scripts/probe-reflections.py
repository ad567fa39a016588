#!/usr/bin/env python3
"""How often does a model write a valid reflection? (issue 25)

A reflection candidate is valid when both `<reflection_rubrics>` and `<reflection_takeaways>`
are present, closed and non-empty (domain/reflection/parse.rs). This probe replays the prompts
a run's reflection job stored (`reflections.prompt_token_ids` of RUN at STEP, one per task, the
exact tokens the meta-policy saw) against a served model (`trainer serve --model DIR`), samples
N candidates each at the meta-policy's settings, and prints the valid share (overall and by
how the attempt reflected on ended: `answer`, `forced_answer`, `length`), how many candidates
ran to the token limit and one example. Serving the warm start, then a run's
checkpoints, tells whether reflections degrade with the agent's RL or with the reflection
updates.

  usage: probe-reflections.py RUN STEP URL [--n 4] [--temperature 0.7] [--max-tokens 256]
         [--seed 17] [--db postgres://postgres@127.0.0.1:5432/rubricem]

Needs psql on PATH (the rows are read with one bound-free query over a validated UUID and
integer). Standard library only.
"""
import argparse
import json
import re
import subprocess
import sys
import urllib.request

STOP = "</reflection_takeaways>"


def block(text, tag):
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else text[start:end].strip()


def valid(text):
    r, t = block(text, "reflection_rubrics"), block(text, "reflection_takeaways")
    return bool(r) and bool(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("step", type=int)
    ap.add_argument("url")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--db", default="postgres://postgres@127.0.0.1:5432/rubricem")
    a = ap.parse_args()
    if not re.fullmatch(r"[0-9a-f-]{36}", a.run):
        sys.exit(f"RUN = {a.run!r}: expected a run UUID")
    sql = (
        "select distinct on (r.task_id) r.task_id, coalesce(t.finish_reason, 'unknown'), "
        "array_to_json(r.prompt_token_ids) from reflections r "
        "left join trajectories t on t.id = r.source_trajectory_id "
        f"where r.run_id = '{a.run}' and r.step = {int(a.step)} "
        "order by r.task_id, r.candidate_index"
    )
    rows = subprocess.run(["psql", a.db, "-Atc", sql], check=True, capture_output=True,
                          text=True).stdout.split("\n")
    prompts = [(r.split("|", 2)[1], json.loads(r.split("|", 2)[2])) for r in rows if r.strip()]
    if not prompts:
        sys.exit(f"no stored reflection prompts for run {a.run} at step {a.step}")
    total = ok = at_limit = 0
    by_reason = {}
    example = None
    for i, (reason, ids) in enumerate(prompts):
        body = {
            "model": "policy", "prompt": ids, "n": a.n, "temperature": a.temperature,
            "max_tokens": a.max_tokens, "stop": [STOP], "include_stop_str_in_output": True,
            "seed": a.seed + i,
        }
        req = urllib.request.Request(a.url.rstrip("/") + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)
        for c in out["choices"]:
            total += 1
            good = valid(c["text"])
            ok += good
            v = by_reason.setdefault(reason, [0, 0])
            v[0] += good
            v[1] += 1
            at_limit += c.get("finish_reason") == "length"
            if example is None or (good and not valid(example)):
                example = c["text"]
    print(json.dumps({"run": a.run, "step": a.step, "url": a.url, "prompts": len(prompts),
                      "candidates": total, "valid": ok, "valid_share": round(ok / total, 4),
                      "valid_by_attempt_end": {k: f"{v[0]}/{v[1]}" for k, v in sorted(by_reason.items())},
                      "at_token_limit": at_limit, "temperature": a.temperature,
                      "example": example[:600]}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How closely two rollout runs of the same model, tasks and seed agree, token by token.

Two servers that differ only in float rounding (an f32 and a bf16 KV cache, issue 25 session
42) sample the same tokens until their distributions differ enough to flip one draw; from there
on the attempts part. Over each pair of attempts (same task, same sample index) this compares
the generated tokens' behaviour log-probabilities on the common prefix, the tokens both runs
sampled before the first difference: their mean and largest absolute difference, what the
trainer's truncated importance weights would see (exp of the difference), and how long the
prefixes run.

    usage: logprob-agreement.py RUN_A RUN_B   (run ids; DATABASE_URL, default the local
           rubricem database; reads Postgres through psql)
"""

import json
import math
import os
import re
import subprocess
import sys

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# Each attempt's model tokens and behaviour log-probs, its segments in order. Bound as psql
# variables (:'a', :'b'), never pasted into the SQL.
QUERY = """
SELECT json_agg(json_build_object('run', x.run_id, 'task', x.task_id, 'i', x.sample_index,
                                  'toks', x.toks, 'lps', x.lps))
FROM (SELECT t.run_id, t.task_id, t.sample_index,
             array_agg(tok ORDER BY s.ordinal, k.n) AS toks,
             array_agg(s.logprobs[k.n] ORDER BY s.ordinal, k.n) AS lps
      FROM trajectories t
      JOIN trajectory_segments s ON s.trajectory_id = t.id AND s.kind = 'model'
      CROSS JOIN LATERAL unnest(s.token_ids) WITH ORDINALITY AS k(tok, n)
      WHERE t.run_id IN (:'a'::uuid, :'b'::uuid)
      GROUP BY t.run_id, t.task_id, t.sample_index) x
"""


def fetch(url, a, b):
    out = subprocess.run(
        ["psql", url, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-v", f"a={a}", "-v", f"b={b}"],
        input=QUERY,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"logprob-agreement: psql failed: {out.stderr.strip()}")
    text = out.stdout.strip()
    return json.loads(text) if text else None


def main():
    if len(sys.argv) != 3 or not all(UUID.match(r) for r in sys.argv[1:]):
        sys.exit(__doc__.strip().split("\n\n")[-1])
    a, b = sys.argv[1:]
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rubricem")
    rows = fetch(url, a, b) or []
    by = {}
    for r in rows:
        by.setdefault((r["task"], r["i"]), {})[r["run"]] = r
    pairs = [(p[a], p[b]) for p in by.values() if a in p and b in p]
    if not pairs:
        sys.exit(f"logprob-agreement: runs {a} and {b} share no attempt (task, sample index)")
    diffs, prefixes, whole = [], [], 0
    for x, y in pairs:
        n = 0
        for tx, ty in zip(x["toks"], y["toks"]):
            if tx != ty:
                break
            n += 1
        prefixes.append(n)
        whole += n == len(x["toks"]) == len(y["toks"])
        diffs += [lx - ly for lx, ly in zip(x["lps"][:n], y["lps"][:n])]
    absd = sorted(abs(d) for d in diffs)
    ratio = [math.exp(d) for d in diffs]

    def q(p):
        return absd[min(len(absd) - 1, int(p * len(absd)))] if absd else float("nan")

    prefixes.sort()
    print(f"attempts compared: {len(pairs)}; identical throughout: {whole}")
    print(
        f"common prefix tokens: {sum(prefixes)} (median {prefixes[len(prefixes) // 2]} per attempt,"
        f" of {sum(len(x['toks']) for x, _ in pairs)} in run A)"
    )
    if absd:
        print(
            f"|logprob A - logprob B| on the common prefix: mean {sum(absd) / len(absd):.2e}, "
            f"median {q(0.5):.2e}, p99 {q(0.99):.2e}, max {absd[-1]:.2e}"
        )
        print(
            f"exp(A - B): min {min(ratio):.4f}, max {max(ratio):.4f}; "
            f"outside [0.99, 1.01]: {sum(not 0.99 <= r <= 1.01 for r in ratio)} of {len(ratio)}"
        )


if __name__ == "__main__":
    main()

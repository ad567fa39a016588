#!/usr/bin/env python3
"""How much generation goes into verbatim loops, and what would stopping them save? (issue 25)

A small policy that fails often does so by repeating one short span until the token budget
cuts it (`finish_reason` = `length`). This reads the stored model segments of the given runs'
trajectories and replays, token by token, a loop detector over each turn's model tokens (a
tool output starts a new turn): it fires at the first token where the last REPEATS x p tokens
are REPEATS copies of one p-token period, for some p <= PERIOD. For each setting it prints:

- of the attempts cut at the budget, how many it stops and at what share of their model tokens
  (median), and the model tokens it saves (the rest of the attempt), as a share of the cut
  attempts' tokens and of all model tokens;
- of the attempts not cut, how many it would stop (each one an answer lost), and how many of
  those scored a reward above 0.

Nothing here changes a run: it measures what a stop rule would buy before one is built.

With --probs, it also reads the sampled tokens' stored probabilities p (the behaviour
logprobs) in each attempt the detector stops at the largest REPEATS (or that a run's own loop
stop ended, finish reason `repetition`), split into the tokens before the loop's first copy,
the first copy, and the later copies, and prints their mean p and mean 1 - p. A policy
gradient reaches a sampled token's logit scaled by 1 - p, so 1 - p near 0 over the copies says
that a negative reward cannot unlearn the loop there: only the tokens where it begins can move.
With --by-step K it also prints, per K training steps, the share of attempts that loop and the
mean p of the three regions, to see whether training moves the loop's onset.

  usage: loop-onset.py RUN [RUN ...] [--period 32] [--repeats 4,8,16] [--probs [--by-step K]]
         [--db postgres://postgres@127.0.0.1:5432/rubricem]

Needs psql on PATH (one query over validated UUIDs). Standard library only.
"""
import argparse
import math
import statistics
import subprocess
import sys
import uuid


def fire_at(turns, max_period, repeats):
    """Model tokens generated before the detector fires (counting the token it fires on), or
    None. `turns` is a list of token lists; counters restart at each turn."""
    span = loop_span(turns, max_period, repeats)
    return None if span is None else span[1]


def loop_span(turns, max_period, repeats):
    """(start, end, period) of the first loop the detector fires on, as offsets into the
    attempt's model tokens (all turns joined): the loop's `repeats` copies are
    [start, end) with end the token it fires on, exclusive, plus one; None if it never fires."""
    seen = 0
    for toks in turns:
        run = [0] * (max_period + 1)
        for i, tok in enumerate(toks):
            for p in range(1, max_period + 1):
                if i >= p and tok == toks[i - p]:
                    run[p] += 1
                    if run[p] >= (repeats - 1) * p:
                        end = seen + i + 1
                        return end - repeats * p, end, p
                else:
                    run[p] = 0
        seen += len(toks)
    return None


def prob_regions(t, max_period, repeats):
    """The stored probabilities of an attempt's model tokens before its loop, in the loop's
    first copy and in the later copies; None when the detector does not fire."""
    span = loop_span(t["turns"], max_period, repeats)
    if span is None:
        return None
    start, end, p = span
    probs = [math.exp(x) for turn in t["probs"] for x in turn]
    return probs[:start], probs[start:start + p], probs[start + p:end]


def load(db, runs):
    ids = ",".join(f"'{r}'" for r in runs)
    sql = f"""
        SELECT t.id, t.step, t.finish_reason,
               coalesce((SELECT max(w.reward) FROM trajectory_rewards w
                         WHERE w.trajectory_id = t.id)::text, ''),
               s.ordinal, s.kind, array_to_string(s.token_ids, ' '),
               coalesce(array_to_string(s.logprobs, ' '), '')
        FROM trajectories t JOIN trajectory_segments s ON s.trajectory_id = t.id
        WHERE t.run_id IN ({ids})
        ORDER BY t.id, s.ordinal"""
    out = subprocess.run(["psql", db, "-AtF", "\t", "-c", sql], check=True,
                         capture_output=True, text=True).stdout
    trajs = {}
    for line in out.splitlines():
        tid, step, finish, reward, _, kind, toks, logprobs = line.split("\t")
        t = trajs.setdefault(tid, {"finish": finish, "step": int(step),
                                   "reward": float(reward) if reward else None,
                                   "turns": [[]], "probs": [[]]})
        if kind == "model":
            t["turns"][-1].extend(int(x) for x in toks.split())
            t["probs"][-1].extend(float(x) for x in logprobs.split())
        elif t["turns"][-1]:
            t["turns"].append([])
            t["probs"].append([])
    return list(trajs.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run ids")
    ap.add_argument("--period", type=int, default=32, help="longest period checked (tokens)")
    ap.add_argument("--repeats", default="4,8,16", help="comma-separated repeat counts")
    ap.add_argument("--probs", action="store_true",
                    help="also print the sampled tokens' probabilities before and in the loops")
    ap.add_argument("--by-step", type=int, metavar="K",
                    help="with --probs: also per K training steps (does the loop's onset fall?)")
    ap.add_argument("--db", default="postgres://postgres@127.0.0.1:5432/rubricem")
    a = ap.parse_args()
    try:
        runs = [str(uuid.UUID(r)) for r in a.runs]
    except ValueError as e:
        sys.exit(f"loop-onset: a run id is not a UUID ({e})")
    try:
        repeats = [int(x) for x in a.repeats.split(",")]
    except ValueError:
        sys.exit(f"loop-onset: --repeats = {a.repeats!r}; expected integers such as 4,8,16")
    if a.by_step is not None and not (a.probs and 1 <= a.by_step <= 10_000):
        sys.exit(f"loop-onset: --by-step = {a.by_step}; allowed: 1 to 10000, with --probs")
    if not 1 <= a.period <= 512 or any(r < 2 or r > 1000 for r in repeats):
        sys.exit(f"loop-onset: --period = {a.period} (allowed 1-512), --repeats = {a.repeats} "
                 "(each allowed 2-1000)")
    trajs = load(a.db, runs)
    if not trajs:
        sys.exit(f"loop-onset: no trajectories with segments for {', '.join(runs)}")
    size = {id(t): sum(len(x) for x in t["turns"]) for t in trajs}
    if a.probs:
        print_probs(trajs, a.period, max(repeats), a.by_step)
    cut = [t for t in trajs if t["finish"] == "length"]
    rest = [t for t in trajs if t["finish"] != "length"]
    all_tokens = sum(size.values())
    cut_tokens = sum(size[id(t)] for t in cut)
    print(f"{len(trajs)} trajectories of {len(runs)} run(s): {len(cut)} cut at the budget "
          f"({len(cut) / len(trajs):.2f}), holding {cut_tokens} of {all_tokens} model tokens "
          f"({cut_tokens / all_tokens:.2f})")
    print("| period <= | repeats | cut attempts stopped | onset (median share of the attempt) "
          "| tokens saved (of cut / of all) | other attempts stopped (reward > 0) |")
    print("|---|---|---|---|---|---|")
    for r in repeats:
        stopped, saved, onset = 0, 0, []
        for t in cut:
            f = fire_at(t["turns"], a.period, r)
            if f is not None:
                stopped += 1
                saved += size[id(t)] - f
                onset.append(f / size[id(t)])
        false_stops = [t for t in rest if fire_at(t["turns"], a.period, r) is not None]
        rewarded = sum(1 for t in false_stops if (t["reward"] or 0) > 0)
        med = f"{statistics.median(onset):.2f}" if onset else "-"
        print(f"| {a.period} | {r} | {stopped} / {len(cut)} | {med} | "
              f"{saved / max(cut_tokens, 1):.2f} / {saved / all_tokens:.2f} | "
              f"{len(false_stops)} / {len(rest)} ({rewarded}) |")


def mean_or_nan(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def print_probs(trajs, max_period, repeats, by_step=None):
    regions = [r for r in (prob_regions(t, max_period, repeats) for t in trajs) if r]
    if not regions:
        print(f"no attempt loops {repeats} times within a period of {max_period}")
        return
    print(f"{len(regions)} looping attempts (period <= {max_period}, {repeats} copies): "
          "sampled tokens' probability p")
    print("| tokens | count | mean p | mean 1 - p | share of the attempts' 1 - p |")
    print("|---|---|---|---|---|")
    names = ["before the loop", "the loop's first copy", "the later copies"]
    mass = [sum(1 - x for r in regions for x in r[k]) for k in range(3)]
    for k, name in enumerate(names):
        xs = [x for r in regions for x in r[k]]
        mean = sum(xs) / len(xs) if xs else float("nan")
        print(f"| {name} | {len(xs)} | {mean:.3f} | {1 - mean:.3f} | "
              f"{mass[k] / max(sum(mass), 1e-12):.3f} |")
    if by_step is None:
        return
    print(f"\nPer {by_step} training steps: attempts that loop, and the sampled tokens' mean p")
    print("| steps | attempts | looping | before the loop | first copy | later copies |")
    print("|---|---|---|---|---|---|")
    bins = {}
    for t in trajs:
        b = bins.setdefault(t["step"] // by_step, [0, []])
        b[0] += 1
        r = prob_regions(t, max_period, repeats)
        if r:
            b[1].append(r)
    for k in sorted(bins):
        n, rs = bins[k]
        ps = [f"{mean_or_nan([x for r in rs for x in r[j]]):.3f}" for j in range(3)]
        print(f"| {k * by_step}-{(k + 1) * by_step - 1} | {n} | {len(rs)} ({len(rs) / n:.2f}) | "
              f"{' | '.join(ps)} |")


if __name__ == "__main__":
    main()

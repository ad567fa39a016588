#!/usr/bin/env python3
"""Score an experiment's policies on the tasks their runs trained on, against the warm start (issue 25).

An evaluation set may not overlap a run's training tasks, so this probe (BENCHMARKS.md, issue 25
session 47, done there by hand) scores them from short probe runs of their own:

1. `seen-tasks.py` writes the rows of --tasks that every run of EXPERIMENT trained on.
2. Per weights (the warm start, then each run's last checkpoint, which the runs write at their
   final step), a one-step `scripts/ablation-mini.sh` experiment on one server pair: its own
   training tasks are --pool (other lineages, so the set is allowed), its only evaluation the
   seen tasks (set `seen`: --size tasks, --n samples at --temperature, the same picks and sampling
   seeds for every weights). Each probe is stopped as soon as its version-0 evaluation is stored;
   two run side by side (one core each).
3. The summary: per weights the score and exact rate, and the change against the warm start
   paired over tasks (mean ± standard error over tasks of the per-task mean over samples), then
   mean ± sd of the changes over the runs; printed and written to OUT/summary.md.

With --models LABEL=DIR ... and --eval TASKS.jsonl instead of an experiment, the same machinery
scores any model directories (the first is the reference) on any task file the probes' pool does
not overlap, under the subset name --subset (default `probe`): e.g. a warm start against models
trained from it some other way (issue 25 session 51: supervised passes on the RL tasks' teacher
demonstrations, the ceiling of what those tasks can teach).

  usage: seen-task-probe.py EXPERIMENT --from runs/EXP_DIR --tasks TASKS.jsonl --pool POOL.jsonl
         [--model runs/split/model-sft] [--out runs/probe-XXXXXXXX] [--size 64] [--n 2]
         [--temperature 0.7] [--bin runs/bin] [--port 8100] [--set KEY=VALUE ...]
         [--db postgres://postgres@127.0.0.1:5432/rubricem]
         seen-task-probe.py --models LABEL=MODEL_DIR ... --eval TASKS.jsonl --pool POOL.jsonl
         [--subset probe] [--out DIR] [--size ...] (the first model is the reference)
         seen-task-probe.py --summary LABEL=PROBE_EXPERIMENT ... [--subset seen]

--set carries the experiment's own settings the probes must share (data.index, data.tokenizer,
rollout.repetition_detection, ...); the probe's step count, seeds, recipe, training tasks and
evaluation sets are the probe's. Needs psql on PATH; standard library only.
"""
import argparse
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEN = "seen"


def say(msg):
    print(f"seen-task-probe: {msg}", file=sys.stderr, flush=True)


def a_uuid(text):
    try:
        return str(uuid.UUID(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UUID ({e})") from e


def psql(db, sql):
    """Rows of one query (every value interpolated is a validated UUID or a fixed name)."""
    out = subprocess.run(["psql", db, "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def last_checkpoints(db, experiment):
    """(run name, seed, checkpoint directory) of each run of the experiment, by seed then name."""
    rows = psql(db, f"""
        SELECT r.name, r.seed, c.path
        FROM runs r
        LEFT JOIN LATERAL (SELECT path FROM checkpoints WHERE run_id = r.id
                           ORDER BY step DESC LIMIT 1) c ON true
        WHERE r.experiment_id = '{experiment}' ORDER BY r.seed, r.name""")
    missing = [name for name, _, path in rows if not path]
    if missing:
        sys.exit(f"seen-task-probe: runs {', '.join(missing)} of {experiment} have no checkpoint")
    return [(name, int(seed), path) for name, seed, path in rows]


def find_checkpoint(path, runs_dir):
    """A stored checkpoint path is the trainer's, under its --checkpoint-dir: absolute as it is,
    else looked up under the experiment's directory (`ablation-mini.sh`'s pairs keep theirs in
    DIR/a/checkpoints and DIR/b/checkpoints)."""
    if os.path.isabs(path):
        return path
    found = [os.path.join(runs_dir, pair, "checkpoints", path)
             for pair in sorted(os.listdir(runs_dir))
             if os.path.isdir(os.path.join(runs_dir, pair, "checkpoints", path))]
    if len(found) != 1:
        sys.exit(f"seen-task-probe: checkpoint {path} found {len(found)} times under "
                 f"{runs_dir}/*/checkpoints (need exactly one; pass the experiment's directory "
                 "with --from)")
    return found[0]


def model_dir(warm, checkpoint, out):
    """The warm start's files (tokenizer, config) with the checkpoint's weights, as links."""
    weights = os.path.abspath(os.path.join(checkpoint, "model.safetensors"))
    if not os.path.isfile(weights):
        sys.exit(f"seen-task-probe: no full weights at {weights} (a LoRA run's checkpoint holds "
                 "an adapter; merge it first)")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(warm):
        src = weights if name == "model.safetensors" else os.path.abspath(os.path.join(warm, name))
        dst = os.path.join(out, name)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(src, dst)
    return out


def probe_args(a, label, seen_file):
    sets = [f"experiment.name=probe-{a.subset}-{label}", "experiment.steps=1", "eval.every=0",
            "eval.held_out=0", "experiment.seeds=[17]", 'experiment.recipes=["baseline-rl"]',
            f"data.tasks={a.pool}",
            f'eval.sets=[{{name="{a.subset}",tasks="{seen_file}",size={a.size},n={a.n},'
            f"temperature={a.temperature}}}]"] + a.set
    args = []
    for s in sets:
        args += ["--set", s]
    return args


def start_probe(a, label, model, port, seen_file):
    out = os.path.join(a.out, label)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, ABLATION_PAIRS="1", ABLATION_PORT=str(port), ABLATION_DIR=out,
               ABLATION_MODEL=model, BIN=a.bin, DATABASE_URL=a.db)
    # The arguments go through ABLATION_ARGS, which the script splits on spaces.
    args = probe_args(a, label, seen_file)
    if any(" " in x for x in args):
        sys.exit(f"seen-task-probe: a --set value holds a space, which ABLATION_ARGS cannot carry: {args}")
    env["ABLATION_ARGS"] = " ".join(args)
    log = open(os.path.join(out, "probe.log"), "w")
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "ablation-mini.sh")], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return {"label": label, "proc": proc, "log": os.path.join(out, "probe.log"), "exp": None}


def probe_done(a, p):
    """The probe's experiment once its version-0 evaluation is stored, else None."""
    if p["exp"] is None:
        try:
            with open(p["log"]) as f:
                m = re.search(r"experiment ([0-9a-f-]{36})", f.read())
        except FileNotFoundError:
            m = None
        if m:
            p["exp"] = a_uuid(m.group(1))
    if p["exp"] is None:
        return None
    rows = psql(a.db, f"""
        SELECT count(*) FROM evaluations e JOIN runs r ON r.id = e.run_id
        WHERE r.experiment_id = '{p["exp"]}' AND e.policy_version = 0
          AND e.subset = '{a.subset}'""")
    return p["exp"] if rows and int(rows[0][0]) > 0 else None


def run_probes(a, models, seen_file):
    """Probe each (label, model), two at a time; returns [(label, probe experiment)]."""
    todo = list(models)
    running, done = [], {}
    slots = [a.port, a.port + 200]
    while todo or running:
        while todo and len(running) < len(slots):
            label, model = todo.pop(0)
            port = next(s for s in slots if s not in [r["port"] for r in running])
            p = start_probe(a, label, model, port, seen_file)
            p["port"] = port
            running.append(p)
            say(f"probe {label} on port {port} (log {p['log']})")
        time.sleep(5)
        for p in list(running):
            exp = probe_done(a, p)
            if exp is not None:
                os.killpg(p["proc"].pid, signal.SIGTERM)
                p["proc"].wait()
                running.remove(p)
                done[p["label"]] = exp
                say(f"probe {p['label']}: experiment {exp} scored")
            elif p["proc"].poll() is not None:
                for q in running:
                    if q is not p:
                        os.killpg(q["proc"].pid, signal.SIGTERM)
                sys.exit(f"seen-task-probe: probe {p['label']} stopped before its evaluation; "
                         f"see {p['log']}")
    return [(label, done[label]) for label, _ in models]


def results(db, experiment, subset):
    """{task: ([scores], [exact or None])} of a probe's version-0 evaluation of `subset`."""
    rows = psql(db, f"""
        SELECT tk.external_id, er.score, er.exact
        FROM evaluation_results er JOIN runs r ON r.id = er.run_id
        JOIN tasks tk ON tk.id = er.task_id
        WHERE r.experiment_id = '{experiment}' AND er.policy_version = 0
          AND er.subset = '{subset}' AND er.score IS NOT NULL""")
    out = {}
    for task, score, exact in rows:
        s, e = out.setdefault(task, ([], []))
        s.append(float(score))
        e.append(None if exact == "" else exact == "t")
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def paired(ref, other, value):
    """Mean and standard error over shared tasks of value(other) - value(ref) (per-task means)."""
    diffs = []
    for task in sorted(set(ref) & set(other)):
        r, o = value(ref[task]), value(other[task])
        if r is not None and o is not None:
            diffs.append(o - r)
    if len(diffs) < 2:
        return float("nan"), float("nan"), len(diffs)
    m = mean(diffs)
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1))
    return m, sd / math.sqrt(len(diffs)), len(diffs)


def task_score(v):
    return mean(v[0])


def task_exact(v):
    known = [e for e in v[1] if e is not None]
    return mean([float(e) for e in known]) if known else None


def summary(db, probes, subset):
    """Markdown table of the probes against the first (the reference)."""
    data = [(label, exp, results(db, exp, subset)) for label, exp in probes]
    label0, _, ref = data[0]
    lines = [f"Tasks scored: {len(ref)} (reference: {label0})", "",
             "| weights | probe experiment | score | change ± s.e. over tasks | exact | change ± s.e. |",
             "|---|---|---|---|---|---|"]
    changes = []
    for label, exp, res in data:
        score = mean([s for v in res.values() for s in v[0]])
        known = [e for v in res.values() for e in v[1] if e is not None]
        exact = mean([float(e) for e in known]) if known else float("nan")
        if res is ref:
            lines.append(f"| {label} | {exp} | {score:.4f} | | {exact:.3f} | |")
            continue
        ds, ses, n = paired(ref, res, task_score)
        de, see, _ = paired(ref, res, task_exact)
        changes.append(ds)
        lines.append(f"| {label} | {exp} | {score:.4f} | {ds:+.3f} ± {ses:.3f} ({n} tasks) | "
                     f"{exact:.3f} | {de:+.3f} ± {see:.3f} |")
    if len(changes) >= 2:
        m = mean(changes)
        sd = math.sqrt(sum((c - m) ** 2 for c in changes) / (len(changes) - 1))
        lines += ["", f"Score change over {len(changes)} runs: {m:+.3f} ± {sd:.3f} (mean ± sd)"]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", type=a_uuid, help="the experiment whose runs are probed")
    ap.add_argument("--tasks", help="the task file the experiment trained on")
    ap.add_argument("--pool", help="the probes' own training tasks (other lineages)")
    ap.add_argument("--from", dest="runs_dir",
                    help="the experiment's directory (its ABLATION_DIR), where its trainers' "
                    "checkpoints are")
    ap.add_argument("--model", default="runs/split/model-sft", help="the warm start")
    ap.add_argument("--out", help="output directory (default runs/probe-<experiment's first 8>)")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--bin", default="runs/bin")
    ap.add_argument("--port", type=int, default=8100, help="first pair's port (the second +200)")
    ap.add_argument("--set", action="append", default=[], help="probe setting KEY=VALUE")
    ap.add_argument("--db", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rubricem"))
    ap.add_argument("--summary", nargs="+", metavar="LABEL=EXPERIMENT",
                    help="only summarise finished probes (the first is the reference)")
    ap.add_argument("--models", nargs="+", metavar="LABEL=MODEL_DIR",
                    help="score these model directories instead of an experiment's runs (the "
                    "first is the reference); needs --eval")
    ap.add_argument("--eval", dest="eval_tasks", help="with --models: the task file scored")
    ap.add_argument("--subset", help="the evaluation subset's name (default: seen for an "
                    "experiment's training tasks, probe with --models)")
    a = ap.parse_args()
    a.subset = a.subset or (SEEN if not a.models else "probe")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", a.subset):
        sys.exit(f"seen-task-probe: --subset = {a.subset!r}; allowed: 1 to 40 of A-Z a-z 0-9 _ -")
    if a.summary:
        probes = []
        for item in a.summary:
            label, _, exp = item.partition("=")
            try:
                probes.append((label, a_uuid(exp)))
            except argparse.ArgumentTypeError as e:
                sys.exit(f"seen-task-probe: --summary {item}: {e}")
        sys.stdout.write(summary(a.db, probes, a.subset))
        return
    if a.models:
        if a.experiment or not (a.eval_tasks and a.pool):
            ap.error("--models needs --eval and --pool, and no EXPERIMENT")
        models = []
        for item in a.models:
            label, _, path = item.partition("=")
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", label) or not path:
                sys.exit(f"seen-task-probe: --models {item!r}: expected LABEL=MODEL_DIR, LABEL 1 "
                         "to 40 of A-Z a-z 0-9 _ . -")
            if not os.path.isfile(os.path.join(path, "model.safetensors")):
                sys.exit(f"seen-task-probe: --models {item}: no model.safetensors in {path}")
            models.append((label, path))
        if len({label for label, _ in models}) != len(models):
            sys.exit(f"seen-task-probe: --models labels repeat: {[l for l, _ in models]}")
        if not os.path.isfile(a.eval_tasks):
            sys.exit(f"seen-task-probe: --eval {a.eval_tasks}: no such file")
    elif not (a.experiment and a.tasks and a.pool and a.runs_dir):
        ap.error("EXPERIMENT, --tasks, --pool and --from are needed (or --models, or --summary)")
    for name, v, lo, hi in [("--size", a.size, 1, 100_000), ("--n", a.n, 1, 64),
                            ("--port", a.port, 1024, 65234)]:
        if not lo <= v <= hi:
            sys.exit(f"seen-task-probe: {name} = {v}; allowed: {lo} to {hi}")
    if not 0.0 <= a.temperature <= 2.0:
        sys.exit(f"seen-task-probe: --temperature = {a.temperature}; allowed: 0 to 2")
    if a.models:
        a.out = a.out or os.path.join("runs", f"probe-{a.subset}")
        os.makedirs(a.out, exist_ok=True)
        report(a, run_probes(a, models, a.eval_tasks))
        return
    a.out = a.out or os.path.join("runs", f"probe-{a.experiment[:8]}")
    os.makedirs(a.out, exist_ok=True)
    seen_file = os.path.join(a.out, "seen.jsonl")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "seen-tasks.py"), a.experiment,
                    a.tasks, seen_file, "--db", a.db], check=True)
    models = [("warm-start", a.model)]
    for name, _seed, path in last_checkpoints(a.db, a.experiment):
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        checkpoint = find_checkpoint(path, a.runs_dir)
        models.append((label, model_dir(a.model, checkpoint, os.path.join(a.out, "models", label))))
    report(a, run_probes(a, models, seen_file))


def report(a, probes):
    """The summary, printed and written to OUT/summary.md."""
    text = summary(a.db, probes, a.subset)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()

// RubricEM dashboard: a hash-routed single page over the orchestrator's read-only JSON API.
// Charts are drawn by uPlot (bundled from npm at build time). Every string from the database
// is inserted as text, never as HTML.
"use strict";

const STAGES = ["plan", "research", "review", "answer"];
const STAGE_COLORS = { plan: "#4e79a7", research: "#59a14f", review: "#f28e2b", answer: "#b07aa1" };
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
// Metric groups in display order; anything else follows alphabetically.
const GROUP_ORDER = ["reward", "advantage", "train", "rollout", "judge", "batch", "time", "reflection", "bank", "gold", "monitor", "rubrics", "shortform_qa"];
const SERIES_PER_CHART = 5;
const POLL_MS = 5000;

// Charts drawn on the current page (the browser test reads this), and timers to stop on navigation.
window.__charts = [];
let timers = [];
let plots = [];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const fmt = (v, d = 3) => (v === null || v === undefined || Number.isNaN(v)) ? "—" : (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : String(v));
const short = (id) => String(id).slice(0, 8);
const when = (t) => t ? new Date(t).toLocaleString() : "—";
function duration(s) {
  if (s === null || s === undefined) return "—";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}h ${m}m` : m ? `${m}m ${r}s` : `${r}s`;
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try { msg += ": " + ((await r.json()).error || ""); } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${msg}`);
  }
  return r.json();
}

function reset() {
  for (const t of timers) clearInterval(t);
  timers = [];
  for (const p of plots) p.destroy();
  plots = [];
  window.__charts = [];
  document.getElementById("live").textContent = "";
}

function crumbs(...parts) {
  const c = document.getElementById("crumbs");
  c.replaceChildren(...parts.map((p) => p.href ? el("a", { href: p.href, text: p.text }) : el("span", { text: p.text })));
}

function badge(status) { return el("span", { class: `badge ${status}`, text: status }); }
function progress(done, total) {
  const pct = total ? Math.min(100, (100 * done) / total) : 0;
  return el("span", {}, el("span", { class: "progress", title: `${done}/${total}` }, el("div", { style: `width:${pct}%` })), ` ${done}/${total ?? "?"}`);
}

// ---------- charts ----------

// Points of several series ([[x, y], ...] each) aligned on the union of their x values.
function align(seriesPoints) {
  const xs = [...new Set(seriesPoints.flatMap((pts) => pts.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = seriesPoints.map((pts) => {
    const y = new Array(xs.length).fill(null);
    for (const [x, v] of pts) y[index.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}

function chart(parent, title, names, seriesPoints, opts = {}) {
  const box = el("div", { class: "chart", "data-title": title, "data-series": names.length });
  box.append(el("h3", { text: title }));
  parent.append(box);
  const width = Math.max(360, (box.clientWidth || 440) - 12);
  const data = align(seriesPoints);
  box.dataset.points = data[0].length;
  const plot = new uPlot({
    width, height: opts.height || 220,
    scales: { x: { time: false } },
    axes: [{ label: opts.xLabel || "step" }, { size: 60 }],
    series: [{ label: opts.xLabel || "step" }, ...names.map((n, i) => ({
      label: n, stroke: opts.colors?.[i] || PALETTE[i % PALETTE.length], width: 1.6, spanGaps: true,
      points: { show: data[0].length < 40 },
    }))],
  }, data, box);
  plots.push(plot);
  window.__charts.push({ title, series: names.length, points: data[0].length });
  return {
    plot,
    update: (pts) => { const d = align(pts); box.dataset.points = d[0].length; plot.setData(d); },
  };
}

function groupOf(name) { return name.split("/")[0]; }
function groupRank(g) { const i = GROUP_ORDER.indexOf(g); return i < 0 ? GROUP_ORDER.length : i; }

// ---------- pages ----------

async function pageRuns(main) {
  crumbs({ text: "runs" });
  const draw = async () => {
    const runs = await api("/api/runs");
    const rows = runs.map((r) => el("tr", {},
      el("td", {}, el("a", { href: `#/experiment/${r.experiment_id}`, text: r.experiment }), el("div", { class: "muted", text: r.preset })),
      el("td", {}, el("a", { href: `#/run/${r.id}`, text: r.name }), el("div", { class: "muted", text: short(r.id) })),
      el("td", { text: r.recipe }),
      el("td", {}, badge(r.status), r.error ? el("div", { class: "error", text: r.error }) : null),
      el("td", {}, progress(r.completed || 0, r.steps)),
      el("td", { class: "num", text: r.status === "running" ? duration(r.eta_s) : "—" }),
      el("td", { text: when(r.created_at) }),
    ));
    main.replaceChildren(
      el("h1", { text: "Runs" }),
      runs.length ? el("table", {}, el("tr", {}, ...["experiment", "run", "recipe", "status", "progress", "ETA", "created"].map((h) => el("th", { text: h }))), ...rows)
        : el("p", { class: "muted", text: "No runs yet: start one with `orchestrator run --experiment smoke`." }),
    );
  };
  await draw();
  timers.push(setInterval(() => draw().catch(showError), POLL_MS));
}

function runHeader(main, run, tab) {
  crumbs({ text: "runs", href: "#/" }, { text: run.experiment.name, href: `#/experiment/${run.experiment.id}` }, { text: run.name });
  const steps = run.config?.experiment?.steps;
  const done = run.steps.filter((s) => s.status === "completed").length;
  const tabs = [["metrics", ""], ["steps", "/steps"], ["evaluations", "/evaluations"], ["rubrics", "/rubrics"], ["reflections", "/reflections"], ["bank", "/bank"], ["config", "/config"]];
  main.replaceChildren(...[
    el("h1", {}, `${run.name} `, badge(run.status)),
    el("div", { class: "muted" }, `recipe ${run.recipe} · seed ${run.seed} · preset ${run.experiment.preset} · started ${when(run.created_at)} · `, progress(done, steps)),
    run.error ? el("p", { class: "error", text: run.error }) : null,
    el("nav", { class: "tabs" }, ...tabs.map(([t, suffix]) => el("a", { href: `#/run/${run.id}${suffix}`, class: t === tab ? "on" : null, text: t }))),
  ].filter(Boolean));
}

async function pageMetrics(main, id) {
  const [run, metrics] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/metrics`)]);
  runHeader(main, run, "metrics");
  const names = Object.keys(metrics).sort();
  if (!names.length) { main.append(el("p", { class: "muted", text: "No step metrics yet." })); return; }
  const groups = new Map();
  for (const n of names) { const g = groupOf(n); if (!groups.has(g)) groups.set(g, []); groups.get(g).push(n); }
  const ordered = [...groups.keys()].sort((a, b) => groupRank(a) - groupRank(b) || a.localeCompare(b));
  const charts = [];
  for (const g of ordered) {
    const members = groups.get(g);
    const section = el("div", { class: "charts" });
    main.append(el("h2", { text: g }), section);
    for (let i = 0; i < members.length; i += SERIES_PER_CHART) {
      const part = members.slice(i, i + SERIES_PER_CHART);
      const title = members.length > SERIES_PER_CHART ? `${g} (${i / SERIES_PER_CHART + 1}/${Math.ceil(members.length / SERIES_PER_CHART)})` : g;
      const c = chart(section, title, part, part.map((n) => metrics[n]));
      charts.push({ names: part, c });
    }
  }
  if (run.status === "running") {
    let last = Math.max(0, ...names.flatMap((n) => metrics[n].map((p) => p[0])));
    const live = document.getElementById("live");
    live.textContent = "live: polling every 5 s";
    timers.push(setInterval(async () => {
      try {
        const fresh = await api(`/api/runs/${id}/metrics?since=${last}`);
        for (const [n, pts] of Object.entries(fresh)) {
          const old = (metrics[n] || []).filter((p) => p[0] < last);
          metrics[n] = old.concat(pts);
          for (const p of pts) last = Math.max(last, p[0]);
        }
        for (const { names: ns, c } of charts) c.update(ns.map((n) => metrics[n] || []));
        live.textContent = `live: updated ${new Date().toLocaleTimeString()} (step ${last})`;
      } catch (e) { live.textContent = `live: ${e.message}`; }
    }, POLL_MS));
  }
}

async function pageSteps(main, id) {
  const run = await api(`/api/runs/${id}`);
  runHeader(main, run, "steps");
  main.append(el("table", {},
    el("tr", {}, ...["step", "policy version", "status", "seconds", "started"].map((h) => el("th", { text: h }))),
    ...run.steps.map((s) => el("tr", {},
      el("td", {}, el("a", { href: `#/run/${id}/step/${s.step}`, text: `step ${s.step}` })),
      el("td", { class: "num", text: s.policy_version }),
      el("td", {}, badge(s.status)),
      el("td", { class: "num", text: fmt(s.seconds, 1) }),
      el("td", { text: when(s.started_at) }),
    ))));
}

function stageCells(stages, key) {
  const by = Object.fromEntries((stages || []).map((s) => [s.stage, s]));
  return el("span", {}, ...STAGES.map((st) => el("span", { class: `cell-stage ${st}`, title: `${st} ${key}`, text: fmt(by[st]?.[key], 2) })));
}

async function pageStep(main, id, step) {
  const [run, groups] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/steps/${step}`)]);
  runHeader(main, run, "steps");
  main.append(el("h2", { text: `Step ${step}: ${groups.length} groups` }));
  for (const g of groups) {
    main.append(el("h3", {}, `${g.external_id}: `, el("span", { class: "muted", text: g.prompt })));
    main.append(el("table", {},
      el("tr", {}, ...["sample", "reward", "stage scores (plan research review answer)", "stage advantages", "finish", "model tok", "tool tok", "tool calls", "parse issues"].map((h) => el("th", { text: h }))),
      ...g.trajectories.map((t) => el("tr", {},
        el("td", {}, el("a", { href: `#/trajectory/${t.id}`, text: `#${t.sample_index}` })),
        el("td", { class: "num", text: fmt(t.reward) }),
        el("td", {}, stageCells(t.stages, "score")),
        el("td", {}, stageCells(t.stages, "advantage")),
        el("td", { text: t.finish_reason }),
        el("td", { class: "num", text: t.model_tokens }),
        el("td", { class: "num", text: t.tool_tokens }),
        el("td", { class: "num", text: t.tool_calls }),
        el("td", { class: "num", text: t.parse_issues }),
      ))));
  }
}

async function pageEvaluations(main, id) {
  const [run, ev, metrics] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/evaluations`), api(`/api/runs/${id}/metrics`)]);
  runHeader(main, run, "evaluations");
  const subsets = [...new Set(ev.subsets.map((r) => r.subset))].sort();
  const section = el("div", { class: "charts" });
  main.append(el("h2", { text: "Scores per subset and policy version" }), section);
  for (const s of subsets) {
    const rows = ev.subsets.filter((r) => r.subset === s);
    const names = ["score"], pts = [rows.filter((r) => r.score !== null).map((r) => [r.policy_version, r.score])];
    if (rows.some((r) => r.exact !== null)) { names.push("exact"); pts.push(rows.filter((r) => r.exact !== null).map((r) => [r.policy_version, r.exact])); }
    chart(section, s, names, pts, { xLabel: "policy version" });
  }
  // Training judge vs gold judge: the training reward by the version it produced (step + 1).
  const gold = Object.keys(metrics).filter((n) => n.startsWith("gold/"));
  if (gold.length && metrics["reward/mean"]) {
    const cmp = el("div", { class: "charts" });
    main.append(el("h2", { text: "Training judge vs gold judge" }), cmp);
    chart(cmp, "reward/mean vs gold", ["reward/mean (training judge)", ...gold],
      [metrics["reward/mean"].map(([s, v]) => [s + 1, v]), ...gold.map((n) => metrics[n].map(([s, v]) => [s + 1, v]))], { xLabel: "policy version" });
    const div = Object.keys(metrics).filter((n) => n.startsWith("monitor/divergence/") && metrics[n].some((p) => p[1] > 0));
    if (div.length) main.append(el("p", { class: "error", text: `Divergence flagged: ${div.join(", ")} (training reward rose while the gold score fell).` }));
  }
  main.append(el("h2", { text: "Evaluations" }), el("table", {},
    el("tr", {}, ...["subset", "version", "judge", "tasks", "samples", "score", "exact", "judged", "failed", "parse failures", "judge $", "seconds"].map((h) => el("th", { text: h }))),
    ...ev.subsets.map((r) => el("tr", {}, el("td", { text: r.subset }), el("td", { class: "num", text: r.policy_version }), el("td", { text: r.judge_model }),
      ...[r.tasks, r.samples, fmt(r.score), fmt(r.exact), r.judged, r.failed, r.parse_failures, fmt(r.judge_cost_usd, 4), fmt(r.seconds, 1)].map((v) => el("td", { class: "num", text: v }))))));
  if (ev.benchmarks.length) {
    main.append(el("h2", { text: "Benchmarks (gold judges)" }), el("table", {},
      el("tr", {}, ...["name", "benchmark", "version", "status", "summary"].map((h) => el("th", { text: h }))),
      ...ev.benchmarks.map((b) => el("tr", {}, el("td", { text: b.name }), el("td", { text: b.benchmark }), el("td", { class: "num", text: b.policy_version }), el("td", {}, badge(b.status)),
        el("td", {}, el("details", {}, el("summary", { text: "summary" }), el("pre", { text: JSON.stringify(b.summary, null, 1) })))))));
  }
  if (!subsets.length && !ev.benchmarks.length) main.append(el("p", { class: "muted", text: "No evaluations stored for this run." }));
}

async function pageRubrics(main, id) {
  const [run, tasks] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/buffers`)]);
  runHeader(main, run, "rubrics");
  if (!tasks.length) { main.append(el("p", { class: "muted", text: "No rubric buffers for this run." })); return; }
  main.append(el("table", {},
    el("tr", {}, ...["task", "prompt", "rubrics", "active", "pruned", "persistent", "last update"].map((h) => el("th", { text: h }))),
    ...tasks.map((t) => el("tr", {},
      el("td", {}, el("a", { href: `#/run/${id}/rubrics/${t.task_id}`, text: t.external_id })),
      el("td", { text: t.prompt }),
      ...[t.rubrics, t.active, t.inactive, t.persistent, t.updated_step].map((v) => el("td", { class: "num", text: v }))))));
}

async function pageBuffer(main, id, task) {
  const [run, b] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/buffers/${task}`)]);
  runHeader(main, run, "rubrics");
  main.append(el("h2", { text: `Buffer of ${b.task?.external_id}` }), el("p", { text: b.task?.prompt }));
  const rubrics = b.rubrics;
  const steps = run.steps.map((s) => s.step);
  // Added, alive (added and not pruned) and pruned rubrics at each step.
  const added = steps.map((s) => [s, rubrics.filter((r) => (r.created_step ?? -1) === s).length]);
  const alive = steps.map((s) => [s, rubrics.filter((r) => (r.created_step ?? -1) <= s && !(r.state === "inactive" && r.updated_step <= s)).length]);
  const pruned = steps.map((s) => [s, rubrics.filter((r) => r.state === "inactive" && r.updated_step <= s).length]);
  const section = el("div", { class: "charts" });
  main.append(section);
  chart(section, "rubrics in the buffer", ["added", "alive", "pruned (cumulative)"], [added, alive, pruned]);
  const scored = rubrics.filter((r) => r.scores.length).slice(0, SERIES_PER_CHART);
  if (scored.length) chart(section, "mean score per step (first rubrics)", scored.map((r) => (r.title || r.description).slice(0, 40)), scored.map((r) => r.scores.map(([s, , m]) => [s, m])));
  main.append(el("table", {},
    el("tr", {}, ...["stage", "origin", "rubric", "weight", "added", "state", "variance", "judgments", "mean score"].map((h) => el("th", { text: h }))),
    ...rubrics.map((r) => {
      const n = r.scores.reduce((a, [, k]) => a + k, 0);
      const mean = n ? r.scores.reduce((a, [, k, m]) => a + k * m, 0) / n : null;
      return el("tr", {},
        el("td", {}, el("span", { class: `cell-stage ${r.stage}`, text: r.stage })),
        el("td", { text: r.origin }),
        el("td", {}, el("b", { text: r.title }), " ", r.negative ? el("span", { class: "badge failed", text: "negative" }) : null, el("div", { text: r.description })),
        el("td", { class: "num", text: fmt(r.weight, 2) }),
        el("td", { class: "num", text: r.created_step ?? "—" }),
        el("td", { text: r.state === "inactive" ? `pruned at ${r.updated_step}` : r.state }),
        el("td", { class: "num", text: fmt(r.variance) }),
        el("td", { class: "num", text: n }),
        el("td", { class: "num", text: fmt(mean) }));
    })));
}

async function pageReflections(main, id) {
  const [run, rows] = await Promise.all([api(`/api/runs/${id}`), api(`/api/runs/${id}/reflections`)]);
  runHeader(main, run, "reflections");
  if (!rows.length) { main.append(el("p", { class: "muted", text: "No reflection candidates for this run." })); return; }
  main.append(el("table", {},
    el("tr", {}, ...["step", "task", "cand.", "valid", "score", "advantage", "utility", "trained at", "text"].map((h) => el("th", { text: h }))),
    ...rows.map((r) => el("tr", {},
      el("td", { class: "num", text: r.step }), el("td", { text: r.external_id }), el("td", { class: "num", text: r.candidate_index }),
      el("td", { text: r.valid ? "yes" : "no" }), el("td", { class: "num", text: fmt(r.score) }), el("td", { class: "num", text: fmt(r.advantage) }),
      el("td", {}, el("pre", { text: JSON.stringify(r.utility) })), el("td", { class: "num", text: r.trained_step ?? "—" }),
      el("td", {}, el("details", {}, el("summary", { text: `${r.text.length} chars` }), el("pre", { text: r.text })))))));
}

async function pageBank(main, id, q) {
  const run = await api(`/api/runs/${id}`);
  runHeader(main, run, "bank");
  const input = el("input", { type: "search", placeholder: "search questions, rubrics, takeaways", value: q || "", size: 50 });
  const results = el("div");
  const search = async () => {
    const rows = await api(`/api/runs/${id}/bank?q=${encodeURIComponent(input.value)}`);
    results.replaceChildren(el("p", { class: "muted", text: `${rows.length} items` }), el("table", {},
      el("tr", {}, ...["step", "score", "question", "rubrics", "takeaways"].map((h) => el("th", { text: h }))),
      ...rows.map((r) => el("tr", {}, el("td", { class: "num", text: r.step }), el("td", { class: "num", text: fmt(r.score) }),
        el("td", { text: r.question }), el("td", {}, el("pre", { text: r.rubrics })), el("td", {}, el("pre", { text: r.takeaways }))))));
  };
  input.addEventListener("change", () => search().catch(showError));
  main.append(el("p", {}, input, " ", el("button", { onclick: () => search().catch(showError), text: "search" })), results);
  await search();
}

async function pageConfig(main, id) {
  const run = await api(`/api/runs/${id}`);
  runHeader(main, run, "config");
  main.append(el("h2", { text: "Resolved configuration" }), el("pre", { text: JSON.stringify(run.config, null, 2) }));
  if (run.trainer_settings) main.append(el("h2", { text: "Trainer settings" }), el("pre", { text: JSON.stringify(run.trainer_settings, null, 2) }));
  if (run.checkpoints.length) main.append(el("h2", { text: "Checkpoints" }), el("table", {},
    el("tr", {}, ...["step", "version", "kind", "path"].map((h) => el("th", { text: h }))),
    ...run.checkpoints.map((c) => el("tr", {}, el("td", { class: "num", text: c.step }), el("td", { class: "num", text: c.policy_version }), el("td", { text: c.kind }), el("td", { text: c.path })))));
}

async function pageExperiment(main, id, metric) {
  const e = await api(`/api/experiments/${id}/metric?name=${encodeURIComponent(metric || "reward/mean")}`);
  crumbs({ text: "runs", href: "#/" }, { text: e.name });
  const select = el("select", { onchange: (ev) => { location.hash = `#/experiment/${id}/${encodeURIComponent(ev.target.value)}`; } },
    ...e.metrics.sort().map((m) => el("option", { value: m, selected: m === e.metric ? "selected" : null, text: m })));
  const section = el("div", { class: "charts" });
  main.replaceChildren(el("h1", { text: `Experiment ${e.name}` }), el("p", { class: "muted" }, `preset ${e.preset} · ${e.runs.length} runs · metric `, select), section);
  const withPts = e.runs.filter((r) => r.points.length);
  if (withPts.length) chart(section, `${e.metric} by run`, withPts.map((r) => `${r.name} (${r.recipe}, seed ${r.seed})`), withPts.map((r) => r.points), { height: 300 });
  else section.append(el("p", { class: "muted", text: `No run of this experiment recorded ${e.metric}.` }));
  main.append(el("table", {},
    el("tr", {}, ...["run", "recipe", "seed", "status", "last value"].map((h) => el("th", { text: h }))),
    ...e.runs.map((r) => el("tr", {}, el("td", {}, el("a", { href: `#/run/${r.id}`, text: r.name })), el("td", { text: r.recipe }), el("td", { class: "num", text: r.seed }),
      el("td", {}, badge(r.status)), el("td", { class: "num", text: fmt(r.points.at(-1)?.[1]) })))));
}

// ---------- trajectory viewer ----------

function advColor(a, max) {
  if (a === null || a === undefined || !max) return "#eaeef2";
  const t = Math.min(1, Math.abs(a) / max);
  const [r, g, b] = a >= 0 ? [26, 127, 55] : [207, 34, 46];
  return `rgba(${r},${g},${b},${0.12 + 0.88 * t})`;
}

function verdict(score) {
  // Judgments are stored on 0..2 (0 unmet, 1 partly met, 2 met).
  if (score >= 1.5) return el("span", { class: "verdict-met", text: `met (${fmt(score, 2)})` });
  if (score >= 0.5) return el("span", { class: "verdict-partial", text: `partly (${fmt(score, 2)})` });
  return el("span", { class: "verdict-unmet", text: `unmet (${fmt(score, 2)})` });
}

async function pageTrajectory(main, id) {
  const t = await api(`/api/trajectories/${id}`);
  crumbs({ text: "runs", href: "#/" }, { text: t.run, href: `#/run/${t.run_id}` }, { text: `step ${t.step}`, href: `#/run/${t.run_id}/step/${t.step}` }, { text: `#${t.sample_index}` });
  // The advantage each model token carries: its stage's advantage under the training judge.
  const judge = t.stage_scores[0]?.judge_model;
  const adv = Object.fromEntries(t.stage_scores.filter((s) => s.judge_model === judge).map((s) => [s.stage, s.advantage]));
  const maxAdv = Math.max(0, ...Object.values(adv).filter((a) => a !== null).map(Math.abs));
  main.replaceChildren(
    el("h1", { text: `Trajectory ${short(t.id)}` }),
    el("p", { class: "muted", text: `run ${t.run} (${t.recipe}) · step ${t.step} · sample ${t.sample_index} · policy version ${t.policy_version} · finish ${t.finish_reason} · ${t.prompt_tokens} prompt + ${t.model_tokens} model + ${t.tool_tokens} tool tokens · server ${t.server}` }),
  );
  // The group: why did one sample get a higher advantage?
  main.append(el("h2", { text: "Group (same task, same step)" }), el("table", {},
    el("tr", {}, ...["sample", "reward", "stage scores", "stage advantages", "finish"].map((h) => el("th", { text: h }))),
    ...t.group.map((o) => el("tr", { class: o.id === t.id ? "current" : null },
      el("td", {}, o.id === t.id ? el("b", { text: `#${o.sample_index} (this)` }) : el("a", { href: `#/trajectory/${o.id}`, text: `#${o.sample_index}` })),
      el("td", { class: "num", text: fmt(o.reward) }), el("td", {}, stageCells(o.stages, "score")), el("td", {}, stageCells(o.stages, "advantage")), el("td", { text: o.finish_reason })))));

  main.append(el("h2", { text: "Task" }), el("pre", { text: t.task.prompt }));

  main.append(el("h2", { text: "Per-token advantage" }),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:rgba(26,127,55,.9)" }), "positive"), el("span", {}, el("i", { style: "background:rgba(207,34,46,.9)" }), "negative"),
      el("span", {}, el("i", { class: "sw-masked" }), "masked (tool output, injected: not trained)"), el("span", { class: "muted", text: `judge ${judge || "—"}` })));
  const strip = el("div", { class: "heat", id: "heat" });
  const stagebar = el("div", { class: "stagebar" });
  for (const s of t.segments) {
    const masked = s.kind !== "model";
    const a = masked ? null : adv[s.stage || "plan"];
    strip.append(el("div", { class: masked ? "masked" : null, style: `flex-grow:${Math.max(1, s.tokens)};${masked ? "" : `background:${advColor(a, maxAdv)}`}`, title: `${s.kind}${s.stage ? " · " + s.stage : ""} · ${s.tokens} tokens · advantage ${masked ? "masked" : fmt(a)}` }));
    stagebar.append(el("div", { style: `flex-grow:${Math.max(1, s.tokens)};background:${masked ? "#9aa0a6" : STAGE_COLORS[s.stage || "plan"]}` }));
  }
  main.append(strip, stagebar);

  main.append(el("h2", { text: "Segments" }), el("div", { class: "legend" },
    ...STAGES.map((s) => el("span", {}, el("i", { class: `sw-${s}` }), s)), el("span", {}, el("i", { class: "sw-masked" }), "tool output (masked)"), el("span", {}, el("i", { class: "sw-injected" }), "injected")));
  const segs = el("div", { id: "segments" });
  for (const s of t.segments) {
    const cls = s.kind === "tool_output" ? "seg masked" : s.kind === "injected" ? "seg injected masked" : `seg stage-${s.stage || "plan"}`;
    segs.append(el("div", { class: cls, "data-kind": s.kind, "data-stage": s.stage || "" },
      el("span", { class: "meta", text: `#${s.ordinal} · ${s.kind === "model" ? s.stage || "plan" : s.kind + " · masked"} · ${s.tokens} tokens${s.kind === "model" ? " · advantage " + fmt(adv[s.stage || "plan"]) : ""}` }),
      s.text));
  }
  main.append(segs);

  // Parsed scaffold.
  const p = t.parsed || {};
  const parsed = el("div", { class: "grid2" });
  const left = el("div"), right = el("div");
  parsed.append(left, right);
  if (p.plan) {
    left.append(el("h3", { text: "Plan" }));
    if (p.plan.deep_analysis) left.append(el("pre", { text: p.plan.deep_analysis }));
    if (p.plan.rubric) {
      const r = p.plan.rubric;
      left.append(el("h3", { text: "Self-generated rubric" }), el("ul", {},
        ...["knowledge", "analytical", "negative", "other"].flatMap((k) => (r[k] || []).map((x) => el("li", {}, el("span", { class: "muted", text: `${k}: ` }), x)))));
    }
    if (p.plan.research_plan) left.append(el("h3", { text: "Research plan" }), el("pre", { text: p.plan.research_plan }));
  }
  if (p.review) {
    left.append(el("h3", { text: "Review" }));
    if (p.review.rubric_review) left.append(el("pre", { text: p.review.rubric_review }));
    if (p.review.writing_plan) left.append(el("pre", { text: p.review.writing_plan }));
  }
  right.append(el("h3", { text: "Answer" }), el("pre", { id: "answer", text: p.answer ?? "(no answer parsed)" }));
  if (p.boxed) right.append(el("p", {}, "boxed: ", el("b", { text: p.boxed })));
  // Citations resolved to the tool calls that returned their snippets.
  const bySnippet = new Map();
  for (const c of t.tool_calls) for (const sid of c.snippet_ids || []) bySnippet.set(sid, c);
  if ((p.citations || []).length) {
    right.append(el("h3", { text: "Citations" }), el("ul", {}, ...p.citations.map((c) => el("li", {},
      el("span", { text: `“${c.claim}” ` }),
      ...c.ids.map((sid) => { const call = bySnippet.get(sid); return call ? el("a", { href: `#call-${call.ordinal}`, onclick: (ev) => { ev.preventDefault(); document.getElementById(`call-${call.ordinal}`)?.scrollIntoView(); }, text: `[${sid} → ${call.tool} #${call.ordinal}] ` }) : el("span", { class: "error", text: `[${sid}: not retrieved] ` }); })))));
  }
  if ((p.issues || []).length) right.append(el("h3", { text: "Parse issues" }), el("pre", { text: JSON.stringify(p.issues, null, 1) }));
  main.append(el("h2", { text: "Parsed scaffold" }), parsed);

  // Judge: per-stage scores and every rubric's verdict.
  main.append(el("h2", { text: "Judge" }));
  main.append(el("table", {},
    el("tr", {}, ...["judge", "stage", "score", "return", "advantage", "source"].map((h) => el("th", { text: h }))),
    ...t.stage_scores.map((s) => el("tr", {}, el("td", { text: s.judge_model }), el("td", {}, el("span", { class: `cell-stage ${s.stage}`, text: s.stage })),
      el("td", { class: "num", text: fmt(s.score) }), el("td", { class: "num", text: fmt(s.return) }), el("td", { class: "num", text: fmt(s.advantage) }), el("td", { text: s.source })))));
  if (t.rewards.length) main.append(el("table", {},
    el("tr", {}, ...["judge", "recipe", "reward", "rubric", "citation", "format", "search", "advantage"].map((h) => el("th", { text: h }))),
    ...t.rewards.map((w) => el("tr", {}, el("td", { text: w.judge_model }), el("td", { text: w.recipe }), ...[w.reward, w.rubric, w.citation, w.format, w.search, w.advantage].map((v) => el("td", { class: "num", text: fmt(v) }))))));
  main.append(el("table", { id: "judgments" },
    el("tr", {}, ...["stage", "rubric", "weight", "verdict", "justification", "judge"].map((h) => el("th", { text: h }))),
    ...t.judgments.map((j) => el("tr", {},
      el("td", {}, el("span", { class: `cell-stage ${j.stage}`, text: j.stage })),
      el("td", {}, el("b", { text: j.title }), j.negative ? el("span", { class: "badge failed", text: " negative" }) : null, el("div", { text: j.description }), el("div", { class: "muted", text: j.origin })),
      el("td", { class: "num", text: fmt(j.weight, 2) }),
      el("td", {}, verdict(j.score), j.fallback ? el("div", { class: "muted", text: "fallback" }) : null),
      el("td", { text: j.justification }),
      el("td", { class: "muted", text: `${j.judge_model} (${j.judge_kind})` })))));

  main.append(el("h2", { text: `Tool calls (${t.tool_calls.length}; outputs are masked from the loss)` }));
  for (const c of t.tool_calls) {
    main.append(el("div", { class: "seg masked", id: `call-${c.ordinal}` },
      el("span", { class: "meta", text: `#${c.ordinal} · ${c.stage || "—"} · ${c.tool} · ${c.latency_ms} ms${c.cached ? " · cached" : ""} · masked` }),
      el("b", { text: JSON.stringify(c.arguments) }), "\n", c.error ? el("span", { class: "error", text: c.error }) : (c.output || "")));
  }
}

// ---------- routing ----------

function showError(e) {
  document.getElementById("main").replaceChildren(el("p", { class: "error", text: String(e && e.message || e) }));
}

async function route() {
  reset();
  const main = document.getElementById("main");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (!parts[0]) return await pageRuns(main);
    if (parts[0] === "run" && parts[1]) {
      const [, id, sub, arg] = parts;
      if (!sub) return await pageMetrics(main, id);
      if (sub === "steps") return await pageSteps(main, id);
      if (sub === "step") return await pageStep(main, id, arg);
      if (sub === "evaluations") return await pageEvaluations(main, id);
      if (sub === "rubrics" && arg) return await pageBuffer(main, id, arg);
      if (sub === "rubrics") return await pageRubrics(main, id);
      if (sub === "reflections") return await pageReflections(main, id);
      if (sub === "bank") return await pageBank(main, id, arg);
      if (sub === "config") return await pageConfig(main, id);
    }
    if (parts[0] === "experiment" && parts[1]) return await pageExperiment(main, parts[1], parts.slice(2).join("/"));
    if (parts[0] === "trajectory" && parts[1]) return await pageTrajectory(main, parts[1]);
    main.replaceChildren(el("p", { class: "error", text: `No page ${location.hash}` }));
  } catch (e) {
    showError(e);
  } finally {
    document.body.dataset.ready = location.hash || "#/";
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

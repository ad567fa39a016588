//! `orchestrator data deeprubric`: DeepRubric's three stages (method.md C.2-C.4) over seed
//! topics, each callable alone and resumable from Postgres:
//! - tree: per seed, an evidence tree grown depth first: retrieve passages with the project's own
//!   search tool, extract statements, stop at the depth or node cap or when the gate says so,
//!   else propose sub-queries (per-depth limits, facet rules) as pending children;
//! - compose: per grown tree, one query-rubric candidate from selected leaves (selection and
//!   merge traces), validated against the tree;
//! - verify: per candidate, KEEP / REVISE / DROP with error tags; the final pair has negative
//!   weights removed unless justified.
//!
//! Every LLM reply is parsed tolerantly and validated (`domain::deeprubric`); one that breaks a
//! rule is retried, then recorded as a failed node or item with its reason, never written out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::deeprubric::{
    self as dr, Candidate, Decision, Invalid, Leaves, Node, Stats, TreeLimits,
};
use crate::domain::tool::ToolArgs;
use crate::infra::db::DbError;
use crate::infra::db::deeprubric::{self as store, ItemRow, Spent, VerdictRow};
use crate::infra::llm::{ChatMessage, ChatRequest, JsonSchemaSpec, LlmClient, ResponseFormat};
use crate::infra::tools::runner::ToolRunner;

#[derive(Debug, thiserror::Error)]
pub enum DeepRubricError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(
        "a DeepRubric build named `{name}` exists with other settings ({what}); choose another --name"
    )]
    Conflict { name: String, what: String },
    #[error("build `{name}` was interrupted; run the same command again to continue it")]
    Interrupted { name: String },
    #[error("writing {path}: {message}")]
    Write { path: String, message: String },
}

/// Which stages to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Tree,
    Compose,
    Verify,
}

/// One build to run (or continue).
pub struct DrSpec {
    pub name: String,
    pub seeds: Vec<String>,
    /// The page each seed was drawn from (corpus seeds), whose summary and information points
    /// seed the root; `None` for a topic (the root retrieves like any node).
    pub pages: Vec<Option<String>>,
    pub limits: TreeLimits,
    /// Tree expansion and co-generation.
    pub llm: LlmClient,
    /// Verification (may be a stronger model).
    pub verifier: LlmClient,
    pub temperature: f32,
    pub max_tokens: u32,
    /// Attempts per LLM call whose reply breaks the schema or a rule.
    pub attempts: u32,
    pub tools: Arc<ToolRunner>,
    /// The search tool passages come from.
    pub search_tool: String,
    pub trees_inflight: usize,
    pub progress: bool,
    /// LLM prices for the cost accounting.
    pub prices: dr::Prices,
}

impl DrSpec {
    /// What the build's outputs depend on (an existing build must match).
    fn config(&self) -> Value {
        json!({
            "seeds_sha256": crate::domain::util::sha256_hex(self.seeds.join("\n").as_bytes()),
            "seeds": self.seeds.len(),
            "pages_sha256": crate::domain::util::sha256_hex(
                self.pages.iter().map(|p| p.as_deref().unwrap_or("")).collect::<Vec<_>>().join("\u{1f}").as_bytes()
            ),
            "limits": self.limits,
            "llm": self.llm.model(), "verifier": self.verifier.model(),
            "temperature": self.temperature, "max_tokens": self.max_tokens,
            "search_tool": self.search_tool,
            "templates": crate::infra::prompts::DEEPRUBRIC_TEMPLATES.iter()
                .map(|(n, s)| (n.to_string(), crate::domain::util::sha256_hex(s.as_bytes())))
                .collect::<BTreeMap<_, _>>(),
        })
    }
}

fn template(name: &str) -> &'static str {
    crate::infra::prompts::DEEPRUBRIC_TEMPLATES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, s)| s)
}

/// What one LLM question produced.
struct Asked<T> {
    value: Result<T, String>,
    raw: Option<String>,
    attempts: i32,
    spent: Spent,
}

fn schema(name: &str, required: &[&str]) -> ResponseFormat {
    ResponseFormat {
        kind: "json_schema",
        json_schema: JsonSchemaSpec {
            name: name.to_string(),
            schema: json!({"type": "object", "required": required}),
            strict: false,
        },
    }
}

/// Render `name` with `ctx`, ask, parse; a reply that does not parse or validate is asked again
/// up to `spec.attempts` times; a transport failure (after the client's own retries) ends it.
async fn ask<T>(
    spec: &DrSpec,
    llm: &LlmClient,
    name: &str,
    required: &[&str],
    ctx: minijinja::Value,
    parse: impl Fn(&str) -> Result<T, Invalid>,
) -> Asked<T> {
    let mut out = Asked {
        value: Err("not asked".into()),
        raw: None,
        attempts: 0,
        spent: Spent::default(),
    };
    let prompt = match crate::infra::prompts::render(template(name), ctx) {
        Ok(p) => p,
        Err(e) => {
            out.value = Err(format!("rendering template `{name}`: {e}"));
            return out;
        }
    };
    let req = ChatRequest {
        model: llm.model().to_string(),
        messages: vec![ChatMessage::user(prompt)],
        temperature: spec.temperature,
        max_tokens: spec.max_tokens,
        response_format: Some(schema(name, required)),
        seed: None,
        stop: vec![],
    };
    for _ in 0..spec.attempts.max(1) {
        out.attempts += 1;
        match llm.chat(&req).await {
            Ok((c, _)) => {
                out.spent.calls += 1;
                out.spent.prompt_tokens += c.usage.prompt_tokens as i64;
                out.spent.completion_tokens += c.usage.completion_tokens as i64;
                let parsed = parse(&c.content);
                out.raw = Some(c.content);
                match parsed {
                    Ok(v) => {
                        out.value = Ok(v);
                        return out;
                    }
                    Err(e) => out.value = Err(format!("{name}: {e}")),
                }
            }
            Err(e) => {
                out.value = Err(format!("{name}: LLM call failed: {e}"));
                return out;
            }
        }
    }
    out
}

fn add(a: &mut Spent, b: Spent) {
    a.calls += b.calls;
    a.prompt_tokens += b.prompt_tokens;
    a.completion_tokens += b.completion_tokens;
}

fn bar(on: bool, len: usize, what: &str) -> indicatif::ProgressBar {
    if on {
        crate::telemetry::progress(len as u64, what)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// Run (or continue) the build's `stages`; its statistics at the end.
pub async fn run(
    pool: &PgPool,
    spec: &DrSpec,
    stages: &[Stage],
    cancel: &CancellationToken,
) -> Result<(Uuid, Stats), DeepRubricError> {
    let config = spec.config();
    let (id, stored) = store::open_build(pool, &spec.name, &config).await?;
    if let Some(stored) = stored
        && stored != config
    {
        let what = [
            "seeds_sha256",
            "limits",
            "llm",
            "verifier",
            "search_tool",
            "templates",
        ]
        .into_iter()
        .filter(|k| stored[*k] != config[*k])
        .collect::<Vec<_>>()
        .join(", ");
        return Err(DeepRubricError::Conflict {
            name: spec.name.clone(),
            what,
        });
    }
    store::add_trees(pool, id, &spec.seeds).await?;
    let interrupted = || DeepRubricError::Interrupted {
        name: spec.name.clone(),
    };
    if stages.contains(&Stage::Tree) {
        let todo: Vec<(i32, String)> = store::trees(pool, id)
            .await?
            .into_iter()
            .filter(|t| t.status == "growing")
            .map(|t| (t.seed_index, t.seed))
            .collect();
        let jobs = todo
            .into_iter()
            .map(|(i, seed)| async move { grow(pool, spec, id, i, &seed).await });
        drive(spec, jobs, "trees", cancel).await?;
    }
    if stages.contains(&Stage::Compose) && !cancel.is_cancelled() {
        let done: BTreeSet<i32> = store::items(pool, id)
            .await?
            .into_iter()
            .filter(|i| i.status == "composed")
            .map(|i| i.seed_index)
            .collect();
        let todo: Vec<i32> = store::trees(pool, id)
            .await?
            .into_iter()
            .filter(|t| t.status == "grown" && !done.contains(&t.seed_index))
            .map(|t| t.seed_index)
            .collect();
        let jobs = todo
            .into_iter()
            .map(|i| async move { compose(pool, spec, id, i).await });
        drive(spec, jobs, "compose", cancel).await?;
    }
    if stages.contains(&Stage::Verify) && !cancel.is_cancelled() {
        let done: BTreeSet<i32> = store::verdicts(pool, id)
            .await?
            .into_iter()
            .filter(|v| v.decision.is_some())
            .map(|v| v.seed_index)
            .collect();
        let todo: Vec<ItemRow> = store::items(pool, id)
            .await?
            .into_iter()
            .filter(|i| i.status == "composed" && !done.contains(&i.seed_index))
            .collect();
        let jobs = todo
            .into_iter()
            .map(|i| async move { verify(pool, spec, id, i).await });
        drive(spec, jobs, "verify", cancel).await?;
    }
    if cancel.is_cancelled() {
        store::set_build(pool, id, "interrupted", None).await?;
        return Err(interrupted());
    }
    let stats = stats(pool, id, spec.prices).await?;
    let value = serde_json::to_value(&stats).unwrap_or(Value::Null);
    store::set_build(pool, id, "finished", Some(&value)).await?;
    Ok((id, stats))
}

/// Run one stage's `jobs`, `spec.trees_inflight` at once behind a progress bar, until done or
/// `cancel` (what finished is stored: every job writes as it goes); the first error.
async fn drive<F>(
    spec: &DrSpec,
    jobs: impl Iterator<Item = F>,
    what: &str,
    cancel: &CancellationToken,
) -> Result<(), DeepRubricError>
where
    F: std::future::Future<Output = Result<(), DeepRubricError>>,
{
    let jobs: Vec<F> = jobs.collect();
    let pb = bar(spec.progress, jobs.len(), what);
    let mut s = futures::stream::iter(jobs).buffer_unordered(spec.trees_inflight.max(1));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            next = s.next() => match next {
                Some(r) => { r?; pb.inc(1); }
                None => break,
            }
        }
    }
    pb.finish_and_clear();
    Ok(())
}

/// Grow (or continue) one tree: process pending nodes depth first (deepest, then oldest).
async fn grow(
    pool: &PgPool,
    spec: &DrSpec,
    id: Uuid,
    seed_index: i32,
    seed: &str,
) -> Result<(), DeepRubricError> {
    let mut nodes = store::nodes(pool, id, seed_index).await?;
    if nodes.is_empty() {
        let root = Node {
            id: "N1".into(),
            parent: None,
            depth: 0,
            query: seed.to_string(),
            statements: vec![],
            passages: vec![],
            status: "pending".into(),
            stop_reason: None,
        };
        store::finish_node(pool, id, seed_index, &root, &[], Spent::default(), 0.0).await?;
        nodes.push(root);
    }
    let mut capped = false;
    let mut db_seconds = 0.0;
    // Depth first: the deepest pending node, the oldest of those.
    let next = |nodes: &[Node]| {
        nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.status == "pending")
            .max_by_key(|(i, n)| (n.depth, std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    };
    while let Some(k) = next(&nodes) {
        let t0 = Instant::now();
        let page = spec
            .pages
            .get(seed_index as usize)
            .and_then(|p| p.as_deref());
        let (node, children, spent) = expand(spec, &nodes, k, page).await;
        let work = t0.elapsed().as_secs_f64();
        let w0 = Instant::now();
        capped |= node
            .stop_reason
            .as_deref()
            .is_some_and(|r| r.contains("nodes, the cap"));
        store::finish_node(pool, id, seed_index, &node, &children, spent, work).await?;
        db_seconds += w0.elapsed().as_secs_f64();
        nodes[k] = node;
        nodes.extend(children);
    }
    let leaves = nodes
        .iter()
        .filter(|n| n.status == "leaf" && !n.statements.is_empty())
        .count();
    if leaves == 0 {
        let why = nodes
            .iter()
            .find_map(|n| n.stop_reason.clone().filter(|_| n.status == "failed"))
            .unwrap_or_else(|| "no leaf with statements".into());
        store::set_tree(pool, id, seed_index, "failed", None, Some(&why), db_seconds).await?;
    } else {
        let stop = capped.then(|| format!("node cap {} reached", spec.limits.max_nodes));
        store::set_tree(
            pool,
            id,
            seed_index,
            "grown",
            stop.as_deref(),
            None,
            db_seconds,
        )
        .await?;
    }
    Ok(())
}

/// Process node `k`: passages, statements, then leaf or children. A root with its seed page
/// takes its statements from the page's summary and information points instead.
async fn expand(
    spec: &DrSpec,
    nodes: &[Node],
    k: usize,
    page: Option<&str>,
) -> (Node, Vec<Node>, Spent) {
    let mut node = nodes[k].clone();
    let mut spent = Spent::default();
    if let (0, Some(page)) = (node.depth, page) {
        node.passages = vec![json!({"id": "seed-page", "title": node.query, "url": null})];
        let text: String = page.chars().take(dr::ROOT_PAGE_CHARS).collect();
        let a = ask(
            spec,
            &spec.llm,
            "root",
            &["summary", "information_points"],
            minijinja::context! { topic => node.query, page => text },
            dr::parse_root,
        )
        .await;
        add(&mut spent, a.spent);
        return match a.value {
            Ok(st) => {
                node.statements = st;
                branch(spec, nodes, node, spent).await
            }
            Err(e) => {
                node.status = "failed".into();
                node.stop_reason = Some(e);
                (node, vec![], spent)
            }
        };
    }
    let res = spec
        .tools
        .run(
            &spec.search_tool,
            ToolArgs {
                query: node.query.clone(),
                attrs: Default::default(),
            },
        )
        .await;
    let passages: Vec<Value> = res
        .snippets
        .iter()
        .take(spec.limits.passages)
        .map(|s| {
            json!({"id": s.id, "title": s.title, "url": s.url,
                   "text": s.text.chars().take(spec.limits.passage_chars).collect::<String>()})
        })
        .collect();
    node.passages = passages
        .iter()
        .map(|p| json!({"id": p["id"], "title": p["title"], "url": p["url"]}))
        .collect();
    if passages.is_empty() {
        node.status = "failed".into();
        node.stop_reason = Some(format!(
            "no passages from {}: {}",
            spec.search_tool,
            res.error.unwrap_or_else(|| "no results".into())
        ));
        return (node, vec![], spent);
    }
    let a = ask(
        spec,
        &spec.llm,
        "statements",
        &["statements"],
        minijinja::context! { query => node.query, passages => passages },
        dr::parse_statements,
    )
    .await;
    add(&mut spent, a.spent);
    match a.value {
        Ok(st) => node.statements = st,
        Err(e) => {
            node.status = "failed".into();
            node.stop_reason = Some(e);
            return (node, vec![], spent);
        }
    }
    branch(spec, nodes, node, spent).await
}

/// A node with its statements: a leaf (caps, gate), or expanded with its proposed children.
async fn branch(
    spec: &DrSpec,
    nodes: &[Node],
    mut node: Node,
    mut spent: Spent,
) -> (Node, Vec<Node>, Spent) {
    if let Some(why) = dr::stop_reason(node.depth, nodes.len(), &spec.limits) {
        node.status = "leaf".into();
        node.stop_reason = Some(why);
        return (node, vec![], spent);
    }
    let g = ask(
        spec,
        &spec.llm,
        "gate",
        &["branch"],
        minijinja::context! { query => node.query, depth => node.depth, max_depth => spec.limits.max_depth, statements => node.statements },
        dr::parse_gate,
    )
    .await;
    add(&mut spent, g.spent);
    match g.value {
        Ok((false, why)) => {
            node.status = "leaf".into();
            node.stop_reason = Some(format!("gate: {why}"));
            return (node, vec![], spent);
        }
        Ok((true, _)) => {}
        Err(e) => {
            // A gate that never answers leaves the node a leaf (its statements stand).
            node.status = "leaf".into();
            node.stop_reason = Some(e);
            return (node, vec![], spent);
        }
    }
    let depth = node.depth;
    let parent_q = node.query.clone();
    let s = ask(
        spec,
        &spec.llm,
        "subqueries",
        &["sub_queries"],
        minijinja::context! { query => node.query, depth => depth, limit => dr::children_limit(depth), statements => node.statements },
        move |t| dr::parse_subqueries(t, depth, &parent_q),
    )
    .await;
    add(&mut spent, s.spent);
    let qs = match s.value {
        Ok(qs) if !qs.is_empty() => qs,
        Ok(_) => {
            node.status = "leaf".into();
            node.stop_reason = Some("no sub-queries proposed".into());
            return (node, vec![], spent);
        }
        Err(e) => {
            node.status = "leaf".into();
            node.stop_reason = Some(e);
            return (node, vec![], spent);
        }
    };
    let room = spec.limits.max_nodes.saturating_sub(nodes.len());
    let mut next = nodes.len() + 1;
    let children: Vec<Node> = qs
        .into_iter()
        .take(room)
        .map(|q| {
            let c = Node {
                id: format!("N{next}"),
                parent: Some(node.id.clone()),
                depth: depth + 1,
                query: q,
                statements: vec![],
                passages: vec![],
                status: "pending".into(),
                stop_reason: None,
            };
            next += 1;
            c
        })
        .collect();
    if children.is_empty() {
        node.status = "leaf".into();
        node.stop_reason = Some(format!(
            "the tree has {} nodes, the cap is {}",
            nodes.len(),
            spec.limits.max_nodes
        ));
    } else {
        node.status = "expanded".into();
    }
    (node, children, spent)
}

/// The leaves of a tree with statements.
fn leaves_of(nodes: &[Node]) -> Leaves {
    nodes
        .iter()
        .filter(|n| n.status == "leaf" && !n.statements.is_empty())
        .map(|n| (n.id.clone(), n.statements.clone()))
        .collect()
}

/// The tree as the co-generation prompt shows it: every node, and each leaf with its
/// root-to-leaf path and up to 4 statements of at most 240 characters.
pub fn compact_tree(nodes: &[Node]) -> Value {
    let by_id: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let children = |id: &str| -> Vec<&str> {
        nodes
            .iter()
            .filter(|n| n.parent.as_deref() == Some(id))
            .map(|n| n.id.as_str())
            .collect()
    };
    let path = |n: &Node| {
        let mut p = vec![n.query.clone()];
        let mut cur = n.parent.as_deref();
        while let Some(id) = cur {
            let Some(x) = by_id.get(id) else { break };
            p.push(x.query.clone());
            cur = x.parent.as_deref();
        }
        p.reverse();
        p
    };
    json!({
        "nodes": nodes.iter().map(|n| json!({"id": n.id, "parent": n.parent, "depth": n.depth,
            "query": n.query, "children": children(&n.id)})).collect::<Vec<_>>(),
        "leaves": nodes.iter().filter(|n| n.status == "leaf" && !n.statements.is_empty())
            .map(|n| json!({"id": n.id, "path": path(n),
                "statements": n.statements.iter().take(4)
                    .map(|s| s.chars().take(240).collect::<String>()).collect::<Vec<_>>()}))
            .collect::<Vec<_>>(),
    })
}

async fn compose(
    pool: &PgPool,
    spec: &DrSpec,
    id: Uuid,
    seed_index: i32,
) -> Result<(), DeepRubricError> {
    let nodes = store::nodes(pool, id, seed_index).await?;
    let leaves = leaves_of(&nodes);
    let tree = serde_json::to_string_pretty(&compact_tree(&nodes)).unwrap_or_default();
    let l2 = leaves.clone();
    let a = ask(
        spec,
        &spec.llm,
        "compose",
        &["question", "selected_leaf_ids", "rubrics"],
        minijinja::context! { tree => tree },
        move |t| dr::parse_candidate(t, &l2),
    )
    .await;
    let (status, candidate, error) = match a.value {
        Ok(c) => ("composed", serde_json::to_value(&c).ok(), None),
        Err(e) => ("failed", None, Some(e)),
    };
    store::put_item(
        pool,
        id,
        &ItemRow {
            seed_index,
            status: status.into(),
            candidate,
            error,
            raw: a.raw,
            attempts: a.attempts,
            llm_calls: a.spent.calls,
            prompt_tokens: a.spent.prompt_tokens,
            completion_tokens: a.spent.completion_tokens,
        },
    )
    .await?;
    Ok(())
}

async fn verify(
    pool: &PgPool,
    spec: &DrSpec,
    id: Uuid,
    item: ItemRow,
) -> Result<(), DeepRubricError> {
    let nodes = store::nodes(pool, id, item.seed_index).await?;
    let leaves = leaves_of(&nodes);
    let Some(cand) = item
        .candidate
        .as_ref()
        .and_then(|c| serde_json::from_value::<Candidate>(c.clone()).ok())
    else {
        return Ok(());
    };
    let selected: Vec<Value> = cand
        .selected_leaf_ids
        .iter()
        .map(|l| json!({"id": l, "statements": leaves.get(l)}))
        .collect();
    let (c2, l2) = (cand.clone(), leaves.clone());
    let a = ask(
        spec,
        &spec.verifier,
        "verify",
        &["decision"],
        minijinja::context! {
            question => cand.question,
            rubrics => serde_json::to_string_pretty(&cand.rubrics).unwrap_or_default(),
            leaves => serde_json::to_string_pretty(&selected).unwrap_or_default(),
        },
        move |t| dr::parse_verdict(t, &c2, &l2),
    )
    .await;
    let mut row = VerdictRow {
        seed_index: item.seed_index,
        decision: None,
        error_tags: json!([]),
        verdict: None,
        r#final: None,
        error: None,
        raw: a.raw,
        attempts: a.attempts,
        llm_calls: a.spent.calls,
        prompt_tokens: a.spent.prompt_tokens,
        completion_tokens: a.spent.completion_tokens,
    };
    match a.value {
        Ok(v) => {
            row.decision = Some(
                match v.decision {
                    Decision::Keep => "KEEP",
                    Decision::Revise => "REVISE",
                    Decision::Drop => "DROP",
                }
                .into(),
            );
            row.error_tags = json!(v.error_tags);
            row.r#final = dr::finalize(&cand, &v).map(|(q, rubrics, removed)| {
                json!({"question": q, "rubrics": rubrics, "removed": removed})
            });
            row.verdict = serde_json::to_value(&v).ok();
        }
        Err(e) => row.error = Some(e),
    }
    store::put_verdict(pool, id, &row).await?;
    Ok(())
}

/// The build's statistics from what is stored.
pub async fn stats(pool: &PgPool, id: Uuid, prices: dr::Prices) -> Result<Stats, DbError> {
    let trees = store::trees(pool, id).await?;
    let items = store::items(pool, id).await?;
    let verdicts = store::verdicts(pool, id).await?;
    let mut s = Stats {
        trees: trees.len(),
        trees_failed: trees.iter().filter(|t| t.status == "failed").count(),
        ..Stats::default()
    };
    let (mut nodes_total, mut leaves_total) = (0usize, 0usize);
    for t in &trees {
        let nodes = store::nodes(pool, id, t.seed_index).await?;
        nodes_total += nodes.len();
        for n in nodes.iter().filter(|n| n.status == "leaf") {
            leaves_total += 1;
            *s.leaf_depths.entry(n.depth).or_default() += 1;
        }
        s.spend(
            "tree",
            t.llm_calls.into(),
            t.prompt_tokens,
            t.completion_tokens,
            prices,
        );
    }
    let n = trees.len().max(1) as f64;
    s.nodes_per_tree = nodes_total as f64 / n;
    s.tree_seconds = trees.iter().map(|t| t.seconds).sum::<f64>() / n;
    s.db_seconds_per_tree = trees.iter().map(|t| t.db_seconds).sum::<f64>() / n;
    s.leaves_per_tree = leaves_total as f64 / n;
    let composed: Vec<Candidate> = items
        .iter()
        .filter_map(|i| serde_json::from_value(i.candidate.clone()?).ok())
        .collect();
    s.items_composed = composed.len();
    s.items_failed = items.iter().filter(|i| i.status == "failed").count();
    let c = composed.len().max(1) as f64;
    s.leaves_per_item = composed
        .iter()
        .map(|c| c.selected_leaf_ids.len())
        .sum::<usize>() as f64
        / c;
    let rubrics: Vec<&dr::DrRubric> = composed.iter().flat_map(|c| &c.rubrics).collect();
    s.rubrics_per_item = rubrics.len() as f64 / c;
    s.factual_share = rubrics
        .iter()
        .filter(|r| r.kind == dr::RubricKind::Factual)
        .count() as f64
        / rubrics.len().max(1) as f64;
    for i in &items {
        s.spend(
            "compose",
            i.llm_calls.into(),
            i.prompt_tokens,
            i.completion_tokens,
            prices,
        );
    }
    for v in &verdicts {
        s.spend(
            "verify",
            v.llm_calls.into(),
            v.prompt_tokens,
            v.completion_tokens,
            prices,
        );
        match v.decision.as_deref() {
            Some("KEEP") => s.keep += 1,
            Some("REVISE") => s.revise += 1,
            Some("DROP") => s.drop += 1,
            _ => s.verify_failed += 1,
        }
        if v.decision.as_deref() != Some("KEEP") {
            for t in v.error_tags.as_array().into_iter().flatten() {
                if let Some(t) = t.as_str() {
                    *s.reasons.entry(t.to_string()).or_default() += 1;
                }
            }
        }
        if let Some(removed) = v.r#final.as_ref().and_then(|f| f["removed"].as_array())
            && !removed.is_empty()
        {
            *s.reasons
                .entry("negative-weight removal".into())
                .or_default() += 1;
        }
    }
    Ok(s)
}

/// Write the kept and revised pairs of build `id` as a task file; returns the rows written.
pub async fn write_tasks(pool: &PgPool, id: Uuid, out: &Path) -> Result<usize, DeepRubricError> {
    let trees: BTreeMap<i32, String> = store::trees(pool, id)
        .await?
        .into_iter()
        .map(|t| (t.seed_index, t.seed))
        .collect();
    let items: BTreeMap<i32, ItemRow> = store::items(pool, id)
        .await?
        .into_iter()
        .map(|i| (i.seed_index, i))
        .collect();
    let mut lines = Vec::new();
    for v in store::verdicts(pool, id).await? {
        let Some(f) = &v.r#final else { continue };
        let rubrics: Vec<dr::DrRubric> =
            serde_json::from_value(f["rubrics"].clone()).unwrap_or_default();
        let question = f["question"].as_str().unwrap_or_default();
        if rubrics.is_empty() || question.is_empty() {
            continue;
        }
        let cand = items.get(&v.seed_index).and_then(|i| i.candidate.clone());
        let meta = json!({
            "build": id, "seed": trees.get(&v.seed_index), "decision": v.decision,
            "error_tags": v.error_tags, "removed": f["removed"],
            "selected_leaf_ids": cand.as_ref().map(|c| c["selected_leaf_ids"].clone()),
            "rubric_types": rubrics.iter().map(|r| (r.id.clone(), r.kind)).collect::<BTreeMap<_, _>>(),
            "source_leaf_ids": rubrics.iter().map(|r| (r.id.clone(), r.source_leaf_ids.clone())).collect::<BTreeMap<_, _>>(),
        });
        let row = dr::task_row(
            &format!("deeprubric-{}", v.seed_index),
            question,
            &rubrics,
            meta,
        );
        lines.push(row.to_string());
    }
    let text = if lines.is_empty() {
        String::new()
    } else {
        format!("{}\n", lines.join("\n"))
    };
    let write_err = |e: std::io::Error| DeepRubricError::Write {
        path: out.display().to_string(),
        message: e.to_string(),
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(write_err)?;
    }
    std::fs::write(out, text).map_err(write_err)?;
    Ok(lines.len())
}

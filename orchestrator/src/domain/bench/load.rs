//! Loaders of the benchmarks' published files, read unchanged (benchmarks.md §1-8): HealthBench
//! JSONL (and the HealthBench-derived "Points: n, Item: text" rubric rows), ResearchQA's JSON
//! array, DeepResearch Bench's query / criteria / reference JSONL joined by prompt text,
//! ResearchRubrics JSONL, SQA-CS2 rubric JSON, the SimpleQA CSV, the multi-hop QA JSONL of
//! R1-Searcher and DR Tulu, WebWalkerQA's JSON array, FrontierScience research rubrics, and
//! answers files of other systems. A malformed row is an error naming file, line and field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{
    Benchmark, CoverageItem, Gold, Ingredient, Item, RaceCriterion, RaceDimension, Turn,
    WeightedItem,
};

/// Tolerance of DRB's weight sums.
pub const WEIGHT_TOLERANCE: f64 = 1e-3;

/// Extra files some benchmarks join.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// DRB: criteria.jsonl when the data file is query.jsonl (default: beside it).
    pub criteria: Option<PathBuf>,
    /// DRB: reference.jsonl (reference articles), joined by prompt text.
    pub references: Option<PathBuf>,
    /// ResearchQA: a JSON list of ids to keep, in file order.
    pub subset_ids: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} line {line} field `{field}`: {message}")]
    Row {
        path: String,
        line: usize,
        field: String,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: String, message: String },
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|e| LoadError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

fn row_err(path: &Path, line: usize, field: &str, message: impl Into<String>) -> LoadError {
    LoadError::Row {
        path: path.display().to_string(),
        line,
        field: field.to_string(),
        message: message.into(),
    }
}

/// Non-empty JSONL lines as (1-based line, value).
fn jsonl(path: &Path) -> Result<Vec<(usize, Value)>, LoadError> {
    let text = read(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map(|v| (i + 1, v))
                .map_err(|e| row_err(path, i + 1, "(row)", format!("not JSON: {e}")))
        })
        .collect()
}

/// A JSON array file as (1-based position, value).
fn json_array(path: &Path) -> Result<Vec<(usize, Value)>, LoadError> {
    let v: Value = serde_json::from_str(&read(path)?).map_err(|e| LoadError::File {
        path: path.display().to_string(),
        message: format!("not JSON: {e}"),
    })?;
    match v {
        Value::Array(a) => Ok(a.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect()),
        _ => Err(LoadError::File {
            path: path.display().to_string(),
            message: "expected a JSON array of rows".into(),
        }),
    }
}

fn str_field(path: &Path, line: usize, v: &Value, key: &str) -> Result<String, LoadError> {
    match v.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(row_err(path, line, key, "empty")),
        Some(other) => Err(row_err(
            path,
            line,
            key,
            format!("expected a string, got {other}"),
        )),
        None => Err(row_err(path, line, key, "missing")),
    }
}

/// A finite number at `v[key]`; errors name `field` (e.g. `rubrics[3].weight`).
fn num_field(
    path: &Path,
    line: usize,
    v: &Value,
    key: &str,
    field: &str,
) -> Result<f64, LoadError> {
    v.get(key)
        .and_then(Value::as_f64)
        .filter(|x| x.is_finite())
        .ok_or_else(|| {
            row_err(
                path,
                line,
                field,
                format!(
                    "expected a number, got {}",
                    v.get(key).unwrap_or(&Value::Null)
                ),
            )
        })
}

/// A non-empty string at `v[key]`; errors name `field` (e.g. `rubrics[3].criterion`).
fn text_field(
    path: &Path,
    line: usize,
    v: &Value,
    key: &str,
    field: &str,
) -> Result<String, LoadError> {
    v[key]
        .as_str()
        .filter(|s| !s.trim().is_empty())
        .map(str::to_string)
        .ok_or_else(|| row_err(path, line, field, "missing or empty"))
}

/// The list at `v[key]`.
fn list_field<'v>(
    path: &Path,
    line: usize,
    v: &'v Value,
    key: &str,
) -> Result<&'v [Value], LoadError> {
    v[key]
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| row_err(path, line, key, "missing or not a list"))
}

fn id_of(v: &Value, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match v.get(*k) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => vec![],
    }
}

/// Read a benchmark file into items.
pub fn load(bench: Benchmark, path: &Path, opts: &LoadOptions) -> Result<Vec<Item>, LoadError> {
    let items = match bench {
        Benchmark::Healthbench | Benchmark::HealthbenchHard | Benchmark::HealthbenchConsensus => {
            healthbench(path)?
        }
        Benchmark::Researchqa => researchqa(path, opts)?,
        Benchmark::Drb => drb(path, opts)?,
        Benchmark::Researchrubrics => researchrubrics(path)?,
        Benchmark::SqaCsV2 => sqa(path)?,
        Benchmark::Simpleqa => simpleqa(path)?,
        Benchmark::TwoWiki | Benchmark::Hotpotqa | Benchmark::Musique | Benchmark::Bamboogle => {
            multihop(path)?
        }
        Benchmark::Webwalker => webwalker(path)?,
        Benchmark::Frontierscience => frontierscience(path)?,
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for it in &items {
        if let Some(first) = seen.insert(it.id.as_str(), it.row) {
            return Err(LoadError::File {
                path: path.display().to_string(),
                message: format!(
                    "item id `{}` appears twice (rows {} and {})",
                    it.id,
                    first + 1,
                    it.row + 1
                ),
            });
        }
    }
    Ok(items)
}

/// "Points: n, Item: text" blocks (an item runs until the next line starting with `Points:`).
pub fn points_blocks(text: &str) -> Result<Vec<WeightedItem>, String> {
    let mut out: Vec<WeightedItem> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("Points:") {
            let (num, item) = rest
                .split_once(',')
                .ok_or_else(|| format!("`{}` has no `, Item:` part", line.trim()))?;
            let weight: f64 = num
                .trim()
                .parse()
                .map_err(|_| format!("points `{}` is not a number", num.trim()))?;
            let text = item
                .trim_start()
                .strip_prefix("Item:")
                .unwrap_or(item)
                .trim();
            out.push(WeightedItem {
                text: text.to_string(),
                weight,
                tags: vec![],
            });
        } else if let Some(last) = out.last_mut() {
            last.text.push('\n');
            last.text.push_str(line);
        } else if !t.is_empty() {
            return Err(format!(
                "text before the first `Points:` line: `{}`",
                t.chars().take(60).collect::<String>()
            ));
        }
    }
    for it in &mut out {
        it.text = it.text.trim().to_string();
    }
    if out.is_empty() {
        return Err("no `Points: n, Item: text` line".into());
    }
    Ok(out)
}

fn turns(path: &Path, line: usize, v: &Value, key: &str) -> Result<Vec<Turn>, LoadError> {
    let list = v
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| row_err(path, line, key, "missing or not a list of messages"))?;
    list.iter()
        .map(|m| {
            Ok(Turn {
                role: str_field(path, line, m, "role")
                    .map_err(|_| row_err(path, line, &format!("{key}.role"), "missing"))?,
                content: m["content"].as_str().map(str::to_string).ok_or_else(|| {
                    row_err(
                        path,
                        line,
                        &format!("{key}.content"),
                        "missing or not a string",
                    )
                })?,
            })
        })
        .collect()
}

/// A row's `rubrics` list as weighted items: `criterion` text, the signed weight under
/// `weight_key` (HealthBench `points`, ResearchRubrics `weight`), tags by `tags`.
fn weighted_rubrics(
    path: &Path,
    line: usize,
    v: &Value,
    weight_key: &str,
    tags: impl Fn(&Value) -> Vec<String>,
) -> Result<Vec<WeightedItem>, LoadError> {
    list_field(path, line, v, "rubrics")?
        .iter()
        .enumerate()
        .map(|(k, r)| {
            Ok(WeightedItem {
                text: text_field(
                    path,
                    line,
                    r,
                    "criterion",
                    &format!("rubrics[{k}].criterion"),
                )?,
                weight: num_field(
                    path,
                    line,
                    r,
                    weight_key,
                    &format!("rubrics[{k}].{weight_key}"),
                )?,
                tags: tags(r),
            })
        })
        .collect()
}

fn healthbench(path: &Path) -> Result<Vec<Item>, LoadError> {
    jsonl(path)?
        .into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let id = str_field(path, line, &v, "prompt_id")?;
            if v.get("rubrics").is_some() {
                // The official file.
                let prompt = turns(path, line, &v, "prompt")?;
                let items = weighted_rubrics(path, line, &v, "points", |r| strings(&r["tags"]))?;
                Ok(Item {
                    id,
                    row,
                    prompt,
                    gold: Gold::Weighted { items },
                    tags: strings(&v["example_tags"]),
                    language: None,
                })
            } else {
                // HealthBench-derived rubric-writer rows: the question in the user message after
                // `QUESTION:`, the rubric as the assistant's "Points:" lines.
                let msgs = turns(path, line, &v, "messages")?;
                let user = msgs
                    .iter()
                    .find(|m| m.role == "user")
                    .ok_or_else(|| row_err(path, line, "messages", "no user message"))?;
                let question = user
                    .content
                    .split_once("QUESTION:")
                    .map(|x| x.1)
                    .unwrap_or(&user.content);
                let question = question.split("YOUR RUBRIC:").next().unwrap_or("").trim();
                let question = question.strip_prefix("user:").unwrap_or(question).trim();
                let answer = msgs
                    .iter()
                    .rev()
                    .find(|m| m.role == "assistant")
                    .ok_or_else(|| row_err(path, line, "messages", "no assistant rubric"))?;
                let items = points_blocks(&answer.content)
                    .map_err(|m| row_err(path, line, "messages.assistant", m))?;
                let tags = v["category"]
                    .as_str()
                    .filter(|c| !c.is_empty())
                    .map(|c| vec![format!("category:{c}")])
                    .unwrap_or_default();
                Ok(Item {
                    id,
                    row,
                    prompt: vec![Turn::user(question)],
                    gold: Gold::Weighted { items },
                    tags,
                    language: None,
                })
            }
        })
        .collect()
}

fn researchqa(path: &Path, opts: &LoadOptions) -> Result<Vec<Item>, LoadError> {
    let mut items = json_array(path)?
        .into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let id = id_of(&v, &["id"]).ok_or_else(|| row_err(path, line, "id", "missing"))?;
            let query = str_field(path, line, &v, "query")?;
            let rubric = list_field(path, line, &v, "rubric")?;
            let items = rubric
                .iter()
                .enumerate()
                .map(|(k, r)| {
                    Ok(CoverageItem {
                        text: text_field(
                            path,
                            line,
                            r,
                            "rubric_item",
                            &format!("rubric[{k}].rubric_item"),
                        )?,
                        kinds: strings(&r["type"]),
                    })
                })
                .collect::<Result<Vec<_>, LoadError>>()?;
            if items.is_empty() {
                return Err(row_err(path, line, "rubric", "empty"));
            }
            let mut tags = Vec::new();
            for (k, key) in [("field", "field"), ("domain", "general_domain")] {
                if let Some(s) = v[key].as_str() {
                    tags.push(format!("{k}:{s}"));
                }
            }
            Ok(Item {
                id,
                row,
                prompt: vec![Turn::user(query)],
                gold: Gold::Coverage { items },
                tags,
                language: None,
            })
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    if let Some(ids_path) = &opts.subset_ids {
        let ids: Vec<String> = serde_json::from_str::<Value>(&read(ids_path)?)
            .ok()
            .and_then(|v| {
                v.as_array().map(|a| {
                    a.iter()
                        .filter_map(|x| id_of(&serde_json::json!({"id": x}), &["id"]))
                        .collect()
                })
            })
            .ok_or_else(|| LoadError::File {
                path: ids_path.display().to_string(),
                message: "expected a JSON list of ids".into(),
            })?;
        let keep: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let have: std::collections::HashSet<&str> = items.iter().map(|i| i.id.as_str()).collect();
        if let Some(missing) = ids.iter().find(|i| !have.contains(i.as_str())) {
            return Err(LoadError::File {
                path: ids_path.display().to_string(),
                message: format!("id `{missing}` is not in {}", path.display()),
            });
        }
        items.retain(|i| keep.contains(i.id.as_str()));
    }
    Ok(items)
}

fn drb_dimensions(path: &Path, line: usize, v: &Value) -> Result<Vec<RaceDimension>, LoadError> {
    let weights = v["dimension_weight"]
        .as_object()
        .ok_or_else(|| row_err(path, line, "dimension_weight", "missing or not an object"))?;
    let crits = v["criterions"]
        .as_object()
        .ok_or_else(|| row_err(path, line, "criterions", "missing or not an object"))?;
    let total: f64 = weights.values().filter_map(Value::as_f64).sum();
    if (total - 1.0).abs() > WEIGHT_TOLERANCE {
        return Err(row_err(
            path,
            line,
            "dimension_weight",
            format!("weights sum to {total}; allowed: 1 ± {WEIGHT_TOLERANCE}"),
        ));
    }
    weights
        .iter()
        .map(|(name, w)| {
            let weight = w.as_f64().ok_or_else(|| {
                row_err(
                    path,
                    line,
                    &format!("dimension_weight.{name}"),
                    "not a number",
                )
            })?;
            let list = crits
                .get(name)
                .and_then(Value::as_array)
                .filter(|l| !l.is_empty())
                .ok_or_else(|| {
                    row_err(
                        path,
                        line,
                        &format!("criterions.{name}"),
                        "missing or empty",
                    )
                })?;
            let criteria = list
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    Ok(RaceCriterion {
                        criterion: c["criterion"]
                            .as_str()
                            .ok_or_else(|| {
                                row_err(
                                    path,
                                    line,
                                    &format!("criterions.{name}[{k}].criterion"),
                                    "missing",
                                )
                            })?
                            .to_string(),
                        explanation: c["explanation"].as_str().unwrap_or("").to_string(),
                        weight: c["weight"].as_f64().filter(|x| *x >= 0.0).ok_or_else(|| {
                            row_err(
                                path,
                                line,
                                &format!("criterions.{name}[{k}].weight"),
                                "missing or negative",
                            )
                        })?,
                    })
                })
                .collect::<Result<Vec<_>, LoadError>>()?;
            let s: f64 = criteria.iter().map(|c| c.weight).sum();
            if (s - 1.0).abs() > WEIGHT_TOLERANCE {
                return Err(row_err(
                    path,
                    line,
                    &format!("criterions.{name}"),
                    format!("weights sum to {s}; allowed: 1 ± {WEIGHT_TOLERANCE}"),
                ));
            }
            Ok(RaceDimension {
                name: name.clone(),
                weight,
                criteria,
            })
        })
        .collect()
}

fn drb(path: &Path, opts: &LoadOptions) -> Result<Vec<Item>, LoadError> {
    let rows = jsonl(path)?;
    let is_criteria = rows
        .first()
        .is_some_and(|(_, v)| v.get("criterions").is_some());
    let sibling = |name: &str| path.parent().map(|d| d.join(name)).filter(|p| p.exists());
    let (criteria_rows, criteria_path, query_rows) = if is_criteria {
        let q = match sibling("query.jsonl") {
            Some(q) => jsonl(&q)?,
            None => vec![],
        };
        (rows, path.to_path_buf(), q)
    } else {
        let cp = opts.criteria.clone().or_else(|| sibling("criteria.jsonl")).ok_or_else(|| LoadError::File {
            path: path.display().to_string(),
            message: "DRB queries carry no criteria: pass --criteria criteria.jsonl (or put it beside the query file)".into(),
        })?;
        (jsonl(&cp)?, cp, rows)
    };
    let queries: HashMap<String, &Value> = query_rows
        .iter()
        .filter_map(|(_, v)| v["prompt"].as_str().map(|p| (p.trim().to_string(), v)))
        .collect();
    let references: HashMap<String, String> = match &opts.references {
        Some(rp) => jsonl(rp)?
            .into_iter()
            .map(|(line, v)| {
                Ok((
                    str_field(rp, line, &v, "prompt")?.trim().to_string(),
                    str_field(rp, line, &v, "article")?,
                ))
            })
            .collect::<Result<_, LoadError>>()?,
        None => HashMap::new(),
    };
    let cp = criteria_path.as_path();
    let mut items = Vec::new();
    let mut matched_refs = 0;
    for (row, (line, v)) in criteria_rows.iter().enumerate() {
        let prompt = str_field(cp, *line, v, "prompt")?;
        let id = id_of(v, &["id"]).ok_or_else(|| row_err(cp, *line, "id", "missing"))?;
        let dimensions = drb_dimensions(cp, *line, v)?;
        let q = queries.get(prompt.trim());
        if !query_rows.is_empty() && !is_criteria && q.is_none() {
            continue;
        }
        let language = q.and_then(|q| q["language"].as_str()).map(str::to_string);
        let mut tags = Vec::new();
        if let Some(l) = &language {
            tags.push(format!("language:{l}"));
        }
        if let Some(t) = q.and_then(|q| q["topic"].as_str()) {
            tags.push(format!("topic:{t}"));
        }
        let reference = references.get(prompt.trim()).cloned();
        matched_refs += usize::from(reference.is_some());
        items.push(Item {
            id,
            row,
            prompt: vec![Turn::user(prompt)],
            gold: Gold::Race {
                dimensions,
                reference,
            },
            tags,
            language,
        });
    }
    if let Some(rp) = &opts.references
        && matched_refs == 0
    {
        return Err(LoadError::File {
            path: rp.display().to_string(),
            message: "no reference article matches a task prompt (DRB joins on the prompt text)"
                .into(),
        });
    }
    Ok(items)
}

fn researchrubrics(path: &Path) -> Result<Vec<Item>, LoadError> {
    jsonl(path)?
        .into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let id = id_of(&v, &["sample_id"])
                .ok_or_else(|| row_err(path, line, "sample_id", "missing"))?;
            let prompt = str_field(path, line, &v, "prompt")?;
            let items = weighted_rubrics(path, line, &v, "weight", |r| {
                r["axis"]
                    .as_str()
                    .map(|a| vec![format!("axis:{a}")])
                    .unwrap_or_default()
            })?;
            let mut tags = Vec::new();
            for key in [
                "domain",
                "conceptual_breadth",
                "logical_nesting",
                "exploration",
            ] {
                if let Some(s) = v[key].as_str() {
                    tags.push(format!("{key}:{s}"));
                }
            }
            Ok(Item {
                id,
                row,
                prompt: vec![Turn::user(prompt)],
                gold: Gold::Weighted { items },
                tags,
                language: None,
            })
        })
        .collect()
}

fn sqa(path: &Path) -> Result<Vec<Item>, LoadError> {
    let text = read(path)?;
    let rows: Vec<(usize, Value)> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(a)) => a.into_iter().enumerate().map(|(i, v)| (i + 1, v)).collect(),
        Ok(Value::Object(o)) if o.values().all(Value::is_object) && !o.contains_key("case_id") => o
            .into_iter()
            .enumerate()
            .map(|(i, (k, mut v))| {
                if v.get("case_id").is_none() {
                    v["case_id"] = Value::String(k);
                }
                (i + 1, v)
            })
            .collect(),
        _ => jsonl(path)?,
    };
    rows.into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let id =
                id_of(&v, &["case_id"]).ok_or_else(|| row_err(path, line, "case_id", "missing"))?;
            let question = str_field(path, line, &v, "question")
                .or_else(|_| str_field(path, line, &v["metadata"], "question"))?;
            let ings = list_field(path, line, &v, "ingredients")?;
            let items = ings
                .iter()
                .enumerate()
                .map(|(k, i)| {
                    Ok(Ingredient {
                        name: i["name"].as_str().unwrap_or("").to_string(),
                        criterion: i["criterion"].as_str().unwrap_or("").to_string(),
                        weight: i["weight"].as_f64().filter(|w| *w >= 0.0).ok_or_else(|| {
                            row_err(
                                path,
                                line,
                                &format!("ingredients[{k}].weight"),
                                "missing or negative",
                            )
                        })?,
                        evidence: strings(&i["evidence"]),
                        examples: strings(&i["examples"]),
                    })
                })
                .collect::<Result<Vec<_>, LoadError>>()?;
            Ok(Item {
                id,
                row,
                prompt: vec![Turn::user(question)],
                gold: Gold::Ingredients { items },
                tags: vec![],
                language: None,
            })
        })
        .collect()
}

/// A value of a Python dict repr like `{'topic': 'Art', ...}` (tolerant; `None` when absent).
fn py_dict_value(repr: &str, key: &str) -> Option<String> {
    let pat = format!("'{key}': '");
    let start = repr.find(&pat)? + pat.len();
    let end = repr[start..].find('\'')?;
    Some(repr[start..start + end].to_string())
}

fn simpleqa(path: &Path) -> Result<Vec<Item>, LoadError> {
    let mut rdr = csv::Reader::from_path(path).map_err(|e| LoadError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let headers = rdr
        .headers()
        .map_err(|e| LoadError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?
        .clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| LoadError::File {
                path: path.display().to_string(),
                message: format!(
                    "no `{name}` column (columns: {})",
                    headers.iter().collect::<Vec<_>>().join(", ")
                ),
            })
    };
    let (pc, ac, mc) = (col("problem")?, col("answer")?, col("metadata").ok());
    let mut items = Vec::new();
    for (row, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line() as usize).unwrap_or(row + 2);
            row_err(path, line, "(record)", e.to_string())
        })?;
        let line = rec.position().map(|p| p.line() as usize).unwrap_or(row + 2);
        let get = |c: usize, name: &str| {
            rec.get(c)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .ok_or_else(|| row_err(path, line, name, "missing or empty"))
        };
        let problem = get(pc, "problem")?;
        let answer = get(ac, "answer")?;
        let mut tags = Vec::new();
        if let Some(m) = mc.and_then(|c| rec.get(c)) {
            for key in ["topic", "answer_type"] {
                if let Some(v) = py_dict_value(m, key) {
                    tags.push(format!("{key}:{v}"));
                }
            }
        }
        items.push(Item {
            id: row.to_string(),
            row,
            prompt: vec![Turn::user(problem)],
            gold: Gold::Short {
                answers: vec![answer],
            },
            tags,
            language: None,
        });
    }
    Ok(items)
}

/// A gold answer field: a string, a list, or a JSON-list string (DR Tulu's `ground_truth`).
fn golds(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Array(a)) if s.trim_start().starts_with('[') => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => vec![s.clone()],
        },
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        Value::Number(n) => vec![n.to_string()],
        _ => vec![],
    }
    .into_iter()
    .filter(|s| !s.trim().is_empty())
    .collect()
}

fn multihop(path: &Path) -> Result<Vec<Item>, LoadError> {
    jsonl(path)?
        .into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let (question, answers) = if v.get("messages").is_some() {
                let msgs = turns(path, line, &v, "messages")?;
                let q = msgs
                    .iter()
                    .rev()
                    .find(|m| m.role == "user")
                    .map(|m| m.content.clone())
                    .ok_or_else(|| row_err(path, line, "messages", "no user message"))?;
                (q, golds(&v["ground_truth"]))
            } else {
                (str_field(path, line, &v, "question")?, golds(&v["answer"]))
            };
            if answers.is_empty() {
                let f = if v.get("messages").is_some() {
                    "ground_truth"
                } else {
                    "answer"
                };
                return Err(row_err(path, line, f, "missing or empty"));
            }
            let id = id_of(&v, &["idx", "id"]).unwrap_or_else(|| row.to_string());
            Ok(Item {
                id,
                row,
                prompt: vec![Turn::user(question)],
                gold: Gold::Short { answers },
                tags: vec![],
                language: None,
            })
        })
        .collect()
}

fn webwalker(path: &Path) -> Result<Vec<Item>, LoadError> {
    json_array(path)?
        .into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let question = ["Question", "question"]
                .iter()
                .find_map(|k| v[*k].as_str())
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| row_err(path, line, "Question", "missing or empty"))?
                .to_string();
            let answer = ["answer", "Answer"]
                .iter()
                .find_map(|k| v[*k].as_str())
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| row_err(path, line, "answer", "missing or empty"))?
                .to_string();
            let info = v.get("info").or_else(|| v.get("Info")).unwrap_or(&v);
            let field = |keys: &[&str]| {
                keys.iter()
                    .find_map(|k| info[*k].as_str().or_else(|| v[*k].as_str()))
                    .map(str::to_string)
            };
            let mut tags = Vec::new();
            if let (Some(t), Some(d)) = (
                field(&["type", "Type"]),
                field(&["difficulty_level", "Difficulty_Level"]),
            ) {
                tags.push(format!("cell:{t}/{d}"));
            }
            if let Some(d) = field(&["domain", "Domain"]) {
                tags.push(format!("domain:{d}"));
            }
            let language = field(&["lang", "Language"]);
            Ok(Item {
                id: row.to_string(),
                row,
                prompt: vec![Turn::user(question)],
                gold: Gold::Short {
                    answers: vec![answer],
                },
                tags,
                language,
            })
        })
        .collect()
}

fn frontierscience(path: &Path) -> Result<Vec<Item>, LoadError> {
    let rows = jsonl(path)?;
    // task_group_id identifies a problem; one is repeated in the published file, so ids are the
    // group id where it is unique and `<group id>#<row>` where it is not.
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (_, v) in &rows {
        if let Some(id) = id_of(v, &["task_group_id"]) {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    rows.into_iter()
        .enumerate()
        .map(|(row, (line, v))| {
            let problem = str_field(path, line, &v, "problem")?;
            let rubric = str_field(path, line, &v, "answer")?;
            let items = points_blocks(&rubric).map_err(|m| row_err(path, line, "answer", m))?;
            let gid = id_of(&v, &["task_group_id"]).unwrap_or_else(|| row.to_string());
            let id = if counts.get(&gid).copied().unwrap_or(0) > 1 {
                format!("{gid}#{row}")
            } else {
                gid
            };
            let tags = v["subject"]
                .as_str()
                .map(|s| vec![format!("subject:{s}")])
                .unwrap_or_default();
            Ok(Item {
                id,
                row,
                prompt: vec![Turn::user(problem)],
                gold: Gold::Weighted { items },
                tags,
                language: None,
            })
        })
        .collect()
}

/// One row of an answers file.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerRow {
    pub id: String,
    pub answer: String,
    pub line: usize,
}

/// An answers file: JSONL `{"id": string | integer, "answer": str}` (also `article`, as DRB's
/// agent outputs name it, or `response`); an id twice is an error naming both lines.
pub fn load_answers(path: &Path) -> Result<Vec<AnswerRow>, LoadError> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    jsonl(path)?
        .into_iter()
        .map(|(line, v)| {
            let id = id_of(&v, &["id"])
                .ok_or_else(|| row_err(path, line, "id", "missing (a string or an integer)"))?;
            let answer = ["answer", "article", "response"]
                .iter()
                .find_map(|k| match &v[*k] {
                    Value::String(s) => Some(s.clone()),
                    Value::Object(_) => Some(v[*k].to_string()),
                    _ => None,
                })
                .ok_or_else(|| row_err(path, line, "answer", "missing or not a string"))?;
            if let Some(first) = seen.insert(id.clone(), line) {
                return Err(row_err(
                    path,
                    line,
                    "id",
                    format!("`{id}` already answered on line {first}"),
                ));
            }
            Ok(AnswerRow { id, answer, line })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(rel: &str) -> PathBuf {
        std::env::var("SHARED_DATA")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
            .join(rel)
    }

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn real_files_load() {
        let o = LoadOptions::default();
        let drb = load(
            Benchmark::Drb,
            &shared("deep_research_bench/criteria.jsonl"),
            &o,
        )
        .unwrap();
        assert_eq!(drb.len(), 100);
        assert_eq!(
            drb.iter()
                .filter(|i| i.language.as_deref() == Some("zh"))
                .count(),
            50
        );
        let from_queries = load(
            Benchmark::Drb,
            &shared("deep_research_bench/query.jsonl"),
            &o,
        )
        .unwrap();
        assert_eq!(from_queries.len(), 100);
        assert!(
            from_queries
                .iter()
                .all(|i| matches!(&i.gold, Gold::Race { dimensions, .. } if dimensions.len() == 4))
        );
        assert_eq!(
            load(
                Benchmark::Simpleqa,
                &shared("shortform_qa/simple_qa_test_set.csv"),
                &o
            )
            .unwrap()
            .len(),
            4326
        );
        for (b, f, n) in [
            (Benchmark::TwoWiki, "2wiki_500.jsonl", 500),
            (Benchmark::Hotpotqa, "hotpotqa_500.jsonl", 500),
            (Benchmark::Musique, "musique_500.jsonl", 500),
            (Benchmark::Bamboogle, "bamboogle.jsonl", 125),
        ] {
            let items = load(b, &shared(&format!("shortform_qa/{f}")), &o).unwrap();
            assert_eq!(items.len(), n, "{f}");
            assert!(matches!(&items[0].gold, Gold::Short { answers } if !answers.is_empty()));
        }
        let ww = load(Benchmark::Webwalker, &shared("webwalker/test.json"), &o).unwrap();
        assert_eq!(ww.len(), 680);
        assert!(
            ww[0].tags.iter().any(|t| t.starts_with("cell:")),
            "{:?}",
            ww[0].tags
        );
        let fs = load(
            Benchmark::Frontierscience,
            &shared("frontierscience_research/test.jsonl"),
            &o,
        )
        .unwrap();
        assert_eq!(fs.len(), 60);
        assert!(
            fs.iter()
                .all(|i| matches!(&i.gold, Gold::Weighted { items } if !items.is_empty()))
        );
        let hb = load(
            Benchmark::Healthbench,
            &shared("healthbench_rubrics/sft_train_rubric_writer.jsonl"),
            &o,
        )
        .unwrap();
        assert_eq!(hb.len(), 1329);
        assert!(hb.iter().any(
            |i| matches!(&i.gold, Gold::Weighted { items } if items.iter().any(|x| x.weight < 0.0))
        ));
        assert!(!hb[0].question().contains("QUESTION:") && !hb[0].question().is_empty());
    }

    #[test]
    fn format_fixtures_load() {
        let d = tempfile::tempdir().unwrap();
        let hb = write(
            &d,
            "hb.jsonl",
            r#"{"prompt": [{"role": "user", "content": "q"}], "prompt_id": "p1", "rubrics": [{"criterion": "c", "points": -3, "tags": ["axis:accuracy"]}], "example_tags": ["theme:hedging"], "ideal_completions_data": null, "canary": "x"}"#,
        );
        let items = load(Benchmark::HealthbenchHard, &hb, &LoadOptions::default()).unwrap();
        assert_eq!(items[0].id, "p1");
        assert_eq!(items[0].tags, vec!["theme:hedging"]);
        let rqa = write(
            &d,
            "rqa.json",
            r#"[{"id": "a", "field": "Geology", "general_domain": "Earth", "query": "q?", "rubric": [{"rubric_item": "r1", "type": ["Comparison"]}, {"rubric_item": "r2", "type": "Example"}]}, {"id": "b", "query": "q2", "rubric": [{"rubric_item": "x", "type": "Explanation"}]}]"#,
        );
        let ids = write(&d, "ids.json", r#"["b"]"#);
        let items = load(
            Benchmark::Researchqa,
            &rqa,
            &LoadOptions {
                subset_ids: Some(ids),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, "b");
        let rr = write(
            &d,
            "rr.jsonl",
            r#"{"prompt": "Write", "sample_id": "s1", "domain": "AI", "rubrics": [{"criterion": "good", "weight": 5.0, "axis": "Explicit Criteria"}, {"criterion": "bad", "weight": -4.0, "axis": "Implicit Criteria"}]}"#,
        );
        let items = load(Benchmark::Researchrubrics, &rr, &LoadOptions::default()).unwrap();
        assert!(
            matches!(&items[0].gold, Gold::Weighted { items } if items[1].weight == -4.0 && items[1].tags == ["axis:Implicit Criteria"])
        );
        let sqa = write(
            &d,
            "sqa.json",
            r#"[{"case_id": "c1", "question": "q", "ingredients": [{"name": "ing_1", "criterion": "Explains", "weight": 0.12, "evidence": ["e"], "examples": ["x"]}]}]"#,
        );
        assert_eq!(
            load(Benchmark::SqaCsV2, &sqa, &LoadOptions::default()).unwrap()[0].id,
            "c1"
        );
        let tulu = write(
            &d,
            "tulu.jsonl",
            r#"{"messages": [{"role": "user", "content": "Who?"}], "ground_truth": "[\"A\", \"B\"]"}"#,
        );
        let items = load(Benchmark::TwoWiki, &tulu, &LoadOptions::default()).unwrap();
        assert_eq!(
            items[0].gold,
            Gold::Short {
                answers: vec!["A".into(), "B".into()]
            }
        );
        assert_eq!(items[0].id, "0");
        let ans = write(
            &d,
            "a.jsonl",
            "{\"id\": 3, \"answer\": \"x\"}\n{\"id\": \"p1\", \"article\": \"y\"}\n",
        );
        let rows = load_answers(&ans).unwrap();
        assert_eq!((rows[0].id.as_str(), rows[1].answer.as_str()), ("3", "y"));
    }

    #[test]
    fn malformed_rows_name_file_line_and_field() {
        let d = tempfile::tempdir().unwrap();
        let hb = write(
            &d,
            "hb.jsonl",
            "\n{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"prompt_id\": \"p\", \"rubrics\": [{\"criterion\": \"c\", \"points\": \"ten\"}]}",
        );
        let e = load(Benchmark::Healthbench, &hb, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hb.jsonl line 2 field `rubrics[0].points`"),
            "{e}"
        );
        let cut = write(
            &d,
            "cut.jsonl",
            "{\"idx\": 1, \"question\": \"q\", \"answer\": \"a\"}\n{\"idx\": 2, \"quest",
        );
        let e = load(Benchmark::TwoWiki, &cut, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cut.jsonl line 2") && e.contains("not JSON"),
            "{e}"
        );
        let csv = write(&d, "s.csv", "metadata,problem,answer\n\"{}\",What?,\n");
        let e = load(Benchmark::Simpleqa, &csv, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("s.csv line 2 field `answer`"), "{e}");
        let drb = write(
            &d,
            "criteria.jsonl",
            r#"{"id": 1, "prompt": "p", "dimension_weight": {"insight": 0.5, "readability": 0.4}, "criterions": {"insight": [{"criterion": "c", "weight": 1.0}], "readability": [{"criterion": "d", "weight": 1.0}]}}"#,
        );
        let e = load(Benchmark::Drb, &drb, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1 field `dimension_weight`") && e.contains("0.9"),
            "{e}"
        );
        let dup = write(
            &d,
            "a.jsonl",
            "{\"id\": 1, \"answer\": \"x\"}\n{\"id\": \"1\", \"answer\": \"y\"}\n",
        );
        assert!(
            load_answers(&dup)
                .unwrap_err()
                .to_string()
                .contains("already answered on line 1")
        );
        let q = write(
            &d,
            "query.jsonl",
            r#"{"id": 1, "topic": "t", "language": "en", "prompt": "p"}"#,
        );
        std::fs::remove_file(&drb).unwrap();
        assert!(
            load(Benchmark::Drb, &q, &LoadOptions::default())
                .unwrap_err()
                .to_string()
                .contains("--criteria")
        );
    }
}

//! The research-world generator: a deterministic (per seed) corpus of documents about invented
//! genes, proteins, compounds, institutes and cities, and tasks whose answers need two or more
//! searches, each with rubrics that list the required facts and the documents supporting them.
//! It is the offline task source for tests and the embedded smoke run: nothing is downloaded and
//! no model can know the answers without searching.
//!
//! World structure (one chain per "lineage"):
//!   gene G encodes protein P; P is expressed in tissue T and binds compound C;
//!   C was discovered in year Y by institute I; I is located in city K.
//! Each entity has its own document, with its facts phrased in varied sentences plus filler.
//! Extra documents about unrelated entities act as distractors.

use serde::{Deserialize, Serialize};

use super::CorpusDoc;

/// splitmix64: tiny, fast, and stable forever (unlike library RNGs whose streams may change).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const SYL: &[&str] = &[
    "ka", "ve", "lin", "tor", "za", "mi", "rex", "qua", "dol", "pen", "sur", "ith", "bo", "nar",
    "fel", "gro", "shi", "tav", "ul", "mor", "ces", "dra", "vy", "lum", "ox", "pri", "sel", "tam",
    "ber", "ko",
];
const TISSUES: &[&str] = &[
    "liver",
    "retina",
    "kidney",
    "cerebellum",
    "pancreas",
    "lung",
    "skeletal muscle",
    "skin",
    "spleen",
    "heart",
];
const FILLER: &[&str] = &[
    "Early studies relied on small cohorts and were later replicated in larger samples.",
    "Several groups have proposed alternative models that remain under discussion.",
    "Measurements were taken under standard laboratory conditions.",
    "The nomenclature was harmonised by an international committee.",
    "Reviews of the field note that methods varied considerably between laboratories.",
    "Follow-up work examined seasonal and regional variation.",
    "Public datasets describing these results have been released for reuse.",
];

fn name(rng: &mut Rng, syllables: usize) -> String {
    let mut s = String::new();
    for _ in 0..syllables {
        s.push_str(rng.pick::<&str>(SYL));
    }
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => s,
    }
}

/// One generated rubric: a fact the answer must state, with its key terms and evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorldRubric {
    pub title: String,
    pub description: String,
    pub weight: f32,
    /// Terms whose presence shows the fact was stated (used by the lexical judge).
    pub key_terms: Vec<String>,
    /// Ids of the documents that support the fact.
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorldTask {
    pub id: String,
    pub query: String,
    /// exact | short | long
    pub answer_format: String,
    /// The known answer (a single string for exact tasks; a summary for long ones).
    pub answer: String,
    /// Searches needed to reach the answer.
    pub hops: u32,
    pub rubrics: Vec<WorldRubric>,
}

#[derive(Debug, Clone)]
struct Lineage {
    gene: String,
    protein: String,
    tissue: String,
    compound: String,
    year: u32,
    institute: String,
    city: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct World {
    pub docs: Vec<CorpusDoc>,
    /// Training tasks.
    pub tasks: Vec<WorldTask>,
    /// Evaluation tasks about lineages (and cities) that no training task mentions: only the
    /// research skill transfers to them, never a memorised answer. Empty unless asked for.
    pub held_out: Vec<WorldTask>,
}

fn doc_id(kind: &str, i: usize) -> String {
    format!("{kind}-{i:05}")
}

fn filler(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| *rng.pick(FILLER))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Generate a world with about `docs` documents and `tasks` tasks. Same seed, same world.
pub fn generate(seed: u64, docs: usize, tasks: usize) -> World {
    generate_split(seed, docs, tasks, 0)
}

/// Lineages reserved for `held_out` tasks: the same share of the lineages as the held-out tasks
/// are of all tasks, at least one, and at least one lineage left for training.
fn held_out_lineages(lineages: usize, tasks: usize, held_out: usize) -> usize {
    if held_out == 0 || lineages < 2 {
        return 0;
    }
    (lineages * held_out)
        .div_ceil(tasks + held_out)
        .clamp(1, lineages - 1)
}

/// [`generate`] plus `held_out` evaluation tasks drawn from lineages reserved for them: their
/// genes, proteins, compounds, institutes and cities appear in no training task (the cities
/// are split into two pools as well). Tissues and years are attribute values shared by design.
/// With `held_out = 0` the world is exactly [`generate`]'s.
pub fn generate_split(seed: u64, docs: usize, tasks: usize, held_out: usize) -> World {
    let mut rng = Rng::new(seed);
    // Each lineage yields 4 documents (gene, protein, compound, institute); a quarter of the
    // budget goes to distractors.
    let lineages_n = (docs * 3 / 4 / 4).max(1);
    let mut used = std::collections::HashSet::new();
    // A name not used before. When names of `syl` syllables keep colliding (their 900 or 27,000
    // combinations are nearly used up in a large world), one more syllable is drawn, so any
    // world size terminates; small worlds never get there and keep their names.
    let mut unique = |rng: &mut Rng, syl: usize| {
        let mut syl = syl;
        let mut misses = 0;
        loop {
            let n = name(rng, syl);
            if used.insert(n.clone()) {
                return n;
            }
            misses += 1;
            if misses % 64 == 0 {
                syl += 1;
            }
        }
    };
    let cities: Vec<String> = (0..(lineages_n / 3).max(2))
        .map(|_| unique(&mut rng, 2))
        .collect();
    let reserved = held_out_lineages(lineages_n, tasks, held_out);
    let first_held = lineages_n - reserved;
    // Held-out lineages take their cities from their own pool (at least one city each side).
    let city_split = if reserved == 0 {
        cities.len()
    } else {
        (cities.len() * first_held / lineages_n).clamp(1, cities.len() - 1)
    };
    let mut lineages = Vec::with_capacity(lineages_n);
    for li in 0..lineages_n {
        let pool = if li < first_held {
            &cities[..city_split]
        } else {
            &cities[city_split..]
        };
        let gene = unique(&mut rng, 2).to_uppercase() + &(1 + rng.below(9)).to_string();
        lineages.push(Lineage {
            gene,
            protein: unique(&mut rng, 3),
            tissue: rng.pick(TISSUES).to_string(),
            compound: unique(&mut rng, 3) + "ine",
            year: 1950 + rng.below(70) as u32,
            institute: format!("{} Institute", unique(&mut rng, 2)),
            city: rng.pick(pool).clone(),
        });
    }
    let mut out = Vec::new();
    for (i, l) in lineages.iter().enumerate() {
        let f1 = filler(&mut rng, 2);
        out.push(CorpusDoc {
            id: doc_id("gene", i),
            title: format!("The {} gene", l.gene),
            text: format!(
                "{} is a protein-coding gene. The {} gene encodes the protein {}. {f1}",
                l.gene, l.gene, l.protein
            ),
            url: Some(format!(
                "https://world.invalid/gene/{}",
                l.gene.to_lowercase()
            )),
        });
        let f2 = filler(&mut rng, 2);
        out.push(CorpusDoc {
            id: doc_id("protein", i),
            title: format!("{} (protein)", l.protein),
            text: format!(
                "{} is a protein expressed mainly in the {}. {} binds the compound {} with high affinity. {f2}",
                l.protein, l.tissue, l.protein, l.compound
            ),
            url: Some(format!("https://world.invalid/protein/{}", l.protein.to_lowercase())),
        });
        let f3 = filler(&mut rng, 2);
        out.push(CorpusDoc {
            id: doc_id("compound", i),
            title: format!("{} (compound)", l.compound),
            text: format!(
                "{} is a small-molecule compound. It was discovered in {} by researchers at the {}. {f3}",
                l.compound, l.year, l.institute
            ),
            url: Some(format!("https://world.invalid/compound/{}", l.compound.to_lowercase())),
        });
        let f4 = filler(&mut rng, 2);
        out.push(CorpusDoc {
            id: doc_id("institute", i),
            title: l.institute.clone(),
            text: format!(
                "The {} is a research institute located in {}. {f4}",
                l.institute, l.city
            ),
            url: Some(format!(
                "https://world.invalid/institute/{}",
                l.institute.to_lowercase().replace(' ', "-")
            )),
        });
    }
    let mut k = 0;
    while out.len() < docs {
        let n = unique(&mut rng, 3);
        let f = filler(&mut rng, 3);
        out.push(CorpusDoc {
            id: doc_id("misc", k),
            title: format!("{n} (disambiguation)"),
            text: format!(
                "{n} may refer to several unrelated subjects studied in the {}. {f}",
                rng.pick(TISSUES)
            ),
            url: None,
        });
        k += 1;
    }

    let mut world_tasks = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let li = rng.below(first_held);
        world_tasks.push(task(format!("w{seed}-{t:05}"), t, li, &lineages[li]));
    }
    let held = (0..if reserved == 0 { 0 } else { held_out })
        .map(|t| {
            let li = first_held + rng.below(reserved);
            task(format!("w{seed}-h{t:05}"), t, li, &lineages[li])
        })
        .collect();
    World {
        docs: out,
        tasks: world_tasks,
        held_out: held,
    }
}

/// Task `t` of the world (its kind cycles through the three question shapes) about lineage
/// `li`.
fn task(id: String, t: usize, li: usize, l: &Lineage) -> WorldTask {
    let rub = |title: &str, desc: String, terms: Vec<String>, evidence: Vec<String>| WorldRubric {
        title: title.to_string(),
        description: desc,
        weight: 1.0,
        key_terms: terms,
        evidence,
    };
    let (g, p, c, ins) = (
        doc_id("gene", li),
        doc_id("protein", li),
        doc_id("compound", li),
        doc_id("institute", li),
    );
    match t % 3 {
        0 => WorldTask {
            id,
            query: format!(
                "Which compound is bound by the protein that the {} gene encodes?",
                l.gene
            ),
            answer_format: "exact".into(),
            answer: l.compound.clone(),
            hops: 2,
            rubrics: vec![
                rub(
                    "protein",
                    format!(
                        "Identifies {} as the protein encoded by {}",
                        l.protein, l.gene
                    ),
                    vec![l.protein.clone()],
                    vec![g.clone()],
                ),
                rub(
                    "compound",
                    format!("States that {} binds {}", l.protein, l.compound),
                    vec![l.compound.clone()],
                    vec![p.clone()],
                ),
            ],
        },
        1 => WorldTask {
            id,
            query: format!(
                "In which city is the institute located whose researchers discovered the compound that {} binds?",
                l.protein
            ),
            answer_format: "exact".into(),
            answer: l.city.clone(),
            hops: 3,
            rubrics: vec![
                rub(
                    "compound",
                    format!("States that {} binds {}", l.protein, l.compound),
                    vec![l.compound.clone()],
                    vec![p.clone()],
                ),
                rub(
                    "institute",
                    format!("Names the {} as discoverer of {}", l.institute, l.compound),
                    vec![l.institute.clone()],
                    vec![c.clone()],
                ),
                rub(
                    "city",
                    format!("Gives {} as the institute's city", l.city),
                    vec![l.city.clone()],
                    vec![ins.clone()],
                ),
            ],
        },
        _ => WorldTask {
            id,
            query: format!(
                "Write a short report on the {} gene: the protein it encodes, where that protein is expressed, what it binds, and when and where its binding partner was discovered.",
                l.gene
            ),
            answer_format: "long".into(),
            answer: format!(
                "{} encodes {}, expressed in the {}, which binds {}, discovered in {} by the {} in {}.",
                l.gene, l.protein, l.tissue, l.compound, l.year, l.institute, l.city
            ),
            hops: 4,
            rubrics: vec![
                rub(
                    "protein",
                    format!(
                        "Identifies {} as the protein encoded by {}",
                        l.protein, l.gene
                    ),
                    vec![l.protein.clone()],
                    vec![g],
                ),
                rub(
                    "tissue",
                    format!("States that {} is expressed in the {}", l.protein, l.tissue),
                    vec![l.tissue.clone()],
                    vec![p.clone()],
                ),
                rub(
                    "compound",
                    format!("States that {} binds {}", l.protein, l.compound),
                    vec![l.compound.clone()],
                    vec![p],
                ),
                rub(
                    "discovery",
                    format!(
                        "Gives the discovery of {} in {} by the {}",
                        l.compound, l.year, l.institute
                    ),
                    vec![l.year.to_string(), l.institute.clone()],
                    vec![c],
                ),
                rub(
                    "city",
                    format!("Locates the {} in {}", l.institute, l.city),
                    vec![l.city.clone()],
                    vec![ins],
                ),
            ],
        },
    }
}

/// The held-out task file [`write`] puts beside `tasks.jsonl`.
pub const HELD_OUT_FILE: &str = "heldout.jsonl";

/// Write `corpus.jsonl` and `tasks.jsonl` into `dir`, and [`HELD_OUT_FILE`] when the world has
/// held-out tasks.
pub fn write(world: &World, dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_rows(&world.docs, &dir.join("corpus.jsonl"))?;
    write_rows(&world.tasks, &dir.join("tasks.jsonl"))?;
    let held = dir.join(HELD_OUT_FILE);
    if !world.held_out.is_empty() {
        write_rows(&world.held_out, &held)?;
    } else if held.exists() {
        // A stale file of an earlier split world would pass for this world's held-out tasks.
        std::fs::remove_file(&held)?;
    }
    Ok(())
}

fn write_rows<T: Serialize>(rows: &[T], path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in rows {
        writeln!(
            f,
            "{}",
            serde_json::to_string(r).map_err(std::io::Error::other)?
        )?;
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed() {
        assert_eq!(generate(7, 200, 30), generate(7, 200, 30));
        assert_ne!(generate(7, 200, 30).docs, generate(8, 200, 30).docs);
    }

    #[test]
    fn sizes_ids_and_evidence_are_consistent() {
        let w = generate(1, 400, 60);
        assert_eq!(w.docs.len(), 400);
        assert_eq!(w.tasks.len(), 60);
        let ids: std::collections::HashSet<&str> = w.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids.len(), w.docs.len(), "unique doc ids");
        for t in &w.tasks {
            assert!(t.hops >= 2);
            for r in &t.rubrics {
                assert!(!r.key_terms.is_empty());
                for e in &r.evidence {
                    let doc = w.docs.iter().find(|d| &d.id == e).expect("evidence exists");
                    assert!(
                        r.key_terms.iter().any(
                            |k| doc.text.contains(k.as_str()) || doc.title.contains(k.as_str())
                        ),
                        "doc {e} supports {:?}",
                        r.key_terms
                    );
                }
            }
            // The answer is not in the question: it needs search.
            assert!(!t.query.contains(&t.answer));
        }
    }

    /// Every named entity of a task: the key terms of its rubrics and the names in its question.
    fn entities(w: &World, t: &WorldTask) -> Vec<String> {
        let docs: Vec<&CorpusDoc> = t
            .rubrics
            .iter()
            .flat_map(|r| r.evidence.iter())
            .filter_map(|e| w.docs.iter().find(|d| &d.id == e))
            .collect();
        let mut v: Vec<String> = t
            .rubrics
            .iter()
            .flat_map(|r| r.key_terms.iter().cloned())
            .filter(|k| !TISSUES.contains(&k.as_str()) && k.parse::<u32>().is_err())
            .collect();
        v.extend(docs.iter().map(|d| d.title.clone()));
        v
    }

    #[test]
    fn held_out_tasks_share_no_entity_with_training_tasks() {
        let w = generate_split(17, 400, 96, 16);
        assert_eq!((w.tasks.len(), w.held_out.len()), (96, 16));
        let train: std::collections::HashSet<String> =
            w.tasks.iter().flat_map(|t| entities(&w, t)).collect();
        let words_train: std::collections::HashSet<String> = w
            .tasks
            .iter()
            .flat_map(|t| {
                format!("{} {}", t.query, t.answer)
                    .split(|c: char| !c.is_alphanumeric())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        for t in &w.held_out {
            assert!(t.id.contains("-h"), "{}", t.id);
            for e in entities(&w, t) {
                assert!(!train.contains(&e), "held-out {} shares {e}", t.id);
                let name = e
                    .trim_start_matches("The ")
                    .split([' ', '('])
                    .next()
                    .unwrap_or_default();
                assert!(!words_train.contains(name), "{name} in a training task");
            }
        }
        // Every question shape is held out.
        let kinds: std::collections::HashSet<u32> = w.held_out.iter().map(|t| t.hops).collect();
        assert_eq!(kinds.len(), 3);
    }

    #[test]
    fn no_held_out_is_the_plain_world() {
        assert_eq!(generate_split(17, 400, 96, 0), generate(17, 400, 96));
        assert!(generate(17, 400, 96).held_out.is_empty());
        // The held-out share of lineages follows the share of tasks, one at least each side.
        assert_eq!(held_out_lineages(75, 96, 16), 11);
        assert_eq!(held_out_lineages(2, 1, 100), 1);
        assert_eq!(held_out_lineages(1, 1, 100), 0);
    }

    #[test]
    fn a_world_larger_than_the_two_syllable_names_still_has_unique_entities() {
        // 750 lineages need 1,750 two-syllable names (genes, institutes, cities) of 900.
        let w = generate_split(17, 4000, 50, 16);
        assert_eq!(w.docs.len(), 4000);
        let titles: std::collections::HashSet<&str> =
            w.docs.iter().map(|d| d.title.as_str()).collect();
        assert_eq!(titles.len(), w.docs.len(), "every entity has its own name");
    }
}

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
    pub tasks: Vec<WorldTask>,
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
    let mut rng = Rng::new(seed);
    // Each lineage yields 4 documents (gene, protein, compound, institute); a quarter of the
    // budget goes to distractors.
    let lineages_n = (docs * 3 / 4 / 4).max(1);
    let mut used = std::collections::HashSet::new();
    let mut unique = |rng: &mut Rng, syl: usize| loop {
        let n = name(rng, syl);
        if used.insert(n.clone()) {
            return n;
        }
    };
    let cities: Vec<String> = (0..(lineages_n / 3).max(2))
        .map(|_| unique(&mut rng, 2))
        .collect();
    let mut lineages = Vec::with_capacity(lineages_n);
    for _ in 0..lineages_n {
        let gene = unique(&mut rng, 2).to_uppercase() + &(1 + rng.below(9)).to_string();
        lineages.push(Lineage {
            gene,
            protein: unique(&mut rng, 3),
            tissue: rng.pick(TISSUES).to_string(),
            compound: unique(&mut rng, 3) + "ine",
            year: 1950 + rng.below(70) as u32,
            institute: format!("{} Institute", unique(&mut rng, 2)),
            city: rng.pick(&cities).clone(),
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

    let rub = |title: &str, desc: String, terms: Vec<String>, evidence: Vec<String>| WorldRubric {
        title: title.to_string(),
        description: desc,
        weight: 1.0,
        key_terms: terms,
        evidence,
    };
    let mut world_tasks = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let li = rng.below(lineages.len());
        let l = &lineages[li];
        let (g, p, c, ins) = (
            doc_id("gene", li),
            doc_id("protein", li),
            doc_id("compound", li),
            doc_id("institute", li),
        );
        let task = match t % 3 {
            0 => WorldTask {
                id: format!("w{seed}-{t:05}"),
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
                id: format!("w{seed}-{t:05}"),
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
                id: format!("w{seed}-{t:05}"),
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
        };
        world_tasks.push(task);
    }
    World {
        docs: out,
        tasks: world_tasks,
    }
}

/// Write `corpus.jsonl` and `tasks.jsonl` into `dir`.
pub fn write(world: &World, dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("corpus.jsonl"))?);
    for d in &world.docs {
        writeln!(
            f,
            "{}",
            serde_json::to_string(d).map_err(std::io::Error::other)?
        )?;
    }
    f.flush()?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("tasks.jsonl"))?);
    for t in &world.tasks {
        writeln!(
            f,
            "{}",
            serde_json::to_string(t).map_err(std::io::Error::other)?
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
}

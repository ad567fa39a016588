//! `local_search`: BM25 over a JSONL corpus with tantivy (the only user of tantivy). Documents are
//! `{"_id"|"id", "title", "text", "url"?}` rows. Text is analysed with an English pipeline
//! (lowercase, stop words, Snowball stemming), which is what BEIR's Elasticsearch BM25 baseline
//! does too; runs of Chinese, Japanese or Korean characters (no spaces between words) are
//! indexed as overlapping character bigrams, as Lucene's CJKAnalyzer does, so a Chinese query
//! matches documents sharing its words in any order (an index built before this holds whole
//! CJK runs as single terms: rebuild it for CJK corpora). Offline, it can stand in for
//! `google_search` and `snippet_search`.
//!
//! Ties in score are broken by corpus order (the `ord` fast field), so a search returns the same
//! hits from every build of the same corpus: tantivy's own tie-break is the document address,
//! which depends on how its indexing threads split the documents into segments, and that split
//! changes from one build to the next (the smoke world's distractor snippets tie often; two
//! builds of one corpus gave SFT data differing in 1,024 of 1,536 demonstrations).

use std::cmp::Reverse;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    FAST, Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, Stemmer, StopWordFilter, TextAnalyzer, Token,
    TokenStream, Tokenizer,
};
use tantivy::{
    DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, SegmentReader, TantivyDocument,
    Term, doc,
};

const ANALYZER: &str = "en_bm25";
/// The fast field holding each document's position in the corpus (the tie-break).
const ORD: &str = "ord";

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("cannot read corpus {path}: {message}")]
    Corpus { path: PathBuf, message: String },
    #[error("corpus {path} line {line}: {message}")]
    Row {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("index {path}: {message}")]
    Index { path: PathBuf, message: String },
    #[error("search failed: {0}")]
    Search(String),
}

pub use crate::domain::data::CorpusDoc;

/// A search hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub id: String,
    pub title: String,
    pub text: String,
    pub url: Option<String>,
    pub score: f32,
}

struct Fields {
    id: Field,
    title: Field,
    text: Field,
    url: Field,
    /// Title and text together: the one field BM25 scores (single-field "flat" BM25 beats
    /// per-field scoring on SciFact, as with Pyserini's flat vs multifield indexes).
    contents: Field,
    /// Position in the corpus; the last field, so an index built before it existed keeps the
    /// other fields' numbers.
    ord: Field,
}

fn schema() -> (Schema, Fields) {
    let mut sb = Schema::builder();
    let indexing = TextFieldIndexing::default()
        .set_tokenizer(ANALYZER)
        .set_index_option(IndexRecordOption::WithFreqsAndPositions);
    let id = sb.add_text_field("id", STRING | STORED);
    let title = sb.add_text_field("title", STORED);
    let text = sb.add_text_field("text", STORED);
    let url = sb.add_text_field("url", STORED);
    let contents = sb.add_text_field(
        "contents",
        TextOptions::default().set_indexing_options(indexing),
    );
    let ord = sb.add_u64_field(ORD, FAST);
    (
        sb.build(),
        Fields {
            id,
            title,
            text,
            url,
            contents,
            ord,
        },
    )
}

fn register(index: &Index) {
    let mut builder = TextAnalyzer::builder(CjkBigramTokenizer)
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .dynamic();
    if let Some(stop) = StopWordFilter::new(Language::English) {
        builder = builder.filter_dynamic(stop);
    }
    let analyzer = builder
        .filter_dynamic(Stemmer::new(Language::English))
        .build();
    index.tokenizers().register(ANALYZER, analyzer);
}

/// tantivy's `SimpleTokenizer` (tokens are maximal runs of alphanumeric characters) except that
/// a run of CJK characters becomes its overlapping bigrams (a lone CJK character stays one
/// token); a token mixing scripts (`GPT4模型`) is cut where the script changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct CjkBigramTokenizer;

/// The tokens of one text, computed up front.
pub struct VecTokenStream {
    tokens: Vec<Token>,
    /// 1-based position of the current token; 0 before the first `advance`.
    at: usize,
    /// What `token` answers before the first `advance` of a text without tokens (as
    /// `SimpleTokenizer` does, an empty token rather than a panic).
    blank: Token,
}

impl TokenStream for VecTokenStream {
    fn advance(&mut self) -> bool {
        if self.at < self.tokens.len() {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        self.tokens.get(self.at.max(1) - 1).unwrap_or(&self.blank)
    }

    fn token_mut(&mut self) -> &mut Token {
        match self.tokens.get_mut(self.at.max(1) - 1) {
            Some(t) => t,
            None => &mut self.blank,
        }
    }
}

impl Tokenizer for CjkBigramTokenizer {
    type TokenStream<'a> = VecTokenStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> VecTokenStream {
        use crate::domain::util::is_cjk;
        let mut tokens = Vec::new();
        let mut push = |from: usize, to: usize| {
            tokens.push(Token {
                offset_from: from,
                offset_to: to,
                position: tokens.len(),
                text: text[from..to].to_string(),
                position_length: 1,
            })
        };
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let end_of = |k: usize| chars.get(k).map_or(text.len(), |&(i, _)| i);
        let mut k = 0;
        while k < chars.len() {
            let (start, c) = chars[k];
            if !c.is_alphanumeric() {
                k += 1;
                continue;
            }
            let cjk = is_cjk(c);
            let mut j = k + 1;
            while j < chars.len() && chars[j].1.is_alphanumeric() && is_cjk(chars[j].1) == cjk {
                j += 1;
            }
            if !cjk || j - k == 1 {
                push(start, end_of(j));
            } else {
                for (b, &(from, _)) in chars.iter().enumerate().take(j - 1).skip(k) {
                    push(from, end_of(b + 2));
                }
            }
            k = j;
        }
        VecTokenStream {
            tokens,
            at: 0,
            blank: Token::default(),
        }
    }
}

/// A BM25 index, on disk or in memory.
pub struct LocalIndex {
    _index: Index,
    reader: IndexReader,
    fields: Fields,
    analyzer: TextAnalyzer,
    path: PathBuf,
}

impl std::fmt::Debug for LocalIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalIndex")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Read a JSONL corpus; a malformed line is an error naming the line.
pub fn read_corpus(path: &Path) -> Result<Vec<CorpusDoc>, IndexError> {
    let file = std::fs::File::open(path).map_err(|e| IndexError::Corpus {
        path: path.into(),
        message: e.to_string(),
    })?;
    let mut docs = Vec::new();
    for (line, d) in crate::domain::jsonl::read_rows::<CorpusDoc, _>(std::io::BufReader::new(file))
    {
        docs.push(d.map_err(|e| match e {
            crate::domain::jsonl::LineError::Io(e) => IndexError::Corpus {
                path: path.into(),
                message: e.to_string(),
            },
            crate::domain::jsonl::LineError::Json(e) => IndexError::Row {
                path: path.into(),
                line,
                message: e.to_string(),
            },
        })?);
    }
    Ok(docs)
}

impl LocalIndex {
    fn wrap(index: Index, fields: Fields, path: PathBuf) -> Result<Self, IndexError> {
        register(&index);
        let err = |e: tantivy::TantivyError| IndexError::Index {
            path: path.clone(),
            message: e.to_string(),
        };
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(err)?;
        let analyzer = index.tokenizer_for_field(fields.contents).map_err(err)?;
        if index.schema().get_field(ORD).is_err() {
            tracing::warn!(
                index = %path.display(),
                "index built without corpus order: tied hits may differ from another build of \
                 the same corpus; rebuild it with `orchestrator index build`"
            );
        }
        Ok(Self {
            _index: index,
            reader,
            fields,
            analyzer,
            path,
        })
    }

    /// Build an index from documents, in `dir` (created; must be empty) or in memory.
    pub fn build(docs: &[CorpusDoc], dir: Option<&Path>) -> Result<Self, IndexError> {
        let (schema, fields) = schema();
        let path = dir
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(":memory:"));
        let err = |e: tantivy::TantivyError| IndexError::Index {
            path: path.clone(),
            message: e.to_string(),
        };
        let index = match dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|e| IndexError::Index {
                    path: d.into(),
                    message: e.to_string(),
                })?;
                Index::create_in_dir(d, schema).map_err(err)?
            }
            None => Index::create_in_ram(schema),
        };
        register(&index);
        let mut writer: IndexWriter = index.writer(64 << 20).map_err(err)?;
        for (ord, d) in (0u64..).zip(docs) {
            let mut doc = doc!(
                fields.id => d.id.clone(),
                fields.title => d.title.clone(),
                fields.text => d.text.clone(),
                fields.contents => format!("{}\n{}", d.title, d.text),
                fields.ord => ord,
            );
            if let Some(u) = &d.url {
                doc.add_text(fields.url, u);
            }
            writer.add_document(doc).map_err(err)?;
        }
        writer.commit().map_err(err)?;
        drop(writer);
        let me = Self::wrap(index, fields, path)?;
        me.reader.reload().map_err(|e| IndexError::Index {
            path: me.path.clone(),
            message: e.to_string(),
        })?;
        Ok(me)
    }

    /// Open an index that `build` wrote to `dir`.
    pub fn open(dir: &Path) -> Result<Self, IndexError> {
        let index = Index::open_in_dir(dir).map_err(|e| IndexError::Index {
            path: dir.into(),
            message: e.to_string(),
        })?;
        let (_, fields) = schema();
        Self::wrap(index, fields, dir.to_path_buf())
    }

    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// The query as BM25 sees it: a disjunction of the analysed terms (repeated terms count
    /// repeatedly, as in Lucene). No query syntax: model queries are full of quotes, colons and
    /// parentheses, and every word of them should count.
    fn query(&self, text: &str) -> Box<dyn Query> {
        let mut analyzer = self.analyzer.clone();
        let mut stream = analyzer.token_stream(text);
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        while stream.advance() {
            let term = Term::from_field_text(self.fields.contents, &stream.token().text);
            clauses.push((
                Occur::Should,
                Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs)),
            ));
        }
        Box::new(BooleanQuery::new(clauses))
    }

    /// Top-`k` documents by BM25 over title and text, ties in corpus order. Never fails on
    /// query content; a query with no indexable word returns no hits.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>, IndexError> {
        let searcher = self.reader.searcher();
        let q = self.query(query);
        let by_score_then_ord =
            TopDocs::with_limit(k.max(1)).tweak_score(|segment: &SegmentReader| {
                // An index built before the field existed has no column: its documents all
                // get the same key, so ties fall back to tantivy's document address.
                let column = segment
                    .fast_fields()
                    .u64(ORD)
                    .ok()
                    .map(|c| c.first_or_default_col(u64::MAX));
                move |doc: DocId, score: Score| {
                    let ord = column.as_ref().map_or(u64::MAX, |c| c.get_val(doc));
                    (score, Reverse(ord))
                }
            });
        let top = searcher
            .search(&q, &by_score_then_ord)
            .map_err(|e| IndexError::Search(e.to_string()))?;
        let mut hits = Vec::with_capacity(top.len());
        for ((score, _), addr) in top {
            let d: TantivyDocument = searcher
                .doc(addr)
                .map_err(|e| IndexError::Search(e.to_string()))?;
            let get = |f: Field| d.get_first(f).and_then(|v| v.as_str()).map(str::to_string);
            hits.push(Hit {
                id: get(self.fields.id).unwrap_or_default(),
                title: get(self.fields.title).unwrap_or_default(),
                text: get(self.fields.text).unwrap_or_default(),
                url: get(self.fields.url),
                score,
            });
        }
        Ok(hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<String> {
        let mut t = CjkBigramTokenizer;
        let mut s = t.token_stream(text);
        let mut out = Vec::new();
        while s.advance() {
            out.push(s.token().text.clone());
        }
        out
    }

    #[test]
    fn cjk_runs_become_bigrams_and_other_text_is_unchanged() {
        assert_eq!(
            tokens("Hello, world-42 x"),
            vec!["Hello", "world", "42", "x"]
        );
        assert_eq!(
            tokens("GPT4模型的性能!"),
            vec!["GPT4", "模型", "型的", "的性", "性能"]
        );
        assert_eq!(tokens("水 ok"), vec!["水", "ok"]);
        assert!(tokens("").is_empty() && tokens("…!?").is_empty());
        // The same tokens as tantivy's SimpleTokenizer on text without CJK.
        let text = "Élan vital, naïve café: 3.14 über-cool ñandú";
        let mut simple = tantivy::tokenizer::SimpleTokenizer::default();
        let mut s = simple.token_stream(text);
        let mut want = Vec::new();
        while s.advance() {
            want.push(s.token().text.clone());
        }
        assert_eq!(tokens(text), want);
    }

    /// On text without CJK the tokens (text, offsets, positions) are SimpleTokenizer's, so an
    /// English index and its BM25 scores are what they were: checked on every document of the
    /// synthetic research world and on odd input.
    #[test]
    fn english_tokens_are_simple_tokenizers() {
        fn all(mut s: impl TokenStream) -> Vec<(String, usize, usize, usize, usize)> {
            let mut v = Vec::new();
            while let Some(t) = s.next() {
                v.push((
                    t.text.clone(),
                    t.offset_from,
                    t.offset_to,
                    t.position,
                    t.position_length,
                ));
            }
            v
        }
        let w = crate::domain::data::world::generate(3, 300, 9);
        let mut texts: Vec<String> = w
            .docs
            .iter()
            .map(|d| format!("{}\n{}", d.title, d.text))
            .collect();
        texts.extend(w.tasks.iter().map(|t| t.query.clone()));
        texts.extend(
            [
                "",
                " ",
                "...",
                "a",
                "x-y_z 1,000.5",
                "naïve ÉCOLE",
                "👍🏽 ok",
                "\u{0}\t\n",
            ]
            .map(String::from),
        );
        for text in &texts {
            let mut simple = tantivy::tokenizer::SimpleTokenizer::default();
            let want = all(simple.token_stream(text));
            let got = all(CjkBigramTokenizer.token_stream(text));
            assert_eq!(got, want, "{text:?}");
        }
    }

    #[test]
    fn odd_input_never_panics() {
        let mut t = CjkBigramTokenizer;
        let mut s = t.token_stream("");
        assert_eq!(s.token().text, "");
        s.token_mut().text.push('x');
        assert!(!s.advance() && !s.advance());
        assert_eq!(tokens("中"), vec!["中"]);
        assert_eq!(tokens("🚀中🚀文"), vec!["中", "文"]);
        assert_eq!(
            tokens("東京タワー의한국어"),
            vec![
                "東京", "京タ", "タワ", "ワー", "ー의", "의한", "한국", "국어"
            ]
        );
        let idx = LocalIndex::build(&[], None).unwrap();
        for q in ["", "中", "🚀", "的", "ｇｐｔ４", "\u{feff}"] {
            assert!(idx.search(q, 3).unwrap().is_empty());
        }
    }

    #[test]
    fn a_chinese_query_finds_its_words_in_any_order() {
        let doc = |id: &str, title: &str, text: &str| CorpusDoc {
            id: id.into(),
            title: title.into(),
            text: text.into(),
            url: None,
        };
        let docs = vec![
            doc(
                "zh-age",
                "人口结构",
                "随着老龄化加深，劳动人口减少，经济增长放缓。",
            ),
            doc(
                "zh-food",
                "饮食文化",
                "四川菜以麻辣著称，火锅在冬天很受欢迎。",
            ),
            doc(
                "en-age",
                "Population ageing",
                "Ageing slows economic growth as the workforce shrinks.",
            ),
            doc(
                "en-food",
                "Cuisine",
                "Sichuan food is known for its numbing spice.",
            ),
        ];
        let idx = LocalIndex::build(&docs, None).unwrap();
        // The query's words appear in the document in another order and never as this clause.
        let hits = idx.search("经济增长与人口老龄化", 2).unwrap();
        assert_eq!(hits[0].id, "zh-age", "{hits:?}");
        let hits = idx.search("火锅 麻辣", 1).unwrap();
        assert_eq!(hits[0].id, "zh-food");
        let hits = idx
            .search("economic growth of an ageing population", 1)
            .unwrap();
        assert_eq!(hits[0].id, "en-age");
    }

    #[test]
    fn bm25_finds_the_first_hop() {
        let w = crate::domain::data::world::generate(3, 300, 9);
        let idx = LocalIndex::build(&w.docs, None).unwrap();
        for t in w.tasks.iter().filter(|t| t.hops == 2) {
            let first = &t.rubrics[0].evidence[0];
            let hits = idx.search(&t.query, 3).unwrap();
            assert!(
                hits.iter().any(|h| &h.id == first),
                "{} -> {:?}",
                t.query,
                hits.iter().map(|h| &h.id).collect::<Vec<_>>()
            );
        }
    }
}

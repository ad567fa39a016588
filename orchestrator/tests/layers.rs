//! The house rules, checked: the orchestrator's three layers (domain / infrastructure doors /
//! stages and commands) and the absence of import circles in every crate of the workspace.
//!
//! Imports are read from the source text: every `use crate::…` tree, every inline
//! `crate::a::b` path and every `super::…` path, resolved to the deepest module file that
//! exists. A parent module re-exporting its own children (`pub use self::x::Y` in `x`'s
//! `mod.rs`) is a facade, not an import, so edges from a module to its own descendants are
//! not counted. The test prints the figures the layering is judged by (circles, upward
//! imports, largest file, the commands' largest file); run it with `--nocapture` to read them.

#![allow(clippy::expect_used)] // a test file: its helpers panic with a message on unreadable sources

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which layer each top-level module of the orchestrator belongs to. 1 = domain (pure types
/// and logic), 2 = infrastructure doors (db, llm, prompts, tools, embeddings), 3 = stages and
/// commands (the only code that combines the two). A module may import its own layer and the
/// layers below; never above. A new top-level module must be placed here, or this test fails.
const ORCHESTRATOR_LAYERS: &[(&str, u8)] = &[
    ("domain", 1),
    ("infra", 2),
    ("pipeline", 3),
    ("commands", 3),
    ("cli", 3),
    ("telemetry", 3),
    ("lib", 3),
    ("main", 3),
];

/// Infrastructure and stage code the domain must never import, named for the error message.
const DOMAIN_FORBIDDEN: &[&str] = &["infra", "pipeline", "commands", "cli", "telemetry"];

/// One module file: its path from `src/` as module segments (`["judge", "step"]`), the file.
#[derive(Debug, Clone)]
struct ModFile {
    segs: Vec<String>,
    path: PathBuf,
    lines: usize,
}

fn module_files(src: &Path) -> Vec<ModFile> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let mut segs: Vec<String> = rel
                .iter()
                .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if segs.last().map(String::as_str) == Some("mod") {
                segs.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            out.push(ModFile {
                segs,
                lines: text.lines().count(),
                path,
            });
        }
    }
    out.sort_by(|a, b| a.segs.cmp(&b.segs));
    out
}

/// Source text with comments, string and char literals blanked out, so that a path written in
/// a doc comment or a message is not read as an import.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        if c == b'r' && (b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"')) {
            // raw string r"…" or r#"…"#
            let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
            if !prev_ident {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) == Some(&b'"') {
                    j += 1;
                    loop {
                        if j >= b.len() {
                            break;
                        }
                        if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                            j += 1 + hashes;
                            break;
                        }
                        j += 1;
                    }
                    out.push_str("\"\"");
                    i = j;
                    continue;
                }
            }
        }
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == b'\'' {
            // char literal ('a', '\n', '\u{..}') vs lifetime ('a)
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
                continue;
            }
            if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.push_str("' '");
                continue;
            }
            // multi-byte char literal
            if let Some(ch) = text[i + 1..].chars().next()
                && !ch.is_ascii()
                && text[i + 1 + ch.len_utf8()..].starts_with('\'')
            {
                i += 2 + ch.len_utf8();
                out.push_str("' '");
                continue;
            }
        }
        // copy one UTF-8 char
        let ch = text[i..].chars().next().expect("char");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into its leaf paths.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path: Vec<String> = prefix.to_vec();
        let mut ident = String::new();
        while *i < s.len() {
            let c = s[*i];
            if is_ident(c) {
                ident.push(c);
                *i += 1;
            } else if c == ':' {
                if !ident.is_empty() {
                    path.push(std::mem::take(&mut ident));
                }
                *i += 1;
            } else if c == '{' {
                if !ident.is_empty() {
                    path.push(std::mem::take(&mut ident));
                }
                *i += 1;
                loop {
                    parse(s, i, &path, out);
                    if *i >= s.len() {
                        return;
                    }
                    match s[*i] {
                        ',' => {
                            *i += 1;
                            // tolerate trailing comma before }
                            while *i < s.len() && s[*i].is_whitespace() {
                                *i += 1;
                            }
                            if *i < s.len() && s[*i] == '}' {
                                *i += 1;
                                return;
                            }
                        }
                        '}' => {
                            *i += 1;
                            return;
                        }
                        _ => *i += 1,
                    }
                }
            } else if c == ',' || c == '}' {
                break;
            } else if c.is_whitespace() {
                if ident == "as" {
                    ident.clear();
                }
                *i += 1;
                // `x as y`: skip the alias
                let rest: String = s[*i..].iter().take(3).collect();
                if rest.starts_with("as ") && !ident.is_empty() {
                    path.push(std::mem::take(&mut ident));
                    *i += 3;
                    while *i < s.len() && (is_ident(s[*i]) || s[*i].is_whitespace()) {
                        *i += 1;
                    }
                    out.push(path);
                    return;
                }
            } else {
                // `*` and anything else ends the path
                *i += 1;
            }
        }
        if !ident.is_empty() {
            path.push(ident);
        }
        if path.len() > prefix.len() || prefix.is_empty() {
            out.push(path);
        }
    }
    let chars: Vec<char> = tree.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    parse(&chars, &mut i, &[], &mut out);
    out
}

/// Inline modules (`mod tests { … }`): their name and the byte span of their body.
fn inline_modules(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(pos) = code[search..].find("mod ") {
        let start = search + pos;
        search = start + 4;
        if start > 0 && is_ident(code[..start].chars().last().unwrap_or(' ')) {
            continue;
        }
        let rest = &code[start + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| is_ident(*c))
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0usize;
        let mut end = code.len();
        for (k, c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, open, end));
    }
    out
}

/// Every module path a file refers to, as absolute segments from the crate root.
fn references(file: &ModFile, code: &str) -> Vec<Vec<String>> {
    let inline = inline_modules(code);
    // `self`/`super` are relative to the module the code is in (the file's, plus inline mods).
    let absolute = |pos: usize, path: &[String]| -> Option<Vec<String>> {
        let mut here = file.segs.clone();
        if here.as_slice() == ["lib"] || here.as_slice() == ["main"] {
            here.clear();
        }
        for (name, open, end) in &inline {
            if *open < pos && pos < *end {
                here.push(name.clone());
            }
        }
        let mut base: Vec<String>;
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base = Vec::new();
                rest = &rest[1..];
            }
            Some("super") => {
                base = here;
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some("self") => {
                base = here;
                rest = &rest[1..];
            }
            _ => return None,
        }
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    };
    let mut refs = Vec::new();
    // use statements (may span lines)
    let mut search = 0;
    while let Some(pos) = code[search..].find("use ") {
        let start = search + pos;
        search = start + 4;
        if start > 0 && is_ident(code[..start].chars().last().unwrap_or(' ')) {
            continue;
        }
        let Some(end) = code[start..].find(';') else {
            break;
        };
        let tree = code[start + 4..start + end].trim();
        if tree.starts_with("crate") || tree.starts_with("super") || tree.starts_with("self") {
            for p in expand_use_tree(tree) {
                if let Some(abs) = absolute(start, &p) {
                    refs.push(abs);
                }
            }
        }
        search = start + end;
    }
    // inline paths: crate::a::b, super::a
    for kw in ["crate::", "super::"] {
        let mut s = 0;
        while let Some(pos) = code[s..].find(kw) {
            let start = s + pos;
            s = start + kw.len();
            if start > 0 && is_ident(code[..start].chars().last().unwrap_or(' ')) {
                continue;
            }
            let mut segs = Vec::new();
            let mut ident = String::new();
            let mut chars = code[start..].chars().peekable();
            while let Some(c) = chars.next() {
                if is_ident(c) {
                    ident.push(c);
                } else if c == ':' && chars.peek() == Some(&':') {
                    chars.next();
                    segs.push(std::mem::take(&mut ident));
                } else {
                    break;
                }
            }
            if !ident.is_empty() {
                segs.push(ident);
            }
            if let Some(abs) = absolute(start, &segs) {
                refs.push(abs);
            }
        }
    }
    refs
}

struct Graph {
    files: Vec<ModFile>,
    edges: BTreeMap<usize, BTreeSet<usize>>,
}

fn graph(src: &Path) -> Graph {
    let files = module_files(src);
    let index: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.segs.clone(), i))
        .collect();
    let root = index
        .get(&vec!["lib".to_string()])
        .or_else(|| index.get(&vec!["main".to_string()]))
        .copied();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(&f.path).expect("read");
        let code = code_only(&text);
        for r in references(f, &code) {
            // deepest existing module file that prefixes the path
            let target = (1..=r.len())
                .rev()
                .find_map(|n| index.get(&r[..n]).copied())
                .or(root);
            let Some(t) = target else { continue };
            if t == i {
                continue;
            }
            // a module re-exporting or naming its own descendants is a facade, not an import
            let tsegs = &files[t].segs;
            if (f.segs.as_slice() == ["lib"] || f.segs.as_slice() == ["main"])
                || (tsegs.len() > f.segs.len() && tsegs.starts_with(&f.segs))
            {
                continue;
            }
            edges.entry(i).or_default().insert(t);
        }
    }
    Graph { files, edges }
}

/// Strongly connected components with more than one file (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<usize>> {
    struct St<'a> {
        g: &'a Graph,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(st: &mut St, v: usize) {
        st.index[v] = Some(st.next);
        st.low[v] = st.next;
        st.next += 1;
        st.stack.push(v);
        st.on[v] = true;
        let succ: Vec<usize> =
            st.g.edges
                .get(&v)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
        for w in succ {
            match st.index[w] {
                None => {
                    visit(st, w);
                    st.low[v] = st.low[v].min(st.low[w]);
                }
                Some(iw) if st.on[w] => st.low[v] = st.low[v].min(iw),
                _ => {}
            }
        }
        if Some(st.low[v]) == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let n = g.files.len();
    let mut st = St {
        g,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if st.index[v].is_none() {
            visit(&mut st, v);
        }
    }
    st.out
}

fn name(f: &ModFile) -> String {
    f.segs.join("::")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn layer_of(segs: &[String]) -> Option<u8> {
    let top = segs.first()?;
    ORCHESTRATOR_LAYERS
        .iter()
        .find(|(m, _)| m == top)
        .map(|(_, l)| *l)
}

#[test]
fn the_orchestrator_keeps_its_three_layers() {
    let src = workspace().join("orchestrator/src");
    let g = graph(&src);
    let mut unplaced = Vec::new();
    let mut upward = Vec::new();
    let mut domain_bad = Vec::new();
    for (from, tos) in &g.edges {
        let f = &g.files[*from];
        let Some(lf) = layer_of(&f.segs) else {
            unplaced.push(name(f));
            continue;
        };
        for to in tos {
            let t = &g.files[*to];
            let Some(lt) = layer_of(&t.segs) else {
                continue;
            };
            if lt > lf {
                upward.push(format!(
                    "{} (layer {lf}) -> {} (layer {lt})",
                    name(f),
                    name(t)
                ));
            }
            if lf == 1 && DOMAIN_FORBIDDEN.contains(&t.segs[0].as_str()) {
                domain_bad.push(format!("{} -> {}", name(f), name(t)));
            }
        }
    }
    for f in &g.files {
        if layer_of(&f.segs).is_none() && !unplaced.contains(&name(f)) {
            unplaced.push(name(f));
        }
    }
    let circ = circles(&g);
    let largest = g.files.iter().max_by_key(|f| f.lines).expect("files");
    let commands_largest = g
        .files
        .iter()
        .filter(|f| f.segs.first().map(String::as_str) == Some("commands"))
        .max_by_key(|f| f.lines);
    eprintln!("orchestrator: {} module files", g.files.len());
    eprintln!(
        "  import circles: {} ({} files)",
        circ.len(),
        circ.iter().map(Vec::len).sum::<usize>()
    );
    for c in &circ {
        let names: Vec<String> = c.iter().map(|i| name(&g.files[*i])).collect();
        eprintln!("    circle: {}", names.join(", "));
    }
    eprintln!("  upward imports: {}", upward.len());
    for u in &upward {
        eprintln!("    {u}");
    }
    eprintln!(
        "  largest file: {} ({} lines)",
        largest.path.display(),
        largest.lines
    );
    if let Some(c) = commands_largest {
        eprintln!(
            "  largest command file: {} ({} lines)",
            c.path.display(),
            c.lines
        );
    }
    assert!(
        unplaced.is_empty(),
        "modules not placed in a layer (add them to ORCHESTRATOR_LAYERS): {unplaced:?}"
    );
    assert!(
        domain_bad.is_empty(),
        "domain code imports infrastructure or stages: {domain_bad:#?}"
    );
    assert!(upward.is_empty(), "upward imports: {upward:#?}");
    assert!(circ.is_empty(), "import circles in the orchestrator");
}

#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    for krate in ["trainer", "wire"] {
        let src = workspace().join(krate).join("src");
        let g = graph(&src);
        let circ = circles(&g);
        let largest = g.files.iter().max_by_key(|f| f.lines).expect("files");
        eprintln!(
            "{krate}: {} module files, {} import circles, largest file {} ({} lines)",
            g.files.len(),
            circ.len(),
            largest.path.display(),
            largest.lines
        );
        for c in &circ {
            let names: Vec<String> = c.iter().map(|i| name(&g.files[*i])).collect();
            eprintln!("    circle: {}", names.join(", "));
        }
        assert!(circ.is_empty(), "import circles in {krate}");
    }
}

#[test]
fn the_checker_reads_use_trees_and_ignores_comments() {
    let paths = expand_use_tree("crate::{a::b, c::{d, e as f}, g::*}");
    let flat: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        flat,
        ["crate::a::b", "crate::c::d", "crate::c::e", "crate::g"]
    );
    let code = code_only("// use crate::db;\nlet s = \"crate::llm::x\"; crate::domain::y();");
    assert!(!code.contains("db"));
    assert!(!code.contains("llm"));
    assert!(code.contains("crate::domain::y"));
    let f = ModFile {
        segs: vec!["domain".into(), "judge".into()],
        path: PathBuf::new(),
        lines: 0,
    };
    let refs = references(&f, "use crate::infra::db; use super::super::{stages::run};");
    let flat: Vec<String> = refs.iter().map(|p| p.join("::")).collect();
    assert!(flat.contains(&"infra::db".to_string()), "{flat:?}");
    assert!(flat.contains(&"stages::run".to_string()), "{flat:?}");
}

//! The shape of the source tree, checked: no import cycles between sibling
//! modules, and no source file much over 700 lines except the few kinds that
//! are long by nature (generated tables, unit-test files, the CRUSH mapper).
//!
//! Both rules read every `crates/*/src/**/*.rs` file as text; nothing is
//! compiled. A module path is the file's place in its crate (`src/a/b.rs`
//! and `src/a/b/mod.rs` are `a::b`).
//!
//! Imports: a file depends on module `M` when a code line (comments are
//! skipped) names `crate::M...`, `super::M...` or `self::M...`, resolved to
//! the longest existing module. An edge between `a::x::p` and `a::y::q` counts
//! as an edge `a::x -> a::y` between the two siblings under their common
//! parent; edges into a module's own ancestors or descendants do not count
//! (a parent and its children use each other by design). A cycle among
//! siblings (for example `cli -> config -> cli`) fails the test and is printed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 750;

/// Files allowed to be longer, each with the reason.
const LONG_OK: &[(&str, &str)] = &[
    (
        "iolift-crush/src/mapper.rs",
        "one algorithm, as Ceph's mapper.c",
    ),
    (
        "iolift-crush/src/ln_tables.rs",
        "generated table (crush_ln)",
    ),
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// One crate's source files by module path (`""` is the crate root).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts == ["lib"] {
            parts.clear();
        }
        if parts == ["main"] || parts.first().is_some_and(|p| p == "bin") {
            continue; // binaries are leaves: nothing imports them
        }
        out.insert(parts.join("::"), f);
    }
    out
}

fn is_ancestor(a: &str, b: &str) -> bool {
    a.is_empty() || b == a || b.starts_with(&format!("{a}::"))
}

fn parent(m: &str) -> String {
    m.rsplit_once("::")
        .map(|p| p.0.to_string())
        .unwrap_or_default()
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_string(),
        (_, true) => base.to_string(),
        _ => format!("{base}::{rest}"),
    }
}

/// The longest known module that `path` (a `::` path) starts with.
fn resolve(mods: &BTreeMap<String, PathBuf>, path: &str) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|p| mods.contains_key(p))
}

/// Paths named after `crate::`, `super::` (repeatable) and `self::` on one
/// line, made absolute for the file whose module path is `me`.
fn named_paths(line: &str, me: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    for (i, _) in line.match_indices("crate::") {
        if i > 0 && ident(line[..i].chars().next_back().unwrap()) {
            continue; // e.g. `iolift_crate::`
        }
        let rest: String = line[i + 7..].chars().take_while(|&c| ident(c)).collect();
        out.push(rest.trim_end_matches(':').to_string());
    }
    // `super` is the parent of the file's module, for `a/mod.rs` and `a.rs` alike.
    for (i, _) in line.match_indices("super::") {
        if i > 0 && ident(line[..i].chars().next_back().unwrap()) {
            continue;
        }
        let mut base = parent(me);
        let mut rest = &line[i + 7..];
        while let Some(r) = rest.strip_prefix("super::") {
            base = parent(&base);
            rest = r;
        }
        let tail: String = rest.chars().take_while(|&c| ident(c)).collect();
        out.push(join(&base, tail.trim_end_matches(':')));
    }
    for (i, _) in line.match_indices("self::") {
        if i > 0 && ident(line[..i].chars().next_back().unwrap()) {
            continue;
        }
        let tail: String = line[i + 6..].chars().take_while(|&c| ident(c)).collect();
        out.push(join(me, tail.trim_end_matches(':')));
    }
    out
}

/// Sibling edges `(parent, from child, to child)` of one crate, each with
/// the first `file:line` that makes it.
fn sibling_edges(src: &Path) -> BTreeMap<(String, String, String), String> {
    let mods = modules(src);
    let mut edges = BTreeMap::new();
    for (me, file) in &mods {
        let text = std::fs::read_to_string(file).unwrap();
        for (no, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for p in named_paths(code, me) {
                let Some(target) = resolve(&mods, &p) else {
                    continue;
                };
                if is_ancestor(&target, me) || is_ancestor(me, &target) {
                    continue;
                }
                // lowest common ancestor, then the two children under it
                let a: Vec<&str> = me.split("::").collect();
                let b: Vec<&str> = target.split("::").collect();
                let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                let lca = a[..common].join("::");
                let from = join(&lca, a[common]);
                let to = join(&lca, b[common]);
                let at = format!("{}:{}", file.strip_prefix(src).unwrap().display(), no + 1);
                edges.entry((lca, from, to)).or_insert(at);
            }
        }
    }
    edges
}

/// A cycle in a directed graph, if any (as the list of its nodes).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn dfs(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = dfs(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = dfs(n, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn crate_srcs() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(crates_dir()).unwrap().flatten() {
        let src = e.path().join("src");
        if src.is_dir() {
            out.push((e.file_name().to_string_lossy().into_owned(), src));
        }
    }
    out.sort();
    out
}

fn cycles_in(src: &Path) -> Vec<String> {
    let edges = sibling_edges(src);
    let mut by_parent: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (lca, from, to) in edges.keys() {
        by_parent
            .entry(lca.clone())
            .or_default()
            .entry(from.clone())
            .or_default()
            .insert(to.clone());
    }
    let mut out = Vec::new();
    for (lca, g) in &by_parent {
        if let Some(c) = find_cycle(g) {
            let steps: Vec<String> = c
                .windows(2)
                .map(|w| {
                    let at = &edges[&(lca.clone(), w[0].clone(), w[1].clone())];
                    format!("{} -> {} ({at})", w[0], w[1])
                })
                .collect();
            out.push(steps.join(", "));
        }
    }
    out
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (name, src) in crate_srcs() {
        seen += 1;
        for c in cycles_in(&src) {
            bad.push(format!("{name}: {c}"));
        }
    }
    assert!(seen >= 3, "found only {seen} crates under crates/");
    assert!(bad.is_empty(), "import cycles:\n  {}", bad.join("\n  "));
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("cli")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod cli;\npub mod config;\n").unwrap();
    std::fs::write(src.join("cli/mod.rs"), "pub mod serve;\n").unwrap();
    std::fs::write(
        src.join("cli/serve.rs"),
        "use crate::config::Config;\n// crate::nothing here counts\n",
    )
    .unwrap();
    std::fs::write(
        src.join("config.rs"),
        "fn f() { super::cli::serve::parse(); }\n",
    )
    .unwrap();
    let c = cycles_in(src);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(c[0].contains("cli") && c[0].contains("config"), "{c:?}");
    // parent <-> child is not a cycle
    std::fs::write(src.join("config.rs"), "// no use of cli\n").unwrap();
    std::fs::write(src.join("cli/serve.rs"), "use super::Args;\n").unwrap();
    std::fs::write(
        src.join("cli/mod.rs"),
        "pub mod serve;\nuse self::serve::x;\n",
    )
    .unwrap();
    assert!(cycles_in(src).is_empty());
}

fn line_count(p: &Path) -> usize {
    std::fs::read_to_string(p).unwrap().lines().count()
}

/// A unit-test file: `tests.rs`, or a file that is one `#[cfg(test)]` module.
fn is_unit_test_file(p: &Path) -> bool {
    if p.file_name().is_some_and(|n| n == "tests.rs") {
        return true;
    }
    let text = std::fs::read_to_string(p).unwrap();
    text.trim_start().starts_with("#![cfg(test)]")
}

#[test]
fn no_source_file_is_much_over_700_lines() {
    let root = crates_dir();
    let mut long = Vec::new();
    for (_, src) in crate_srcs() {
        let mut files = Vec::new();
        rs_files(&src, &mut files);
        for f in files {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let n = line_count(&f);
            if n > MAX_LINES && !is_unit_test_file(&f) && !LONG_OK.iter().any(|(p, _)| *p == rel) {
                long.push(format!("{rel}: {n} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by job, or list them in LONG_OK with the reason):\n  {}",
        long.join("\n  ")
    );
}

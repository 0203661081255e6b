//! The layering check: which module of `src/` may name which other module.
//!
//! The crate is layered, and arrows only point down:
//!
//! ```text
//! bin/         the CLI: uses only the public API (`baton::...`), no `crate::` paths at all
//! client       builds the backend, hands out primitive handles; inspect (the operator's
//!              view over every primitive's keys) sits beside it
//! primitives   failover, mutex, leader, fair, queue, redlock, advisory
//! lease        what every lease-holding primitive shares: deadlines, fencing, the guards,
//!              the keepalive, the one acquisition engine and options; no wire protocol
//! backend      the store seams (`src/backend/*.rs`): one `Backend` enum, its dispatch, and
//!              one method set per shape of storage (locks, jobs, the fair line, queues,
//!              Redlock's masters, inspection, connect), one arm per backend
//! backends     one folder each under the seam: backend::redis, backend::postgres; neither
//!              knows the other
//! leaves       error, util, schedule (the calendar: pure, no I/O)
//! testing      fixtures behind a feature (may import backends and leaves: the fixture
//!              builds its least-privilege user from the Redis backend's ACL rules)
//! model_api    what the model checker (the workspace crate `baton-model` in `model/`, outside
//!              `src/`) reads, hidden behind a feature: may re-export the primitives' and the
//!              lease kernel's pure decisions and the leaves, never the I/O layers (client,
//!              backend, backends), so what the model checks is the decisions alone
//! lib.rs       the crate root: may reference anything (re-exports)
//! ```
//!
//! A second rule keeps the wire protocols in the backends: outside `src/backend/`,
//! `src/testing/` and `src/bin/`, no path names the `redis` or `tokio_postgres` crates or a
//! backend's folder (`crate::backend::redis::…`, `crate::backend::postgres::…`; the seams'
//! own items, `crate::backend::X`, are fine), and no string literal holds a Redis script
//! (`redis.call(`) or starts with a SQL verb. A file in breach may only be listed in
//! `KNOWN_WIRE` (empty: none is), and an entry whose file is clean fails the check too.
//!
//! The compiler cannot enforce this inside one crate, so this test reads the sources. It is a
//! small hand-written scanner, not a Rust parser: it strips comments and literals (keeping
//! string literals' contents, for the wire rule), then looks at every path that starts with
//! `crate::` or `super::` (in `use` lines, expressions, types, and `use` groups) and resolves
//! it to a top-level module. A top-level module that is in no layer
//! is reported by itself, so a new file cannot dodge the check by not being in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// The layer table
// ---------------------------------------------------------------------------------------------

const PRIMITIVES: &[&str] = &[
    "failover",
    "mutex",
    "leader",
    "fair",
    "queue",
    "redlock",
    "advisory",
    "semaphore",
    "rwlock",
];
/// The backends, one folder each under the store seam `src/backend/` (a top-level module named
/// `redis` would shadow the `redis` crate inside baton): `backend::redis` and
/// `backend::postgres` are layers of their own, below the seam (`backend`, its other files).
/// Top-level `redis`/`postgres` stay valid names for the synthetic trees.
const TRANSPORTS: &[&str] = &["backend::redis", "backend::postgres", "redis", "postgres"];
/// File cycles still in the tree, each as the check prints it (without the return to the
/// first file). Each entry is a debt with an owner, not a licence: delete it once the cycle is
/// gone (the check then keeps it gone). `failover::admin` dispatches the operator tools to
/// `failover::pg`, which builds `admin`'s `JobStatus`: moving `JobState`/`JobStatus`/`job_state`
/// into a file of their own ends it.
const KNOWN_CYCLES: &[&str] = &[];
/// The folders under `src/backend/` that are backends rather than the seam.
const BACKEND_FOLDERS: &[&str] = &["redis", "postgres"];

/// The unit a module path belongs to for the layer table: its top-level module, except that a
/// backend's folder under the seam (`backend::redis::…`) is a unit of its own.
fn unit_of(segs: &[&str]) -> String {
    match segs {
        ["backend", b, ..] if BACKEND_FOLDERS.contains(b) => format!("backend::{b}"),
        [top, ..] => top.to_string(),
        [] => String::new(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The library's layers; `bin/` and the root are not here, they are places (see [`Place`]).
enum Layer {
    Client,
    Primitive,
    Lease,
    Backend,
    Transport,
    Leaf,
    Testing,
    Model,
    /// A top-level module the table does not know.
    Unknown,
}

impl Layer {
    fn of(top: &str) -> Layer {
        match top {
            // The operator's view reads every primitive's layout: the client's layer.
            "client" | "inspect" => Layer::Client,
            "lease" => Layer::Lease,
            "backend" => Layer::Backend,
            "error" | "util" | "schedule" => Layer::Leaf,
            "testing" => Layer::Testing,
            "model_api" => Layer::Model,
            _ if PRIMITIVES.contains(&top) => Layer::Primitive,
            _ if TRANSPORTS.contains(&top) => Layer::Transport,
            _ => Layer::Unknown,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Layer::Client => "client",
            Layer::Primitive => "primitive",
            Layer::Lease => "lease",
            Layer::Backend => "backend",
            Layer::Transport => "transport",
            Layer::Leaf => "leaf",
            Layer::Testing => "testing",
            Layer::Model => "model_api",
            Layer::Unknown => "unknown",
        }
    }
}

/// Whether code in top-level module `from` may name top-level module `to`.
fn may_import(from: &str, to: &str) -> bool {
    use Layer::*;
    if from == to {
        return true;
    }
    let target = Layer::of(to);
    // A module in no layer is reported once by itself; reporting every import of it as well
    // would bury the list, and once it is placed its importers are judged normally.
    if target == Unknown {
        return true;
    }
    match Layer::of(from) {
        // The client hands out the inspector as it hands out the primitives' handles; the
        // inspector never names the client.
        Client => {
            matches!(target, Primitive | Lease | Backend | Transport | Leaf)
                || (from == "client" && to == "inspect")
        }
        Primitive => matches!(target, Lease | Backend | Transport | Leaf),
        Lease => matches!(target, Backend | Transport | Leaf),
        Backend => matches!(target, Transport | Leaf),
        Transport => target == Leaf,
        Leaf => {
            (from == "util" && to == "error")
                || (from == "schedule" && matches!(to, "error" | "util"))
        }
        Testing => matches!(target, Transport | Leaf),
        Model => matches!(target, Primitive | Lease | Leaf),
        // Wherever an unplaced module ends up, importing the leaves will still be legal, so that
        // much is allowed; anything more already tells where it cannot go.
        Unknown => target == Leaf,
    }
}

/// What `from` may import, for the hint line under a violation.
fn allowed_for(from: &str) -> &'static str {
    match Layer::of(from) {
        Layer::Client => "client may import primitives, lease, backend, transports and leaves (error, util), not testing",
        Layer::Primitive => "a primitive may import lease, backend, transports and leaves (error, util) only: move shared code down into lease, backend or util instead of reaching into another primitive, client or testing",
        Layer::Lease => "lease may import backend, transports and leaves (error, util) only: primitives build on lease, not the other way round",
        Layer::Backend => "backend may import transports and leaves (error, util) only",
        Layer::Transport => "a transport may import leaves (error, util) only: it must not know lease, the primitives, client, testing or the other transport",
        Layer::Leaf if from == "error" => "error is the bottom layer and imports no other module",
        Layer::Leaf if from == "schedule" => "schedule (the calendar) may import error and util only",
        Layer::Leaf => "util may import error only",
        Layer::Testing => "testing may import transports and leaves (error, util) only",
        Layer::Model => "model_api (what the model checker reads) may import the primitives, lease and leaves (error, util) only: the model checks pure decisions, never I/O",
        Layer::Unknown => "this module is in no layer yet (reported separately); until it is placed it may import leaves (error, util) only",
    }
}

// ---------------------------------------------------------------------------------------------
// Violations
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    /// `src/...`, with `/` separators.
    file: String,
    line: usize,
    /// The importing module's path (`failover::worker::tests`), or the unknown module's name.
    module: String,
    /// The top-level module named (or `*`, or the path that climbs above the root).
    target: String,
    message: String,
    hint: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}\n    hint: {}",
            self.file, self.line, self.message, self.hint
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Lexer: just enough of Rust's to skip comments and literals and keep line numbers
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A char or number literal; its content is never looked at.
    Literal,
    /// A string literal (plain, raw, byte or C), with its content as written between the
    /// quotes (escapes left as they are): only the wire rule reads it, for SQL and scripts.
    Str(String),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Skips a `"..."` literal starting at `c[i] == '"'`; returns the index after it.
fn skip_quoted(c: &[char], mut i: usize, line: &mut usize) -> usize {
    i += 1;
    while i < c.len() {
        match c[i] {
            // The escaped character may be a newline (a line continuation): count it.
            '\\' => {
                if c.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            '"' => return i + 1,
            '\n' => {
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// Skips a raw string whose opening `"` is at `c[i]` and which closes with `"` plus `hashes` `#`.
fn skip_raw(c: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    i += 1;
    while i < c.len() {
        if c[i] == '\n' {
            *line += 1;
        } else if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// At `c[i] == '\''`: a char literal (returns the index after it) or a lifetime/label (None).
fn char_literal_end(c: &[char], i: usize) -> Option<usize> {
    if c.get(i + 1) == Some(&'\\') {
        // '\n', '\'', '\u{1F600}': the escaped char, then up to the closing quote.
        let mut j = i + 3;
        while j < c.len() && c[j] != '\'' && c[j] != '\n' {
            j += 1;
        }
        return Some(j + 1);
    }
    // 'x' is a char; 'a without a quote two places on is a lifetime or a label.
    (c.get(i + 2) == Some(&'\'')).then_some(i + 3)
}

/// The characters `c[from..to]` (empty when the literal ran off the end of the file).
fn between(c: &[char], from: usize, to: usize) -> String {
    c.get(from..to.max(from))
        .unwrap_or_default()
        .iter()
        .collect()
}

fn lex(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let push = |out: &mut Vec<Token>, tok, line| out.push(Token { tok, line });
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        match ch {
            '\n' => {
                line += 1;
                i += 1;
            }
            _ if ch.is_whitespace() => i += 1,
            // Line comments, doc comments included: a path in a doc link is not an import.
            '/' if next == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            // Block comments nest in Rust.
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if c[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => {
                let start_line = line;
                let start = i;
                i = skip_quoted(&c, i, &mut line);
                push(
                    &mut out,
                    Tok::Str(between(&c, start + 1, i - 1)),
                    start_line,
                );
            }
            '\'' => match char_literal_end(&c, i) {
                Some(end) => {
                    push(&mut out, Tok::Literal, line);
                    i = end;
                }
                None => {
                    // A lifetime or label: drop it, it never names a module.
                    i += 1;
                    while i < c.len() && is_ident_continue(c[i]) {
                        i += 1;
                    }
                }
            },
            _ if is_ident_start(ch) => {
                let start = i;
                while i < c.len() && is_ident_continue(c[i]) {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let start_line = line;
                let after = c.get(i).copied();
                match (word.as_str(), after) {
                    // Byte and C strings, byte chars.
                    ("b" | "c", Some('"')) => {
                        let start = i;
                        i = skip_quoted(&c, i, &mut line);
                        push(
                            &mut out,
                            Tok::Str(between(&c, start + 1, i - 1)),
                            start_line,
                        );
                    }
                    ("b", Some('\'')) => {
                        i = char_literal_end(&c, i).unwrap_or(i + 1);
                        push(&mut out, Tok::Literal, start_line);
                    }
                    // Raw strings `r"…"`, `r#"…"#`, `br##"…"##`, or a raw identifier `r#mod`.
                    ("r" | "br" | "cr", Some('"' | '#')) => {
                        let mut j = i;
                        while c.get(j) == Some(&'#') {
                            j += 1;
                        }
                        if c.get(j) == Some(&'"') {
                            let hashes = j - i;
                            i = skip_raw(&c, j, hashes, &mut line);
                            let text = between(&c, j + 1, i.saturating_sub(1 + hashes));
                            push(&mut out, Tok::Str(text), start_line);
                        } else if word == "r" && j == i + 1 {
                            // Kept with its `r#` so that `r#mod` is not taken for the keyword.
                            let s = j;
                            while j < c.len() && is_ident_continue(c[j]) {
                                j += 1;
                            }
                            let raw: String = c[s..j].iter().collect();
                            push(&mut out, Tok::Ident(format!("r#{raw}")), start_line);
                            i = j;
                        } else {
                            push(&mut out, Tok::Ident(word), start_line);
                        }
                    }
                    _ => push(&mut out, Tok::Ident(word), start_line),
                }
            }
            // Numbers, with their suffixes (`1u64`, `0x1F`); `1.5` lexes as `1` `.` `5`.
            _ if ch.is_ascii_digit() => {
                while i < c.len() && is_ident_continue(c[i]) {
                    i += 1;
                }
                push(&mut out, Tok::Literal, line);
            }
            ':' if next == Some(':') => {
                push(&mut out, Tok::PathSep, line);
                i += 2;
            }
            _ => {
                push(&mut out, Tok::Punct(ch), line);
                i += 1;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Paths and `use` trees
// ---------------------------------------------------------------------------------------------

/// One path named in the code, a `use` group flattened into one per leaf.
#[derive(Debug)]
struct UsePath {
    /// `["crate", "client", "Client", "new"]`, `["super", "super", "client"]`, `[.., "*"]`.
    segs: Vec<String>,
    alias: Option<String>,
    /// The line of the path's own first token (for a group item, the item's line).
    line: usize,
}

fn ident_at(toks: &[Token], i: usize) -> Option<&str> {
    match toks.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn tok_at(toks: &[Token], i: usize) -> Option<&Tok> {
    toks.get(i).map(|t| &t.tok)
}

/// Reads the path or `use` tree starting at `toks[i]` (after `prefix`), flattening groups into
/// `out`; returns the index after it. In an expression the path simply ends where something
/// other than `::` follows (`(`, `<`, `;`, ...).
fn parse_tree(toks: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<UsePath>) -> usize {
    let mut segs = prefix.to_vec();
    let line = toks.get(i).map_or(0, |t| t.line);
    loop {
        match tok_at(toks, i) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 1;
                if tok_at(toks, i) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let mut alias = None;
                if ident_at(toks, i) == Some("as") {
                    if let Some(name) = ident_at(toks, i + 1) {
                        alias = Some(name.to_string());
                        i += 2;
                    }
                }
                out.push(UsePath { segs, alias, line });
                return i;
            }
            Some(Tok::Punct('*')) => {
                segs.push("*".to_string());
                out.push(UsePath {
                    segs,
                    alias: None,
                    line,
                });
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match tok_at(toks, i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        None => return i,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let next = parse_tree(toks, i, &segs, out);
                            // Something the grammar does not expect: step over it rather than loop.
                            i = if next == i { i + 1 } else { next };
                        }
                    }
                }
            }
            _ => {
                // `crate::f::<T>()` ends after `::`; an empty item adds nothing.
                if segs.len() > prefix.len() {
                    out.push(UsePath {
                        segs,
                        alias: None,
                        line,
                    });
                }
                return i;
            }
        }
    }
}

/// What one file says about modules: every path starting with `crate::` or `super::`, and
/// (for `lib.rs`) the top-level modules it declares and the names it re-exports.
#[derive(Default)]
struct Scan {
    /// Each path with the inline `mod` blocks around it, innermost last (relative to the file).
    paths: Vec<(UsePath, Vec<String>)>,
    /// `mod name;` and `mod name { ... }` at the file's top level, with their line.
    top_mods: Vec<(String, usize)>,
    /// `use` trees at the file's top level (the crate root's re-exports, in `lib.rs`).
    top_uses: Vec<UsePath>,
    /// Brace depth at the end of the file: anything but 0 means the lexer lost its step (a
    /// literal it misread) and may have missed imports, so the check refuses to trust it.
    final_depth: usize,
}

fn scan(text: &str) -> Scan {
    let toks = lex(text);
    let mut result = Scan::default();
    // Inline `mod name { ... }` blocks we are in, with the brace depth of their body, so that
    // `super` inside `mod tests` resolves from the test module, not from the file.
    let mut mods: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let prev_is_sep = i > 0 && toks[i - 1].tok == Tok::PathSep;
        match &toks[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if mods.last().is_some_and(|&(_, d)| d == depth) {
                    mods.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(k) if k == "mod" => {
                if let Some(name) = ident_at(&toks, i + 1) {
                    let body = tok_at(&toks, i + 2) == Some(&Tok::Punct('{'));
                    if mods.is_empty() && depth == 0 {
                        result.top_mods.push((name.to_string(), toks[i].line));
                    }
                    if body {
                        mods.push((name.to_string(), depth + 1));
                    }
                }
            }
            Tok::Ident(k) if k == "use" && mods.is_empty() && depth == 0 => {
                let mut out = Vec::new();
                let end = parse_tree(&toks, i + 1, &[], &mut out);
                // A `use crate::...` line is also an import to judge: keep both views.
                for p in out {
                    if matches!(p.segs.first().map(String::as_str), Some("crate" | "super")) {
                        let copy = UsePath {
                            segs: p.segs.clone(),
                            alias: p.alias.clone(),
                            line: p.line,
                        };
                        result.paths.push((copy, Vec::new()));
                    }
                    result.top_uses.push(p);
                }
                i = end.max(i + 1);
                continue;
            }
            // The start of a path (`a::crate` is not one; `pub(crate)`, `pub(super)` are not
            // followed by `::`).
            Tok::Ident(k)
                if (k == "crate" || k == "super")
                    && !prev_is_sep
                    && tok_at(&toks, i + 1) == Some(&Tok::PathSep) =>
            {
                let mut out = Vec::new();
                let end = parse_tree(&toks, i, &[], &mut out);
                let inline: Vec<String> = mods.iter().map(|(n, _)| n.clone()).collect();
                for p in out {
                    result.paths.push((p, inline.clone()));
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    result.final_depth = depth + mods.len();
    result
}

// ---------------------------------------------------------------------------------------------
// The tree
// ---------------------------------------------------------------------------------------------

/// Where a source file sits in the crate.
enum Place {
    /// `src/lib.rs`: may reference anything.
    Root,
    /// `src/bin/**` or `src/main.rs`: a separate crate, named for messages.
    Bin(String),
    /// A module of the library, e.g. `["failover", "worker"]`.
    Module(Vec<String>),
}

fn place_of(rel: &[String]) -> Place {
    let mut parts: Vec<String> = rel.to_vec();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_string();
    }
    match parts.first().map(String::as_str) {
        Some("bin") => Place::Bin(parts.join("::")),
        Some("main") if parts.len() == 1 => Place::Bin("main".to_string()),
        Some("lib") if parts.len() == 1 => Place::Root,
        _ => {
            if parts.last().map(String::as_str) == Some("mod") {
                parts.pop();
            }
            Place::Module(parts)
        }
    }
}

/// Every `.rs` file under `dir`, as paths relative to `src`, sorted so the report is stable.
fn rust_files(src: &Path, dir: &Path, out: &mut Vec<Vec<String>>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).expect("under src");
            out.push(
                rel.components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect(),
            );
        }
    }
}

/// Checks the tree at `src` (a crate's `src/` directory) and returns every violation.
fn check(src: &Path) -> Vec<Violation> {
    let mut files = Vec::new();
    rust_files(src, src, &mut files);
    let display = |rel: &[String]| format!("src/{}", rel.join("/"));
    let read = |rel: &[String]| {
        let path = rel.iter().fold(src.to_path_buf(), |p, c| p.join(c));
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    };

    // Top-level modules, with where to point at them: their file, or the `mod` line in lib.rs
    // (an inline module, or a `#[path]` one).
    let mut tops: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for rel in &files {
        if let Place::Module(m) = place_of(rel) {
            tops.entry(m[0].clone())
                .or_insert_with(|| (display(rel), 1));
        }
    }
    // The root's re-exports (`pub use client::{Client, ...}`), so that `crate::Client` from a
    // primitive counts as an import of `client` and a re-export cannot be used as a back door.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    let lib = vec!["lib.rs".to_string()];
    let scanned_lib = files.contains(&lib).then(|| scan(&read(&lib)));
    if let Some(root) = &scanned_lib {
        for (name, line) in &root.top_mods {
            tops.entry(name.clone())
                .or_insert_with(|| (display(&lib), *line));
        }
        for u in &root.top_uses {
            let segs: Vec<&str> = u
                .segs
                .iter()
                .map(String::as_str)
                .skip_while(|s| matches!(*s, "crate" | "self"))
                .collect();
            // Re-exports of other crates (`pub use tokio::...`) name no module of ours.
            let ours = |top: &str| tops.contains_key(top) || Layer::of(top) != Layer::Unknown;
            if let [top, .., last] = segs[..] {
                if ours(top) && !matches!(last, "*" | "self") {
                    let name = u.alias.as_deref().unwrap_or(last);
                    reexports.insert(name.to_string(), top.to_string());
                }
            }
        }
    }
    // Resolves a name right under the crate root to the top-level module it stands for, and
    // the re-export it went through, if any.
    let resolve = |name: &str| -> Option<(String, Option<String>)> {
        if tops.contains_key(name) || Layer::of(name) != Layer::Unknown {
            Some((name.to_string(), None))
        } else {
            reexports
                .get(name)
                .map(|top| (top.clone(), Some(name.to_string())))
        }
    };

    let mut found = Vec::new();
    for (name, (file, line)) in &tops {
        if Layer::of(name) == Layer::Unknown {
            found.push(Violation {
                file: file.clone(),
                line: *line,
                module: name.clone(),
                target: name.clone(),
                message: format!(
                    "{name} (layer none) is a top-level module in no layer: unknown module, place it in a layer"
                ),
                hint: "move its code into client, a primitive, lease, backend, a transport, error or util (or add the module to the table in tests/layering.rs if it is a new layer)".to_string(),
            });
        }
    }

    // The files of the library, by module path, for the cycle check at the end.
    let file_modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .filter_map(|rel| match place_of(rel) {
            Place::Module(m) => Some((m, display(rel))),
            _ => None,
        })
        .collect();
    // file -> files it names, with the line of the first such path.
    let mut edges: BTreeMap<Vec<String>, BTreeMap<Vec<String>, usize>> = BTreeMap::new();

    for rel in &files {
        let place = place_of(rel);
        let file = display(rel);
        let own;
        let scanned = match (&place, &scanned_lib) {
            (Place::Root, Some(s)) => s,
            _ => {
                own = scan(&read(rel));
                &own
            }
        };
        assert_eq!(
            scanned.final_depth, 0,
            "{file}: unbalanced braces after stripping comments and literals; the scanner \
             misread a literal and cannot vouch for this file"
        );
        for (path, inline) in &scanned.paths {
            let segs: Vec<&str> = path.segs.iter().map(String::as_str).collect();
            let module = match &place {
                Place::Bin(name) => {
                    // `super` stays inside the binary; `crate::` there is the binary itself,
                    // which must reach the library through `baton::` only.
                    if segs[0] == "crate" {
                        let target = segs.get(1).copied().unwrap_or("crate");
                        found.push(Violation {
                            file: file.clone(),
                            line: path.line,
                            module: name.clone(),
                            target: target.to_string(),
                            message: format!(
                                "{name} (layer bin) imports crate::{target} (layer bin): not allowed"
                            ),
                            hint: "the CLI uses only the public API: write `baton::...`, never `crate::...`".to_string(),
                        });
                    }
                    continue;
                }
                Place::Root => inline.clone(),
                Place::Module(m) => m.iter().chain(inline).cloned().collect::<Vec<_>>(),
            };
            // Inline modules of lib.rs are top-level modules of their own.
            if module.is_empty() {
                continue; // the root itself
            }
            let from_top = unit_of(&module.iter().map(String::as_str).collect::<Vec<_>>());
            let module_name = module.join("::");
            let from_layer = Layer::of(&from_top).name();

            // The path from the crate root, if it gets there.
            let abs: Vec<&str> = if segs[0] == "crate" {
                segs[1..].to_vec()
            } else {
                let ups = segs.iter().take_while(|s| **s == "super").count();
                if ups > module.len() {
                    found.push(Violation {
                        file: file.clone(),
                        line: path.line,
                        module: module_name.clone(),
                        target: segs.join("::"),
                        message: format!(
                            "{module_name} (layer {from_layer}) imports {} (above the crate root): not allowed",
                            segs.join("::")
                        ),
                        hint: format!(
                            "`super` is used {ups} times but {module_name} is only {} deep",
                            module.len()
                        ),
                    });
                    continue;
                }
                module[..module.len() - ups]
                    .iter()
                    .map(String::as_str)
                    .chain(segs[ups..].iter().copied())
                    .collect()
            };
            // An edge between files for the cycle check (unit tests are left out: a test module
            // may reach back to the file that declares it).
            if let Place::Module(m) = &place {
                if !inline.iter().any(|i| i == "tests") {
                    let target = (1..=abs.len()).rev().find_map(|n| {
                        let key: Vec<String> = abs[..n].iter().map(|x| x.to_string()).collect();
                        file_modules.contains_key(&key).then_some(key)
                    });
                    // Only within one unit: a cycle across units always has an arrow pointing
                    // up, which the layer check reports already.
                    let same_unit = |t: &Vec<String>| {
                        unit_of(&t.iter().map(String::as_str).collect::<Vec<_>>()) == from_top
                    };
                    if let Some(target) = target.filter(|t| t != m && same_unit(t)) {
                        edges
                            .entry(m.clone())
                            .or_default()
                            .entry(target)
                            .or_insert(path.line);
                    }
                }
            }
            if unit_of(&abs) == from_top {
                continue; // still inside the same unit
            }
            // The name right under the crate root.
            let Some(named) = abs.first().copied() else {
                continue;
            };
            if named == "self" {
                continue;
            }
            if named == "*" {
                found.push(Violation {
                    file: file.clone(),
                    line: path.line,
                    module: module_name.clone(),
                    target: "*".to_string(),
                    message: format!(
                        "{module_name} (layer {from_layer}) imports * (every item of the crate root): not allowed"
                    ),
                    hint: "a glob of the crate root pulls in every re-export, whatever its layer: name the module instead".to_string(),
                });
                continue;
            }
            // Names that are neither modules nor re-exports (items defined in lib.rs, macros)
            // belong to the root, which everyone may use.
            let Some((to_top, via)) = resolve(named) else {
                continue;
            };
            let to_top = if via.is_none() { unit_of(&abs) } else { to_top };
            if may_import(&from_top, &to_top) {
                continue;
            }
            let via = via
                .map(|name| format!(" (through the root re-export crate::{name})"))
                .unwrap_or_default();
            found.push(Violation {
                file: file.clone(),
                line: path.line,
                module: module_name.clone(),
                target: to_top.clone(),
                message: format!(
                    "{module_name} (layer {from_layer}) imports {to_top} (layer {}): not allowed",
                    Layer::of(&to_top).name()
                ),
                hint: format!("{}{via}", allowed_for(&from_top)),
            });
        }
    }
    for cycle in file_cycles(&edges).into_iter().filter(|c| {
        !KNOWN_CYCLES.contains(
            &c.iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" -> ")
                .as_str(),
        )
    }) {
        let first = &cycle[0];
        let next = &cycle[1 % cycle.len()];
        let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
        found.push(Violation {
            file: file_modules[first].clone(),
            line: edges[first][next],
            module: first.join("::"),
            target: next.join("::"),
            message: format!(
                "import cycle between files: {} -> {}",
                names.join(" -> "),
                names[0]
            ),
            hint: "move what both need into a file of its own that neither imports back (or into the lower of the two)".to_string(),
        });
    }
    // `use crate::client::{Client, JobState}` names `client` twice on one line: say it once.
    let mut seen = BTreeSet::new();
    found.retain(|v| seen.insert((v.file.clone(), v.line, v.module.clone(), v.target.clone())));
    found
}

/// The strongly connected components of more than one file (Tarjan), each as a cycle through
/// its files in edge order, starting at its smallest module path so the report is stable.
fn file_cycles(
    edges: &BTreeMap<Vec<String>, BTreeMap<Vec<String>, usize>>,
) -> Vec<Vec<Vec<String>>> {
    type M = Vec<String>;
    struct Tarjan<'a> {
        edges: &'a BTreeMap<M, BTreeMap<M, usize>>,
        index: BTreeMap<M, usize>,
        low: BTreeMap<M, usize>,
        stack: Vec<M>,
        on_stack: BTreeSet<M>,
        out: Vec<Vec<M>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &M) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            let next: Vec<M> = self
                .edges
                .get(v)
                .map(|e| e.keys().cloned().collect())
                .unwrap_or_default();
            for w in &next {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = BTreeSet::new();
                loop {
                    let w = self.stack.pop().expect("on the stack");
                    self.on_stack.remove(&w);
                    let done = &w == v;
                    comp.insert(w);
                    if done {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.out.push(self.order(comp));
                }
            }
        }

        /// A walk from the smallest member along edges inside the component, for the message.
        fn order(&self, comp: BTreeSet<M>) -> Vec<M> {
            let start = comp.iter().next().expect("non-empty").clone();
            let mut walk = vec![start.clone()];
            let mut cur = start;
            loop {
                let next = self.edges[&cur]
                    .keys()
                    .find(|w| comp.contains(*w) && !walk.contains(w))
                    .cloned();
                match next {
                    Some(w) => {
                        walk.push(w.clone());
                        cur = w;
                    }
                    None => break,
                }
            }
            walk
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

fn report(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// The wire rule: wire protocols live only under src/backend/
// ---------------------------------------------------------------------------------------------

/// The files that still speak a wire protocol outside `src/backend/`, each as the rule prints it
/// (`src/...`). Each entry is a debt, not a licence: the code is moving into the backends'
/// folders, and the entry goes once its file is clean (the check reports an entry whose file
/// no longer violates, so the list cannot go stale).
const KNOWN_WIRE: &[&str] = &[];

/// The external crates that speak a backend's protocol.
const WIRE_CRATES: &[&str] = &["redis", "tokio_postgres"];

/// The first words of a SQL statement (a string literal that starts with one, after leading
/// whitespace, in any case, is SQL).
const SQL_VERBS: &[&str] = &[
    "SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "CREATE", "ALTER", "DROP", "LISTEN",
    "UNLISTEN", "NOTIFY", "TRUNCATE",
];

/// Whether the rule applies to the file at `rel` (relative to `src`): everything but the
/// backends (`backend/`), the test fixtures (`testing/`) and the CLI (`bin/`, which may only
/// use `baton::` anyway).
fn wire_rule_applies(rel: &[String]) -> bool {
    let top = rel.first().map(|t| t.trim_end_matches(".rs"));
    !matches!(top, Some("backend" | "testing" | "bin"))
}

/// What a string literal speaks, if it is wire code: a Lua script's `redis.call(`, or SQL.
fn wire_literal(text: &str) -> Option<String> {
    if text.contains("redis.call(") {
        return Some("a Redis script (`redis.call(`)".to_string());
    }
    let rest = text.trim_start();
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    let after = rest[word.len()..].chars().next();
    let whole_word = after.map_or(true, |c| !(c.is_alphanumeric() || c == '_'));
    let verb = SQL_VERBS
        .iter()
        .find(|v| whole_word && v.eq_ignore_ascii_case(&word))?;
    // `with` also starts English ("with the lock held"): SQL's names a common table expression.
    if *verb == "WITH" && !rest.to_ascii_uppercase().contains(" AS (") {
        return None;
    }
    Some(format!("a SQL statement (`{verb} …`)"))
}

/// Every wire-protocol path and literal outside the backends in the tree at `src`: a path into
/// `redis::` or `tokio_postgres::` (the crates), or into `crate::backend::redis`/`postgres`
/// (only the seams' own items, `crate::backend::X` for X not a backend folder, may be named);
/// a string literal holding a Redis script or starting with a SQL verb.
fn wire_violations(src: &Path) -> Vec<Violation> {
    let mut files = Vec::new();
    rust_files(src, src, &mut files);
    let mut found = Vec::new();
    for rel in files.iter().filter(|rel| wire_rule_applies(rel)) {
        let file = format!("src/{}", rel.join("/"));
        let path = rel.iter().fold(src.to_path_buf(), |p, c| p.join(c));
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let module: Vec<String> = match place_of(rel) {
            Place::Module(m) => m,
            _ => Vec::new(),
        };
        let module_name = if module.is_empty() {
            "crate".to_string()
        } else {
            module.join("::")
        };
        let mut push = |line: usize, target: String, message: String| {
            found.push(Violation {
                file: file.clone(),
                line,
                module: module_name.clone(),
                target,
                message,
                hint: "wire protocols live only under src/backend/: move the commands, scripts or \
                       statements into the backend's folder, behind the seam's method set, and \
                       take typed values back"
                    .to_string(),
            });
        };
        // Paths from the crate root (or climbing to it with `super`) into a backend's folder.
        for (p, inline) in &scan(&text).paths {
            let segs: Vec<&str> = p.segs.iter().map(String::as_str).collect();
            let here: Vec<&str> = module.iter().chain(inline).map(String::as_str).collect();
            let abs: Vec<&str> = if segs[0] == "crate" {
                segs[1..].to_vec()
            } else {
                let ups = segs.iter().take_while(|s| **s == "super").count();
                if ups > here.len() {
                    continue; // reported by the layer check
                }
                here[..here.len() - ups]
                    .iter()
                    .copied()
                    .chain(segs[ups..].iter().copied())
                    .collect()
            };
            if let ["backend", b, ..] = abs[..] {
                if BACKEND_FOLDERS.contains(&b) {
                    push(
                        p.line,
                        format!("backend::{b}"),
                        format!(
                            "{module_name} names crate::{} (a backend's internals) outside src/backend/",
                            abs.join("::")
                        ),
                    );
                }
            }
        }
        // The crates themselves, and literals. A `use crate::{redis::X}` group names a module of
        // ours, not the crate: only a path whose `use` starts at the crate counts there.
        let toks = lex(&text);
        let mut use_root: Option<String> = None;
        for (i, t) in toks.iter().enumerate() {
            match &t.tok {
                Tok::Ident(k) if k == "use" => {
                    use_root = match tok_at(&toks, i + 1) {
                        Some(Tok::Ident(r)) => Some(r.clone()),
                        Some(Tok::PathSep) => ident_at(&toks, i + 2).map(str::to_string),
                        _ => None,
                    };
                }
                Tok::Punct(';') => use_root = None,
                Tok::Ident(k)
                    if WIRE_CRATES.contains(&k.as_str())
                        && tok_at(&toks, i + 1) == Some(&Tok::PathSep) =>
                {
                    // `a::redis::` is someone's module; `::redis::` (nothing before the `::`) is
                    // the crate.
                    let prev = i.checked_sub(1).and_then(|j| tok_at(&toks, j));
                    let before_prev = i.checked_sub(2).and_then(|j| tok_at(&toks, j));
                    let leading_sep = prev == Some(&Tok::PathSep)
                        && !matches!(before_prev, Some(Tok::Ident(_) | Tok::Punct('>')));
                    let in_group_of_ours = matches!(prev, Some(Tok::Punct('{' | ',')))
                        && use_root
                            .as_deref()
                            .is_some_and(|r| matches!(r, "crate" | "super" | "self"));
                    if (prev != Some(&Tok::PathSep) || leading_sep) && !in_group_of_ours {
                        push(
                            t.line,
                            k.clone(),
                            format!("{module_name} names the `{k}` crate outside src/backend/"),
                        );
                    }
                }
                Tok::Str(s) => {
                    if let Some(what) = wire_literal(s) {
                        push(
                            t.line,
                            "literal".to_string(),
                            format!("{module_name} holds {what} outside src/backend/"),
                        );
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// The wire rule against an allowlist: the violations in files not on `known`, and the entries
/// of `known` whose file no longer violates (a stale entry).
fn wire_check(src: &Path, known: &[&str]) -> (Vec<Violation>, Vec<String>) {
    let found = wire_violations(src);
    let violating: BTreeSet<&str> = found.iter().map(|v| v.file.as_str()).collect();
    let stale = known
        .iter()
        .filter(|k| !violating.contains(**k))
        .map(|k| k.to_string())
        .collect();
    let new = found
        .iter()
        .filter(|v| !known.contains(&v.file.as_str()))
        .cloned()
        .collect();
    (new, stale)
}

// ---------------------------------------------------------------------------------------------
// The real tree
// ---------------------------------------------------------------------------------------------

#[test]
fn the_source_tree_respects_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let violations = check(&src);
    assert!(
        violations.is_empty(),
        "{} layering violation(s) in src/:\n{}",
        violations.len(),
        report(&violations)
    );
}

#[test]
fn wire_protocols_live_only_under_the_backends() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (new, stale) = wire_check(&src, KNOWN_WIRE);
    assert!(
        new.is_empty() && stale.is_empty(),
        "{} wire violation(s) outside src/backend/ in files not on KNOWN_WIRE:\n{}\n\
         KNOWN_WIRE entries whose file is clean now (delete them): {stale:?}",
        new.len(),
        report(&new)
    );
}

// ---------------------------------------------------------------------------------------------
// Self-tests on synthetic trees
// ---------------------------------------------------------------------------------------------

/// A throwaway crate layout under the temp dir, removed on drop (also when the test fails).
struct Tree {
    root: PathBuf,
}

impl Tree {
    /// A tree that respects every rule, with at least one legal import of each kind (`use`
    /// groups, expressions, `super` chains through inline modules, a root re-export), so the
    /// tests below can plant exactly one forbidden import in it.
    fn clean(name: &str) -> Tree {
        let root =
            std::env::temp_dir().join(format!("baton-layering-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let tree = Tree { root };
        tree.write(
            "lib.rs",
            "//! The root: `crate::failover::X` in a doc comment is not an import.\n\
             pub mod client;\n\
             pub mod error;\n\
             pub mod failover;\n\
             pub mod lease;\n\
             pub mod mutex;\n\
             pub mod redis;\n\
             #[cfg(feature = \"testing\")]\n\
             pub mod testing;\n\
             pub mod util;\n\
             pub use client::Client;\n\
             pub use error::{Error, ErrorKind as Kind};\n\
             pub use failover::{worker::Worker, Config};\n",
        );
        tree.write(
            "client.rs",
            "use crate::{\n    error::Error,\n    failover::Worker,\n    mutex::Guard,\n    redis::Conn,\n};\n\
             pub struct Client;\n\
             impl Client { pub fn new() -> Self { let _ = crate::lease::Lease; Client } }\n",
        );
        tree.write(
            "failover/mod.rs",
            "pub mod worker;\npub struct Config;\nuse crate::lease::Lease;\nuse self::worker::Worker;\n",
        );
        tree.write(
            "failover/worker.rs",
            "use super::super::lease::Lease;\n\
             use super::Config;\n\
             use crate::redis::hub::Hub;\n\
             use crate::Error;\n\
             pub struct Worker<'a>(&'a str);\n\
             #[cfg(test)]\n\
             mod tests {\n    use super::*;\n    use super::super::super::util::after;\n    use super::super::Config;\n}\n",
        );
        tree.write(
            "mutex.rs",
            "use crate::lease::Lease;\n\
             pub struct Guard;\n\
             pub fn f() -> Result<(), crate::error::Error> { crate::util::after(); Ok(()) }\n",
        );
        tree.write(
            "lease/mod.rs",
            "use crate::redis::Conn;\nuse crate::error::Error;\npub struct Lease;\n",
        );
        tree.write(
            "redis/mod.rs",
            "pub mod hub;\npub struct Conn;\nuse crate::util::after;\nuse self::hub::Hub;\n",
        );
        tree.write(
            "redis/hub.rs",
            "use super::Conn;\nuse crate::error::Error;\npub struct Hub;\n",
        );
        tree.write(
            "error.rs",
            "pub struct Error;\npub enum ErrorKind {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        );
        tree.write(
            "util/mod.rs",
            "use crate::error::Error;\npub fn after() {}\n",
        );
        tree.write(
            "testing.rs",
            "use crate::util::after;\nuse crate::error::{Error, ErrorKind};\n",
        );
        tree.write(
            "bin/baton.rs",
            "use baton::Client;\nfn main() { baton::util::after(); }\n",
        );
        tree
    }

    /// Writes (or replaces) `src/<rel>`.
    fn write(&self, rel: &str, text: &str) -> &Tree {
        let path = self.root.join("src").join(rel);
        fs::create_dir_all(path.parent().expect("has a parent")).expect("create dir");
        fs::write(&path, text).expect("write file");
        self
    }

    fn check(&self) -> Vec<Violation> {
        check(&self.root.join("src"))
    }

    /// Asserts the tree has exactly one violation, at `file:line`, of `module` importing `target`.
    fn expect_one(&self, file: &str, line: usize, module: &str, target: &str) -> Violation {
        let found = self.check();
        let summary: Vec<(&str, usize, &str, &str)> = found
            .iter()
            .map(|v| {
                (
                    v.file.as_str(),
                    v.line,
                    v.module.as_str(),
                    v.target.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [(file, line, module, target)],
            "\n{}",
            report(&found)
        );
        found.into_iter().next().expect("one violation")
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

#[test]
fn a_clean_tree_has_no_violations() {
    let tree = Tree::clean("clean");
    let found = tree.check();
    assert!(found.is_empty(), "\n{}", report(&found));
}

#[test]
fn a_transport_importing_a_primitive_is_reported() {
    let tree = Tree::clean("transport-primitive");
    tree.write(
        "redis/hub.rs",
        "use super::Conn;\nuse crate::failover::X;\npub struct Hub;\n",
    );
    let v = tree.expect_one("src/redis/hub.rs", 2, "redis::hub", "failover");
    assert_eq!(
        v.message,
        "redis::hub (layer transport) imports failover (layer primitive): not allowed"
    );
}

#[test]
fn a_primitive_importing_another_through_a_multi_line_group_is_reported() {
    let tree = Tree::clean("primitive-group");
    tree.write(
        "failover/worker.rs",
        "use crate::{\n    lease::Lease,\n    mutex::Guard,\n    util::{after, self},\n};\n",
    );
    tree.expect_one("src/failover/worker.rs", 3, "failover::worker", "mutex");
}

#[test]
fn a_primitive_naming_the_client_in_an_expression_is_reported() {
    let tree = Tree::clean("primitive-client-expr");
    tree.write(
        "mutex.rs",
        "pub struct Guard;\n\npub fn f() {\n    let _c = crate::client::Client::new();\n}\n",
    );
    tree.expect_one("src/mutex.rs", 4, "mutex", "client");
}

#[test]
fn a_primitive_reaching_the_client_through_super_super_is_reported() {
    let tree = Tree::clean("primitive-client-super");
    tree.write(
        "failover/worker.rs",
        "use super::Config;\nuse super::super::client::Client;\n",
    );
    tree.expect_one("src/failover/worker.rs", 2, "failover::worker", "client");
}

#[test]
fn super_inside_an_inline_module_resolves_from_that_module() {
    // From `failover::worker::tests`, two `super`s are still inside `failover` and three reach
    // the root: without tracking `mod tests` the first would look like an import of `mutex`.
    let tree = Tree::clean("inline-mod");
    tree.write(
        "failover/worker.rs",
        "pub struct Worker;\n\
         #[cfg(test)]\n\
         mod tests {\n    use super::super::Config;\n    mod deeper { use super::super::super::super::lease::Lease; }\n    use super::super::super::mutex::Guard;\n}\n\
         use super::super::lease::Lease;\n",
    );
    tree.expect_one(
        "src/failover/worker.rs",
        6,
        "failover::worker::tests",
        "mutex",
    );
}

#[test]
fn a_primitive_using_a_root_re_export_of_the_client_is_reported() {
    let tree = Tree::clean("primitive-reexport");
    tree.write("mutex.rs", "use crate::Error;\nuse crate::Client;\n");
    let v = tree.expect_one("src/mutex.rs", 2, "mutex", "client");
    assert!(v.hint.contains("crate::Client"), "{v}");
}

#[test]
fn glob_imports_of_super_in_a_leaf_test_module_are_fine() {
    let tree = Tree::clean("leaf-tests-glob");
    tree.write(
        "error.rs",
        "pub struct Error;\n\
         #[cfg(test)]\n\
         mod tests {\n    use super::*;\n    mod inner {\n        use super::super::*;\n        use super::*;\n    }\n}\n",
    );
    let found = tree.check();
    assert!(found.is_empty(), "\n{}", report(&found));
}

#[test]
fn imports_inside_comments_and_literals_are_ignored() {
    // Everything before the last line mentions forbidden modules only in comments and literals,
    // with the lexer's traps in between (a `"` char, lifetimes, raw strings with `"` inside,
    // nested block comments). The real import on the last line proves the scanner is still in
    // step and counting lines.
    let tree = Tree::clean("comments-strings");
    let text = r####"//! Docs: [`Client`](crate::client::Client).
/// use crate::client::Client;
// use crate::failover::Worker;
/* use crate::client::Client; /* nested crate::mutex::Guard */ still comment crate::client */
pub fn f<'a>(x: &'a str) -> &'a str {
    let _q = '"';
    let _s = "use crate::client::Client; \" crate::mutex::Guard";
    let _r = r#"use crate::client::Client; "quoted" crate::mutex"#;
    let _rr = r##"a "# crate::failover::X"##;
    let _b = b"crate::client";
    let _br = br#"crate::client"#;
    let _c = b'\'';
    let _brace = '{';
    let _esc = '\u{7B}';
    'outer: loop { break 'outer; }
    x
}
pub fn g() { let _ = "multi
line crate::client::Client
string"; }
use crate::client::Client;
"####;
    tree.write("util/mod.rs", text);
    tree.expect_one("src/util/mod.rs", 21, "util", "client");
}

#[test]
fn the_lease_kernel_importing_a_primitive_is_reported() {
    let tree = Tree::clean("lease-primitive");
    tree.write(
        "lease/mod.rs",
        "use crate::redis::Conn;\nuse crate::failover::Worker;\npub struct Lease;\n",
    );
    tree.expect_one("src/lease/mod.rs", 2, "lease", "failover");
}

#[test]
fn util_importing_a_transport_is_reported() {
    let tree = Tree::clean("util-redis");
    tree.write(
        "util/mod.rs",
        "use crate::error::Error;\npub fn after() {\n    let _ = crate::redis::Conn;\n}\n",
    );
    tree.expect_one("src/util/mod.rs", 3, "util", "redis");
}

#[test]
fn an_unknown_top_level_module_is_reported() {
    let tree = Tree::clean("unknown-module");
    tree.write("keys.rs", "use crate::error::Error;\npub fn key() {}\n");
    let v = tree.expect_one("src/keys.rs", 1, "keys", "keys");
    assert!(v.message.contains("unknown module"), "{v}");
}

#[test]
fn an_unknown_inline_module_of_the_root_is_reported() {
    // `mod keys { ... }` written straight into lib.rs must not dodge the table either.
    let tree = Tree::clean("unknown-inline");
    tree.write(
        "lib.rs",
        "pub mod client;\npub mod error;\npub mod failover;\npub mod lease;\npub mod mutex;\n\
         pub mod redis;\npub mod util;\npub use client::Client;\npub use error::Error;\n\
         pub use failover::worker::Worker;\nmod keys {\n    pub fn key() {}\n}\n",
    );
    tree.expect_one("src/lib.rs", 11, "keys", "keys");
}

#[test]
fn super_above_the_crate_root_is_reported() {
    let tree = Tree::clean("above-root");
    tree.write("redis/hub.rs", "use super::super::super::Conn;\n");
    tree.expect_one(
        "src/redis/hub.rs",
        1,
        "redis::hub",
        "super::super::super::Conn",
    );
}

#[test]
fn crate_paths_in_the_cli_are_reported() {
    let tree = Tree::clean("bin-crate");
    tree.write(
        "bin/baton.rs",
        "use baton::Client;\nfn main() {\n    crate::util::after();\n}\n",
    );
    let v = tree.expect_one("src/bin/baton.rs", 3, "bin::baton", "util");
    assert!(v.hint.contains("baton::"), "{v}");
}

#[test]
fn an_import_cycle_between_files_is_reported() {
    let tree = Tree::clean("file-cycle");
    // Legal by layer (both in one primitive), but the two files name each other.
    tree.write(
        "failover/events.rs",
        "use super::store::Row;\npub struct Status;\n",
    );
    tree.write(
        "failover/store.rs",
        "use super::events::Status;\npub struct Row;\n",
    );
    let v = tree.expect_one(
        "src/failover/events.rs",
        1,
        "failover::events",
        "failover::store",
    );
    assert_eq!(
        v.message,
        "import cycle between files: failover::events -> failover::store -> failover::events"
    );
}

// ---------------------------------------------------------------------------------------------
// Self-tests of the wire rule
// ---------------------------------------------------------------------------------------------

/// The wire rule's violations in `tree`, as `(file, line, target)`.
fn wire_summary(tree: &Tree) -> Vec<(String, usize, String)> {
    wire_violations(&tree.root.join("src"))
        .into_iter()
        .map(|v| (v.file, v.line, v.target))
        .collect()
}

/// The clean tree with a seam (`backend/mod.rs`) and a backend folder that speak the wire
/// freely: the rule has nothing to say about them.
fn wire_tree(name: &str) -> Tree {
    let tree = Tree::clean(name);
    tree.write(
        "backend/mod.rs",
        "pub mod redis;\npub mod inspect;\npub struct Backend;\n\
         pub fn f() { let _ = ::redis::cmd(\"PING\"); }\n",
    )
    .write(
        "backend/redis/mod.rs",
        "use redis::Value;\nuse tokio_postgres::Row;\n\
         const S: &str = \"return redis.call('GET', KEYS[1])\";\n\
         const Q: &str = \"\\n  select 1\";\npub struct Node;\n",
    )
    .write("backend/inspect.rs", "pub struct Record;\n")
    .write(
        "testing.rs",
        "use crate::util::after;\nuse crate::error::{Error, ErrorKind};\n\
         const Q: &str = \"DELETE FROM t\";\npub fn f() { let _ = redis::cmd(\"FLUSHALL\"); }\n",
    );
    tree
}

#[test]
fn wire_code_inside_the_backends_and_the_fixtures_is_fine() {
    let tree = wire_tree("wire-clean");
    assert_eq!(wire_summary(&tree), []);
    // The seam's own items may be named from anywhere.
    tree.write(
        "mutex.rs",
        "use crate::backend::Backend;\nuse crate::backend::inspect::Record;\n\
         pub struct Guard;\nconst M: &str = \"with the lock held\";\n\
         const N: &str = \"selected\";\n",
    );
    assert_eq!(wire_summary(&tree), []);
}

#[test]
fn a_primitive_naming_the_redis_crate_is_reported() {
    let tree = wire_tree("wire-crate");
    tree.write(
        "mutex.rs",
        "pub struct Guard;\n\npub fn f() {\n    let _ = redis::cmd(\"GET\");\n}\n",
    );
    assert_eq!(
        wire_summary(&tree),
        [("src/mutex.rs".to_string(), 4, "redis".to_string())]
    );
    // Through a `use` line, a leading `::`, and tokio_postgres too.
    tree.write(
        "mutex.rs",
        "use redis::Value;\npub struct Guard;\npub fn f(_: ::redis::Value) {}\n\
         pub fn g(_: &tokio_postgres::Row) {}\n",
    );
    assert_eq!(
        wire_summary(&tree),
        [
            ("src/mutex.rs".to_string(), 1, "redis".to_string()),
            ("src/mutex.rs".to_string(), 3, "redis".to_string()),
            ("src/mutex.rs".to_string(), 4, "tokio_postgres".to_string()),
        ]
    );
}

#[test]
fn a_path_into_a_backend_folder_is_reported() {
    let tree = wire_tree("wire-folder");
    tree.write(
        "failover/worker.rs",
        "use crate::backend::{Backend, redis::Node};\n\
         pub struct Worker;\n\
         pub fn f() { let _ = super::super::backend::redis::Node; }\n",
    );
    assert_eq!(
        wire_summary(&tree),
        [
            (
                "src/failover/worker.rs".to_string(),
                1,
                "backend::redis".to_string()
            ),
            (
                "src/failover/worker.rs".to_string(),
                3,
                "backend::redis".to_string()
            ),
        ]
    );
}

#[test]
fn a_script_or_a_statement_outside_the_backends_is_reported() {
    let tree = wire_tree("wire-literal");
    tree.write(
        "client.rs",
        "pub struct Client;\n\
         const A: &str = \"if redis.call('GET', KEYS[1]) then return 1 end\";\n\
         const B: &str = r#\"\n    Select key FROM t\"#;\n\
         const C: &str = \"insert into t values (1)\";\n\
         const D: &str = \"  WITH c AS (SELECT 1) SELECT * FROM c\";\n",
    );
    assert_eq!(
        wire_summary(&tree),
        [
            ("src/client.rs".to_string(), 2, "literal".to_string()),
            ("src/client.rs".to_string(), 3, "literal".to_string()),
            ("src/client.rs".to_string(), 5, "literal".to_string()),
            ("src/client.rs".to_string(), 6, "literal".to_string()),
        ]
    );
}

#[test]
fn the_wire_allowlist_hides_its_files_and_reports_the_clean_ones() {
    let tree = wire_tree("wire-known");
    tree.write(
        "mutex.rs",
        "pub struct Guard;\npub fn f() { let _ = redis::cmd(\"GET\"); }\n",
    );
    let src = tree.root.join("src");
    let (new, stale) = wire_check(&src, &["src/mutex.rs"]);
    assert!(new.is_empty() && stale.is_empty(), "{new:?} {stale:?}");
    // An entry whose file no longer violates is reported, so the list only shrinks.
    tree.write("mutex.rs", "pub struct Guard;\n");
    let (new, stale) = wire_check(&src, &["src/mutex.rs"]);
    assert!(new.is_empty(), "{new:?}");
    assert_eq!(stale, ["src/mutex.rs"]);
    // A violation in a file not on the list is reported.
    tree.write(
        "lease/mod.rs",
        "use crate::redis::Conn;\nuse crate::error::Error;\npub struct Lease;\n\
         const Q: &str = \"UPDATE t SET a = 1\";\n",
    );
    let (new, _) = wire_check(&src, &["src/mutex.rs"]);
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!((new[0].file.as_str(), new[0].line), ("src/lease/mod.rs", 4));
}

//! Every relative link in README.md and docs/*.md leads somewhere: the file (or folder) exists,
//! and a `#anchor` names a heading of the target Markdown file under GitHub's rules. Guides move
//! and headings get renamed; a link that silently points nowhere is what a newcomer meets first.
//!
//! No network and no new dependency: links to `http(s)://` and `mailto:` are not checked (a
//! flaky remote would fail CI for nothing), only what lives in this repository. The self-tests at
//! the bottom plant broken links and require each to be reported, so the check cannot pass by
//! finding no links at all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The documents whose links are checked, relative to the crate's root: the README and every
/// Markdown file directly in `docs/`.
fn documents(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut paths = vec![PathBuf::from("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("a docs/ folder")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| PathBuf::from("docs").join(path.file_name().expect("a file name")))
        .collect();
    guides.sort();
    paths.extend(guides);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path))
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            (path, text)
        })
        .collect()
}

/// The lines of `text` outside fenced code blocks (```` ``` ```` or `~~~`), each with its
/// 1-based number: a `# comment` in a shell block or a hidden `# line` of a doctest is not a
/// heading, and `[a](b)` in Rust code is not a link.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A line with its inline code spans (`` `…` ``) blanked, so a `[x](y)` shown as code is not
/// taken for a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// GitHub's anchor for a heading: lowercase; letters, digits, `-` and `_` kept; spaces become
/// `-`; everything else (punctuation, backticks, emphasis marks) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a document offers: one per ATX heading (`#` to `######`), with GitHub's `-1`,
/// `-2`, … suffixes for repeated headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line.get(hashes..) else {
            continue;
        };
        if !(1..=6).contains(&hashes) || !title.starts_with(' ') {
            continue;
        }
        let base = slug(title.trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links (`[text](target)`, images included) and reference
/// definitions (`[label]: target`) of a document, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some((_, rest)) = trimmed.split_once("]: ") {
                if let Some(target) = rest.split_whitespace().next() {
                    out.push((number, target.to_string()));
                }
                continue;
            }
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            // `[text](target "title")`: the target is the first word.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((number, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// `base`'s folder joined with `relative`, `..` and `.` resolved; `None` when it climbs out of
/// the repository.
fn resolve(base: &Path, relative: &str) -> Option<PathBuf> {
    let mut out = Vec::new();
    let joined = base.parent().unwrap_or(Path::new("")).join(relative);
    for part in joined.components() {
        match part {
            Component::Normal(p) => out.push(p.to_owned()),
            Component::ParentDir => {
                out.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out.iter().collect())
}

/// Every broken relative link of `docs`, as `file:line: target: why`. `exists` says whether a
/// path (relative to the repository's root) is a file or folder; a link to a Markdown file that
/// is itself in `docs` has its anchor checked against that text, another Markdown file is read
/// through `read`.
fn broken_links(
    docs: &BTreeMap<PathBuf, String>,
    exists: impl Fn(&Path) -> bool,
    read: impl Fn(&Path) -> Option<String>,
) -> Vec<String> {
    let mut broken = Vec::new();
    for (file, text) in docs {
        for (line, target) in links(text) {
            let is_remote = target.contains("://") || target.starts_with("mailto:");
            if is_remote || target.is_empty() {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let where_ = format!("{}:{line}: {target}", file.display());
            let target_file = if path.is_empty() {
                file.clone()
            } else {
                match resolve(file, path) {
                    Some(p) if exists(&p) => p,
                    _ => {
                        broken.push(format!("{where_}: no such file"));
                        continue;
                    }
                }
            };
            let Some(anchor) = anchor else {
                continue;
            };
            if target_file.extension().and_then(|ext| ext.to_str()) != Some("md") {
                // `src/lib.rs#L10` and the like: GitHub's line anchors, not headings.
                continue;
            }
            let text = docs
                .get(&target_file)
                .cloned()
                .or_else(|| read(&target_file));
            match text {
                Some(text) if anchors(&text).contains(anchor) => {}
                Some(_) => broken.push(format!(
                    "{where_}: no heading with anchor #{anchor} in {}",
                    target_file.display()
                )),
                None => broken.push(format!("{where_}: cannot read {}", target_file.display())),
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = documents(root);
    assert!(
        docs.len() > 1,
        "expected README.md and guides in docs/, found {:?}",
        docs.keys().collect::<Vec<_>>()
    );
    let checked: usize = docs.values().map(|text| links(text).len()).sum();
    assert!(checked > 0, "no links found: is the link parser broken?");
    let broken = broken_links(
        &docs,
        |p| root.join(p).exists(),
        |p| std::fs::read_to_string(root.join(p)).ok(),
    );
    assert!(
        broken.is_empty(),
        "broken links ({} of {checked}):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_links_to_every_guide() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = documents(root);
    let readme_targets: BTreeSet<String> = links(&docs[Path::new("README.md")])
        .into_iter()
        .map(|(_, target)| target.split('#').next().unwrap_or("").to_string())
        .collect();
    let unlinked: Vec<String> = docs
        .keys()
        .filter(|path| path.starts_with("docs"))
        .map(|path| path.display().to_string())
        .filter(|path| !readme_targets.contains(path))
        .collect();
    assert!(
        unlinked.is_empty(),
        "guides the README does not link to: {unlinked:?}"
    );
}

/// GitHub's anchors for headings this repository uses: code spans, parentheses, colons,
/// slashes and apostrophes dropped, underscores and hyphens kept.
#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(slug("What that means for you"), "what-that-means-for-you");
    assert_eq!(slug("`baton lock`"), "baton-lock");
    assert_eq!(
        slug("PostgreSQL roles and `baton migrate`"),
        "postgresql-roles-and-baton-migrate"
    );
    assert_eq!(
        slug("Advisory locks (`advisory_locks()`)"),
        "advisory-locks-advisory_locks"
    );
    assert_eq!(
        slug("PostgreSQL's clock and poolers"),
        "postgresqls-clock-and-poolers"
    );
    assert_eq!(
        slug("Is \"≤ 1.15 × one server\" met?"),
        "is--115--one-server-met"
    );
    let text = "# Title\n## Caveats\n```sh\n# not a heading\n```\n### Caveats\n#nospace\n";
    let got = anchors(text);
    let want: BTreeSet<String> = ["title", "caveats", "caveats-1"].map(String::from).into();
    assert_eq!(got, want);
}

/// A planted broken file link, a broken anchor in another file, a broken anchor in the same
/// file and a link that climbs out of the repository are each reported, with file and line;
/// good links, remote links, links inside code and `.rs` line anchors are not.
#[test]
fn planted_broken_links_are_reported() {
    let docs: BTreeMap<PathBuf, String> = [
        (
            "README.md",
            "# Top\n\nSee [guide](docs/guide.md), [its part](docs/guide.md#part-two),\n\
             [gone](docs/gone.md) and [web](https://example.com/x#y).\n\
             [layout](src/lib.rs#L10) `[code](nowhere.md)`\n\
             ```md\n[fenced](nowhere.md)\n```\n",
        ),
        (
            "docs/guide.md",
            "# Guide\n\n## Part two\n\n[back](../README.md#top) [self](#part-two)\n\
             [bad anchor](../README.md#bottom) [bad self](#part-three)\n\
             [escape](../../outside.md)\n\n[ref]: missing.md\n",
        ),
    ]
    .into_iter()
    .map(|(p, t)| (PathBuf::from(p), t.to_string()))
    .collect();
    let files: BTreeSet<PathBuf> = ["README.md", "docs/guide.md", "src/lib.rs", "docs"]
        .map(PathBuf::from)
        .into();
    let broken = broken_links(&docs, |p| files.contains(p), |_| None);
    assert_eq!(
        broken,
        vec![
            "README.md:4: docs/gone.md: no such file".to_string(),
            "docs/guide.md:6: ../README.md#bottom: no heading with anchor #bottom in README.md"
                .to_string(),
            "docs/guide.md:6: #part-three: no heading with anchor #part-three in docs/guide.md"
                .to_string(),
            "docs/guide.md:7: ../../outside.md: no such file".to_string(),
            "docs/guide.md:9: missing.md: no such file".to_string(),
        ]
    );
}

//! The mutex guide's PostgreSQL snippet for the resource's side of fencing, run against a
//! private PostgreSQL (`baton::testing::PgServer`, `--features testing`).
//!
//! The snippet is read from docs/mutex.md itself (the first ```` ```sql ```` block after its
//! title), so the docs and this test cannot drift apart: change the snippet and this
//! test runs the new one. It is prepared as `fenced_write(id, value, token)` and executed
//! through `psql`, whose command tags give the rows affected (`INSERT 0 1`, `INSERT 0 0`).
#![cfg(feature = "testing")]

use baton::testing::PgServer;

/// The first ```` ```sql ```` block after the title of docs/mutex.md, without its
/// fences and with each line's indentation (it sits in a list item) removed.
fn readme_snippet() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mutex.md");
    let readme = std::fs::read_to_string(path).expect("read docs/mutex.md");
    let mut lines = readme.lines();
    lines
        .by_ref()
        .find(|line| line.starts_with("# Fenced mutex"))
        .expect("docs/mutex.md has no `# Fenced mutex` title; update tests/fencing_sql.rs");
    let mut in_block = false;
    let mut block = Vec::new();
    for line in lines {
        let trimmed = line.trim();
        if !in_block {
            if trimmed == "```sql" {
                in_block = true;
            }
            continue;
        }
        if trimmed == "```" {
            assert!(!block.is_empty(), "docs/mutex.md's sql block is empty");
            return block.join("\n");
        }
        block.push(trimmed.to_owned());
    }
    panic!(
        "docs/mutex.md has no complete ```sql block after its title (the PostgreSQL fencing \
         snippet); update tests/fencing_sql.rs if it moved"
    );
}

/// The snippet as one statement for `PREPARE`: comment lines dropped, the trailing `;` removed.
fn statement(snippet: &str) -> String {
    let sql = snippet
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let sql = sql.trim_end();
    let sql = sql.strip_suffix(';').unwrap_or(sql).trim_end();
    assert!(
        !sql.contains(';'),
        "The guide's snippet should be one statement, got:\n{sql}"
    );
    assert!(
        sql.contains("$1") && sql.contains("$2") && sql.contains("$3"),
        "The guide's snippet should take $1 (id), $2 (value), $3 (fencing token), got:\n{sql}"
    );
    sql.to_owned()
}

/// One `EXECUTE fenced_write(...)` in its own psql session (the prepared statement is made in the
/// same script), returning psql's output: the command tag.
fn fenced_write(pg: &PgServer, prepare: &str, id: &str, value: &str, token: &str) -> String {
    let script = format!("{prepare};\nEXECUTE fenced_write('{id}', '{value}', {token});\n");
    let out = pg
        .psql(&script)
        .unwrap_or_else(|err| panic!("fenced_write({id}, {value}, {token}): {err}"));
    out.strip_prefix("PREPARE\n")
        .unwrap_or_else(|| panic!("PREPARE did not answer PREPARE: {out:?}"))
        .trim_end()
        .to_owned()
}

/// The stored `value|fencing_token` of `id`.
fn row(pg: &PgServer, id: &str) -> String {
    pg.psql(&format!(
        "SELECT value, fencing_token FROM resource WHERE id = '{id}';"
    ))
    .expect("select")
    .trim_end()
    .to_owned()
}

#[test]
fn readme_fenced_write_refuses_stale_tokens() {
    let snippet = readme_snippet();
    let prepare = format!(
        "PREPARE fenced_write(text, text, bigint) AS\n{}",
        statement(&snippet)
    );

    let t0 = std::time::Instant::now();
    let pg = PgServer::start().expect("start PostgreSQL");
    eprintln!("PgServer::start took {:?} ({})", t0.elapsed(), pg.url());

    assert_eq!(
        pg.psql(
            "CREATE TABLE resource (id text primary key, value text, fencing_token bigint not null);"
        )
        .expect("create table"),
        "CREATE TABLE\n"
    );

    // The first write of a resource inserts it.
    assert_eq!(fenced_write(&pg, &prepare, "r", "a", "5"), "INSERT 0 1");
    assert_eq!(row(&pg, "r"), "a|5");
    // A later holder overwrites.
    assert_eq!(fenced_write(&pg, &prepare, "r", "b", "7"), "INSERT 0 1");
    assert_eq!(row(&pg, "r"), "b|7");
    // A stale holder (6 < 7) is refused: 0 rows, nothing changes.
    assert_eq!(fenced_write(&pg, &prepare, "r", "stale", "6"), "INSERT 0 0");
    assert_eq!(row(&pg, "r"), "b|7");
    // The same holder again (7 = 7) may write again.
    assert_eq!(fenced_write(&pg, &prepare, "r", "c", "7"), "INSERT 0 1");
    assert_eq!(row(&pg, "r"), "c|7");
    // Another resource is independent of this one's token.
    assert_eq!(fenced_write(&pg, &prepare, "s", "x", "1"), "INSERT 0 1");
    assert_eq!(row(&pg, "s"), "x|1");
    assert_eq!(row(&pg, "r"), "c|7");

    // Tokens above 2^53 (where a double loses integers) compare exactly as bigint.
    assert_eq!(
        fenced_write(&pg, &prepare, "big", "high", "9007199254740993"),
        "INSERT 0 1"
    );
    assert_eq!(
        fenced_write(&pg, &prepare, "big", "lower", "9007199254740992"),
        "INSERT 0 0"
    );
    assert_eq!(row(&pg, "big"), "high|9007199254740993");
    assert_eq!(
        fenced_write(&pg, &prepare, "big", "higher", "9223372036854775807"),
        "INSERT 0 1"
    );
    assert_eq!(row(&pg, "big"), "higher|9223372036854775807");

    let pid = pg.pid();
    drop(pg);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("postgres"),
        "the postmaster (pid {pid}) outlived its PgServer"
    );
    eprintln!("whole test took {:?}", t0.elapsed());
}

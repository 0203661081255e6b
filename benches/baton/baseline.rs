//! Each run against the figures committed in `benches/baton/baseline.json`: which scenario got
//! worse by more than its noise band, said loudly. A report, never a failure (CI only
//! smoke-runs the bench, and a timing is no test).
//!
//! The baseline holds, for every result row (by its scenario name) and for the idle
//! scenario's memory and observations, the **median of several full release runs** and a
//! **band**: the runs' own spread, (max − min) / median, never under [`MIN_BAND`]. A figure
//! outside median × (1 ± band) in the bad direction is reported `WORSE`, in the good one
//! `better`. Every compared figure is a cost: a ratio over the floor, bytes, observations;
//! higher is worse.
//!
//! `cargo bench --all-features -- --make-baseline A.json B.json C.json` writes the file from
//! the `latest.json` of runs copied aside (only figures present in every one of them); a quick
//! or dev-profile run is never compared nor accepted as a baseline.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The narrowest band: run-to-run noise on two shared cores is rarely below this even when
/// three runs happen to agree.
pub const MIN_BAND: f64 = 0.05;

/// The idle scenario's figures compared (all costs: higher is worse).
const IDLE_FIGURES: &[&str] = &[
    "rss_kb_per_backup",
    "heap_kb_per_backup",
    "holders_process_rss_mb",
    "observations_per_backup_per_lease_period",
];

/// The committed baseline's path.
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/baton/baseline.json")
}

/// The figures one run's document (`latest.json`'s shape) offers for comparison, by name:
/// `ratio of <scenario>` per row, `idle <figure>` for the idle scenario.
fn figures(doc: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for row in doc["results"].as_array().into_iter().flatten() {
        if let (Some(name), Some(ratio)) = (row["scenario"].as_str(), row["ratio"].as_f64()) {
            out.insert(format!("ratio of {name}"), json!(ratio));
        }
    }
    for f in IDLE_FIGURES {
        if let Some(v) = doc["idle"][f].as_f64() {
            out.insert(format!("idle {f}"), json!(v));
        }
    }
    out
}

/// Whether a document's figures can stand as, or be compared with, a baseline.
fn comparable(doc: &Value) -> Result<(), String> {
    if doc["meta"]["profile"] != "release" {
        return Err("not a release build".into());
    }
    if doc["meta"]["quick"] == true {
        return Err("a --quick run".into());
    }
    Ok(())
}

/// `--make-baseline FILE...`: writes the baseline from those runs; `Err` says why not.
pub fn make(files: &[String]) -> Result<PathBuf, String> {
    if files.len() < 2 {
        return Err("--make-baseline needs at least two runs' latest.json files".into());
    }
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{f}: {e}"))?;
        comparable(&doc).map_err(|why| format!("{f}: {why}"))?;
        docs.push(figures(&doc));
    }
    let mut entries = Map::new();
    for (name, _) in docs[0].iter() {
        let mut values: Vec<f64> = docs.iter().filter_map(|d| d.get(name)?.as_f64()).collect();
        if values.len() != docs.len() {
            continue;
        }
        values.sort_by(f64::total_cmp);
        let median = values[values.len() / 2];
        let spread = (values[values.len() - 1] - values[0]) / median.abs().max(f64::EPSILON);
        entries.insert(
            name.clone(),
            json!({ "median": median, "band": spread.max(MIN_BAND), "runs": values }),
        );
    }
    let doc = json!({
        "about": "medians of full release runs of `cargo bench --all-features` and their spread \
                  (benches/baton/baseline.rs); written by --make-baseline",
        "runs": files.len(),
        "figures": entries,
    });
    let out = path();
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
    std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// One figure's verdict.
#[derive(Debug, PartialEq)]
enum Verdict {
    Worse,
    Better,
    Within,
}

fn verdict(value: f64, median: f64, band: f64) -> Verdict {
    if value > median * (1.0 + band) {
        Verdict::Worse
    } else if value < median * (1.0 - band) {
        Verdict::Better
    } else {
        Verdict::Within
    }
}

/// Compares this run's document with the committed baseline: the lines to print (empty when
/// there is nothing to compare) and the JSON kept in `latest.json`.
pub fn compare(doc: &Value) -> (Vec<String>, Value) {
    if let Err(why) = comparable(doc) {
        return (Vec::new(), json!({ "skipped": why }));
    }
    let Some(base) = std::fs::read_to_string(path())
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return (
            vec![format!(
                "no baseline at {} to compare with",
                path().display()
            )],
            json!({ "skipped": "no baseline" }),
        );
    };
    let mut lines = Vec::new();
    let mut worse = Vec::new();
    let mut checked = Vec::new();
    for (name, value) in figures(doc) {
        let (Some(value), Some(entry)) = (value.as_f64(), base["figures"].get(&name)) else {
            continue;
        };
        let (Some(median), Some(band)) = (entry["median"].as_f64(), entry["band"].as_f64()) else {
            continue;
        };
        let v = verdict(value, median, band);
        let word = match v {
            Verdict::Worse => "WORSE ",
            Verdict::Better => "better",
            Verdict::Within => "ok    ",
        };
        lines.push(format!(
            "{word} {name}: {value:.3} against {median:.3} (band ±{:.0} %)",
            band * 100.0
        ));
        if v == Verdict::Worse {
            worse.push(name.clone());
        }
        checked.push(
            json!({ "figure": name, "value": value, "median": median, "band": band,
            "verdict": word.trim() }),
        );
    }
    if !worse.is_empty() {
        lines.push(format!(
            "!!! {} figure(s) worse than the committed baseline beyond their noise band: {}",
            worse.len(),
            worse.join("; ")
        ));
    }
    (lines, json!({ "worse": worse, "figures": checked }))
}

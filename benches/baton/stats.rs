//! Percentiles, the result rows, the table and the JSON file.

use std::time::Duration;

use serde_json::{json, Value};

/// Latency samples in µs.
#[derive(Default, Clone)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }
    pub fn push_us(&mut self, us: f64) {
        self.0.push(us);
    }
    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Nearest-rank percentile (`p` in 0..=100); `None` without samples.
    pub fn pct(&self, p: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }
}

/// One line of the table and one object of `latest.json`.
pub struct Row {
    pub scenario: String,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub ops_per_s: Option<f64>,
    pub floor_ops_per_s: Option<f64>,
    /// baton's cost over the floor's (1.0 = the floor).
    pub ratio: Option<f64>,
    pub samples: usize,
    pub notes: String,
    /// Anything else worth keeping (floor percentiles, targets...).
    pub extra: Value,
}

impl Row {
    pub fn to_json(&self) -> Value {
        let r = |x: Option<f64>, d: i32| {
            x.map(|v| {
                let m = 10f64.powi(d);
                (v * m).round() / m
            })
        };
        let mut o = json!({
            "scenario": self.scenario,
            "p50_us": r(self.p50_us, 1),
            "p99_us": r(self.p99_us, 1),
            "ops_per_s": r(self.ops_per_s, 1),
            "floor_ops_per_s": r(self.floor_ops_per_s, 1),
            "ratio": r(self.ratio, 3),
            "samples": self.samples,
            "notes": self.notes,
        });
        if let (Value::Object(o), Value::Object(e)) = (&mut o, &self.extra) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        o
    }
}

fn cell(x: Option<f64>, prec: usize) -> String {
    match x {
        Some(v) => format!("{v:.prec$}"),
        None => "-".into(),
    }
}

/// The plain table printed to stdout.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<28} {:>10} {:>10} {:>11} {:>11} {:>7}  {}\n",
        "scenario", "p50 µs", "p99 µs", "ops/s", "floor ops/s", "ratio", "notes"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<28} {:>10} {:>10} {:>11} {:>11} {:>7}  {}\n",
            r.scenario,
            cell(r.p50_us, 0),
            cell(r.p99_us, 0),
            cell(r.ops_per_s, 0),
            cell(r.floor_ops_per_s, 0),
            cell(r.ratio, 2),
            r.notes
        ));
    }
    out
}

//! Small shared pieces: the monotonic clock, the seeded PRNG and the JSONL writer.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde_json::Value;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `CLOCK_MONOTONIC` in nanoseconds: shared by every process on the host, unlike `Instant`.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// splitmix64: tiny, seedable, good enough for schedules.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Mixes numbers into a seed (for per-worker, per-job streams).
pub fn mix(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x5EED);
    let mut acc = 0u64;
    for p in parts {
        r = Rng::new(r.next_u64() ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        acc = r.next_u64();
    }
    acc
}

/// An append-only JSONL file: every line is written with one `write` (O_APPEND).
pub struct Jsonl {
    file: Mutex<File>,
}

impl Jsonl {
    pub fn open(path: &Path) -> std::io::Result<Jsonl> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Jsonl {
            file: Mutex::new(file),
        })
    }

    /// Appends `v` with a `t` (monotonic ns) field set if absent. Errors are ignored: the log
    /// is best effort and a full disk shows up as missing lines in the checker.
    pub fn write(&self, mut v: Value) {
        if let Some(obj) = v.as_object_mut() {
            obj.entry("t").or_insert_with(|| Value::from(mono_ns()));
        }
        let mut line = v.to_string();
        line.push('\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
}

/// Reads a JSONL file; unparsable lines (a torn last line of a killed process) are skipped.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `j-0042`.
pub fn job_name(j: usize) -> String {
    format!("j-{j:04}")
}

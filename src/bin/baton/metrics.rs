//! `--metrics-addr` and `--metrics-file`: what the library records, as Prometheus text.
//!
//! The library records through the `metrics` facade and installs nothing; with either flag
//! this process installs a Prometheus recorder before it connects, so everything from the
//! first grant on is counted, and describes baton's metrics to it ([`baton::describe_metrics`])
//! so each is served with its help text. `--metrics-addr` serves it at `/metrics` (with `/healthz`) over
//! HTTP/1 (axum); `--metrics-file` writes it when the command ends, replacing the file
//! atomically (a temporary file in the same directory, then a rename) so node_exporter's
//! textfile collector never reads half a file. Without either flag no recorder is installed
//! and recording costs nothing more than a look at the facade's global.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::time::Instant;

use super::cli::MetricsArgs;
use super::exit::EX_UNAVAILABLE;
use super::out;

/// The buckets of baton's duration histograms, in seconds: a local round trip (1 ms) to a
/// long wait for a lock or a job (10 min).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// How often the recorder's histogram buffers are folded into their buckets when nobody
/// scrapes (each render does it too): keeps an unscraped process's memory flat.
const UPKEEP: Duration = Duration::from_secs(5);

/// How long the standby's view of its election may stay in error before `/healthz` says so:
/// one failed read is a blip, a campaign that keeps failing is not.
pub(crate) const UNHEALTHY_AFTER: Duration = Duration::from_secs(3);

/// The exporter of one command: the recorder's handle, where to write on exit, and what
/// `/healthz` answers.
pub(crate) struct Exporter {
    handle: PrometheusHandle,
    file: Option<PathBuf>,
    health: Health,
}

/// What `/healthz` answers. A command other than `leader` is healthy while it runs (the
/// process answers at all); `leader` is healthy while it leads, or while it stands by and can
/// read its election (as client-go's leader-election health adaptor: a candidate that cannot
/// reach its server is not standing by, it is cut off).
#[derive(Clone, Default)]
pub(crate) struct Health(Arc<HealthState>);

#[derive(Default)]
struct HealthState {
    leading: AtomicBool,
    /// Since when the election could not be read (`None`: it could, or nobody looks).
    failing_since: Mutex<Option<Instant>>,
}

impl Health {
    /// This candidate leads (`true`) or no longer does.
    pub(crate) fn set_leading(&self, leading: bool) {
        self.0.leading.store(leading, Ordering::SeqCst);
    }

    /// The election was read (`true`) or its read failed (`false`).
    pub(crate) fn set_reachable(&self, reachable: bool) {
        let mut since = self
            .0
            .failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match (reachable, *since) {
            (true, _) => *since = None,
            (false, None) => *since = Some(Instant::now()),
            (false, Some(_)) => {}
        }
    }

    /// Whether `/healthz` answers 200.
    pub(crate) fn healthy(&self) -> bool {
        self.healthy_at(Instant::now())
    }

    fn healthy_at(&self, now: Instant) -> bool {
        if self.0.leading.load(Ordering::SeqCst) {
            return true;
        }
        let since = *self
            .0
            .failing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        !matches!(since, Some(t) if now.saturating_duration_since(t) >= UNHEALTHY_AFTER)
    }
}

impl Exporter {
    /// Installs the Prometheus recorder and, with `--metrics-addr`, starts serving; `None`
    /// without either flag. `Err` is the exit status.
    pub(crate) async fn start(args: &MetricsArgs) -> Result<Option<Exporter>, u8> {
        if args.metrics_addr.is_none() && args.metrics_file.is_none() {
            return Ok(None);
        }
        if let Some(path) = &args.metrics_file {
            check_file(path)?;
        }
        // Neither can fail here (the buckets are not empty, and this is the process's only
        // recorder), but both are said rather than unwrapped.
        let recorder = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .map_err(|e| internal(&format!("the metrics' buckets: {e}")))?
            .build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder)
            .map_err(|e| internal(&format!("installing the metrics recorder: {e}")))?;
        // Descriptions reach only the recorder installed when they are made: now, so every
        // metric is served with its `# HELP` line (`promtool check metrics` requires one).
        baton::describe_metrics();
        let exporter = Exporter {
            handle,
            file: args.metrics_file.clone(),
            health: Health::default(),
        };
        let upkeep = exporter.handle.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP);
            loop {
                tick.tick().await;
                upkeep.run_upkeep();
            }
        });
        if let Some(addr) = args.metrics_addr {
            exporter.serve(addr).await?;
        }
        Ok(Some(exporter))
    }

    /// What `/healthz` answers; `leader` keeps it current.
    pub(crate) fn health(&self) -> Health {
        self.health.clone()
    }

    /// Binds `addr` and serves `/metrics` and `/healthz` in a task of the runtime (it ends with
    /// the process).
    async fn serve(&self, addr: SocketAddr) -> Result<(), u8> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            say!("baton: --metrics-addr {addr}: cannot listen: {e}");
            EX_UNAVAILABLE
        })?;
        let handle = self.handle.clone();
        let health = self.health.clone();
        let app = axum::Router::new()
            .route("/metrics", get(move || async move { handle.render() }))
            .route(
                "/healthz",
                get(move || async move {
                    if health.healthy() {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n")
                    }
                }),
            );
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                say!("baton: --metrics-addr {addr}: the server stopped: {e}");
            }
        });
        Ok(())
    }

    /// Writes the metrics to `--metrics-file`, if given. A failure is said, and does not change
    /// the command's exit status (the work it reports on is done).
    pub(crate) fn finish(&self) {
        let Some(path) = &self.file else {
            return;
        };
        if let Err(e) = write_atomically(path, self.handle.render().as_bytes()) {
            say!(
                "baton: --metrics-file {}: cannot write: {e}",
                path.display()
            );
        }
    }
}

/// A usage error (64) when `path` cannot be a file to replace: its directory must exist.
fn check_file(path: &Path) -> Result<(), u8> {
    let dir = parent(path);
    if path.file_name().is_none() || !dir.is_dir() {
        return Err(super::exit::usage(format!(
            "--metrics-file {}: not a file in an existing directory",
            path.display()
        )));
    }
    Ok(())
}

/// The directory of `path` (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replaces `path` with `bytes`: written to a temporary file beside it, synced, then renamed
/// over it, so a reader sees the old file or the new one, never a part.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // A dot file: node_exporter's textfile collector reads only `*.prom`.
    let tmp = parent(path).join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A failure that is not the user's: said, and the command does not run.
fn internal(what: &str) -> u8 {
    say!("baton: {what}");
    EX_UNAVAILABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_leaves_no_temporary_behind() {
        let dir = std::env::temp_dir().join(format!("baton-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("baton.prom");
        write_atomically(&path, b"old\n").unwrap();
        write_atomically(&path, b"new\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new\n");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("baton.prom")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_standby_is_unhealthy_only_once_its_election_stays_unreadable() {
        let h = Health::default();
        assert!(h.healthy(), "standing by");
        h.set_reachable(false);
        assert!(h.healthy(), "one failed read is a blip");
        let later = Instant::now() + UNHEALTHY_AFTER;
        assert!(!h.healthy_at(later), "cut off");
        h.set_leading(true);
        assert!(h.healthy_at(later), "leading");
        h.set_leading(false);
        h.set_reachable(true);
        assert!(h.healthy(), "standing by again");
    }
}

//! [`Client`]: the connections shared by every worker of a process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::IntoConnectionInfo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{connect_manager, ConnSettings, Hub, Pool};
use crate::error::{ConfigError, Error};
use crate::failover::{worker, FailoverConfig, Worker};

/// State shared by the client handles and every worker task.
pub(crate) struct Shared {
    pub manager: ConnectionManager,
    pub pool: Arc<Pool>,
    pub hub: Hub,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub settings: ConnSettings,
    #[cfg(feature = "testing")]
    pub before_exec: std::sync::Mutex<Option<crate::testing::BeforeExecHook>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last handle is gone: stop the pub/sub task and any worker still running.
        self.cancel.cancel();
    }
}

/// A connection to one Redis server, shared cheaply by many jobs and workers.
///
/// It holds one multiplexed connection, one pub/sub connection and a small pool of dedicated
/// connections for `WATCH`/`MULTI`/`EXEC`; clones share them. See the [crate docs](crate) for the
/// protocol.
///
/// ```no_run
/// # async fn demo() -> Result<(), baton::Error> {
/// let client = baton::Client::connect("redis://127.0.0.1:6379/").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URL: it may carry a password.
        f.debug_struct("Client")
            .field("pool_size", &self.shared.settings.pool_size)
            .finish_non_exhaustive()
    }
}

/// Builder for [`Client`].
#[derive(Clone)]
#[must_use]
pub struct ClientBuilder {
    url: String,
    password: Option<String>,
    settings: ConnSettings,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// How long opening a connection may take. Defaults to 1 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.settings.connect_timeout = d;
        self
    }
    /// How long one request may wait for its reply; a request that times out has an unknown
    /// outcome and its connection is discarded. Defaults to 500 ms.
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.settings.response_timeout = d;
        self
    }
    /// The cap of the exponential reconnect/retry backoff. Defaults to 5 s.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.settings.max_backoff = d;
        self
    }
    /// How many dedicated connections transitions may use at once. Defaults to 8.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.settings.pool_size = n;
        self
    }
    /// The password (overrides one in the URL). Defaults to the URL's.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }
    /// Reads the password from a file (trailing newline stripped), as secrets are mounted.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read (its content is never echoed).
    pub fn password_file(mut self, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path.as_ref()).map_err(|e| {
            ConfigError::invalid(
                "password_file",
                format!("cannot read {}: {e}", path.as_ref().display()),
            )
        })?;
        self.password = Some(text.trim_end_matches(['\r', '\n']).to_string());
        Ok(self)
    }

    fn validate(&self) -> Result<redis::Client, ConfigError> {
        let s = &self.settings;
        let range = |field: &'static str, d: Duration, lo: Duration, hi: Duration| {
            if d < lo || d > hi {
                Err(ConfigError::invalid(
                    field,
                    format!("{d:?} is outside {lo:?} ..= {hi:?}"),
                ))
            } else {
                Ok(())
            }
        };
        range(
            "connect_timeout",
            s.connect_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        range(
            "response_timeout",
            s.response_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        range(
            "max_backoff",
            s.max_backoff,
            Duration::from_millis(50),
            Duration::from_secs(300),
        )?;
        if s.pool_size == 0 || s.pool_size > 1024 {
            return Err(ConfigError::invalid(
                "pool_size",
                format!("{} is outside 1 ..= 1024", s.pool_size),
            ));
        }
        if !(self.url.starts_with("redis://") || self.url.starts_with("unix://")) {
            // The URL is not echoed: it may contain a password.
            return Err(ConfigError::invalid(
                "url",
                "must start with redis:// or unix:// (TLS is not compiled in)",
            ));
        }
        let info = self.url.as_str().into_connection_info().map_err(|e| {
            ConfigError::invalid("url", format!("not a valid redis URL ({:?})", e.kind()))
        })?;
        let info = match &self.password {
            Some(pw) => {
                let redis = info.redis_settings().clone().set_password(pw);
                info.set_redis_settings(redis)
            }
            None => info,
        };
        redis::Client::open(info)
            .map_err(|e| ConfigError::invalid("url", format!("rejected ({:?})", e.kind())))
    }

    /// Connects (the multiplexed connection first, so a bad address fails here) and starts the
    /// pub/sub task.
    ///
    /// # Errors
    /// [`Error::Config`] for invalid settings or URL, [`Error::Connection`] /
    /// [`Error::Timeout`] when Redis cannot be reached, a permission error for bad credentials.
    pub async fn connect(self) -> Result<Client, Error> {
        let client = self.validate()?;
        let settings = self.settings;
        let manager = connect_manager(&client, &settings).await?;
        let cancel = CancellationToken::new();
        let hub = Hub::start(client.clone(), settings.clone(), cancel.clone());
        let pool = Pool::new(client, settings.clone());
        let client = Client {
            shared: Arc::new(Shared {
                manager,
                pool,
                hub,
                cancel,
                tracker: TaskTracker::new(),
                settings,
                #[cfg(feature = "testing")]
                before_exec: std::sync::Mutex::new(None),
            }),
        };
        // Best effort: managed Redis services often forbid CONFIG, which is fine.
        match client.durability().await {
            Ok(d) if !d.is_safe() => tracing::warn!(
                problems = ?d.problems(),
                "redis may lose acknowledged writes; baton's guarantees need appendonly yes, \
                 appendfsync always and maxmemory-policy noeviction"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read redis durability settings"),
        }
        Ok(client)
    }
}

/// A job's state as stored in Redis; see [`Client::job_state`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state")]
#[non_exhaustive]
pub enum JobState {
    /// No state: never run, or its retention ran out.
    Absent,
    /// Attempt `number` was the last one started.
    Attempt {
        /// The attempt number.
        number: u64,
        /// The holder's name while its lease is alive.
        holder: Option<String>,
        /// The lease time left in ms (`None` when no lease is alive, or it has no TTL).
        lease_remaining_ms: Option<u64>,
    },
    /// The job succeeded.
    Done,
    /// Every attempt failed.
    Exhausted,
    /// A value baton never writes.
    Corrupt {
        /// A printable preview of it.
        value: String,
    },
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobState::Absent => f.write_str("absent"),
            JobState::Attempt { number, .. } => write!(f, "attempt {number}"),
            JobState::Done => f.write_str("DONE"),
            JobState::Exhausted => f.write_str("EXHAUSTED"),
            JobState::Corrupt { value } => write!(f, "corrupt ({value})"),
        }
    }
}

/// The durability settings Redis reports (`CONFIG GET`); see [`Client::durability`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Durability {
    /// `appendonly` (`yes` is needed).
    pub appendonly: Option<String>,
    /// `appendfsync` (`always` is needed).
    pub appendfsync: Option<String>,
    /// `maxmemory-policy` (`noeviction` is needed).
    pub maxmemory_policy: Option<String>,
}

impl Durability {
    /// What keeps acknowledged writes from surviving a crash or memory pressure (empty if safe).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut want = |name: &str, have: &Option<String>, need: &str| {
            if have.as_deref() != Some(need) {
                out.push(format!(
                    "{name} is {} (needs {need})",
                    have.as_deref().unwrap_or("unknown")
                ));
            }
        };
        want("appendonly", &self.appendonly, "yes");
        want("appendfsync", &self.appendfsync, "always");
        want("maxmemory-policy", &self.maxmemory_policy, "noeviction");
        out
    }

    /// Whether every acknowledged write survives a crash and is never evicted.
    pub fn is_safe(&self) -> bool {
        self.problems().is_empty()
    }
}

impl Client {
    /// Reads the server's durability settings with `CONFIG GET`.
    ///
    /// `Client::connect` already logs a warning (via `tracing`) when they are unsafe.
    ///
    /// # Errors
    /// A permission error where `CONFIG` is not allowed; connection errors.
    pub async fn durability(&self) -> Result<Durability, Error> {
        let mut conn = self.shared.manager.clone();
        let pairs: std::collections::HashMap<String, String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .arg("appendfsync")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await?;
        Ok(Durability {
            appendonly: pairs.get("appendonly").cloned(),
            appendfsync: pairs.get("appendfsync").cloned(),
            maxmemory_policy: pairs.get("maxmemory-policy").cloned(),
        })
    }

    /// Starts a builder for the server at `url` (`redis://[:password@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            password: None,
            settings: ConnSettings {
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_millis(500),
                max_backoff: Duration::from_secs(5),
                pool_size: 8,
            },
        }
    }

    /// Connects with default settings.
    ///
    /// # Errors
    /// As [`ClientBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder(url).connect().await
    }

    /// Starts a worker for one job and returns its event stream.
    ///
    /// The worker competes for the job as described in the [crate docs](crate): it either wins an
    /// attempt (`Acquired`), waits as a backup (`Locked`), or finds the job ended. Read the stream
    /// to the end; dropping it stops the worker and fails an attempt it holds.
    pub fn start(&self, config: FailoverConfig) -> Worker {
        worker::spawn(self.shared.clone(), config)
    }

    /// Stops every worker of this client (holders release their attempts, so backups elsewhere
    /// take over at once) and waits up to `deadline` for them to finish.
    ///
    /// Returns `true` if every worker ended in time.
    pub async fn shutdown(&self, deadline: Duration) -> bool {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        tokio::time::timeout(deadline, self.shared.tracker.wait())
            .await
            .is_ok()
    }

    /// Installs a hook that runs between round trip 1 (`WATCH` + reads) and round trip 2
    /// (`MULTI … EXEC`) of every transition of this client's workers, with the transition's name
    /// (`"grant"`, `"exhaust"`, `"finish"`, `"extend"`). Tests use it to write a competing value
    /// exactly in the window the `WATCH` protects. Only with the `testing` feature.
    #[cfg(feature = "testing")]
    pub fn set_before_exec_hook(&self, hook: Option<crate::testing::BeforeExecHook>) {
        *crate::failover::events::lock(&self.shared.before_exec) = hook;
    }

    /// Reads a job's state (plain reads, no transaction), as an operator would with
    /// `redis-cli GET 'baton:{msg:42}'`. [`Client::job_status`] tells more.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid job name; connection errors.
    pub async fn job_state(&self, job: impl crate::failover::IntoJob) -> Result<JobState, Error> {
        Ok(self.job_status(job).await?.state)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(b: ClientBuilder) -> &'static str {
        match b.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(_) => "accepted",
        }
    }

    #[test]
    fn client_settings_are_validated() {
        let b = || Client::builder("redis://127.0.0.1:6379/");
        assert_eq!(field(b()), "accepted");
        assert_eq!(field(b().pool_size(0)), "pool_size");
        assert_eq!(
            field(b().response_timeout(Duration::ZERO)),
            "response_timeout"
        );
        assert_eq!(field(Client::builder("http://x")), "url");
        assert_eq!(field(Client::builder("rediss://127.0.0.1/")), "url");
        assert_eq!(field(Client::builder("redis://127.0.0.1:99999/")), "url");
    }

    #[test]
    fn url_errors_never_echo_the_password() {
        let err = Client::builder("redis://:s3cret@127.0.0.1:99999/")
            .validate()
            .unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn password_file_is_read_and_trimmed() {
        let path = std::env::temp_dir().join(format!("baton-pw-{}", std::process::id()));
        std::fs::write(&path, "pw\n").unwrap();
        let b = Client::builder("redis://127.0.0.1/")
            .password_file(&path)
            .unwrap();
        assert_eq!(b.password.as_deref(), Some("pw"));
        std::fs::remove_file(&path).unwrap();
        assert!(Client::builder("redis://127.0.0.1/")
            .password_file("/nonexistent/pw")
            .is_err());
    }
}

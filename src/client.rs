//! [`Client`]: the connections shared by every worker of a process.

use std::path::Path;
use std::time::Duration;

use crate::backend::connect::ConnectSettings;
use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::failover::Failover;
use crate::mutex::Locks;
use crate::queue::Queues;
use crate::redlock::Redlock;
use crate::util::redact::redact_url;
use crate::util::settings::ConnSettings;

pub use crate::util::durability::Durability;

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
    backend: Backend,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URL: it may carry a password.
        f.debug_struct("Client")
            .field("backend", &self.backend.name())
            .field("pool_size", &self.backend.settings().pool_size)
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
    #[cfg(feature = "tls")]
    tls: crate::util::tls::TlsSettings,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL is shown redacted (no credentials, no query); the password only as set or not;
        // TLS material only as sizes and paths.
        let mut d = f.debug_struct("ClientBuilder");
        d.field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("settings", &self.settings);
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls);
        d.finish()
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
    /// How many dedicated connections transitions may use at once. Defaults to 32: with 8,
    /// 64 concurrent jobs queued for connections and ran at 0.61 of a connection-per-task
    /// loop; 32 gives 0.82, as much as 64 (benchmark `profile`), and connections are opened
    /// only when that many transitions run at once.
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

    /// Trusts the CA certificate(s) in `pem` (PEM text, one or more `BEGIN CERTIFICATE`
    /// blocks) for a `rediss://` URL (or a `postgres://` one with `sslmode=require`), instead of
    /// the system's trust store. Only with the `tls` feature (which `postgres` brings).
    ///
    /// Checked when the client connects, before any network I/O: an unparsable PEM is an
    /// [`Error::Config`] naming `tls_root_ca`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").expect("the CA file");
    /// let client = baton::Client::builder("rediss://redis.internal:6380/")
    ///     .tls_root_ca_pem(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_ca = Some(crate::util::tls::Pem::bytes(pem.into()));
        self
    }

    /// Like [`tls_root_ca_pem`](Self::tls_root_ca_pem), reading the PEM file now. Only with the
    /// `tls` feature.
    ///
    /// # Errors
    /// [`ConfigError`] naming `tls_root_ca` when the file cannot be read.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = baton::Client::builder("rediss://redis.internal:6380/")
    ///     .tls_root_ca_file("/etc/redis/tls/ca.crt")?
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_ca_file(mut self, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        self.tls.root_ca = Some(crate::util::tls::Pem::file("tls_root_ca", path.as_ref())?);
        Ok(self)
    }

    /// Presents a client certificate (PEM, the leaf first, then any intermediates) and its
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1), for servers with `tls-auth-clients yes` (or a
    /// PostgreSQL that asks for one under `sslmode=require`). Only with the `tls` feature.
    ///
    /// Checked when the client connects, before any network I/O: the key must parse and fit the
    /// certificate, else [`Error::Config`] naming `tls_client_cert` or `tls_client_key`. The key
    /// is never printed (`Debug` shows its size).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let read = |p: &str| std::fs::read(p).expect("a PEM file");
    /// let client = baton::Client::builder("rediss://redis.internal:6380/")
    ///     .tls_root_ca_pem(read("/etc/redis/tls/ca.crt"))
    ///     .tls_client_cert_pem(read("/etc/baton/client.crt"), read("/etc/baton/client.key"))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((
            crate::util::tls::Pem::bytes(cert.into()),
            crate::util::tls::Pem::bytes(key.into()),
        ));
        self
    }

    /// Like [`tls_client_cert_pem`](Self::tls_client_cert_pem), reading both PEM files now.
    /// Only with the `tls` feature.
    ///
    /// # Errors
    /// [`ConfigError`] naming `tls_client_cert` or `tls_client_key` when a file cannot be read.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = baton::Client::builder("rediss://redis.internal:6380/")
    ///     .tls_root_ca_file("/etc/redis/tls/ca.crt")?
    ///     .tls_client_cert_files("/etc/baton/client.crt", "/etc/baton/client.key")?
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_files(
        mut self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, ConfigError> {
        let cert = crate::util::tls::Pem::file("tls_client_cert", cert.as_ref())?;
        let key = crate::util::tls::Pem::file("tls_client_key", key.as_ref())?;
        self.tls.client = Some((cert, key));
        Ok(self)
    }

    /// Whether any TLS option was given.
    /// What the backend connects with besides the URL.
    fn connect_settings(&self) -> ConnectSettings {
        ConnectSettings {
            password: self.password.clone(),
            conn: self.settings.clone(),
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
        }
    }

    /// Connects (the multiplexed connection first, so a bad address fails here) and starts the
    /// pub/sub task.
    ///
    /// The URL is checked before any network I/O: the scheme must be `redis://`, `unix://` or
    /// (feature `tls`) `rediss://`; the port must be 1..=65535; `redis://:@host` (empty
    /// credentials) and any `#fragment`, `#insecure` above all, are refused; TLS options need a
    /// `rediss://` URL. Messages show the URL with its credentials and query redacted.
    ///
    /// A `rediss://` URL without `tls_root_ca_pem`/`tls_root_ca_file` trusts the system's
    /// CAs (rustls-native-certs: `/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR`); a server
    /// with a private CA then fails with [`ErrorKind::Tls`](crate::ErrorKind::Tls).
    ///
    /// # Errors
    /// [`Error::Config`] for invalid settings or URL, [`Error::Connection`] /
    /// [`Error::Timeout`] when Redis cannot be reached, a permission error for bad or missing
    /// credentials (a `PING` is sent to find out),
    /// [`Error::Tls`] at once (no retries, never a plain-TCP fallback) when the TLS handshake
    /// fails.
    pub async fn connect(self) -> Result<Client, Error> {
        self.connect_once(&mut false).await
    }

    /// Connects as [`connect`](Self::connect) does, but rides out a deployment that is briefly
    /// unavailable (a restart, a failover, a network blip): failures a retry can fix
    /// ([`Error::is_retryable`]: refused, reset, timed out, `LOADING`, `CLUSTERDOWN`, …) are
    /// retried with capped, jittered backoff. It gives up once `unreached` has passed without
    /// any server of the deployment answering since the call began (the server, a Cluster
    /// seed, a Sentinel: a mistyped address fails quickly), or, once one has answered (a
    /// Sentinel that names a primary still being failed over, a server answering `LOADING`),
    /// once `outage` has passed since the call began.
    ///
    /// # Errors
    /// The last attempt's error when it gives up: when that attempt was cut short by the
    /// deadline, the error of the one before it, if any, else a [`Error::Timeout`] (so a server
    /// that refuses connections gives up with [`Error::Connection`] saying so); an error no
    /// retry can fix (configuration, credentials, TLS, [`Error::NotRedis`]) at once.
    pub async fn connect_patiently(
        self,
        unreached: Duration,
        outage: Duration,
    ) -> Result<Client, Error> {
        let start = tokio::time::Instant::now();
        let mut reached = false;
        let mut backoff = crate::util::backoff::Backoff::new(self.settings.max_backoff);
        // Both limits count from the call: nothing answered a client yet.
        let deadline = |reached: bool| {
            let limit = if reached {
                unreached.max(outage)
            } else {
                unreached
            };
            crate::util::time::after(start, limit)
        };
        // The latest try's own error: a try cut short by the deadline says less (only that it
        // timed out) than the one before it ("refused", a TLS handshake never answered).
        let mut last: Option<Error> = None;
        loop {
            let until = deadline(reached);
            let attempt = self.clone().connect_once(&mut reached);
            let error = match tokio::time::timeout_at(until, attempt).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) if !e.is_retryable() => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => last.take().unwrap_or(Error::Timeout {
                    during: "connecting",
                }),
            };
            let now = tokio::time::Instant::now();
            let deadline = deadline(reached);
            if now >= deadline {
                return Err(error);
            }
            tracing::debug!(error = %error, reached, "cannot connect yet; retrying");
            let retry_at = crate::util::time::after(now, backoff.next_delay());
            if retry_at >= deadline {
                // No try could start before the deadline: this one's error ("refused") says
                // why, where a try cut short at once would only say it timed out.
                tokio::time::sleep_until(deadline).await;
                return Err(error);
            }
            last = Some(error);
            tokio::time::sleep_until(retry_at).await;
        }
    }

    /// One try of [`connect`](Self::connect); sets `reached` once a server of the deployment
    /// answered, even with an error (a Sentinel naming a primary that does not answer yet, a
    /// server replying `LOADING`).
    async fn connect_once(self, reached: &mut bool) -> Result<Client, Error> {
        let result = self.connect_inner(reached).await;
        if matches!(result, Ok(_) | Err(Error::Redis { .. })) {
            *reached = true;
        }
        result
    }

    async fn connect_inner(self, reached: &mut bool) -> Result<Client, Error> {
        let backend =
            crate::backend::connect::connect(&self.url, &self.connect_settings(), reached).await?;
        Ok(Client { backend })
    }

    /// A client that connects on first use instead of now: checks the settings and URL as
    /// [`ClientBuilder::connect`] does, but sends nothing, so it succeeds while the server is
    /// down. Its connections are opened (and reopened) by the requests that need them; until the
    /// server answers, each request fails like one on a connection that was lost.
    ///
    /// For a [Redlock](crate::redlock): a master that is down when the process starts is then
    /// one failed vote among the others, not a reason not to start, and it rejoins the quorum
    /// once it is back. Elsewhere prefer [`ClientBuilder::connect`], which reports an
    /// unreachable server, bad credentials and a failed TLS handshake at once.
    ///
    /// # Errors
    /// [`Error::Config`] for invalid settings or URL, or when called outside a Tokio runtime.
    pub fn build_lazy(self) -> Result<Client, Error> {
        let backend = crate::backend::connect::connect_lazy(&self.url, &self.connect_settings())?;
        Ok(Client { backend })
    }
}

/// The name a worker, election candidate or lock holder gets when none is set: `host:pid`
/// (the host name from the kernel, else `HOSTNAME`), as `baton status` shows it.
pub fn default_worker_name() -> String {
    crate::util::token::default_worker_name().to_string()
}

/// `url` as baton's own messages show it: the user, the password and the query (which may
/// carry a password) replaced by `<redacted>`, the rest bounded in length and escaped. For an
/// application's logs and pages: `baton dashboard` shows its server this way.
///
/// ```
/// let shown = baton::client::redacted_url("redis://app:s3cret@cache.internal:6379/2");
/// assert_eq!(shown, "redis://<redacted>@cache.internal:6379/2");
/// ```
pub fn redacted_url(url: &str) -> String {
    crate::util::redact::redact_url(url)
}

impl Client {
    /// Reads the server's durability settings with `CONFIG GET`.
    ///
    /// `Client::connect` already logs a warning (via `tracing`) when they are unsafe.
    ///
    /// # Errors
    /// A permission error where `CONFIG` is not allowed; connection errors.
    pub async fn durability(&self) -> Result<Durability, Error> {
        let transport = self.backend.redis(
            "Client::durability",
            "it reads Redis' CONFIG; on PostgreSQL, check fsync and synchronous_commit (docs/operating.md, \"Durability settings\")",
        )?;
        transport.durability().await
    }

    /// Starts a builder for the server at `url` (`redis://[:password@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            password: None,
            #[cfg(feature = "tls")]
            tls: crate::util::tls::TlsSettings::default(),
            settings: ConnSettings {
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_millis(500),
                max_backoff: Duration::from_secs(5),
                pool_size: 32,
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

    /// The failover coordinator on this client's connections.
    pub fn failover(&self) -> Failover {
        Failover::new(self.backend.clone())
    }

    /// The fenced mutex on this client's connections.
    pub fn locks(&self) -> Locks {
        Locks::new(self.backend.clone())
    }

    /// The semaphore (leased, fenced permits) on this client's connections
    /// ([`crate::semaphore`]).
    pub fn semaphores(&self) -> crate::Semaphores {
        crate::Semaphores::new(self.backend.clone())
    }

    /// The fenced read-write lock on this client's connections ([`crate::rwlock`]).
    pub fn rw_locks(&self) -> crate::rwlock::RwLocks {
        crate::rwlock::RwLocks::new(self.backend.clone())
    }

    /// PostgreSQL advisory locks on this client's connections (feature `postgres`;
    /// [`crate::advisory`]): transaction-scoped, or session-scoped on a dedicated connection per
    /// guard. On a Redis client every operation returns [`Error::Unsupported`].
    #[cfg(feature = "postgres")]
    pub fn advisory_locks(&self) -> crate::advisory::AdvisoryLocks {
        crate::advisory::AdvisoryLocks::new(self.backend.clone())
    }

    /// Leader election on this client's connections.
    pub fn leaders(&self) -> crate::leader::Leaders {
        crate::leader::Leaders::new(self.backend.clone())
    }

    /// The fair lock (a queue in arrival order, a priority reservation) on this client's
    /// connections.
    pub fn fair_locks(&self) -> crate::fair::FairLocks {
        crate::fair::FairLocks::new(self.backend.clone())
    }

    /// An operator's view of everything under a prefix on this client's backend: list every
    /// job, lock, election, fair lock and queue, say what a name is, follow a lock
    /// ([`crate::inspect`]).
    pub fn inspect(&self) -> crate::inspect::Inspector {
        crate::inspect::Inspector::new(self.backend.clone())
    }

    /// Run-or-enqueue on this client's connections ([`crate::queue`]).
    pub fn queues(&self) -> Queues {
        Queues::new(self.backend.clone())
    }

    /// Creates the schema of every primitive this client's backend needs, if missing: on
    /// PostgreSQL the tables `baton_jobs` and `baton_locks`, the schedules' record
    /// (`baton_schedules`, `baton_schedule_history`, `baton_schedule_control`), the semaphore's
    /// `baton_semaphores`, the read-write lock's `baton_rwlocks`, their indexes and the sequence
    /// `baton_advisory_fence`, in the connection's default schema (the first of its
    /// `search_path`); on Redis nothing. What `baton migrate` runs. Idempotent and safe while
    /// workers run: it takes no lock when everything exists, and its DDL waits for a lock at
    /// most a second before it tries again (a few times). See [`Failover::migrate`] and
    /// [`Locks::migrate`].
    ///
    /// # Errors
    /// Connection errors; [`ErrorKind::Permission`](crate::ErrorKind::Permission) for a role
    /// that may not create them; [`ErrorKind::Busy`](crate::ErrorKind::Busy) when other
    /// transactions kept a table locked through every try.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.failover().migrate().await?;
        self.locks().migrate().await?;
        self.semaphores().migrate().await?;
        self.rw_locks().migrate().await?;
        #[cfg(feature = "postgres")]
        if self.backend.postgres("migrate", "").is_ok() {
            self.advisory_locks().migrate().await?;
        }
        Ok(())
    }

    /// Stops every worker of this client and waits up to `deadline` for them to finish: failover
    /// holders release their attempts, and every live [`Elector`](crate::Elector) and
    /// [`LeaderWorker`](crate::LeaderWorker) resigns its term, so backups and standbys elsewhere
    /// take over at once rather than after a lease.
    ///
    /// Returns `true` if every worker ended in time.
    pub async fn shutdown(&self, deadline: Duration) -> bool {
        self.backend.cancel().cancel();
        self.backend.tracker().close();
        tokio::time::timeout(deadline, self.backend.tracker().wait())
            .await
            .is_ok()
    }

    /// The backend this client talks to.
    #[cfg(feature = "testing")]
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }
}

/// Redlock's constructor lives with the client: a primitive never imports the client, and
/// handing out a handle over clients' connections is the client's job.
impl Redlock {
    /// A [Redlock](crate::redlock) over `masters`: independent Redis servers (not replicas of
    /// one another), one client each. The quorum is `masters.len() / 2 + 1`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut masters = Vec::new();
    /// for url in ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"] {
    ///     // A master that is down now is one failed vote (see `ClientBuilder::build_lazy`).
    ///     masters.push(baton::Client::builder(url).build_lazy()?);
    /// }
    /// let redlock = baton::Redlock::new(&masters)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`] naming `masters` for fewer than 3 masters, an even count (it adds a
    /// master without tolerating one more failure), or the same `host:port/db` twice (one
    /// server counted twice would fake a quorum). Two spellings of one server (`localhost` and
    /// `127.0.0.1`, a DNS alias) are not detected: give each master once.
    pub fn new(masters: &[Client]) -> Result<Redlock, ConfigError> {
        let mut transports = Vec::with_capacity(masters.len());
        for master in masters {
            match master
                .backend
                .redis("Redlock", "it needs independent Redis masters")
            {
                Ok(_) => transports.push(master.backend.clone()),
                Err(_) => {
                    return Err(ConfigError::invalid(
                        "masters",
                        "Redlock needs independent Redis masters; a postgres:// client is one \
                         server with real locks (use `locks()` or `advisory_locks()` on it)",
                    ))
                }
            }
        }
        Redlock::from_transports(transports)
    }
}

/// The hidden test seam (feature `testing`): hooks into a client's transitions that tests use to
/// drive an interleaving deterministically. Not part of the API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod seam {
    pub use crate::util::settings::ExecHook;

    /// Installs (or removes) the hook run between round trip 1 (`WATCH` + reads) and round
    /// trip 2 (`MULTI … EXEC`) of every transition of `client`'s workers, and before each lease
    /// extension, with the transition's name (`"grant"`, `"exhaust"`, `"finish"`, `"extend"`).
    pub fn set_before_exec_hook(client: &super::Client, hook: Option<ExecHook>) {
        client.backend().set_before_exec(hook);
    }

    /// The schema and the periodic cleanup statement of each PostgreSQL table a client keeps
    /// (`baton_jobs`, `baton_locks`), for tests of the cleanup.
    #[cfg(feature = "postgres")]
    pub fn pg_schema_and_cleanup() -> [(&'static str, &'static str, &'static str); 2] {
        [
            (
                crate::failover::pg::TABLE,
                crate::failover::pg::SCHEMA,
                crate::failover::pg::CLEANUP,
            ),
            (
                crate::backend::pg_seam::SCHEMA_NAME,
                crate::backend::pg_seam::SCHEMA,
                crate::backend::pg_seam::CLEANUP,
            ),
        ]
    }

    /// How many notifications `client`'s `LISTEN` connection has received, on any channel
    /// (0 on Redis, or before anything subscribed).
    pub fn pg_notifications_received(client: &super::Client) -> u64 {
        client.backend().notifications_received()
    }

    /// The lock acquisition statement of `baton_locks` (`$1` key, `$2` token, `$3` lock ms,
    /// `$4` fence retention ms), for tests that interleave it with the cleanup.
    #[cfg(feature = "postgres")]
    pub fn pg_lock_acquire() -> &'static str {
        crate::backend::pg_seam::ACQUIRE
    }

    /// A backup's grant of `attempt` (fencing token `fence`, lease `token`) to job row `key`
    /// observed at `version` (`None`: no row), as the statement and parameters a worker sends;
    /// for tests that interleave it with the cleanup.
    ///
    /// # Errors
    /// A fence that does not fit a `bigint`.
    #[cfg(feature = "postgres")]
    #[allow(clippy::type_complexity)]
    pub fn pg_job_grant(
        key: &str,
        version: Option<i64>,
        attempt: u64,
        fence: u64,
        token: &str,
    ) -> Result<(String, crate::backend::pg_seam::Params), crate::error::Error> {
        crate::failover::pg::grant_statement(key, version, attempt, fence, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(b: &ClientBuilder) -> Result<(), ConfigError> {
        crate::backend::connect::check(&b.url, &b.connect_settings())
    }

    fn field(b: ClientBuilder) -> &'static str {
        match validate(&b) {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(_) => "accepted",
        }
    }

    /// What `migrate` and the first operation look for is read from each schema's DDL: every
    /// table and index of baton's PostgreSQL schemas is found there.
    #[cfg(feature = "postgres")]
    #[test]
    fn every_relation_of_the_postgres_schemas_is_read_from_their_ddl() {
        use crate::backend::pg_seam::created_relations;
        assert_eq!(
            created_relations(crate::backend::pg_seam::SCHEMA),
            [
                ("TABLE", "baton_locks"),
                ("INDEX", "baton_locks_fence_expires_at")
            ]
        );
        assert_eq!(
            created_relations(crate::failover::pg::SCHEMA),
            [("TABLE", "baton_jobs"), ("INDEX", "baton_jobs_expires_at")]
        );
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
        assert_eq!(field(Client::builder("redis://127.0.0.1:99999/")), "url");
    }

    /// The reason of a rejected builder, asserting it names `url`.
    fn url_reason(b: ClientBuilder) -> String {
        match validate(&b) {
            Err(ConfigError::Invalid {
                field: "url",
                reason,
            }) => reason,
            Err(other) => panic!("rejected for another field: {other}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn row_08_invalid_urls_are_config_errors_naming_url_and_never_echo_the_password() {
        let pw = "canary-7f3a9c";
        for url in [
            format!("http://:{pw}@127.0.0.1:6379/"),
            format!("redis://:{pw}@127.0.0.1:0/"),
            format!("redis://:{pw}@127.0.0.1:99999/"),
            format!("redis://:{pw}@127.0.0.1:6379/#insecure"),
            format!("rediss://:{pw}@127.0.0.1:6379/#insecure"),
            format!("redis://u:{pw}@127.0.0.1:6379/#frag"),
            format!("redis://u:{pw}@127.0.0.1:6379/notanumber"),
            format!("valkey://:{pw}@127.0.0.1:6379/"),
            format!("127.0.0.1:6379 {pw}"),
            format!("redis://:{pw}@/"),
        ] {
            let reason = url_reason(Client::builder(url.clone()));
            assert!(!reason.contains(pw), "{url} -> {reason}");
        }
        // Empty credentials.
        let reason = url_reason(Client::builder("redis://:@127.0.0.1:6379/"));
        assert!(reason.contains("empty credentials"), "{reason}");
        assert!(url_reason(Client::builder("redis://@127.0.0.1:6379/")).contains("empty"));
        // Port 0 is named as such, with the rest of the URL shown.
        let reason = url_reason(Client::builder("redis://127.0.0.1:0/"));
        assert!(reason.contains("port 0"), "{reason}");
        assert!(reason.contains("127.0.0.1:0"), "{reason}");
        // #insecure is refused whatever the features.
        let reason = url_reason(Client::builder("rediss://127.0.0.1:6380/#insecure"));
        if cfg!(feature = "tls") {
            assert!(reason.contains("#insecure"), "{reason}");
        }
        // The scheme.
        assert!(url_reason(Client::builder("http://127.0.0.1:6379/")).contains("scheme"));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn row_08_rediss_without_the_tls_feature_is_a_config_error() {
        let reason = url_reason(Client::builder("rediss://127.0.0.1:6380/"));
        assert!(reason.contains("`tls` feature"), "{reason}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn row_08_tls_options_with_a_plain_url_are_a_config_error() {
        let reason = url_reason(Client::builder("redis://127.0.0.1:6379/").tls_root_ca_pem("x"));
        assert!(reason.contains("not rediss://"), "{reason}");
        let reason =
            url_reason(Client::builder("unix:///tmp/redis.sock").tls_client_cert_pem("c", "k"));
        assert!(reason.contains("not rediss://"), "{reason}");
        // rediss:// alone is fine (system roots); bad PEM names its own field.
        assert_eq!(
            field(Client::builder("rediss://127.0.0.1:6380/")),
            "accepted"
        );
        assert_eq!(
            field(Client::builder("rediss://127.0.0.1:6380/").tls_root_ca_pem("not pem")),
            "tls_root_ca"
        );
    }

    #[test]
    fn redact_url_hides_credentials_and_query() {
        assert_eq!(
            redact_url("redis://user:pw@127.0.0.1:6379/0"),
            "redis://<redacted>@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("unix:///run/redis.sock?db=1&pass=pw"),
            "unix:///run/redis.sock?<redacted>"
        );
        // A password with an unescaped `/` or `@` is still hidden.
        let r = redact_url("redis://:p/w@x@127.0.0.1/");
        assert!(!r.contains("p/w") && !r.contains("w@x"), "{r}");
        assert_eq!(redact_url("no url pw"), "<not a URL, 9 bytes>");
        assert!(redact_url("redis://h/#secret").ends_with("#<fragment>"));
    }

    #[test]
    fn url_errors_never_echo_the_password() {
        let err = validate(&Client::builder("redis://:s3cret@127.0.0.1:99999/")).unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let b = Client::builder("redis://:s3cret@127.0.0.1:6379/").password("s3cret-2");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
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

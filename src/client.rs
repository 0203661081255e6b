//! [`Client`]: the connections shared by every worker of a process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::redis::topology_url::{self, Target};
use crate::backend::redis::url::{check_url, redact_url};
use crate::backend::redis::{
    connect_manager, lazy_manager, ConnSettings, Hub, HubSource, Router, Transport,
};
use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::failover::Failover;
use crate::mutex::Locks;
use crate::queue::Queues;
use crate::redlock::Redlock;
use redis::aio::ConnectionManager;

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
    fn tls_options_set(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.tls.is_set()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    fn validate(&self) -> Result<redis::Client, ConfigError> {
        self.check_settings()?;
        self.client_for(&self.url)
    }

    /// The connection settings' ranges.
    fn check_settings(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// A checked client for one server's URL, with this builder's password and TLS material.
    /// Messages name the URL the user typed (`self.url`), redacted.
    fn client_for(&self, url: &str) -> Result<redis::Client, ConfigError> {
        let scheme = check_url(url, self.tls_options_set())?;
        let info = url.into_connection_info().map_err(|e| {
            ConfigError::invalid(
                "url",
                format!(
                    "{} is not a valid redis URL ({:?})",
                    redact_url(&self.url),
                    e.kind()
                ),
            )
        })?;
        if let redis::ConnectionAddr::Tcp(_, 0) | redis::ConnectionAddr::TcpTls { port: 0, .. } =
            info.addr()
        {
            return Err(ConfigError::invalid(
                "url",
                format!(
                    "{}: port 0 is not a port to connect to",
                    redact_url(&self.url)
                ),
            ));
        }
        let info = match &self.password {
            Some(pw) => {
                let redis = info.redis_settings().clone().set_password(pw);
                info.set_redis_settings(redis)
            }
            None => info,
        };
        let rejected = |e: redis::RedisError| {
            ConfigError::invalid(
                "url",
                format!("{} rejected ({:?})", redact_url(&self.url), e.kind()),
            )
        };
        #[cfg(feature = "tls")]
        if scheme == crate::backend::redis::url::Scheme::Tls {
            crate::util::tls::install_crypto_provider();
            if self.tls.is_set() {
                let certs = self.tls.certificates()?;
                return redis::Client::build_with_tls(info, certs).map_err(rejected);
            }
        }
        let _ = scheme;
        redis::Client::open(info).map_err(rejected)
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
    /// The last attempt's error when it gives up (a [`Error::Timeout`] if that attempt was cut
    /// short); an error no retry can fix (configuration, credentials, TLS) at once.
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
        loop {
            let until = deadline(reached);
            let attempt = self.clone().connect_once(&mut reached);
            let error = match tokio::time::timeout_at(until, attempt).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) if !e.is_retryable() => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => Error::Timeout {
                    during: "connecting",
                },
            };
            let now = tokio::time::Instant::now();
            let deadline = deadline(reached);
            if now >= deadline {
                return Err(error);
            }
            tracing::debug!(error = %error, reached, "cannot connect yet; retrying");
            let retry_at = crate::util::time::after(now, backoff.next_delay()).min(deadline);
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
        if is_postgres(&self.url) {
            let client = self.postgres()?;
            #[cfg(feature = "postgres")]
            if let Backend::Postgres(t) = &client.backend {
                // Fail at connect, as on Redis: an unreachable server or bad credentials. The
                // same round trip reads the durability settings, warned about like Redis'.
                let conn = t.pooled().await?;
                let rows = conn
                    .by(
                        tokio::time::Instant::now() + t.settings.response_timeout,
                        "connecting",
                        conn.query(
                            "SELECT name, setting FROM pg_settings WHERE name IN \
                             ('fsync', 'synchronous_commit', 'full_page_writes')",
                            &[],
                        ),
                    )
                    .await?;
                let unsafe_settings: Vec<String> = rows
                    .iter()
                    .filter_map(|r| {
                        let (name, value): (String, String) =
                            (r.try_get(0).ok()?, r.try_get(1).ok()?);
                        let safe = match name.as_str() {
                            "synchronous_commit" => value != "off",
                            _ => value == "on",
                        };
                        (!safe).then(|| format!("{name} is {value}"))
                    })
                    .collect();
                if !unsafe_settings.is_empty() {
                    tracing::warn!(
                        problems = ?unsafe_settings,
                        "PostgreSQL may lose acknowledged commits in a crash; baton's guarantees \
                         need fsync on, synchronous_commit on and full_page_writes on"
                    );
                }
            }
            return Ok(client);
        }
        match topology_url::parse(&self.url)? {
            Target::Single(_) => {}
            #[cfg(feature = "cluster")]
            Target::Cluster { seeds } => return self.connect_cluster(&seeds).await,
            #[cfg(not(feature = "cluster"))]
            Target::Cluster { .. } => return Err(missing_feature(&self.url, "cluster")),
            #[cfg(feature = "sentinel")]
            Target::Sentinel {
                sentinels,
                service,
                data,
            } => {
                return self
                    .connect_sentinel(sentinels, service, &data, reached)
                    .await
            }
            #[cfg(not(feature = "sentinel"))]
            Target::Sentinel { .. } => return Err(missing_feature(&self.url, "sentinel")),
        }
        let client = self.validate()?;
        let settings = self.settings;
        first_connection_check(&client, &settings).await?;
        let manager = connect_manager(&client, &settings).await?;
        // Fail closed, and at connect: with no password given, redis-rs sends no AUTH, so a
        // server that requires one accepts the connection and only the first request fails
        // (NOAUTH). One PING makes that a Permission error here.
        let mut conn = manager.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        let client = assemble(client, manager, settings);
        client.warn_if_unsafe().await;
        Ok(client)
    }

    /// Connects to the primary a Sentinel set names for `service` and follows it across
    /// failovers ([`crate::backend::redis::follow`]).
    #[cfg(feature = "sentinel")]
    async fn connect_sentinel(
        self,
        sentinels: Vec<String>,
        service: String,
        data: &crate::backend::redis::topology_url::DataTemplate,
        reached: &mut bool,
    ) -> Result<Client, Error> {
        self.check_settings()?;
        let settings = self.settings.clone();
        let (host, port) = crate::backend::redis::sentinel::resolve_primary(
            &sentinels,
            &service,
            settings.connect_timeout,
        )
        .await?;
        // A Sentinel answered: the deployment is there, its primary may be failing over.
        *reached = true;
        let client = self.client_for(&data.primary_url(&host, port))?;
        let manager = connect_manager(&client, &settings).await?;
        let mut conn = manager.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        let endpoint = format!("sentinel:{service}@{}", endpoint_of(&client));
        let cancel = CancellationToken::new();
        let followed = crate::backend::redis::follow::Followed::start(
            client,
            manager,
            sentinels,
            service,
            settings.clone(),
            cancel.clone(),
        );
        let client = assemble_with(
            Router::Followed(followed.clone()),
            HubSource::Followed(followed),
            settings,
            endpoint,
            cancel,
        );
        client.warn_if_unsafe().await;
        Ok(client)
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
        if is_postgres(&self.url) {
            return self.postgres();
        }
        if !matches!(topology_url::parse(&self.url)?, Target::Single(_)) {
            return Err(Error::Config(ConfigError::invalid(
                "url",
                format!(
                    "{}: build_lazy takes a single server's URL (a cluster or Sentinel client \
                     must first ask the nodes where the data lives: use connect)",
                    redact_url(&self.url)
                ),
            )));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Config(ConfigError::invalid(
                "runtime",
                "build_lazy must be called within a Tokio runtime",
            )));
        }
        let client = self.validate()?;
        let settings = self.settings;
        let manager = lazy_manager(&client, &settings)?;
        Ok(assemble(client, manager, settings))
    }
}

/// Whether `url` asks for PostgreSQL (`postgres://`, `postgresql://`).
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

impl ClientBuilder {
    /// A PostgreSQL client (feature `postgres`), not connected yet.
    fn postgres(&self) -> Result<Client, Error> {
        self.check_settings()?;
        #[cfg(feature = "postgres")]
        {
            let transport = crate::backend::postgres::PgTransport::new(
                &self.url,
                self.password.as_deref(),
                self.settings.clone(),
                &self.tls,
            )?;
            Ok(Client {
                backend: Backend::Postgres(Arc::new(transport)),
            })
        }
        #[cfg(not(feature = "postgres"))]
        Err(Error::Config(ConfigError::invalid(
            "url",
            format!(
                "{}: this URL needs baton's `postgres` feature, which is not compiled in",
                redact_url(&self.url)
            ),
        )))
    }
}

/// A client on `manager`, with its pub/sub task started.
fn assemble(client: redis::Client, manager: ConnectionManager, settings: ConnSettings) -> Client {
    let endpoint = endpoint_of(&client);
    let hub = HubSource::Plain(Box::new(client.clone()));
    let router = Router::single(client, manager, &settings, endpoint.clone());
    assemble_with(router, hub, settings, endpoint, CancellationToken::new())
}

/// A client over `router`, with its pub/sub task started on `hub`.
fn assemble_with(
    router: Router,
    hub: HubSource,
    settings: ConnSettings,
    endpoint: String,
    cancel: CancellationToken,
) -> Client {
    // The hub is tracked with the workers, so `shutdown` also waits for it to let go of its
    // connection.
    let tracker = TaskTracker::new();
    let hub = Hub::start(hub, settings.clone(), cancel.clone(), &tracker);
    Client {
        backend: Backend::Redis(Arc::new(Transport {
            router,
            hub,
            cancel,
            tracker,
            settings,
            endpoint,
            wait_reads: tokio::sync::Semaphore::new(crate::backend::redis::WAIT_READS),
            #[cfg(feature = "testing")]
            before_exec: std::sync::Mutex::new(None),
        })),
    }
}

/// A configuration error for a URL form whose cargo feature is not compiled in.
#[cfg(not(all(feature = "cluster", feature = "sentinel")))]
fn missing_feature(url: &str, feature: &str) -> Error {
    Error::Config(ConfigError::invalid(
        "url",
        format!(
            "{}: this URL needs baton's `{feature}` feature, which is not compiled in",
            redact_url(url)
        ),
    ))
}

#[cfg(feature = "cluster")]
impl ClientBuilder {
    /// Connects to a Redis Cluster through `seeds` (plain URLs from a `redis+cluster://` URL):
    /// reads the slot map from the first seed that answers and starts the sharded pub/sub task.
    async fn connect_cluster(self, seeds: &[String]) -> Result<Client, Error> {
        self.check_settings()?;
        let clients = seeds
            .iter()
            .map(|u| self.client_for(u))
            .collect::<Result<Vec<_>, _>>()?;
        let infos = clients
            .iter()
            .map(|c| c.get_connection_info().clone())
            .collect();
        let endpoint = format!("cluster:{}", endpoint_of(&clients[0]));
        let cluster =
            crate::backend::redis::cluster::Cluster::connect(clients, self.settings.clone())
                .await?;
        let moved = cluster.moved();
        let client = assemble_with(
            Router::Cluster(cluster),
            HubSource::Sharded {
                seeds: infos,
                moved,
            },
            self.settings,
            endpoint,
            CancellationToken::new(),
        );
        client.warn_if_unsafe().await;
        Ok(client)
    }
}

/// `host:port/db` (host lowercased) or `path/db`: what identifies a server as configured, without
/// credentials.
fn endpoint_of(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!(
        "{}/{}",
        info.addr().to_string().to_ascii_lowercase(),
        info.redis_settings().db()
    )
}

/// One direct connection before the connection manager, which retries whatever fails: an
/// error no retry can fix (a failed TLS handshake, a wrong password or unknown user, a
/// database index out of range) is returned at once, so the server sees one failed login, not
/// one per retry; anything else is left to the manager's usual path.
async fn first_connection_check(
    client: &redis::Client,
    settings: &ConnSettings,
) -> Result<(), Error> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout));
    let fut = client.get_multiplexed_async_connection_with_config(&cfg);
    match tokio::time::timeout(settings.connect_timeout * 2, fut).await {
        Ok(Err(e)) => {
            let e = Error::from(e);
            if matches!(
                e.kind(),
                crate::ErrorKind::Tls
                    | crate::ErrorKind::Permission
                    | crate::ErrorKind::Misconfigured
            ) {
                return Err(e);
            }
            Ok(())
        }
        Ok(Ok(_)) => Ok(()),
        Err(_) => Ok(()),
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
    /// Logs a warning (via `tracing`) when the server's durability settings are unsafe; best
    /// effort: managed Redis services often forbid `CONFIG`, which is fine.
    async fn warn_if_unsafe(&self) {
        match self.durability().await {
            Ok(d) if !d.is_safe() => tracing::warn!(
                problems = ?d.problems(),
                "redis may lose acknowledged writes; baton's guarantees need appendonly yes, \
                 appendfsync always and maxmemory-policy noeviction"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read redis durability settings"),
        }
    }

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
        let mut conn = transport.router.any().await?.conn();
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
    /// PostgreSQL the tables `baton_jobs` and `baton_locks`, their indexes and the sequence
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
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(_) = &self.backend {
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
            match &master.backend {
                Backend::Redis(_) => transports.push(master.backend.clone()),
                #[cfg(feature = "postgres")]
                Backend::Postgres(_) => {
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
        match client.backend() {
            crate::backend::Backend::Redis(t) => *crate::util::lock(&t.before_exec) = hook,
            #[cfg(feature = "postgres")]
            crate::backend::Backend::Postgres(t) => *crate::util::lock(&t.before_exec) = hook,
        }
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
                crate::backend::postgres::locks::SCHEMA_NAME,
                crate::backend::postgres::locks::SCHEMA,
                crate::backend::postgres::locks::CLEANUP,
            ),
        ]
    }

    /// How many notifications `client`'s `LISTEN` connection has received, on any channel
    /// (0 on Redis, or before anything subscribed).
    pub fn pg_notifications_received(client: &super::Client) -> u64 {
        match client.backend() {
            crate::backend::Backend::Redis(_) => 0,
            #[cfg(feature = "postgres")]
            crate::backend::Backend::Postgres(t) => t
                .notices_received
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The lock acquisition statement of `baton_locks` (`$1` key, `$2` token, `$3` lock ms,
    /// `$4` fence retention ms), for tests that interleave it with the cleanup.
    #[cfg(feature = "postgres")]
    pub fn pg_lock_acquire() -> &'static str {
        crate::backend::postgres::locks::ACQUIRE
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
    ) -> Result<
        (
            String,
            Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>,
        ),
        crate::Error,
    > {
        crate::failover::pg::grant_statement(key, version, attempt, fence, token)
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

    /// What `migrate` and the first operation look for is read from each schema's DDL: every
    /// table and index of baton's PostgreSQL schemas is found there.
    #[cfg(feature = "postgres")]
    #[test]
    fn every_relation_of_the_postgres_schemas_is_read_from_their_ddl() {
        use crate::backend::postgres::schema::created_relations;
        assert_eq!(
            created_relations(crate::backend::postgres::locks::SCHEMA),
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
        match b.validate() {
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
        let err = Client::builder("redis://:s3cret@127.0.0.1:99999/")
            .validate()
            .unwrap_err();
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

//! Connecting to Redis: the URL and TLS material checked before any network I/O, one server,
//! a Cluster through its seeds, or the primary a Sentinel set names (followed across
//! failovers); the `PING` that makes bad credentials fail at connect; and the durability
//! settings (`CONFIG GET`) a connect warns about.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::IntoConnectionInfo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::topology_url::{self, Target};
use super::url::{check_url, redact_url};
use super::{connect_manager, lazy_manager, ConnSettings, Hub, HubSource, Router, Transport};
use crate::error::{ConfigError, Error, ErrorKind};
use crate::util::durability::Durability;

/// What a Redis client is built from: the URL as the user typed it, the password given beside
/// it, the connection settings and the TLS material.
pub(crate) struct Options<'a> {
    pub(crate) url: &'a str,
    pub(crate) password: Option<&'a str>,
    pub(crate) settings: &'a ConnSettings,
    #[cfg(feature = "tls")]
    pub(crate) tls: &'a crate::util::tls::TlsSettings,
}

impl Options<'_> {
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

    /// The settings and the URL, checked (what [`connect`] checks before any network I/O).
    fn validate(&self) -> Result<redis::Client, ConfigError> {
        self.settings.check()?;
        self.client_for(self.url)
    }

    /// A checked client for one server's URL, with this password and TLS material. Messages
    /// name the URL the user typed (`self.url`), redacted.
    fn client_for(&self, url: &str) -> Result<redis::Client, ConfigError> {
        let scheme = check_url(url, self.tls_options_set())?;
        let info = url.into_connection_info().map_err(|e| {
            ConfigError::invalid(
                "url",
                format!(
                    "{} is not a valid redis URL ({:?})",
                    redact_url(self.url),
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
                    redact_url(self.url)
                ),
            ));
        }
        let info = match self.password {
            Some(pw) => {
                let redis = info.redis_settings().clone().set_password(pw);
                info.set_redis_settings(redis)
            }
            None => info,
        };
        let rejected = |e: redis::RedisError| {
            ConfigError::invalid(
                "url",
                format!("{} rejected ({:?})", redact_url(self.url), e.kind()),
            )
        };
        #[cfg(feature = "tls")]
        if scheme == super::url::Scheme::Tls {
            crate::util::tls::install_crypto_provider();
            if self.tls.is_set() {
                let pem = self.tls.certificates()?;
                let certs = redis::TlsCertificates {
                    client_tls: pem.client.map(|(client_cert, client_key)| {
                        redis::ClientTlsConfig {
                            client_cert,
                            client_key,
                        }
                    }),
                    root_cert: pem.root_cert,
                };
                return redis::Client::build_with_tls(info, certs).map_err(rejected);
            }
        }
        let _ = scheme;
        redis::Client::open(info).map_err(rejected)
    }
}

/// Checks the settings and a single server's URL as [`connect`] does, without connecting.
///
/// # Errors
/// A [`ConfigError`] naming the setting or `url`.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn check(o: &Options<'_>) -> Result<(), ConfigError> {
    o.validate().map(|_| ())
}

/// Connects (the multiplexed connection first, so a bad address fails here) and starts the
/// pub/sub task; sets `reached` once a Sentinel of the set answered.
///
/// # Errors
/// As `ClientBuilder::connect`.
pub(crate) async fn connect(o: Options<'_>, reached: &mut bool) -> Result<Arc<Transport>, Error> {
    match topology_url::parse(o.url)? {
        Target::Single(_) => {}
        #[cfg(feature = "cluster")]
        Target::Cluster { seeds } => return connect_cluster(o, &seeds).await,
        #[cfg(not(feature = "cluster"))]
        Target::Cluster { .. } => return Err(missing_feature(o.url, "cluster")),
        #[cfg(feature = "sentinel")]
        Target::Sentinel {
            sentinels,
            service,
            data,
        } => return connect_sentinel(o, sentinels, service, &data, reached).await,
        #[cfg(not(feature = "sentinel"))]
        Target::Sentinel { .. } => return Err(missing_feature(o.url, "sentinel")),
    }
    let _ = reached;
    let client = o.validate()?;
    let settings = o.settings.clone();
    first_connection_check(&client, &settings).await?;
    let manager = connect_manager(&client, &settings).await?;
    // Fail closed, and at connect: with no password given, redis-rs sends no AUTH, so a
    // server that requires one accepts the connection and only the first request fails
    // (NOAUTH). One PING makes that a Permission error here.
    let mut conn = manager.clone();
    if let Err(e) = redis::cmd("PING").query_async::<()>(&mut conn).await {
        return Err(diagnose(&client, e, &settings).await);
    }
    let t = assemble(client, manager, settings);
    warn_if_unsafe(&t).await;
    Ok(t)
}

/// Connects to the primary a Sentinel set names for `service` and follows it across
/// failovers ([`super::follow`]).
#[cfg(feature = "sentinel")]
async fn connect_sentinel(
    o: Options<'_>,
    sentinels: Vec<String>,
    service: String,
    data: &topology_url::DataTemplate,
    reached: &mut bool,
) -> Result<Arc<Transport>, Error> {
    o.settings.check()?;
    let settings = o.settings.clone();
    let (host, port) = match super::sentinel::resolve_primary(
        &sentinels,
        &service,
        settings.connect_timeout,
    )
    .await
    {
        Ok(found) => found,
        // A Sentinel's reply that is not Redis' protocol: is another service listening?
        Err(e) if caused_by_unexpected_reply(&e) => {
            return Err(not_redis(&addrs_of(&sentinels), &settings)
                .await
                .unwrap_or(e));
        }
        Err(e) => return Err(e),
    };
    // A Sentinel answered: the deployment is there, its primary may be failing over.
    *reached = true;
    let client = o.client_for(&data.primary_url(&host, port))?;
    let manager = connect_manager(&client, &settings).await?;
    let mut conn = manager.clone();
    redis::cmd("PING").query_async::<()>(&mut conn).await?;
    let endpoint = format!("sentinel:{service}@{}", endpoint_of(&client));
    let cancel = CancellationToken::new();
    let followed = super::follow::Followed::start(
        client,
        manager,
        sentinels,
        service,
        settings.clone(),
        cancel.clone(),
    );
    let t = assemble_with(
        Router::Followed(followed.clone()),
        HubSource::Followed(followed),
        settings,
        endpoint,
        cancel,
    );
    warn_if_unsafe(&t).await;
    Ok(t)
}

/// Connects to a Redis Cluster through `seeds` (plain URLs from a `redis+cluster://` URL):
/// reads the slot map from the first seed that answers and starts the sharded pub/sub task.
#[cfg(feature = "cluster")]
async fn connect_cluster(o: Options<'_>, seeds: &[String]) -> Result<Arc<Transport>, Error> {
    o.settings.check()?;
    let clients = seeds
        .iter()
        .map(|u| o.client_for(u))
        .collect::<Result<Vec<_>, _>>()?;
    let infos = clients
        .iter()
        .map(|c| c.get_connection_info().clone())
        .collect();
    let Some(first) = clients.first() else {
        return Err(Error::Config(ConfigError::invalid(
            "url",
            format!("{}: a cluster URL needs a seed", redact_url(o.url)),
        )));
    };
    let endpoint = format!("cluster:{}", endpoint_of(first));
    let cluster = match super::cluster::Cluster::connect(clients, o.settings.clone()).await {
        Ok(cluster) => cluster,
        // A seed's reply that is not Redis' protocol: is another service listening?
        Err(e) if caused_by_unexpected_reply(&e) => {
            return Err(not_redis(&addrs_of(seeds), o.settings).await.unwrap_or(e));
        }
        Err(e) => return Err(e),
    };
    let moved = cluster.moved();
    let t = assemble_with(
        Router::Cluster(cluster),
        HubSource::Sharded {
            seeds: infos,
            moved,
        },
        o.settings.clone(),
        endpoint,
        CancellationToken::new(),
    );
    warn_if_unsafe(&t).await;
    Ok(t)
}

/// A client that connects on first use: checks the settings and URL as [`connect`] does, but
/// sends nothing.
///
/// # Errors
/// [`Error::Config`] for invalid settings or URL, a cluster or Sentinel URL, or when called
/// outside a Tokio runtime.
pub(crate) fn connect_lazy(o: Options<'_>) -> Result<Arc<Transport>, Error> {
    if !matches!(topology_url::parse(o.url)?, Target::Single(_)) {
        return Err(Error::Config(ConfigError::invalid(
            "url",
            format!(
                "{}: build_lazy takes a single server's URL (a cluster or Sentinel client \
                 must first ask the nodes where the data lives: use connect)",
                redact_url(o.url)
            ),
        )));
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::Config(ConfigError::invalid(
            "runtime",
            "build_lazy must be called within a Tokio runtime",
        )));
    }
    let client = o.validate()?;
    let settings = o.settings.clone();
    let manager = lazy_manager(&client, &settings)?;
    Ok(assemble(client, manager, settings))
}

/// A transport on `manager`, with its pub/sub task started.
fn assemble(
    client: redis::Client,
    manager: ConnectionManager,
    settings: ConnSettings,
) -> Arc<Transport> {
    let endpoint = endpoint_of(&client);
    let hub = HubSource::Plain(Box::new(client.clone()));
    let router = Router::single(client, manager, &settings, endpoint.clone());
    assemble_with(router, hub, settings, endpoint, CancellationToken::new())
}

/// A transport over `router`, with its pub/sub task started on `hub`.
fn assemble_with(
    router: Router,
    hub: HubSource,
    settings: ConnSettings,
    endpoint: String,
    cancel: CancellationToken,
) -> Arc<Transport> {
    // The hub is tracked with the workers, so `shutdown` also waits for it to let go of its
    // connection.
    let tracker = TaskTracker::new();
    let hub = Hub::start(hub, settings.clone(), cancel.clone(), &tracker);
    Arc::new(Transport {
        router,
        hub,
        cancel,
        tracker,
        settings,
        endpoint,
        wait_reads: tokio::sync::Semaphore::new(super::WAIT_READS),
        #[cfg(feature = "testing")]
        before_exec: std::sync::Mutex::new(None),
    })
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
/// database index out of range, a server that is not Redis) is returned at once, so the
/// server sees one failed login, not one per retry, and so is a TLS handshake a server
/// accepted and never answered (a plain Redis behind `rediss://`); anything else is left to
/// the manager's usual path.
async fn first_connection_check(
    client: &redis::Client,
    settings: &ConnSettings,
) -> Result<(), Error> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout));
    let fut = client.get_multiplexed_async_connection_with_config(&cfg);
    let e = match tokio::time::timeout(settings.connect_timeout * 2, fut).await {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => diagnose(client, e, settings).await,
        Err(_) => Error::Timeout {
            during: "connecting",
        },
    };
    // A plain Redis behind a `rediss://` URL never answers the ClientHello (it waits for the
    // end of a line): the handshake times out. When the TCP connection itself is accepted
    // (checked without sending a byte: nothing is ever sent in clear on a TLS URL), that is
    // said, and returned (still retryable) rather than left to the manager's generic timeout.
    if matches!(e, Error::Timeout { .. }) && is_tls(client) && accepts(client, settings).await {
        return Err(Error::Timeout {
            during: "waiting for the TLS handshake's reply: the server accepted the connection \
                     and sent nothing back, so it looks like it does not speak TLS (a plain \
                     redis:// port?)",
        });
    }
    if matches!(
        e.kind(),
        ErrorKind::Tls | ErrorKind::Permission | ErrorKind::Misconfigured | ErrorKind::NotRedis
    ) {
        return Err(e);
    }
    Ok(())
}

/// Whether a TCP connection to `client`'s server is accepted within the connect timeout; no
/// byte is sent on it.
async fn accepts(client: &redis::Client, settings: &ConnSettings) -> bool {
    let redis::ConnectionAddr::TcpTls { host, port, .. } = client.get_connection_info().addr()
    else {
        return false;
    };
    let connect = tokio::net::TcpStream::connect((host.as_str(), *port));
    matches!(
        tokio::time::timeout(settings.connect_timeout, connect).await,
        Ok(Ok(_))
    )
}

/// The most of a server's answer a probe reads.
const PROBE_BYTES: usize = 64;

/// `err`, from connecting to `client`'s server, as a typed error: a reply that does not parse
/// as Redis' protocol is checked with a probe of its own ([`probe_plain`]), and is
/// [`Error::NotRedis`] when the server answers a plain `PING` with something that is not RESP.
async fn diagnose(
    client: &redis::Client,
    err: redis::RedisError,
    settings: &ConnSettings,
) -> Error {
    if err.kind() != redis::ErrorKind::Parse || is_tls(client) {
        return Error::from(err);
    }
    let addr = client.get_connection_info().addr().clone();
    not_redis(&[addr], settings)
        .await
        .unwrap_or_else(|| Error::from(err))
}

/// [`Error::NotRedis`] for the first of `addrs` that answers a plain `PING` with something
/// that is not RESP, if any.
async fn not_redis(addrs: &[redis::ConnectionAddr], settings: &ConnSettings) -> Option<Error> {
    let within = settings.connect_timeout + settings.response_timeout;
    for addr in addrs {
        if matches!(addr, redis::ConnectionAddr::TcpTls { .. }) {
            continue;
        }
        match probe_plain(addr, within).await {
            // A TLS record (an alert) is a TLS server on a redis:// URL: its own error says so.
            Some(reply)
                if !reply.is_empty() && !looks_like_resp(&reply) && !looks_like_tls(&reply) =>
            {
                return Some(Error::NotRedis {
                    server: addr.to_string(),
                    reply: shown(&reply),
                })
            }
            _ => {}
        }
    }
    None
}

/// The addresses of `urls` (Cluster seeds, Sentinels) that parse, for [`not_redis`].
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn addrs_of(urls: &[String]) -> Vec<redis::ConnectionAddr> {
    urls.iter()
        .filter_map(|u| u.as_str().into_connection_info().ok())
        .map(|i| i.addr().clone())
        .collect()
}

/// Whether `e` is, or was caused by, a reply baton could not read as Redis' protocol.
#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn caused_by_unexpected_reply(e: &Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // A bound, not a loop forever on a strange self-referencing chain.
    for _ in 0..8 {
        let Some(cur) = next else { return false };
        if cur
            .downcast_ref::<Error>()
            .is_some_and(|e| e.kind() == ErrorKind::UnexpectedReply)
        {
            return true;
        }
        // A cause kept as an `Arc` shows its own source, not itself: look inside.
        next = match cur.downcast_ref::<crate::error::Cause>() {
            Some(arc) => {
                let inner: &(dyn std::error::Error + 'static) = arc.as_ref();
                Some(inner)
            }
            None => cur.source(),
        };
    }
    false
}

/// Whether `client` connects with TLS.
fn is_tls(client: &redis::Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    )
}

/// What the server at `addr` answers to a plain-text `PING` on a connection of its own, TLS or
/// not: its first bytes (up to [`PROBE_BYTES`], up to the end of the first line), or `None`
/// when it cannot be reached or says nothing within `within`. No credentials are sent, so a
/// server that echoes its request (an HTTP error page) cannot show one.
async fn probe_plain(addr: &redis::ConnectionAddr, within: std::time::Duration) -> Option<Vec<u8>> {
    let talk = async {
        match addr {
            redis::ConnectionAddr::Tcp(host, port)
            | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .ok()?;
                exchange(stream).await
            }
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => {
                exchange(tokio::net::UnixStream::connect(path).await.ok()?).await
            }
            _ => None,
        }
    };
    tokio::time::timeout(within, talk).await.ok().flatten()
}

/// Sends `PING` and reads the answer's first line (at most [`PROBE_BYTES`]). Written on the
/// poll methods: the library's tokio has no `io-util`.
async fn exchange(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
) -> Option<Vec<u8>> {
    use std::pin::Pin;
    // A server that speaks first (an SSH banner) may close before reading: its words count.
    let ping = b"PING\r\n";
    let mut sent = 0;
    while sent < ping.len() {
        match std::future::poll_fn(|cx| Pin::new(&mut stream).poll_write(cx, &ping[sent..])).await {
            Ok(0) | Err(_) => break,
            Ok(n) => sent += n,
        }
    }
    let mut buf = vec![0u8; PROBE_BYTES];
    let mut len = 0;
    while len < buf.len() && !buf[..len].contains(&b'\n') {
        let read = std::future::poll_fn(|cx| {
            let mut rb = tokio::io::ReadBuf::new(&mut buf[len..]);
            Pin::new(&mut stream)
                .poll_read(cx, &mut rb)
                .map_ok(|()| rb.filled().len())
        })
        .await;
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
    }
    buf.truncate(len);
    Some(buf)
}

/// Whether `reply` starts as a Redis reply does (RESP2 or RESP3 type byte).
fn looks_like_resp(reply: &[u8]) -> bool {
    reply
        .first()
        .is_some_and(|b| b"+-:$*_,#!=(|~>%".contains(b))
}

/// Whether `reply` starts as a TLS record does (handshake or alert, version 3.x).
fn looks_like_tls(reply: &[u8]) -> bool {
    matches!(reply, [0x15 | 0x16, 0x03, ..])
}

/// The start of a server's answer for a message: its first line, at most 40 bytes, printable
/// ASCII kept and anything else escaped (`\x16`), in quotes, with `…` when more followed.
fn shown(reply: &[u8]) -> String {
    const MAX: usize = 40;
    let end = reply
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(reply.len());
    let line = &reply[..end.min(MAX)];
    let mut out = String::from("\"");
    for &b in line {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b' '..=b'~' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    if reply[line.len()..]
        .iter()
        .any(|b| !matches!(b, b'\r' | b'\n'))
    {
        out.push('…');
    }
    out.push('"');
    out
}

/// Logs a warning (via `tracing`) when the server's durability settings are unsafe; best
/// effort: managed Redis services often forbid `CONFIG`, which is fine.
async fn warn_if_unsafe(t: &Transport) {
    match t.durability().await {
        Ok(d) if !d.is_safe() => tracing::warn!(
            problems = ?d.problems(),
            "redis may lose acknowledged writes; baton's guarantees need appendonly yes, \
             appendfsync always and maxmemory-policy noeviction"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "cannot read redis durability settings"),
    }
}

impl Transport {
    /// Reads the server's durability settings with `CONFIG GET`.
    ///
    /// # Errors
    /// A permission error where `CONFIG` is not allowed; connection errors.
    pub(crate) async fn durability(&self) -> Result<Durability, Error> {
        let mut conn = self.router.any().await?.conn();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_answer_is_shown_printable_and_short() {
        assert_eq!(
            shown(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
            "\"HTTP/1.1 400 Bad Request…\""
        );
        assert_eq!(shown(b"SSH-2.0-OpenSSH_9.2\r\n"), "\"SSH-2.0-OpenSSH_9.2\"");
        assert_eq!(shown(b"\x15\x03\x03\"x"), "\"\\x15\\x03\\x03\\\"x\"");
        let long = shown(&[b'a'; 200]);
        assert_eq!(long, format!("\"{}…\"", "a".repeat(40)));
    }

    #[test]
    fn redis_replies_look_like_resp_and_others_do_not() {
        for reply in [
            &b"+PONG\r\n"[..],
            b"-NOAUTH Authentication required.\r\n",
            b"%1\r\n",
        ] {
            assert!(looks_like_resp(reply), "{reply:?}");
        }
        for reply in [&b"HTTP/1.1 400"[..], b"SSH-2.0", b"\x15\x03", b""] {
            assert!(!looks_like_resp(reply), "{reply:?}");
        }
    }
}

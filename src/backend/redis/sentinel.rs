//! Finding a Sentinel-monitored primary, and following it through failovers.
//!
//! - [`resolve_primary`] asks the Sentinels in turn for the primary's address
//!   (`SENTINEL get-master-addr-by-name`); the first address wins.
//! - [`watch_switch_master`] spawns a task that subscribes to `+switch-master` on one Sentinel
//!   at a time and publishes the primary's address on a [`watch`] channel whenever it changes.
//!
//! The Sentinels are reached by plain URLs without credentials (what
//! [`super::topology_url::Target::Sentinel`] holds): credentials belong to the data nodes.
//!
//! **Nothing here checks the address on the primary itself.** Sentinels name the node they
//! promoted, but a check (`ROLE`) needs the data nodes' credentials and TLS settings, which the
//! caller has and this module does not; [`is_primary`] makes that check on a URL the caller
//! builds ([`super::topology_url::DataTemplate::primary_url`]). A client that writes to a demoted
//! primary anyway gets `READONLY` (`ErrorKind::ReadOnly`, retryable) and should resolve again.

use std::time::Duration;

use redis::Value;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::classify::{from_server_error, unexpected};
use super::url::redact_url;
use crate::error::{ConfigError, Error};
use crate::util::backoff::Backoff;

/// The channel Sentinels announce a new primary on.
const SWITCH_MASTER: &str = "+switch-master";
/// The request a reply to `SENTINEL get-master-addr-by-name` is reported against.
const GET_ADDR: &str = "SENTINEL get-master-addr-by-name";

/// What one Sentinel said about the service.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// The primary's address.
    Addr(String, u16),
    /// The Sentinel monitors no primary by that name (a nil reply).
    Unknown,
}

/// Asks the Sentinels, in order, for the address of the primary they monitor as `service`;
/// the first address wins. `timeout` bounds the connect and the reply of each Sentinel
/// separately (a dead Sentinel costs at most `2 × timeout`).
///
/// The address is what the Sentinel says; it is not checked on the node (see the
/// [module documentation](self), and [`is_primary`]).
///
/// # Errors
///
/// - [`Error::Config`] (field `service`) when no Sentinel named an address and at least one
///   answered that it monitors no primary by that name (a typo in the service name, or
///   Sentinels monitoring something else); the message names the service.
/// - [`Error::Connection`] when no Sentinel answered usefully (all unreachable, timed out, or
///   answering with errors or odd replies); the message says how many Sentinels were tried
///   and what each said (addresses redacted).
pub(crate) async fn resolve_primary(
    sentinels: &[String],
    service: &str,
    timeout: Duration,
) -> Result<(String, u16), Error> {
    let mut unknown = 0usize;
    let mut failures = Vec::new();
    let mut first_cause = None;
    for sentinel in sentinels {
        match ask(sentinel, service, timeout).await {
            Ok(Answer::Addr(host, port)) => return Ok((host, port)),
            Ok(Answer::Unknown) => unknown += 1,
            Err(err) => {
                failures.push(format!("{}: {err}", redact_url(sentinel)));
                if first_cause.is_none() {
                    first_cause = Some(err);
                }
            }
        }
    }
    if unknown > 0 {
        let mut why = format!(
            "{unknown} of the {} Sentinels asked monitor no primary named {service:?}",
            sentinels.len()
        );
        if !failures.is_empty() {
            why.push_str(&format!(
                " and {} did not answer ({})",
                failures.len(),
                failures.join("; ")
            ));
        }
        return Err(ConfigError::invalid("service", why).into());
    }
    let mut message = format!(
        "none of the {} Sentinels tried named the primary of {service:?}",
        sentinels.len()
    );
    if !failures.is_empty() {
        message.push_str(&format!(": {}", failures.join("; ")));
    }
    Err(Error::Connection {
        message,
        source: first_cause.map(|e| std::sync::Arc::new(e) as crate::error::Cause),
    })
}

/// Whether the node at `url` (a data node's URL, with its credentials) says it is a primary
/// (`ROLE` answers `master`). `timeout` bounds the connect and the reply separately.
///
/// # Errors
///
/// The connection's or the server's error (e.g. `Permission` for bad credentials), a timeout,
/// or [`Error::UnexpectedReply`] for a reply that is not a `ROLE` reply.
#[cfg_attr(not(test), allow(dead_code))] // the fixture tests check resolutions with it
pub(crate) async fn is_primary(url: &str, timeout: Duration) -> Result<bool, Error> {
    let mut conn = connect(url, timeout, "connecting to check ROLE").await?;
    let reply: Value =
        match tokio::time::timeout(timeout, redis::cmd("ROLE").query_async(&mut conn)).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::Timeout { during: "ROLE" }),
        };
    match &reply {
        Value::Array(items) => match items.first().and_then(text) {
            Some("master") => Ok(true),
            Some("slave") | Some("replica") | Some("sentinel") => Ok(false),
            _ => Err(unexpected("ROLE", &reply)),
        },
        _ => Err(unexpected("ROLE", &reply)),
    }
}

/// How [`watch_switch_master`] talks to the Sentinels.
#[derive(Debug, Clone)]
pub(crate) struct WatchSettings {
    /// Bounds each connect, each reply, and each `PING` of the subscribed connection.
    pub timeout: Duration,
    /// The cap of the backoff between two connection attempts (from 50 ms, doubling, jittered).
    pub max_backoff: Duration,
    /// How often the subscribed connection is pinged (a Sentinel that does not answer within
    /// `timeout` is left for the next one) and the Sentinels are asked again (see
    /// [`watch_switch_master`]).
    pub health_interval: Duration,
}

/// Spawns a task that follows the primary of `service` and returns the receiving end of what
/// it learns: `None` until the address is first known, then the latest `(host, port)`. The
/// value changes only when the address does.
///
/// The task subscribes to `+switch-master` on one Sentinel at a time, in order, and publishes
/// the new address of every message about `service` (`<service> <old-ip> <old-port> <new-ip>
/// <new-port>`; malformed messages and other services are ignored). When the connection fails,
/// cannot be opened or does not answer a `PING` in time, it moves on to the next Sentinel
/// after a backoff.
///
/// Messages published while no connection was subscribed are lost, so after every subscribe,
/// and every `health_interval`, the task asks all Sentinels ([`ask`]) and publishes their
/// answer **only if every Sentinel that named an address named the same one**. This departs
/// from [`resolve_primary`]'s "first answer wins" on purpose: just after a failover a Sentinel
/// that has not yet heard of it still names the old primary, and believing it would flip the
/// watcher back to a dead node that no later message would correct.
///
/// The task ends when `cancel` fires or every receiver is dropped (or at once if `sentinels`
/// is empty: the sender is dropped and the receiver sees the channel closed). Needs a Tokio
/// runtime (it is spawned with [`tokio::spawn`]).
pub(crate) fn watch_switch_master(
    sentinels: Vec<String>,
    service: String,
    settings: WatchSettings,
    cancel: CancellationToken,
) -> watch::Receiver<Option<(String, u16)>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(watch_task(sentinels, service, settings, cancel, tx));
    rx
}

async fn watch_task(
    sentinels: Vec<String>,
    service: String,
    settings: WatchSettings,
    cancel: CancellationToken,
    tx: watch::Sender<Option<(String, u16)>>,
) {
    if sentinels.is_empty() {
        return;
    }
    let mut backoff = Backoff::new(settings.max_backoff);
    for sentinel in sentinels.iter().cycle() {
        let err = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
            err = follow(sentinel, &sentinels, &service, &settings, &tx, &mut backoff) => err,
        };
        tracing::warn!(
            sentinel = %redact_url(sentinel),
            service = %service,
            error = %err,
            "Sentinel +switch-master subscription failed; trying the next Sentinel"
        );
        let delay = backoff.next_delay();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Follows `+switch-master` on one Sentinel until its connection fails; returns why.
async fn follow(
    sentinel: &str,
    sentinels: &[String],
    service: &str,
    settings: &WatchSettings,
    tx: &watch::Sender<Option<(String, u16)>>,
    backoff: &mut Backoff,
) -> Error {
    let client = match redis::Client::open(sentinel) {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    let mut pubsub = match tokio::time::timeout(settings.timeout, client.get_async_pubsub()).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return e.into(),
        Err(_) => {
            return Error::Timeout {
                during: "opening a pub/sub connection to a Sentinel",
            }
        }
    };
    match tokio::time::timeout(settings.timeout, pubsub.subscribe(SWITCH_MASTER)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return e.into(),
        Err(_) => {
            return Error::Timeout {
                during: "subscribing to +switch-master",
            }
        }
    }
    backoff.reset();
    let (mut sink, mut stream) = pubsub.split();
    // Subscribed: from here on no switch is missed, so read what may have been missed before.
    refresh(sentinels, service, settings.timeout, tx).await;
    let mut health = tokio::time::interval(settings.health_interval);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    health.tick().await; // the first tick is immediate
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                None => {
                    return Error::Connection {
                        message: "the Sentinel closed the pub/sub connection".into(),
                        source: None,
                    }
                }
                Some(msg) => {
                    let payload = String::from_utf8_lossy(msg.get_payload_bytes());
                    match parse_switch_master(&payload, service) {
                        Some(addr) => {
                            tracing::info!(
                                service = %service,
                                primary = %format!("{}:{}", addr.0, addr.1),
                                "Sentinel announced a new primary"
                            );
                            publish(tx, addr);
                        }
                        None => tracing::debug!(
                            payload = %crate::error::preview(&payload),
                            "+switch-master message ignored (another service, or malformed)"
                        ),
                    }
                }
            },
            _ = health.tick() => {
                match tokio::time::timeout(settings.timeout, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return e.into(),
                    Err(_) => return Error::Timeout { during: "PING on the Sentinel subscription" },
                }
                refresh(sentinels, service, settings.timeout, tx).await;
            }
        }
    }
}

/// Asks every Sentinel and publishes the address if all that named one agree (see
/// [`watch_switch_master`] for why not the first answer).
async fn refresh(
    sentinels: &[String],
    service: &str,
    timeout: Duration,
    tx: &watch::Sender<Option<(String, u16)>>,
) {
    let mut agreed: Option<(String, u16)> = None;
    for sentinel in sentinels {
        match ask(sentinel, service, timeout).await {
            Ok(Answer::Addr(host, port)) => match &agreed {
                None => agreed = Some((host, port)),
                Some(seen) if *seen == (host.clone(), port) => {}
                Some(_) => {
                    tracing::debug!(service = %service, "Sentinels disagree on the primary; keeping the last known one");
                    return;
                }
            },
            Ok(Answer::Unknown) => {}
            Err(err) => tracing::debug!(
                sentinel = %redact_url(sentinel),
                error = %err,
                "Sentinel did not answer"
            ),
        }
    }
    if let Some(addr) = agreed {
        publish(tx, addr);
    }
}

/// Publishes `addr` if it is not already the current value.
fn publish(tx: &watch::Sender<Option<(String, u16)>>, addr: (String, u16)) {
    tx.send_if_modified(|current| {
        if current.as_ref() == Some(&addr) {
            false
        } else {
            *current = Some(addr);
            true
        }
    });
}

/// The new address in a `+switch-master` payload about `service`
/// (`<service> <old-ip> <old-port> <new-ip> <new-port>`), or `None` for another service or
/// anything malformed.
fn parse_switch_master(payload: &str, service: &str) -> Option<(String, u16)> {
    let parts: Vec<&str> = payload.split_ascii_whitespace().collect();
    let [name, _old_ip, _old_port, new_ip, new_port] = parts.as_slice() else {
        return None;
    };
    if *name != service {
        return None;
    }
    let port = parse_port(new_port)?;
    Some(((*new_ip).to_string(), port))
}

/// A TCP port as Redis writes it: decimal digits, 1 to 65535.
fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&p| p != 0)
}

/// Asks one Sentinel for the primary of `service`.
async fn ask(sentinel: &str, service: &str, timeout: Duration) -> Result<Answer, Error> {
    let mut conn = connect(sentinel, timeout, "connecting to a Sentinel").await?;
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("get-master-addr-by-name").arg(service);
    let query = cmd.query_async::<Value>(&mut conn);
    let reply = match tokio::time::timeout(timeout, query).await {
        Ok(r) => r?,
        Err(_) => return Err(Error::Timeout { during: GET_ADDR }),
    };
    parse_addr_reply(&reply)
}

/// A reply to `SENTINEL get-master-addr-by-name`: nil, or `[host, port]`.
fn parse_addr_reply(reply: &Value) -> Result<Answer, Error> {
    match reply {
        Value::Nil => Ok(Answer::Unknown),
        Value::ServerError(err) => Err(from_server_error(err)),
        Value::Array(items) => {
            let [host, port] = items.as_slice() else {
                return Err(unexpected(GET_ADDR, reply));
            };
            let host = text(host).filter(|h| {
                !h.is_empty() && !h.chars().any(|c| c.is_whitespace() || c.is_control())
            });
            let port = match port {
                Value::Int(p) => u16::try_from(*p).ok().filter(|&p| p != 0),
                other => text(other).and_then(parse_port),
            };
            match (host, port) {
                (Some(host), Some(port)) => Ok(Answer::Addr(host.to_string(), port)),
                _ => Err(unexpected(GET_ADDR, reply)),
            }
        }
        _ => Err(unexpected(GET_ADDR, reply)),
    }
}

/// A string reply's text, if it is one and is UTF-8.
fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A short-lived multiplexed connection to `url`, connect and replies bounded by `timeout`.
async fn connect(
    url: &str,
    timeout: Duration,
    during: &'static str,
) -> Result<redis::aio::MultiplexedConnection, Error> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    match tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Timeout { during }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn switch_master_messages_are_parsed_defensively() {
        let svc = "baton-test";
        assert_eq!(
            parse_switch_master("baton-test 127.0.0.1 7000 127.0.0.1 7001", svc),
            Some(("127.0.0.1".into(), 7001))
        );
        assert_eq!(
            parse_switch_master("baton-test ::1 7000 ::1 7001", svc),
            Some(("::1".into(), 7001))
        );
        for odd in [
            "",
            "other 127.0.0.1 7000 127.0.0.1 7001",
            "baton-test-2 127.0.0.1 7000 127.0.0.1 7001",
            "baton-test 127.0.0.1 7000 127.0.0.1",
            "baton-test 127.0.0.1 7000 127.0.0.1 7001 extra",
            "baton-test 127.0.0.1 7000 127.0.0.1 0",
            "baton-test 127.0.0.1 7000 127.0.0.1 70000",
            "baton-test 127.0.0.1 7000 127.0.0.1 +7001",
            "baton-test 127.0.0.1 7000 127.0.0.1 x",
        ] {
            assert_eq!(parse_switch_master(odd, svc), None, "{odd:?}");
        }
    }

    #[test]
    fn addr_replies_are_parsed_defensively() {
        assert_eq!(
            parse_addr_reply(&Value::Array(vec![bulk("10.0.0.1"), bulk("6380")])).ok(),
            Some(Answer::Addr("10.0.0.1".into(), 6380))
        );
        assert_eq!(
            parse_addr_reply(&Value::Array(vec![bulk("h"), Value::Int(6380)])).ok(),
            Some(Answer::Addr("h".into(), 6380))
        );
        assert_eq!(parse_addr_reply(&Value::Nil).ok(), Some(Answer::Unknown));
        for odd in [
            Value::Array(vec![]),
            Value::Array(vec![bulk("h")]),
            Value::Array(vec![bulk("h"), bulk("1"), bulk("2")]),
            Value::Array(vec![bulk(""), bulk("6379")]),
            Value::Array(vec![bulk("a b"), bulk("6379")]),
            Value::Array(vec![bulk("h"), bulk("0")]),
            Value::Array(vec![bulk("h"), bulk("65536")]),
            Value::Array(vec![bulk("h"), Value::Int(-1)]),
            Value::Array(vec![Value::BulkString(vec![0xff]), bulk("1")]),
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Int(3),
            bulk("127.0.0.1:6379"),
        ] {
            let e = parse_addr_reply(&odd).expect_err("an odd reply");
            assert_eq!(e.kind(), ErrorKind::UnexpectedReply, "{odd:?}: {e}");
        }
    }

    /// A loopback port nobody listens on (bound, then released).
    fn dead_sentinel() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("its address").port();
        drop(listener);
        format!("redis://127.0.0.1:{port}/")
    }

    #[tokio::test]
    async fn no_reachable_sentinel_is_a_connection_error_naming_how_many_were_tried() {
        let sentinels = vec![dead_sentinel(), dead_sentinel(), dead_sentinel()];
        let err = resolve_primary(&sentinels, "svc", Duration::from_millis(500))
            .await
            .expect_err("nothing listens");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        let message = err.to_string();
        assert!(message.contains("none of the 3 Sentinels"), "{message}");
        assert!(message.contains("\"svc\""), "{message}");
        assert!(std::error::Error::source(&err).is_some());

        let err = resolve_primary(&[], "svc", Duration::from_millis(500))
            .await
            .expect_err("no Sentinel at all");
        assert!(err.to_string().contains("none of the 0 Sentinels"), "{err}");
    }

    #[tokio::test]
    async fn a_watcher_without_sentinels_closes_its_channel() {
        let mut rx = watch_switch_master(
            Vec::new(),
            "svc".into(),
            WatchSettings {
                timeout: Duration::from_millis(200),
                max_backoff: Duration::from_millis(200),
                health_interval: Duration::from_secs(1),
            },
            CancellationToken::new(),
        );
        let changed = tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("the task ends at once");
        assert!(changed.is_err(), "the sender is gone");
        assert_eq!(*rx.borrow(), None);
    }
}

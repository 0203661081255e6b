//! Errors: one crate [`Error`] for everything that happens at run time, and
//! [`ConfigError`] for what `build()` rejects before any network I/O.
//!
//! Retry classification lives in one place, [`Error::is_retryable`], so the worker
//! task, the closure form and users all agree on what is worth another try.

use serde::{Deserialize, Serialize};

/// A configuration value that `build()` (or deserialization) rejected.
///
/// Returned before any network I/O; the message names the field and the valid range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting is outside its valid range.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The setting's name, as in the configuration table.
        field: &'static str,
        /// Why it was rejected, with the valid range.
        reason: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// The error an [`Error`] was made from (the client library's), kept so that
/// [`std::error::Error::source`] walks the whole chain. Its concrete type is not part of
/// baton's API.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// The stable, serializable classification of an [`Error`]; this is what `Error` events carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Invalid configuration.
    Config,
    /// Redis could not be reached, or the connection dropped.
    Connection,
    /// Redis did not answer in time; the outcome of the request is unknown.
    Timeout,
    /// A key of the job holds a value baton never writes.
    CorruptState,
    /// A key of the job holds a Redis type other than a string.
    WrongType,
    /// The lease key has no TTL (a foreign write); baton never makes a key persistent.
    NoExpiry,
    /// The job's state vanished or went back after this worker had seen it.
    StateLost,
    /// A lease is no longer held: a failover attempt, a lock, a leader's term.
    LeaseLost,
    /// `done()` or `fail()` was already called on this attempt.
    AttemptEnded,
    /// `done()` could not find out whether its `DONE` was recorded (its reply was lost and
    /// nothing read back afterwards tells): the job may or may not be `DONE`. Not retryable.
    OutcomeUnknown,
    /// The server refused writes (a replica, or a demoted primary).
    ReadOnly,
    /// The server is loading its data set or asked to try again later (`LOADING`, `BUSY`,
    /// `TRYAGAIN` during a slot migration, `CLUSTERDOWN`, `MASTERDOWN`). Nothing was written.
    Busy,
    /// A cluster node answered that the key's slot is served by another node (`MOVED`) or is
    /// being migrated to one (`ASK`): baton refreshes its slot map and looks again. Nothing was
    /// written on the node that refused.
    Moved,
    /// The server is out of memory (`maxmemory` with `noeviction`); nothing was written.
    Oom,
    /// The server denied the command (ACL) or the credentials.
    Permission,
    /// The server rejects this configuration: an unknown PostgreSQL database, a Redis
    /// database index out of range, baton's PostgreSQL tables missing where this role may not
    /// create them (run `baton migrate`). Not retryable: an operator must change something.
    Misconfigured,
    /// The TLS handshake failed (unknown issuer, a name not in the certificate, a missing client
    /// certificate, a server that does not speak TLS). Never retried without TLS.
    Tls,
    /// The URL names a server that does not speak Redis' protocol (an HTTP server, an SSH
    /// daemon, …): see [`Error::NotRedis`]. Not retryable: the URL must change.
    NotRedis,
    /// Redis returned a reply baton did not expect.
    UnexpectedReply,
    /// Another server-side error.
    Server,
    /// The worker or client was stopped.
    Stopped,
    /// A lock was not acquired within the caller's bound (a number of tries or a wait): it was
    /// held by someone else all along. Not a connection problem.
    NotAcquired,
    /// A Redlock could not reach its quorum because too many masters were down or erroring
    /// (not because the lock was held elsewhere). Retryable.
    QuorumUnavailable,
    /// A write that asked for replica acknowledgement (`WAIT`) was confirmed by fewer replicas
    /// than required in time: it is on the primary, but a failover now could lose it.
    /// Retryable (replicas catch up); see each primitive for what it did with the write.
    NotReplicated,
    /// A fair lock's priority reservation could not be taken because another contender holds
    /// it, or the caller's own reservation was gone before its turn came. Not retryable as is.
    Reserved,
    /// The operation is not available on this client's backend (see [`Error::Unsupported`]).
    Unsupported,
}

/// Everything that can go wrong at run time.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Invalid configuration (see [`ConfigError`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server (Redis or PostgreSQL) could not be reached, or the connection dropped
    /// mid-request.
    #[error("connection failed: {message}")]
    Connection {
        /// What the client library reported.
        message: String,
        /// The client library's error, for the source chain.
        source: Option<Cause>,
    },
    /// The TLS handshake failed: the server's certificate is not signed by a trusted CA or does
    /// not name the host, or the server wants a client certificate. Never retried, and never
    /// retried without TLS.
    #[error("TLS handshake failed: {message}")]
    Tls {
        /// What rustls reported (e.g. `invalid peer certificate: UnknownIssuer`).
        message: String,
        /// The client library's error, for the source chain.
        source: Option<Cause>,
    },
    /// The server at a `redis://` URL (or a Cluster seed, a Sentinel) answered with something
    /// that is not Redis' protocol: another service listens there. `reply` shows the start of
    /// what it answered to a plain `PING` sent on a connection of its own (no credentials on
    /// it), printable and bounded, e.g. `"HTTP/1.1 400 Bad Request…"`. Not retryable.
    #[error("{server} is not a Redis server (it answered {reply})")]
    NotRedis {
        /// The server's address, `host:port` or a socket's path (never credentials).
        server: String,
        /// The start of the server's answer, escaped and shortened, in quotes.
        reply: String,
    },
    /// Redis did not answer within the response timeout.
    #[error("the server did not answer in time while {during}")]
    Timeout {
        /// The step that timed out.
        during: &'static str,
    },
    /// A key of the job holds a value that baton never writes; it is left untouched.
    #[error("key `{key}` holds {value}, which baton never writes; it is left untouched")]
    CorruptState {
        /// The Redis key.
        key: String,
        /// A printable, shortened rendering of the stored value.
        value: String,
    },
    /// A key of the job holds a non-string Redis type.
    #[error("key `{key}` holds the wrong Redis type ({detail}); it is left untouched")]
    WrongType {
        /// The Redis key.
        key: String,
        /// The server's message.
        detail: String,
    },
    /// The lease key exists without a TTL, so it would never expire.
    #[error("lease key `{key}` has no TTL (written by someone else?); re-checking every lease")]
    NoExpiry {
        /// The Redis key.
        key: String,
    },
    /// The job's state vanished or went back after this worker had seen it (Redis lost data).
    #[error("state of `{key}` was lost: this worker saw {seen}, Redis now has {now}")]
    StateLost {
        /// The state key.
        key: String,
        /// What this worker had seen.
        seen: String,
        /// What Redis holds now.
        now: String,
    },
    /// A lease this process held is no longer (or may no longer be) held: a failover attempt,
    /// a lock (mutex, fair lock, Redlock, advisory lock), a leader's term or a queue's hold. An
    /// extension found another token, no extension was confirmed before the lease could end,
    /// or (advisory) the session that held the lock ended.
    #[error("{}", lease_lost_message(.key, *.attempt, *.fencing_token, .reason))]
    LeaseLost {
        /// The failover job's state key, or the lock's key.
        key: String,
        /// The failover attempt that was lost; 0 for a lock (locks have no attempts).
        attempt: u64,
        /// The fencing token of the lost grant, when the primitive has one (Redlock does not)
        /// and it was at hand.
        fencing_token: Option<u64>,
        /// Why.
        reason: String,
    },
    /// `done()` or `fail()` was already called for this attempt (through a clone of the handle).
    #[error("attempt {attempt} of `{key}` was already ended")]
    AttemptEnded {
        /// The state key.
        key: String,
        /// The attempt.
        attempt: u64,
    },
    /// `done()` sent its `DONE` but could not learn whether it was recorded: the reply was lost
    /// and what was read back afterwards belongs to nobody's grant in particular (the job may
    /// be `DONE` by this attempt, or not at all), or the lease deadline came first.
    #[error("the outcome of attempt {attempt} of `{key}` is unknown (the job may or may not be DONE): {reason}")]
    OutcomeUnknown {
        /// The state key.
        key: String,
        /// The attempt.
        attempt: u64,
        /// Why it cannot be known.
        reason: String,
    },
    /// A Redis server error.
    #[error("redis error {code}: {message}")]
    Redis {
        /// The classification.
        kind: ErrorKind,
        /// The server's error code (`ERR`, `READONLY`, `NOPERM`, ...).
        code: String,
        /// The server's message.
        message: String,
        /// The client library's error, when there was one, for the source chain.
        source: Option<Cause>,
    },
    /// A PostgreSQL server error (feature `postgres`).
    #[error("PostgreSQL error {code}: {message}")]
    Postgres {
        /// The classification (by SQLSTATE).
        kind: ErrorKind,
        /// The SQLSTATE (`40001`, `57P01`, ...).
        code: String,
        /// The server's message.
        message: String,
        /// The driver's error, for the source chain.
        source: Option<Cause>,
    },
    /// The operation needs another backend: e.g. the fair lock, run-or-enqueue and Redlock on a
    /// `postgres://` client, or advisory locks on a Redis client.
    #[error("{what} is not available on {backend}: {why}")]
    Unsupported {
        /// The primitive or operation.
        what: &'static str,
        /// The client's backend (`Redis`, `PostgreSQL`).
        backend: &'static str,
        /// Why, and what to use instead.
        why: &'static str,
    },
    /// Redis returned a reply baton did not expect.
    #[error("unexpected reply to {context}: {reply}")]
    UnexpectedReply {
        /// Which request.
        context: &'static str,
        /// A printable rendering of the reply.
        reply: String,
    },
    /// The worker or client was stopped before the request completed.
    #[error("stopped")]
    Stopped,
    /// A lock stayed held by someone else until the caller's bound (tries or wait) ran out.
    #[error("lock `{key}` was not acquired in time ({tries} {} in {waited:?})", if *tries == 1 { "try" } else { "tries" })]
    NotAcquired {
        /// The lock key.
        key: String,
        /// How many acquisition scripts were sent.
        tries: u32,
        /// How long the caller waited.
        waited: std::time::Duration,
    },
    /// Too many Redlock masters were down or erroring to ever reach the quorum: the lock was
    /// not acquired (and was released on every master in case a lost reply had set it).
    /// Contention is never this error (it is `Ok(None)` or [`Error::NotAcquired`]).
    #[error("Redlock `{key}`: quorum unavailable, {reachable} of {masters} masters answered and {needed} are needed: {errors}")]
    QuorumUnavailable {
        /// The lock key.
        key: String,
        /// The quorum: `masters / 2 + 1`.
        needed: usize,
        /// How many masters answered (whatever they answered).
        reachable: usize,
        /// How many masters the Redlock has.
        masters: usize,
        /// What went wrong on the others, one `master i (host:port/db): error` per failed
        /// master (never credentials).
        errors: String,
    },
    /// Fewer replicas than required acknowledged a write within the `WAIT` timeout.
    #[error(
        "{what} of {key}: only {acked} of {wanted} replicas acknowledged it within {timeout:?} \
         (it is on the primary, but a failover now could lose it)"
    )]
    NotReplicated {
        /// What was written: `"the grant of attempt 3"`, `"DONE"`, `"the lock"`.
        what: String,
        /// The job or lock key.
        key: String,
        /// How many replicas acknowledged it.
        acked: u64,
        /// How many were required.
        wanted: u32,
        /// The `WAIT` timeout.
        timeout: std::time::Duration,
    },
    /// A fair lock's priority reservation ("I go next") is held by another contender, so this
    /// one could not be taken; or the caller's own reservation expired (its lifetime ran out)
    /// or was dropped before the lock was granted to it.
    #[error("fair lock `{key}`: {reason}")]
    Reserved {
        /// The reservation key.
        key: String,
        /// What happened, e.g. "another contender holds the reservation".
        reason: String,
    },
    /// A terminal error the worker reported as an `Error` event (used by the closure form).
    #[error("{message}")]
    Reported {
        /// Its classification.
        kind: ErrorKind,
        /// Its message.
        message: String,
    },
}

impl Error {
    /// A lost lock: `LeaseLost` with no attempt (locks have none).
    pub(crate) fn lock_lost(
        key: impl Into<String>,
        fencing_token: Option<u64>,
        reason: impl Into<String>,
    ) -> Self {
        Error::LeaseLost {
            key: key.into(),
            attempt: 0,
            fencing_token,
            reason: reason.into(),
        }
    }

    /// The stable classification of this error (what `Error` events carry).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config(_) => ErrorKind::Config,
            Error::Connection { .. } => ErrorKind::Connection,
            Error::Tls { .. } => ErrorKind::Tls,
            Error::NotRedis { .. } => ErrorKind::NotRedis,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::CorruptState { .. } => ErrorKind::CorruptState,
            Error::WrongType { .. } => ErrorKind::WrongType,
            Error::NoExpiry { .. } => ErrorKind::NoExpiry,
            Error::StateLost { .. } => ErrorKind::StateLost,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::AttemptEnded { .. } => ErrorKind::AttemptEnded,
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::Redis { kind, .. } => *kind,
            Error::Postgres { kind, .. } => *kind,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::UnexpectedReply { .. } => ErrorKind::UnexpectedReply,
            Error::Stopped => ErrorKind::Stopped,
            Error::NotAcquired { .. } => ErrorKind::NotAcquired,
            Error::QuorumUnavailable { .. } => ErrorKind::QuorumUnavailable,
            Error::NotReplicated { .. } => ErrorKind::NotReplicated,
            Error::Reserved { .. } => ErrorKind::Reserved,
            Error::Reported { kind, .. } => *kind,
        }
    }

    /// Whether trying again later may succeed.
    ///
    /// Transient conditions (connection trouble, timeouts, a loading or read-only server, a lease
    /// without TTL that someone may fix) are retryable; corrupt data, lost state, a lost lease and
    /// configuration errors are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Connection
                | ErrorKind::Timeout
                | ErrorKind::ReadOnly
                | ErrorKind::Busy
                | ErrorKind::Moved
                | ErrorKind::Oom
                | ErrorKind::NoExpiry
                | ErrorKind::QuorumUnavailable
                | ErrorKind::NotReplicated
        )
    }

    /// Whether a write may or may not have been applied (the reply was lost).
    pub(crate) fn is_indeterminate(&self) -> bool {
        matches!(self.kind(), ErrorKind::Connection | ErrorKind::Timeout)
    }
}

/// `attempt 3 of `k` is no longer held: …` for a failover attempt, `lock `k` (fencing token
/// 7) is no longer held: …` for a lock.
fn lease_lost_message(key: &str, attempt: u64, fencing_token: Option<u64>, reason: &str) -> String {
    let what = if attempt == 0 {
        format!("lock `{key}`")
    } else {
        format!("attempt {attempt} of `{key}`")
    };
    match fencing_token {
        Some(t) => format!("{what} (fencing token {t}) is no longer held: {reason}"),
        None => format!("{what} is no longer held: {reason}"),
    }
}

/// An error as JSON: `{"kind": "LeaseLost", "message": "…", "retryable": false}`. The message is
/// the `Display` text, which never holds a credential or a full lock token; the source chain is
/// left out (its types are not baton's API).
impl Serialize for Error {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Error", 3)?;
        s.serialize_field("kind", &self.kind())?;
        s.serialize_field("message", &self.to_string())?;
        s.serialize_field("retryable", &self.is_retryable())?;
        s.end()
    }
}

/// A printable, bounded rendering of a stored value for error messages (values may be huge or
/// binary; an error message must stay readable and must not echo megabytes).
pub(crate) fn preview(raw: &str) -> String {
    const MAX: usize = 64;
    let mut out = String::new();
    for (i, c) in raw.chars().enumerate() {
        if i == MAX {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    format!("\"{out}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        assert!(Error::Connection {
            message: "x".into(),
            source: None,
        }
        .is_retryable());
        assert!(!Error::CorruptState {
            key: "k".into(),
            value: "v".into()
        }
        .is_retryable());
        assert!(!Error::Stopped.is_retryable());
    }

    #[test]
    fn tls_is_its_own_kind_and_not_retryable() {
        let e = Error::Tls {
            message: "invalid peer certificate: UnknownIssuer".into(),
            source: None,
        };
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert!(!e.is_retryable());
        assert!(!e.is_indeterminate());
    }

    #[test]
    fn errors_serialize_as_kind_message_and_retryable() {
        let lost = Error::lock_lost("k", Some(7), "an extension found another token");
        assert_eq!(
            serde_json::to_value(&lost).unwrap(),
            serde_json::json!({
                "kind": "LeaseLost",
                "message": "lock `k` (fencing token 7) is no longer held: an extension found another token",
                "retryable": false,
            })
        );
        let timeout = Error::Timeout { during: "x" };
        assert_eq!(
            serde_json::to_value(&timeout).unwrap(),
            serde_json::json!({
                "kind": "Timeout",
                "message": "the server did not answer in time while x",
                "retryable": true,
            })
        );
        assert_eq!(
            serde_json::to_string(&ErrorKind::LeaseLost).unwrap(),
            r#""LeaseLost""#
        );
    }

    #[test]
    fn lost_leases_say_what_was_lost() {
        let attempt = Error::LeaseLost {
            key: "baton:{j}:state".into(),
            attempt: 3,
            fencing_token: None,
            reason: "gone".into(),
        };
        assert_eq!(
            attempt.to_string(),
            "attempt 3 of `baton:{j}:state` is no longer held: gone"
        );
        assert_eq!(
            Error::lock_lost("r", None, "no quorum").to_string(),
            "lock `r` is no longer held: no quorum"
        );
        assert_eq!(attempt.kind(), ErrorKind::LeaseLost);
    }

    #[test]
    fn preview_is_bounded_and_escaped() {
        let p = preview(&"a".repeat(1000));
        assert!(p.chars().count() < 80);
        assert_eq!(preview("DONE\0"), "\"DONE\\0\"");
    }
}

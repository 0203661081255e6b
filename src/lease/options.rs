//! [`LockOptions`]: how a lock-shaped primitive (the mutex, the fair lock, Redlock, the advisory
//! lock) waits for its lock and what the guard does while held. One type for all four, validated
//! by [`LockOptionsBuilder::build`] and by deserialization alike, never coerced.
//!
//! Most fields mean the same on every primitive. A few belong to one of them
//! (`replica_ack`: the mutex on Redis; `waiter_timeout`: the fair lock; `heartbeat`: the advisory
//! lock); a primitive that cannot honour a field that was set refuses the call with
//! [`Error::Unsupported`] naming the field, rather than ignoring it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Error};
use crate::util::settings::ReplicaWait;
use crate::util::time::ms;

/// The default cap of the backoff between tries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The shortest fair-lock waiter timeout and reservation lifetime.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(30);
/// The longest fair-lock waiter timeout and reservation lifetime.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The default fair-lock waiter timeout.
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default interval of an advisory session guard's heartbeat (`SELECT 1` on its connection).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// The shortest heartbeat interval accepted.
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// The longest heartbeat interval accepted.
pub const MAX_HEARTBEAT: Duration = Duration::from_secs(3600);

/// Checks a fair-lock waiter timeout or a reservation lifetime: 30 ms ..= 1 h.
pub(crate) fn validate_timeout(field: &'static str, d: Duration) -> Result<(), ConfigError> {
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&d) {
        return Err(ConfigError::invalid(
            field,
            format!("{d:?} is outside 30ms ..= 1 h"),
        ));
    }
    Ok(())
}

/// A mutex holder's name: 1..=1024 bytes, not blank, no control characters (it is printed).
fn check_holder_name(name: &str) -> Result<(), ConfigError> {
    let max = crate::util::names::MAX_NAME_BYTES;
    if name.is_empty() || name.len() > max {
        return Err(ConfigError::invalid(
            "holder_name",
            format!("must be 1..={max} bytes, got {}", name.len()),
        ));
    }
    if name.trim().is_empty() {
        return Err(ConfigError::invalid("holder_name", "must not be blank"));
    }
    if name.chars().any(char::is_control) {
        return Err(ConfigError::invalid(
            "holder_name",
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// One field of [`LockOptions`], for a primitive to say which ones it honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    MaxTries,
    MaxBackoff,
    Watchdog,
    MaxHold,
    ReplicaAck,
    WaiterTimeout,
    Heartbeat,
    HolderName,
    Fair,
}

impl Field {
    /// The field's name (as in the error) and why a primitive that refuses it does.
    fn refusal(self) -> (&'static str, &'static str) {
        match self {
            Field::MaxTries => (
                "the option `max_tries`",
                "the server queues the waiter and nothing retries; bound the wait with `wait`",
            ),
            Field::MaxBackoff => (
                "the option `max_backoff`",
                "the server queues the waiter and nothing retries; leave it unset",
            ),
            Field::Watchdog => (
                "the option `watchdog`",
                "a session lock has no lease to extend (its heartbeat watches the session); \
                 leave it off",
            ),
            Field::MaxHold => (
                "the option `max_hold`",
                "a session lock has no lease and no watchdog to cap; leave it unset",
            ),
            Field::ReplicaAck => (
                "the option `replica_ack`",
                "only the mutex's grants wait for replicas (`WAIT`); leave it unset",
            ),
            Field::WaiterTimeout => (
                "the option `waiter_timeout`",
                "only the fair lock keeps a queue of waiters; leave it unset",
            ),
            Field::Heartbeat => (
                "the option `heartbeat`",
                "only an advisory session lock has a heartbeat; leave it unset",
            ),
            Field::HolderName => (
                "the option `holder_name`",
                "only the mutex stores a holder's name; leave it unset",
            ),
            Field::Fair => (
                "the option `fair`",
                "only the semaphore's waiters take a place in a queue on request (the fair \
                 lock's always do: use `FairLocks` for a FIFO mutex); leave it unset",
            ),
        }
    }
}

/// How a lock-shaped primitive waits for its lock, and what the guard does while held: the
/// options of [`Locks::acquire`](crate::Locks::acquire),
/// [`FairLocks::acquire`](crate::FairLocks::acquire), [`Redlock::acquire`](crate::Redlock::acquire)
/// and the advisory lock's `acquire`, and of their `with_lock`.
///
/// Build it with [`LockOptions::builder`] or deserialize it (durations in milliseconds, e.g.
/// `{"wait_ms":10000,"watchdog":true}`); both run the same validation. The default waits
/// forever, with no watchdog.
///
/// A field only one primitive uses (`replica_ack`, `waiter_timeout`, `heartbeat`), or one a
/// primitive cannot honour (the advisory lock has no retries and no lease), makes the other
/// primitives' calls fail with [`Error::Unsupported`](crate::Error::Unsupported) naming it when
/// it is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawOptions", into = "RawOptions")]
pub struct LockOptions {
    pub(crate) wait: Option<Duration>,
    pub(crate) max_tries: Option<u32>,
    pub(crate) max_backoff: Option<Duration>,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) replica_ack: Option<ReplicaWait>,
    pub(crate) waiter_timeout: Option<Duration>,
    pub(crate) heartbeat: Option<Duration>,
    pub(crate) holder_name: Option<String>,
    pub(crate) fair: bool,
}

impl LockOptions {
    /// Starts from the defaults.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder {
            opts: LockOptions::default(),
            replica_ack: (0, None),
        }
    }

    /// How long to wait for the lock at most (`None`: forever).
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// How many tries at most (`None`: no limit).
    pub fn max_tries(&self) -> Option<u32> {
        self.max_tries
    }

    /// The cap of the exponential backoff between tries.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff.unwrap_or(DEFAULT_MAX_BACKOFF)
    }

    /// Whether the guard starts with a watchdog.
    pub fn watchdog(&self) -> bool {
        self.watchdog
    }

    /// The cap on the total hold time with the watchdog (`None`: no cap).
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The replica acknowledgement each mutex grant waits for: `(replicas, timeout)`.
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.replica_ack.map(|w| (w.replicas, w.timeout))
    }

    /// How long a queued waiter (the fair lock's, a fair semaphore's) that stops refreshing its
    /// place (a dead process) keeps it.
    pub fn waiter_timeout(&self) -> Duration {
        self.waiter_timeout.unwrap_or(DEFAULT_WAITER_TIMEOUT)
    }

    /// The interval of an advisory session guard's heartbeat.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat.unwrap_or(DEFAULT_HEARTBEAT)
    }

    /// The mutex holder's name, stored after the random part of its token (see
    /// [`LockOptionsBuilder::holder_name`]).
    pub fn holder_name(&self) -> Option<&str> {
        self.holder_name.as_deref()
    }

    /// Whether waiters are granted in the order the server first saw them (see
    /// [`LockOptionsBuilder::fair`]).
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// The same options with the watchdog on (what every `with_lock` runs with).
    pub(crate) fn with_watchdog(mut self) -> Self {
        self.watchdog = true;
        self
    }

    /// Refuses the call when a field outside `honoured` was set: `primitive` ("the fair lock")
    /// cannot honour it, and ignoring it would silently do something else than asked.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first such field.
    pub(crate) fn refuse_others(
        &self,
        primitive: &'static str,
        honoured: &[Field],
    ) -> Result<(), Error> {
        let set = [
            (Field::MaxTries, self.max_tries.is_some()),
            (Field::MaxBackoff, self.max_backoff.is_some()),
            (Field::Watchdog, self.watchdog),
            (Field::MaxHold, self.max_hold.is_some()),
            (Field::ReplicaAck, self.replica_ack.is_some()),
            (Field::WaiterTimeout, self.waiter_timeout.is_some()),
            (Field::Heartbeat, self.heartbeat.is_some()),
            (Field::HolderName, self.holder_name.is_some()),
            (Field::Fair, self.fair),
        ];
        match set.into_iter().find(|(f, on)| *on && !honoured.contains(f)) {
            Some((f, _)) => {
                let (what, why) = f.refusal();
                Err(Error::Unsupported {
                    what,
                    backend: primitive,
                    why,
                })
            }
            None => Ok(()),
        }
    }
}

/// The serialized shape of [`LockOptions`]: plain fields with defaults, durations in ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawOptions {
    wait_ms: Option<u64>,
    max_tries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_backoff_ms: Option<u64>,
    watchdog: bool,
    max_hold_ms: Option<u64>,
    /// 0: no replica acknowledgement.
    #[serde(skip_serializing_if = "is_zero")]
    replica_ack: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica_ack_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiter_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeat_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder_name: Option<String>,
    #[serde(skip_serializing_if = "is_false")]
    fair: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions::from(LockOptions::default())
    }
}

impl From<LockOptions> for RawOptions {
    fn from(o: LockOptions) -> Self {
        RawOptions {
            wait_ms: o.wait.map(ms),
            max_tries: o.max_tries,
            max_backoff_ms: o.max_backoff.map(ms),
            watchdog: o.watchdog,
            max_hold_ms: o.max_hold.map(ms),
            replica_ack: o.replica_ack.map_or(0, |w| w.replicas),
            replica_ack_timeout_ms: o.replica_ack.map(|w| ms(w.timeout)),
            waiter_timeout_ms: o.waiter_timeout.map(ms),
            heartbeat_ms: o.heartbeat.map(ms),
            holder_name: o.holder_name,
            fair: o.fair,
        }
    }
}

impl TryFrom<RawOptions> for LockOptions {
    type Error = ConfigError;
    fn try_from(r: RawOptions) -> Result<Self, ConfigError> {
        let d = |v: Option<u64>| v.map(Duration::from_millis);
        LockOptionsBuilder {
            opts: LockOptions {
                wait: d(r.wait_ms),
                max_tries: r.max_tries,
                max_backoff: d(r.max_backoff_ms),
                watchdog: r.watchdog,
                max_hold: d(r.max_hold_ms),
                replica_ack: None,
                waiter_timeout: d(r.waiter_timeout_ms),
                heartbeat: d(r.heartbeat_ms),
                holder_name: r.holder_name,
                fair: r.fair,
            },
            replica_ack: (r.replica_ack, d(r.replica_ack_timeout_ms)),
        }
        .build()
    }
}

/// Builder of [`LockOptions`]. Keeps durations as given (the serialized form is in whole
/// milliseconds).
#[derive(Debug, Clone)]
pub struct LockOptionsBuilder {
    opts: LockOptions,
    /// `replica_ack` as given: replicas (0: off) and the timeout.
    replica_ack: (u32, Option<Duration>),
}

impl LockOptionsBuilder {
    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after waiting this long
    /// (`Duration::ZERO`: one try; the advisory lock needs at least 1 ms, its server-side
    /// `lock_timeout`). Defaults to waiting forever.
    pub fn wait(mut self, d: Duration) -> Self {
        self.opts.wait = Some(d);
        self
    }

    /// Gives up with [`Error::NotAcquired`](crate::Error::NotAcquired) after this many tries
    /// (1 ..= 2^32−1). Not on the advisory lock (the server queues its waiter). Defaults to no
    /// limit.
    pub fn max_tries(mut self, n: u32) -> Self {
        self.opts.max_tries = Some(n);
        self
    }

    /// The cap of the exponential backoff (with full jitter, from 50 ms) between tries, 1 ms
    /// ..= 1 min; a release or the holder's lease running out wakes a waiter earlier (the fair
    /// lock backs off after transient errors only: a release wakes its next waiter). Not on the
    /// advisory lock. Defaults to 1 s.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.opts.max_backoff = Some(d);
        self
    }

    /// Starts the guard's watchdog (see [`LeaseGuard::start_watchdog`](crate::LeaseGuard::start_watchdog)).
    /// `with_lock` always turns it on. Not on the advisory lock (no lease). Defaults to off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.opts.watchdog = on;
        self
    }

    /// With the watchdog, stops extending once the lock was held this long and fires the loss
    /// signal then. Must exceed 0. Not on the advisory lock. Defaults to no cap.
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.opts.max_hold = Some(d);
        self
    }

    /// The mutex's replica acknowledgement: each acquisition's script is followed, on the same
    /// dedicated connection and in the same round trip, by `WAIT replicas timeout`. `replicas`
    /// 0 switches it off (the default); 1 ..= 100 replicas, timeout 1 ms ..= 1 min, and at most
    /// half the lock's lease (checked when acquiring) and three quarters of the client's
    /// response timeout (applied when sent).
    ///
    /// A grant fewer replicas acknowledged is never returned: the lock is released by token
    /// and the acquisition fails with [`Error::NotReplicated`](crate::Error::NotReplicated)
    /// (not retried). `WAIT` narrows the window in which a granted lock can be lost to a
    /// failover; it does not close it (replication stays asynchronous).
    ///
    /// The mutex on Redis only: on a PostgreSQL client, and on the other primitives, an
    /// acquisition with it is [`Error::Unsupported`](crate::Error::Unsupported) (on PostgreSQL,
    /// configure synchronous replication on the server instead). Defaults to off.
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = (replicas, Some(timeout));
        self
    }

    /// The fair lock's waiter timeout: how long a waiter keeps its place without refreshing
    /// it, 30 ms ..= 1 h. It refreshes every third of it while it waits, so only a dead (or
    /// stalled) waiter loses its place, and a dead head delays the queue by at most this much.
    /// The fair lock, and the semaphore with [`LockOptionsBuilder::fair`]. Defaults to 10 s.
    pub fn waiter_timeout(mut self, d: Duration) -> Self {
        self.opts.waiter_timeout = Some(d);
        self
    }

    /// The advisory session guard's heartbeat interval ([`MIN_HEARTBEAT`] ..=
    /// [`MAX_HEARTBEAT`]). The advisory lock only. Defaults to [`DEFAULT_HEARTBEAT`] (1 s).
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.opts.heartbeat = Some(d);
        self
    }

    /// The mutex holder's name (e.g. `host:pid`), 1..=1024 bytes, not blank, no control
    /// characters. The mutex stores it after the random part of the holder's token
    /// (`TOKEN:NAME` under the lock's key, or in its row), as an election stores its leader's
    /// name, so that whoever reads the lock sees who holds it; the token stays unique, and
    /// release and extension compare it whole. The mutex only. Defaults to none: the token alone.
    pub fn holder_name(mut self, name: impl Into<String>) -> Self {
        self.opts.holder_name = Some(name.into());
        self
    }

    /// Waiters are granted in the order the server first saw them (FIFO across every client),
    /// and nobody else is granted ahead of them: each waiter keeps a place in the
    /// semaphore's queue, refreshed every third of [`LockOptionsBuilder::waiter_timeout`] while
    /// it waits, so a dead waiter delays the line by at most that timeout. The semaphore only
    /// (the fair lock is always FIFO). Defaults to off: a free permit goes to whichever try
    /// comes first, and within one client waiters go in the order they asked.
    pub fn fair(mut self, on: bool) -> Self {
        self.opts.fair = on;
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field out of range.
    pub fn build(self) -> Result<LockOptions, ConfigError> {
        let mut o = self.opts;
        crate::lease::check_waiting(o.wait, o.max_tries, o.max_backoff(), o.max_hold)?;
        o.replica_ack = match self.replica_ack {
            (0, _) => None,
            (n, _) if n > 100 => {
                return Err(ConfigError::invalid(
                    "replica_ack",
                    format!("{n} replicas is outside 0 ..= 100"),
                ))
            }
            (replicas, timeout) => {
                let timeout = timeout.unwrap_or(Duration::from_secs(1));
                if timeout.is_zero() || timeout > Duration::from_secs(60) {
                    return Err(ConfigError::invalid(
                        "replica_ack",
                        format!("a timeout of {timeout:?} is outside 1ms ..= 1 min"),
                    ));
                }
                Some(ReplicaWait { replicas, timeout })
            }
        };
        if let Some(t) = o.waiter_timeout {
            validate_timeout("waiter_timeout", t)?;
        }
        if let Some(name) = &o.holder_name {
            check_holder_name(name)?;
        }
        if let Some(h) = o.heartbeat {
            if !(MIN_HEARTBEAT..=MAX_HEARTBEAT).contains(&h) {
                return Err(ConfigError::invalid(
                    "heartbeat",
                    format!("{h:?} is out of range: {MIN_HEARTBEAT:?} ..= {MAX_HEARTBEAT:?}"),
                ));
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<LockOptions, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(o) => panic!("accepted: {o:?}"),
        }
    }

    #[test]
    fn defaults_wait_forever_without_a_watchdog() {
        let o = LockOptions::builder().build().unwrap();
        assert_eq!(o, LockOptions::default());
        assert_eq!((o.wait(), o.max_tries(), o.max_hold()), (None, None, None));
        assert_eq!(o.max_backoff(), DEFAULT_MAX_BACKOFF);
        assert_eq!(o.waiter_timeout(), DEFAULT_WAITER_TIMEOUT);
        assert_eq!(o.heartbeat(), DEFAULT_HEARTBEAT);
        assert!(!o.watchdog());
        assert_eq!(o.replica_ack(), None);
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let b = LockOptions::builder;
        assert_eq!(field(b().max_tries(0).build()), "max_tries");
        assert_eq!(
            field(b().max_backoff(Duration::ZERO).build()),
            "max_backoff"
        );
        assert_eq!(
            field(b().max_backoff(Duration::from_secs(61)).build()),
            "max_backoff"
        );
        assert_eq!(field(b().max_hold(Duration::ZERO).build()), "max_hold");
        assert_eq!(field(b().wait(Duration::MAX).build()), "wait");
        assert_eq!(
            field(b().waiter_timeout(Duration::from_millis(29)).build()),
            "waiter_timeout"
        );
        assert_eq!(
            field(b().waiter_timeout(Duration::from_secs(3601)).build()),
            "waiter_timeout"
        );
        assert_eq!(
            field(b().heartbeat(Duration::from_millis(1)).build()),
            "heartbeat"
        );
        assert_eq!(
            field(b().replica_ack(101, Duration::from_secs(1)).build()),
            "replica_ack"
        );
        assert!(b().wait(Duration::ZERO).max_tries(1).build().is_ok());
    }

    #[test]
    fn deserialization_validates_too_and_round_trips() {
        let o: LockOptions =
            serde_json::from_str(r#"{"wait_ms":10000,"watchdog":true,"waiter_timeout_ms":5000}"#)
                .unwrap();
        assert_eq!(o.wait(), Some(Duration::from_secs(10)));
        assert!(o.watchdog());
        assert_eq!(o.waiter_timeout(), Duration::from_secs(5));
        assert!(serde_json::from_str::<LockOptions>(r#"{"max_tries":0}"#).is_err());
        assert!(serde_json::from_str::<LockOptions>(r#"{"waiter_timeout_ms":0}"#).is_err());
        assert!(serde_json::from_str::<LockOptions>(r#"{"wait":5}"#).is_err());
        let fair: LockOptions = serde_json::from_str(r#"{"fair":true}"#).unwrap();
        assert!(fair.fair());
        assert_eq!(
            serde_json::to_string(&fair).unwrap(),
            r#"{"wait_ms":null,"max_tries":null,"watchdog":false,"max_hold_ms":null,"fair":true}"#
        );
        assert!(!LockOptions::default().fair());
        let back: LockOptions = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
        let full = LockOptions::builder()
            .replica_ack(1, Duration::from_millis(200))
            .heartbeat(Duration::from_millis(250))
            .max_backoff(Duration::from_millis(300))
            .build()
            .unwrap();
        let back: LockOptions =
            serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(back, full);
    }

    #[test]
    fn a_field_a_primitive_cannot_honour_is_refused_by_name() {
        let o = LockOptions::builder().max_tries(3).build().unwrap();
        assert!(o.refuse_others("the mutex", &[Field::MaxTries]).is_ok());
        let e = o.refuse_others("the advisory lock", &[]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        assert!(e.to_string().contains("max_tries"), "{e}");
        assert!(LockOptions::default().refuse_others("x", &[]).is_ok());
    }
}

//! Configuration of one failover job, validated by [`FailoverConfigBuilder::build`].
//!
//! Invalid values are rejected with a [`ConfigError`] naming the field, never coerced: a lease of
//! 0 ms or a retention shorter than the lease would silently break the guarantees.

use crate::util::settings::ReplicaWait;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::util::names::{check_name, check_prefix};

/// How chatty `Status` events are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub enum StatusLevel {
    /// Ownership changes and waits only.
    #[default]
    Normal,
    /// Every round trip's decision too.
    Verbose,
}

/// A validated configuration of one job for one worker.
///
/// Build it with [`FailoverConfig::builder`], or deserialize it (durations in milliseconds, e.g.
/// `{"key":"msg:42","lease_ms":10000,"watchdog":true}`); both paths run the same validation.
/// The former field names `lock_timeout_ms`, `keepalive` and `max_run_ms` are still read, as
/// aliases of `lease_ms`, `watchdog` and `max_hold_ms`; serialization writes the current ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawConfig", into = "RawConfig")]
pub struct FailoverConfig {
    pub(crate) key: String,
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) max_attempts: u64,
    pub(crate) retention: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) retry_delay: Duration,
    pub(crate) rejoin_after_fail: bool,
    pub(crate) status_level: StatusLevel,
    pub(crate) worker_name: Option<String>,
    pub(crate) event_capacity: usize,
    pub(crate) replica_ack: Option<ReplicaWait>,
    /// The occurrence whose attempts the worker records in its schedule's record
    /// ([`FailoverConfig::with_record`]); not serialized.
    pub(crate) occurrence: Option<std::sync::Arc<super::record_options::OccurrenceContext>>,
}

/// The serialized shape of [`FailoverConfig`]: plain fields with defaults, durations in ms.
///
/// Written with the current names; the former ones (`lock_timeout_ms`, `keepalive`,
/// `max_run_ms`) are read as aliases, so configuration files from before the rename still load.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    key: String,
    prefix: String,
    #[serde(alias = "lock_timeout_ms")]
    lease_ms: u64,
    max_attempts: u64,
    retention_ms: u64,
    #[serde(alias = "keepalive")]
    watchdog: bool,
    #[serde(alias = "max_run_ms")]
    max_hold_ms: Option<u64>,
    retry_delay_ms: u64,
    rejoin_after_fail: bool,
    status_level: StatusLevel,
    worker_name: Option<String>,
    event_capacity: usize,
    /// 0: no replica acknowledgement.
    replica_ack: u32,
    replica_ack_timeout_ms: u64,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            key: String::new(),
            prefix: DEFAULT_PREFIX.to_string(),
            lease_ms: DEFAULT_LEASE.as_millis() as u64,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retention_ms: DEFAULT_RETENTION.as_millis() as u64,
            watchdog: false,
            max_hold_ms: None,
            retry_delay_ms: 0,
            rejoin_after_fail: false,
            status_level: StatusLevel::Normal,
            worker_name: None,
            event_capacity: DEFAULT_EVENT_CAPACITY,
            replica_ack: 0,
            replica_ack_timeout_ms: 1000,
        }
    }
}

impl TryFrom<RawConfig> for FailoverConfig {
    type Error = ConfigError;
    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        FailoverConfigBuilder { raw }.build()
    }
}

impl From<FailoverConfig> for RawConfig {
    fn from(c: FailoverConfig) -> Self {
        RawConfig {
            key: c.key,
            prefix: c.prefix,
            lease_ms: c.lease.as_millis() as u64,
            max_attempts: c.max_attempts,
            retention_ms: c.retention.as_millis() as u64,
            watchdog: c.watchdog,
            max_hold_ms: c.max_hold.map(|d| d.as_millis() as u64),
            retry_delay_ms: c.retry_delay.as_millis() as u64,
            rejoin_after_fail: c.rejoin_after_fail,
            status_level: c.status_level,
            worker_name: c.worker_name,
            event_capacity: c.event_capacity,
            replica_ack: c.replica_ack.map_or(0, |w| w.replicas),
            replica_ack_timeout_ms: c.replica_ack.map_or(1000, |w| w.timeout.as_millis() as u64),
        }
    }
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = crate::util::names::DEFAULT_PREFIX;
/// The default lease time (the original's `lockTimeout`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// The former name of [`DEFAULT_LEASE`].
#[deprecated(since = "0.1.0", note = "renamed `DEFAULT_LEASE`")]
pub const DEFAULT_LOCK_TIMEOUT: Duration = DEFAULT_LEASE;
/// The default number of attempts (the original's `maxAttempts`).
pub const DEFAULT_MAX_ATTEMPTS: u64 = 5;
/// How long `DONE` / `EXHAUSTED` and the counter are kept by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How many droppable events queue up unread before `Status`/`Locked` are dropped.
pub const DEFAULT_EVENT_CAPACITY: usize = 64;

const MIN_LEASE: Duration = Duration::from_millis(10);
const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
const MAX_MAX_ATTEMPTS: u64 = 1_000_000;
/// Redis stores TTLs in ms as i64; ten years is far beyond any sane retention and far inside i64.
const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The longest `max_hold`: like retention, far beyond any real attempt, and small enough that
/// `now + max_hold` stays representable as a monotonic `Instant` on every platform.
const MAX_MAX_HOLD: Duration = MAX_RETENTION;

impl FailoverConfig {
    /// Starts a configuration for the job named `key` (e.g. `msg:42`), with every default.
    pub fn builder(key: impl Into<String>) -> FailoverConfigBuilder {
        FailoverConfigBuilder {
            raw: RawConfig {
                key: key.into(),
                ..RawConfig::default()
            },
        }
    }

    /// The job name.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The lease time ([`FailoverConfigBuilder::lease`]).
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// The maximum number of attempts.
    pub fn max_attempts(&self) -> u64 {
        self.max_attempts
    }
    /// How long the state and fence are kept after the last write.
    pub fn retention(&self) -> Duration {
        self.retention
    }
    /// Whether the holder's watchdog extends its lease while its process lives.
    pub fn watchdog(&self) -> bool {
        self.watchdog
    }
    /// How often a holder's watchdog extends its lease: always `lease / 3`.
    ///
    /// It is derived, not a setting, so the interval can never reach the lease time: two
    /// extensions can fail in a row (a slow reply, a reconnect) and the lease still has a third
    /// of its time left for the next one.
    pub fn watchdog_interval(&self) -> Duration {
        self.lease / 3
    }
    /// The cap on how long one attempt may hold the job, if any.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }
    /// The pause before a backup takes over a failed attempt.
    pub fn retry_delay(&self) -> Duration {
        self.retry_delay
    }
    /// Whether a worker whose attempt failed (or lost its lease) waits as a backup again.
    pub fn rejoin_after_fail(&self) -> bool {
        self.rejoin_after_fail
    }
    /// The `Status` events emitted.
    pub fn status_level(&self) -> StatusLevel {
        self.status_level
    }
    /// The worker name stored with the lease (for operators), if set.
    pub fn worker_name(&self) -> Option<&str> {
        self.worker_name.as_deref()
    }
    /// The replica acknowledgement each grant and `DONE` waits for: `(replicas, timeout)`.
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.replica_ack.map(|w| (w.replicas, w.timeout))
    }
    /// Returns a copy with the watchdog switched on or off (used by the closure form).
    pub(crate) fn with_watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
}

/// Builder for [`FailoverConfig`]; every setter documents its default.
#[derive(Debug, Clone)]
#[must_use]
pub struct FailoverConfigBuilder {
    raw: RawConfig,
}

impl FailoverConfigBuilder {
    /// The key prefix; must end with `:` and contain no `{` `}`. Defaults to `baton:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.raw.prefix = prefix.into();
        self
    }
    /// The lease time: how long a silent holder keeps the job before a backup may take over.
    /// 10 ms ..= 1 day. Serialized as `lease_ms` (formerly `lock_timeout_ms`, still read), the
    /// CLI's `--lease`; errors name it `lease`. Defaults to 5 s.
    pub fn lease(mut self, d: Duration) -> Self {
        self.raw.lease_ms = duration_ms(d);
        self
    }
    /// The maximum number of attempts, 1 ..= 1 000 000. Defaults to 5.
    ///
    /// The attempt counter is stored in Redis as a decimal integer (what `INCR` and `GET` agree
    /// on, an i64); the cap keeps it a million-fold away from wrapping, and larger values are
    /// rejected rather than clamped.
    pub fn max_attempts(mut self, n: u64) -> Self {
        self.raw.max_attempts = n;
        self
    }
    /// How long the counter, `DONE`/`EXHAUSTED` and the fence are kept after the last write, so
    /// late duplicates of the job are not re-run. At least 2 × `lease`. Defaults to 24 h.
    pub fn retention(mut self, d: Duration) -> Self {
        self.raw.retention_ms = duration_ms(d);
        self
    }
    /// Whether the holder's watchdog extends its lease every `lease / 3` (see
    /// [`FailoverConfig::watchdog_interval`]) while its process lives. Serialized as `watchdog`
    /// (formerly `keepalive`, still read).
    /// Defaults to off (the original's model: an attempt must finish within `lease`).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.raw.watchdog = on;
        self
    }
    /// A cap on how long one attempt may hold the job, counted from its grant; must exceed
    /// `lease` and be at most 10 years. Serialized as `max_hold_ms` (formerly `max_run_ms`,
    /// still read). Defaults to none.
    pub fn max_hold(mut self, d: Option<Duration>) -> Self {
        self.raw.max_hold_ms = d.map(duration_ms);
        self
    }
    /// How long a backup waits after seeing a failed attempt before taking over; must be below
    /// `retention`. Defaults to 0.
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.raw.retry_delay_ms = duration_ms(d);
        self
    }
    /// Whether a worker whose own attempt failed waits as a backup again (after giving the other
    /// backups a head start of `lease / 10`, 10..=500 ms, or `retry_delay` if longer), and one
    /// whose attempt lost its lease too (at once: the lease has already passed on): it then
    /// reports [`Event::Rejoined`](crate::Event::Rejoined) instead of the terminal `Failed` or
    /// `LeaseLost`, and the attempt handle's loss signal still fires at once. A worker that left
    /// after a lost lease would strand the job when it was the only worker left. Defaults to
    /// false.
    pub fn rejoin_after_fail(mut self, on: bool) -> Self {
        self.raw.rejoin_after_fail = on;
        self
    }
    /// Which `Status` events are emitted. Defaults to [`StatusLevel::Normal`].
    pub fn status_level(mut self, level: StatusLevel) -> Self {
        self.raw.status_level = level;
        self
    }
    /// The name stored with the lease for operators (1..=256 bytes). Defaults to `host:pid`.
    pub fn worker_name(mut self, name: impl Into<String>) -> Self {
        self.raw.worker_name = Some(name.into());
        self
    }
    /// How many `Status`/`Locked` events may wait unread before new ones are dropped (with a
    /// `Lagged` count); `Acquired` and terminal events are never dropped. 1 ..= 65 536.
    /// Defaults to 64.
    pub fn event_capacity(mut self, n: usize) -> Self {
        self.raw.event_capacity = n;
        self
    }

    /// Replica acknowledgement: after each grant and each `DONE`, `WAIT replicas timeout` is
    /// pipelined right after the `EXEC`, on the connection that wrote. `replicas` 0 switches
    /// it off (the default); 1 ..= 100 replicas, timeout 1 ms ..= `lease / 2` (and at
    /// most three quarters of the client's response timeout, applied when sent).
    ///
    /// A grant fewer replicas confirmed is never handed to the caller: the worker reports an
    /// [`Error`](crate::Event::Error) event ([`ErrorKind::NotReplicated`](crate::ErrorKind)),
    /// releases the attempt (which counts as used: the next grant is the next attempt, so
    /// `max_attempts` bounds the retries and a job whose replicas stay away ends `EXHAUSTED`,
    /// never silently), and waits as a backup again. A `DONE` fewer replicas confirmed is on the
    /// primary, so the worker still ends with `Completed`, but `done()` returns
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) and an `Error` event says so: a
    /// failover now could lose the `DONE`, and the job could run again.
    ///
    /// `WAIT` narrows the window in which an acknowledged write can be lost to a failover; it
    /// does not close it (Redis replication stays asynchronous: no rollback, and Sentinel or the
    /// cluster may promote a replica that had not received the write).
    ///
    /// Defaults to off (0 replicas).
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.raw.replica_ack = replicas;
        self.raw.replica_ack_timeout_ms = duration_ms(timeout);
        self
    }

    /// Validates every setting.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first field out of range.
    pub fn build(self) -> Result<FailoverConfig, ConfigError> {
        let r = self.raw;
        check_name("key", &r.key)?;
        check_prefix(&r.prefix)?;
        let lease = Duration::from_millis(r.lease_ms);
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(ConfigError::invalid(
                "lease",
                format!("{lease:?} is outside 10ms ..= 1 day"),
            ));
        }
        if r.max_attempts == 0 || r.max_attempts > MAX_MAX_ATTEMPTS {
            return Err(ConfigError::invalid(
                "max_attempts",
                format!("{} is outside 1 ..= 1000000", r.max_attempts),
            ));
        }
        let retention = Duration::from_millis(r.retention_ms);
        if retention < lease * 2 {
            return Err(ConfigError::invalid(
                "retention",
                format!("{retention:?} is below twice the lease ({:?})", lease * 2),
            ));
        }
        if retention > MAX_RETENTION {
            return Err(ConfigError::invalid(
                "retention",
                format!("{retention:?} is above 10 years"),
            ));
        }
        let max_hold = r.max_hold_ms.map(Duration::from_millis);
        if let Some(m) = max_hold {
            if m <= lease {
                return Err(ConfigError::invalid(
                    "max_hold",
                    format!("{m:?} must exceed the lease ({lease:?})"),
                ));
            }
            if m > MAX_MAX_HOLD {
                return Err(ConfigError::invalid(
                    "max_hold",
                    format!("{m:?} is above 10 years"),
                ));
            }
        }
        let retry_delay = Duration::from_millis(r.retry_delay_ms);
        if retry_delay >= retention {
            return Err(ConfigError::invalid(
                "retry_delay",
                format!("{retry_delay:?} must be below retention ({retention:?})"),
            ));
        }
        if let Some(name) = &r.worker_name {
            if name.is_empty() || name.len() > 256 || name.trim().is_empty() {
                return Err(ConfigError::invalid(
                    "worker_name",
                    "must be 1..=256 bytes and not blank",
                ));
            }
        }
        if r.event_capacity == 0 || r.event_capacity > 65_536 {
            return Err(ConfigError::invalid(
                "event_capacity",
                format!("{} is outside 1 ..= 65536", r.event_capacity),
            ));
        }
        let replica_ack = replica_wait(r.replica_ack, r.replica_ack_timeout_ms, lease)?;
        Ok(FailoverConfig {
            key: r.key,
            prefix: r.prefix,
            lease,
            max_attempts: r.max_attempts,
            retention,
            watchdog: r.watchdog,
            max_hold,
            retry_delay,
            rejoin_after_fail: r.rejoin_after_fail,
            status_level: r.status_level,
            worker_name: r.worker_name,
            event_capacity: r.event_capacity,
            replica_ack,
            occurrence: None,
        })
    }
}

/// Checks a replica acknowledgement setting against the lease it guards (shared with no one:
/// the mutex checks its own against its ttl when it acquires).
fn replica_wait(
    replicas: u32,
    timeout_ms: u64,
    lease: Duration,
) -> Result<Option<ReplicaWait>, ConfigError> {
    if replicas == 0 {
        return Ok(None);
    }
    if replicas > 100 {
        return Err(ConfigError::invalid(
            "replica_ack",
            format!("{replicas} replicas is outside 0 ..= 100"),
        ));
    }
    let timeout = Duration::from_millis(timeout_ms);
    if timeout.is_zero() || timeout > lease / 2 {
        return Err(ConfigError::invalid(
            "replica_ack",
            format!(
                "a timeout of {timeout:?} is outside 1ms ..= half the lease ({:?}): the wait \
                 must end well inside the lease it guards",
                lease / 2
            ),
        ));
    }
    Ok(Some(ReplicaWait { replicas, timeout }))
}

/// Durations are stored in whole milliseconds (what Redis takes). Sub-millisecond parts round
/// down, and a duration too long for u64 ms saturates, so `build()` then rejects it as out of
/// range instead of wrapping.
fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<FailoverConfig, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { field, .. }) => field,
            Ok(_) => "accepted",
        }
    }

    #[test]
    fn defaults_follow_the_design() {
        let c = FailoverConfig::builder("msg:42").build().unwrap();
        assert_eq!(c.prefix(), "baton:");
        assert_eq!(c.lease(), Duration::from_secs(5));
        assert_eq!(c.max_attempts(), 5);
        assert_eq!(c.retention(), Duration::from_secs(86_400));
        assert!(!c.watchdog());
        assert_eq!(c.max_hold(), None);
        assert_eq!(c.retry_delay(), Duration::ZERO);
        assert!(!c.rejoin_after_fail());
        assert_eq!(c.status_level(), StatusLevel::Normal);
    }

    #[test]
    fn key_rules() {
        let b = FailoverConfig::builder;
        assert_eq!(field(b("").build()), "key");
        assert_eq!(field(b("   ").build()), "key");
        assert_eq!(field(b("a{b").build()), "key");
        assert_eq!(field(b("}ab").build()), "key");
        assert_eq!(
            field(FailoverConfig::builder("x".repeat(1025)).build()),
            "key"
        );
        assert_eq!(
            field(FailoverConfig::builder("x".repeat(1024)).build()),
            "accepted"
        );
        assert_eq!(field(b("ジョブ 🔒\r\n").build()), "accepted");
    }

    #[test]
    fn prefix_rules() {
        let b = || FailoverConfig::builder("k");
        assert_eq!(field(b().prefix("").build()), "prefix");
        assert_eq!(field(b().prefix("baton").build()), "prefix");
        assert_eq!(field(b().prefix("  :").build()), "prefix");
        assert_eq!(field(b().prefix("a{:").build()), "prefix");
        assert_eq!(field(b().prefix("a}:").build()), "prefix");
        assert_eq!(field(b().prefix("app:").build()), "accepted");
    }

    #[test]
    fn lease_range() {
        let b = || FailoverConfig::builder("k");
        assert_eq!(field(b().lease(Duration::ZERO).build()), "lease");
        assert_eq!(field(b().lease(Duration::from_millis(9)).build()), "lease");
        assert_eq!(
            field(b().lease(Duration::from_millis(10)).build()),
            "accepted"
        );
        let day = Duration::from_secs(86_400);
        assert_eq!(field(b().lease(day).retention(day * 2).build()), "accepted");
        assert_eq!(
            field(
                b().lease(day + Duration::from_millis(1))
                    .retention(day * 3)
                    .build()
            ),
            "lease"
        );
        assert_eq!(field(b().lease(Duration::MAX).build()), "lease");
    }

    #[test]
    fn max_attempts_range() {
        let b = || FailoverConfig::builder("k");
        assert_eq!(field(b().max_attempts(0).build()), "max_attempts");
        assert_eq!(field(b().max_attempts(1).build()), "accepted");
        assert_eq!(field(b().max_attempts(1_000_000).build()), "accepted");
        assert_eq!(field(b().max_attempts(1_000_001).build()), "max_attempts");
        assert_eq!(field(b().max_attempts(u64::MAX).build()), "max_attempts");
    }

    #[test]
    fn retention_at_least_twice_the_lease() {
        let b = || FailoverConfig::builder("k").lease(Duration::from_secs(10));
        assert_eq!(
            field(b().retention(Duration::from_secs(19)).build()),
            "retention"
        );
        assert_eq!(
            field(b().retention(Duration::from_secs(20)).build()),
            "accepted"
        );
        assert_eq!(field(b().retention(Duration::MAX).build()), "retention");
    }

    #[test]
    fn max_hold_must_exceed_the_lease() {
        let b = || FailoverConfig::builder("k").lease(Duration::from_secs(1));
        assert_eq!(
            field(b().max_hold(Some(Duration::from_secs(1))).build()),
            "max_hold"
        );
        assert_eq!(
            field(b().max_hold(Some(Duration::from_millis(1001))).build()),
            "accepted"
        );
        assert_eq!(field(b().max_hold(None).build()), "accepted");
        assert_eq!(field(b().max_hold(Some(MAX_MAX_HOLD)).build()), "accepted");
        assert_eq!(field(b().max_hold(Some(Duration::MAX)).build()), "max_hold");
    }

    #[test]
    fn retry_delay_below_retention() {
        let b = || FailoverConfig::builder("k").retention(Duration::from_secs(60));
        assert_eq!(
            field(b().retry_delay(Duration::from_secs(60)).build()),
            "retry_delay"
        );
        assert_eq!(
            field(b().retry_delay(Duration::from_secs(59)).build()),
            "accepted"
        );
    }

    #[test]
    fn worker_name_and_capacity() {
        let b = || FailoverConfig::builder("k");
        assert_eq!(field(b().worker_name("").build()), "worker_name");
        assert_eq!(field(b().worker_name(" ").build()), "worker_name");
        assert_eq!(field(b().worker_name("w1").build()), "accepted");
        assert_eq!(field(b().event_capacity(0).build()), "event_capacity");
    }

    #[test]
    fn deserialization_validates_too() {
        let ok: FailoverConfig =
            serde_json::from_str(r#"{"key":"msg:1","lease_ms":1000,"max_attempts":3}"#).unwrap();
        assert_eq!(ok.lease(), Duration::from_secs(1));
        assert_eq!(ok.max_attempts(), 3);
        let bad = serde_json::from_str::<FailoverConfig>(r#"{"key":"msg:1","max_attempts":0}"#);
        assert!(bad.unwrap_err().to_string().contains("max_attempts"));
        let unknown = serde_json::from_str::<FailoverConfig>(r#"{"key":"k","lease":5}"#);
        assert!(unknown.is_err());
        let round = serde_json::to_string(&ok).unwrap();
        let back: FailoverConfig = serde_json::from_str(&round).unwrap();
        assert_eq!(back, ok);
    }

    #[test]
    fn the_former_field_names_still_deserialize() {
        let new = r#"{"key":"k","lease_ms":1000,"watchdog":true,"max_hold_ms":5000}"#;
        let old = r#"{"key":"k","lock_timeout_ms":1000,"keepalive":true,"max_run_ms":5000}"#;
        for text in [new, old] {
            let c: FailoverConfig = serde_json::from_str(text).unwrap();
            assert_eq!(c.lease(), Duration::from_secs(1), "{text}");
            assert!(c.watchdog(), "{text}");
            assert_eq!(c.max_hold(), Some(Duration::from_secs(5)), "{text}");
        }
        // An alias is a second name for the same field, not a second field: both at once is a
        // duplicate, refused like any other.
        let both = r#"{"key":"k","lease_ms":1000,"lock_timeout_ms":2000}"#;
        assert!(serde_json::from_str::<FailoverConfig>(both).is_err());
    }

    #[test]
    fn serialization_writes_the_current_names() {
        let c = FailoverConfig::builder("k")
            .lease(Duration::from_secs(1))
            .watchdog(true)
            .max_hold(Some(Duration::from_secs(5)))
            .build()
            .unwrap();
        let json: serde_json::Value = serde_json::to_value(&c).unwrap();
        assert_eq!(json["lease_ms"], 1000);
        assert_eq!(json["watchdog"], true);
        assert_eq!(json["max_hold_ms"], 5000);
        for old in ["lock_timeout_ms", "keepalive", "max_run_ms"] {
            assert!(json.get(old).is_none(), "{old} in {json}");
        }
    }
}

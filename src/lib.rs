//! # baton: hand a job between workers safely, through Redis or PostgreSQL
//!
//! A fleet of identical workers receives the same job (send message 42, run the nightly report).
//! Exactly one of them must do it; if that one fails or dies, a backup takes over, but only after
//! the holder's attempt has visibly failed, and only up to `max_attempts` attempts. baton is the
//! Rust successor of yahoo's `redis-locking-worker`, with the original's races fixed.
//!
//! ```no_run
//! use baton::{Client, FailoverConfig, RunOutcome};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), baton::Error> {
//! let client = Client::connect("redis://127.0.0.1:6379/").await?;
//! let job = FailoverConfig::builder("msg:42")
//!     .lock_timeout(Duration::from_secs(10))
//!     .max_attempts(3)
//!     .build()?;
//! let outcome = client
//!     .run(job, |attempt| async move {
//!         // Pass attempt.fencing_token to whatever you write to.
//!         send_message(42, attempt.fencing_token).await
//!     })
//!     .await?;
//! match outcome {
//!     RunOutcome::Done(()) => println!("we sent it"),
//!     RunOutcome::CompletedElsewhere => println!("another worker sent it"),
//!     other => println!("{other:?}"),
//! }
//! # Ok(()) }
//! # async fn send_message(_: u64, _: u64) -> Result<(), std::io::Error> { Ok(()) }
//! ```
//!
//! # The protocol
//! Job `J` has a state key `baton:{J}` holding the number of the latest attempt started, then
//! `DONE` or `EXHAUSTED`; a lease key `baton:{J}:lease` with the holder's random token and a TTL
//! (`lock_timeout`); a fence key with the last fencing token; and a pub/sub channel that wakes
//! backups. Every transition is `WATCH` + reads, a pure decision, then `MULTI … EXEC` on a
//! dedicated connection, so two backups can never both win one attempt. See
//! [`Event`] for what a worker reports and [`FailoverConfig`] for the settings.
//!
//! # Guarantees
//! - Each attempt number is granted to at most one worker, and at most `max_attempts` attempts
//!   start, as long as Redis does not lose acknowledged writes (run it with `appendonly yes`,
//!   `appendfsync always` and `maxmemory-policy noeviction`). When a worker sees that Redis did
//!   lose the state, it reports [`ErrorKind::StateLost`] instead of running the job again.
//! - A job ends `DONE` at most once; `DONE`/`EXHAUSTED` are kept for `retention`, so late
//!   duplicates of the job are not re-run.
//! - A worker that loses its attempt learns it: `LeaseLost` as soon as it is seen, and at the
//!   latest by its lease deadline (send time of the last confirmed extension + `lock_timeout` −
//!   max(1 %, 2 ms)) whatever a request in flight is doing; `done()` then returns an error and
//!   writes nothing. A `done()` whose reply was lost is judged by the fencing token read back:
//!   never a success that was another attempt's ([`ErrorKind::OutcomeUnknown`] when nothing
//!   tells).
//!
//! What a lease cannot do: a holder that is paused (GC, SIGSTOP, a VM stall) longer than its lease
//! cannot know that a backup took over in the meantime, and may still be writing when it wakes.
//! That is what the [fencing token](Acquired::fencing_token) is for: it strictly increases across
//! attempts (even when the fence key is lost, since it is floored by the server's clock in µs), so
//! the resource you write to can reject writes that carry an older token.
//!
//! # Layout
//! Layered, arrows pointing down only (a CI step, `tests/layering.rs`, keeps it so):
//! - [`client`]: [`Client`] builds the transport and hands out primitive handles
//!   ([`Client::failover`]); its `start`/`run`/`job_status`/… are one-line delegations.
//! - [`failover`]: the coordinator, a primitive: configuration, pure protocol, worker task,
//!   events, closure form, operator tools ([`Failover`]). Primitives never import each other or
//!   the client.
//! - [`mutex`]: the fenced mutex, a primitive ([`Locks`], [`LockGuard`], [`AcquireOptions`]).
//! - [`fair`]: the fair lock, a primitive: waiters in arrival order, only the next one woken,
//!   a priority reservation ([`FairLocks`], [`FairGuard`], [`Reservation`]).
//! - [`leader`]: leader election, a primitive: terms that double as fencing tokens, renewals,
//!   work stopped before anyone else can lead ([`Leaders`], [`Elector`], [`LeaderWorker`]).
//! - [`queue`]: run-or-enqueue, a primitive: one runner per key, posts queued in a Redis Stream
//!   and drained by the holder before it lets go, at-least-once ([`Queues`]).
//! - `advisory` (feature `postgres`): PostgreSQL advisory locks, transaction-scoped or
//!   session-scoped on a dedicated connection per guard, with a heartbeat loss signal and
//!   fencing tokens from a sequence (`AdvisoryLocks`, `AdvisoryGuard`).
//! - [`redlock`]: the mutex over several independent masters by quorum, without fencing
//!   ([`Redlock`], [`RedlockGuard`]).
//! - `lease`: the lease kernel every lease-holding primitive shares: deadlines computed at send
//!   time, the one-command extension script, fencing tokens, the lock scripts, the lock store's
//!   operations (acquire, extend, release by token on either backend) and the watchdog.
//! - `backend`: the store seam, one `Backend` enum (and its weak form) with the dispatch every
//!   primitive shares (tasks, cancellation, timeouts, pub/sub), over one folder per backend:
//!   `backend::redis` (the multiplexed connection, the dedicated-connection pool for
//!   `WATCH … EXEC`, the pub/sub hub, Cluster and Sentinel routing, URL checks, the
//!   classification of server errors, and [`acl`]: the exact commands baton sends, for a
//!   least-privilege ACL user) and `backend::postgres` (pool, dedicated sessions, the `LISTEN`
//!   hub, schema, SQLSTATE classification). Neither imports a
//!   primitive or the other.
//! - leaves: [`error`] ([`Error`] with [`Error::is_retryable`], [`ConfigError`]) and `util`
//!   (backoff, deadlines, tokens, the mailbox, and what both backends share: connection
//!   settings, pub/sub messages, wake-one groups, URL redaction, TLS material).
//! - `testing` (feature `testing`): a private `redis-server` fixture for tests and examples.
//!
//! # Features
//! None is on by default: the default build talks to a single Redis (or Valkey) server.
//! - `tls`: `rediss://` URLs through rustls (ring), with a private CA and client certificates
//!   set on [`ClientBuilder`] (`tls_root_ca_pem`, `tls_client_cert_pem`, and `_file` variants).
//!   redis' `tls-rustls-insecure` is never enabled, and a `#insecure` URL is always refused.
//! - `cluster`: Redis Cluster (`redis+cluster://` URLs): baton's own slot map, a pool per
//!   primary, sharded pub/sub.
//! - `sentinel`: a Sentinel-monitored primary (`redis+sentinel://` URLs), followed across
//!   failovers.
//! - `postgres`: PostgreSQL as a backend (`postgres://` URLs): advisory locks, and the failover
//!   coordinator, the mutex and leader election on tables (`Client::migrate` creates them);
//!   brings `tls` for `sslmode=require`.
//! - `cli`: the `baton` command (brings `cluster`, `sentinel` and `postgres`).
//! - `testing`: the fixtures of this crate's tests, examples, benchmarks and fault harness
//!   (`testing::RedisServer`, `RedisCluster`, `PgServer`, and `RedisSentinel` with
//!   `sentinel`): private servers on free loopback ports.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "postgres")]
pub mod advisory;
mod backend;
pub mod client;
pub mod error;
pub mod failover;
pub mod fair;
pub mod leader;
mod lease;
#[cfg(any(test, feature = "model"))]
#[doc(hidden)]
pub mod model;
pub mod mutex;
pub mod queue;
pub mod redlock;
#[cfg(feature = "testing")]
pub mod testing;
mod util;

pub use backend::redis::acl;

#[cfg(feature = "testing")]
#[doc(hidden)]
pub use client::seam as __seam;

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "postgres")]
pub use advisory::{
    AdvisoryGuard, AdvisoryKey, AdvisoryLocks, AdvisoryMode, AdvisoryOptions,
    AdvisoryOptionsBuilder,
};
pub use client::{Client, ClientBuilder, Durability};
pub use error::{ConfigError, Error, ErrorKind};
pub use failover::{
    Acquired, Attempt, AttemptHandle, Event, Failover, FailoverConfig, FailoverConfigBuilder,
    IntoJob, JobChange, JobState, JobStatus, JobWatch, RunError, RunOutcome, StatusLevel, Worker,
};
pub use fair::{FairGuard, FairLocks, FairOptions, FairOptionsBuilder, Reservation};
pub use leader::{
    ElectionOptions, ElectionOptionsBuilder, Elector, LeaderEvent, LeaderWorker, Leaders, Observed,
    Observer, Term,
};
pub use mutex::{AcquireOptions, AcquireOptionsBuilder, FencedWrite, LockGuard, Locks};
pub use queue::{Drain, QueueError, QueueItem, Queues, RunOrEnqueue};
pub use redlock::{Redlock, RedlockGuard, RedlockOptions};

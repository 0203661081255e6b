//! # baton: hand work between processes safely, through Redis or PostgreSQL
//!
//! baton coordinates a fleet of workers through Redis (one server, Valkey, a Redis Cluster or a
//! Sentinel-monitored primary) or PostgreSQL. Its first primitive is an attempt-counted failover
//! coordinator: many workers receive the same job (send message 42, run the nightly report),
//! exactly one does it, a backup takes over only once the holder's attempt has visibly failed,
//! and never more than `max_attempts` times. Next to it sit a fenced mutex, a fair lock, leader
//! election, Redlock, run-or-enqueue and PostgreSQL advisory locks. Every grant but Redlock's
//! comes with a fencing token that only grows, so the resource you write to can refuse a holder that was
//! paused past its lease. baton is the Rust successor of yahoo's `redis-locking-worker`, with
//! the original's races fixed; the `baton` command (feature `cli`) puts any program under the
//! same coordination.
//!
//! ```no_run
//! use baton::{Client, FailoverConfig, RunOutcome};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), baton::Error> {
//! let client = Client::connect("redis://127.0.0.1:6379/").await?;
//! let job = FailoverConfig::builder("msg:42")
//!     .lease(Duration::from_secs(10))
//!     .max_attempts(3)
//!     .build()?;
//! let outcome = client
//!     .failover()
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
//! `run` keeps the lease alive while the closure runs, cancels the closure the moment the
//! attempt is lost, turns `Ok` into `done()` and `Err` or a panic into `fail()`. The same code
//! runs on `postgres://` URLs (feature `postgres`).
//!
//! # Primitives, backends and guides
//! Each primitive has a guide in the repository's `docs/` folder (linked from its README), with
//! examples, guarantees and limits; the API of each is in its module here.
//!
//! | primitive | handle | Redis, Valkey, Cluster, Sentinel | PostgreSQL | guide |
//! | --- | --- | --- | --- | --- |
//! | failover coordinator | [`Client::failover`] | yes | yes | `docs/failover.md` |
//! | fenced mutex | [`Client::locks`] | yes | yes | `docs/mutex.md` |
//! | read-write lock | [`Client::rw_locks`] | yes | yes | `docs/rwlock.md` |
//! | fair lock | [`Client::fair_locks`] | yes | no | `docs/fair-lock.md` |
//! | semaphore (fenced permits) | [`Client::semaphores`] | yes | yes | `docs/semaphore.md` |
//! | leader election | [`Client::leaders`] | yes | yes | `docs/leader-election.md` |
//! | Redlock | [`Redlock::new`] | independent single servers | no | `docs/redlock.md` |
//! | run-or-enqueue | [`Client::queues`] | yes | no | `docs/run-or-enqueue.md` |
//! | advisory locks | `Client::advisory_locks` (feature `postgres`) | no | yes | `docs/advisory-locks.md` |
//! | scheduled jobs (a failover job per occurrence) | [`Failover::schedule`], [`Failover::occurrence`] | yes | yes | `docs/scheduling.md` |
//!
//! A primitive refused by a backend returns [`ErrorKind::Unsupported`]. The other guides in
//! `docs/`: `cli.md` (the `baton` command), `operating.md` (durability settings, ACL users,
//! PostgreSQL roles and `baton migrate`, TLS, Cluster and Sentinel), `protocol.md` (the keys and
//! rows each primitive writes), `reliability.md` (the model checker, the chaos harness, the test
//! suite) and `benchmarks.md`.
//!
//! # The API at a glance
//! Every primitive is reached the same way (a handle from the [`Client`]; Redlock's from
//! [`Redlock::new`] over several clients), its options are validated builders whose setters say
//! "Defaults to …", and everything it holds answers the same names: the read side of every held
//! lease is [`HeldLease`], the fencing token is [`Fenced`], the owner's side is [`LeaseGuard`]
//! (`use baton::prelude::*;` brings all three). A lease's duration is its `lease`, a watchdog
//! keeps it alive up to `max_hold`, an attempt is an `attempt`, and every stream of events reads
//! with `next_event()`.
//!
//! The lock-shaped primitives share one options type, [`LockOptions`] (a field one of them
//! cannot honour is refused with [`ErrorKind::Unsupported`], naming it), one wait loop, and
//! one `with_lock` that hands `work` the guard:
//!
//! | operation | [`Locks`] (mutex) | [`FairLocks`] | [`Redlock`] | `AdvisoryLocks` | [`RwLocks`] | [`Semaphores`] |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | one try, `Ok(None)` when held | `try_acquire(key, lease)` | `try_acquire(key, lease)` | `try_acquire(key, lease)` | `try_acquire(key, mode, &opts)` | `try_read(key, lease)`, `try_write`, `try_upgradeable_read` | `try_acquire(key, limit, lease)` |
//! | wait for it | `acquire(key, lease, &opts)` | `acquire(key, lease, &opts)` | `acquire(key, lease, &opts)` | `acquire(key, mode, &opts)` | `read(key, lease, &opts)`, `write`, `upgradeable_read` | `acquire(key, limit, lease, &opts)` |
//! | run `work(&guard)` holding it | `with_lock` | `with_lock` | `with_lock` | `with_xact_lock` (the lock ends with the transaction `work` runs in) | `with_read`, `with_write` | `with_permit` |
//! | what you hold | [`LockGuard`] | [`LockGuard`] | [`RedlockGuard`] | `AdvisoryGuard` | [`ReadGuard`], [`WriteGuard`], [`UpgradeableReadGuard`] (`upgrade`, `downgrade`) | [`PermitGuard`] (`slot()`: which of the `limit` permits) |
//! | [`HeldLease`]: `key()`, `lease_deadline()`, `lost()`, `lost_token()`, `is_lost()`, `loss_reason()` | yes | yes | yes | yes (a session lock has no lease: its deadline never comes; a heartbeat raises the loss signal when the session dies) | yes | yes |
//! | [`LeaseGuard`]: `extend`, `start_watchdog`, `release() -> Result<bool>` | yes | yes | yes (by quorum) | `release()` only: nothing to extend | yes | yes |
//! | [`Fenced`]: `fencing_token()` | yes | yes | no: independent masters cannot order their grants | yes (from a sequence) | yes (a read: the last write's token) | yes (per slot) |
//! | fenced resource, a Redis hash (on PostgreSQL your own table checks the token): `write_fenced`, `read_fenced` | on [`Locks`] | on the guard | no | pass the token to your own table | on the guard (`write_fenced` on a write) | on the guard and on [`Semaphores`] (the resource keyed by permit slot) |
//! | backends | Redis (all topologies), PostgreSQL | Redis (all topologies) | independent Redis servers | PostgreSQL | Redis (all topologies), PostgreSQL | Redis (all topologies), PostgreSQL |
//!
//! The other primitives hold leases for you and hand out the same read side: leader election
//! ([`Leaders`]: `elector(key, &opts)?.campaign()` waits for a [`Term`], `lead(key, &opts,
//! work)` runs `work` while leading; the elector renews the term and `resign`s it, and the
//! term's fencing token is its number), the failover coordinator ([`Failover`], from
//! [`Client::failover`]: `run`/`start`, whose [`AttemptHandle`] is a [`HeldLease`] with a
//! [`Fenced`] token, and the operator's `job_status`, `watch_job`, `fail_attempt` and
//! `reset_job`) and run-or-enqueue ([`Queues`]: `run_or_enqueue`/`drain`). A primitive a
//! backend cannot hold is refused with [`ErrorKind::Unsupported`], which says what to use
//! instead.
//!
//! # Guarantees
//! - Each attempt number is granted to at most one worker, and at most `max_attempts` attempts
//!   start, as long as Redis does not lose acknowledged writes (run it with `appendonly yes`,
//!   `appendfsync always` and `maxmemory-policy noeviction`). When a worker sees that Redis did
//!   lose the state, it reports [`ErrorKind::StateLost`] instead of running the job again.
//! - A job ends `DONE` at most once; `DONE`/`EXHAUSTED` are kept for `retention`, so late
//!   duplicates of the job are not re-run.
//! - A worker that loses its attempt learns it: `LeaseLost` as soon as it is seen, and at the
//!   latest by its lease deadline (send time of the last confirmed extension + `lease` −
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
//! - [`client`]: [`Client`] opens the backend and hands out primitive handles
//!   ([`Client::failover`], [`Client::locks`], …, and [`Redlock::new`] over several clients);
//!   nothing else.
//! - [`inspect`]: the operator's view beside the client ([`Client::inspect`]): every job, lock,
//!   election, fair lock and queue under a prefix, listed in bounded batches, read from the
//!   primitives' key layouts.
//! - [`failover`]: the coordinator, a primitive: configuration, pure protocol, worker task,
//!   events, closure form, operator tools ([`Failover`]). Primitives never import each other or
//!   the client.
//! - [`mutex`]: the fenced mutex, a primitive ([`Locks`], [`LockGuard`], [`LockOptions`]).
//! - [`rwlock`]: the fenced read-write lock, a primitive ([`RwLocks`], [`ReadGuard`],
//!   [`WriteGuard`], [`UpgradeableReadGuard`]).
//! - [`fair`]: the fair lock, a primitive: waiters in arrival order, only the next one woken,
//!   a priority reservation ([`FairLocks`], [`LockGuard`], [`Reservation`]).
//! - [`leader`]: leader election, a primitive: terms that double as fencing tokens, renewals,
//!   work stopped before anyone else can lead ([`Leaders`], [`Elector`], [`LeaderWorker`]).
//! - [`queue`]: run-or-enqueue, a primitive: one runner per key, posts queued in a Redis Stream
//!   and drained by the holder before it lets go, at-least-once ([`Queues`]).
//! - `advisory` (feature `postgres`): PostgreSQL advisory locks, transaction-scoped or
//!   session-scoped on a dedicated connection per guard, with a heartbeat loss signal and
//!   fencing tokens from a sequence (`AdvisoryLocks`, `AdvisoryGuard`).
//! - [`redlock`]: the mutex over several independent masters by quorum, without fencing
//!   ([`Redlock`], [`RedlockGuard`]).
//! - `lease`: the lease kernel every lease-holding primitive shares, and no wire protocol:
//!   deadlines computed at send time, fencing tokens, the background release of a lost grant,
//!   the one held lease (one core behind [`HeldLease`], [`Fenced`] and [`LeaseGuard`]), the
//!   one keepalive engine (each primitive gives one extension round: the lock store's, a
//!   Redlock quorum's; the watchdog and the loss signal are the engine's), and the one way to
//!   acquire: the lock options ([`LockOptions`]) and the acquisition engine (`lease::acquire`:
//!   each lock-shaped primitive gives one try and its wake channel; the engine owns the wait
//!   loop and `with_lock`).
//! - `backend`: the store seams. One `Backend` enum (and its weak form) with the dispatch every
//!   primitive shares (tasks, cancellation, timeouts, pub/sub), `backend::connect` (the one way
//!   a client builds its backend from a URL), and one method set per shape of storage, each
//!   with one arm per backend: `backend::locks` (acquire, extend, release by token, read,
//!   take), `backend::jobs` (the failover coordinator's job store), `backend::fair`,
//!   `backend::queue`, `backend::redlock` (Redis structures, refused elsewhere),
//!   `backend::inspect` (what the operator's view reads) and `backend::advisory` (a PostgreSQL
//!   feature). What crosses a seam is plain data from the leaves. Below them, one folder per
//!   backend holds every script and statement: `backend::redis` (the multiplexed connection,
//!   the dedicated-connection pool for `WATCH … EXEC`, the pub/sub hub, Cluster and Sentinel
//!   routing, URL checks, the classification of server errors, and [`acl`]: the exact commands
//!   baton sends, for a least-privilege ACL user) and `backend::postgres` (pool, dedicated
//!   sessions, the `LISTEN` hub, schema, SQLSTATE classification, the job and lock tables'
//!   statements, the advisory lock functions). Neither imports a seam, a primitive or the
//!   other; no file outside `src/backend/` names a wire crate, a backend folder, a script or
//!   a SQL statement (`tests/layering.rs` checks it).
//! - leaves: [`error`] ([`Error`] with [`Error::is_retryable`], [`ConfigError`]) and `util`
//!   (backoff, deadlines, tokens, the mailbox, what both backends share: connection settings,
//!   pub/sub messages, wake-one groups, URL redaction, TLS material, and the data that crosses
//!   the store seams).
//! - `testing` (feature `testing`): a private `redis-server` fixture for tests and examples.
//!
//! # Metrics
//! baton records counters and duration histograms through the [`metrics`](https://docs.rs/metrics)
//! facade and never installs a recorder: install yours (a Prometheus exporter, StatsD, ...), then
//! call [`describe_metrics`] once so the recorder has every metric's help text and unit. The
//! metrics and their labels are listed in `docs/operating.md` ("Metrics and traces").
//!
//! # Errors
//! One rule for every method that runs your code ([`Failover::run`], [`Queues::run_or_enqueue`],
//! [`Queues::drain`], the `with_lock`s, `AdvisoryLocks::with_xact_lock`): baton's own failures
//! come back as `Err(`[`Error`]`)`; everything your code returns, its error included, comes
//! back inside `Ok(...)` (as an outcome: [`RunOutcome::Failed`], [`RunOrEnqueue::HandlerFailed`],
//! [`Drain::HandlerFailed`]; or as it is: `with_lock` returns your value, `with_xact_lock` your
//! `Result`), so `?` on the call never mixes the two. [`Error::kind`] gives the stable classification and
//! [`Error::is_retryable`] says whether trying again can help.
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
pub mod inspect;
pub mod leader;
// Its decisions the model reads are `pub` for `model_api` only, which is hidden.
#[cfg_attr(feature = "model", allow(missing_docs))]
mod lease;
// What the model checker (the `baton-model` crate in `model/`) reads: hidden, not the API.
#[cfg(any(test, feature = "model"))]
#[doc(hidden)]
pub mod model_api;
pub mod mutex;
pub mod queue;
pub mod redlock;
pub mod rwlock;
pub mod schedule;
pub mod semaphore;
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

// The guides' code blocks (docs/*.md), compiled as doctests like the README's: one item per
// file, so a failing block names its guide.
#[cfg(doctest)]
#[doc = include_str!("../docs/failover.md")]
pub struct DocsFailover;
#[cfg(doctest)]
#[doc = include_str!("../docs/mutex.md")]
pub struct DocsMutex;
#[cfg(doctest)]
#[doc = include_str!("../docs/rwlock.md")]
pub struct DocsRwLock;
#[cfg(doctest)]
#[doc = include_str!("../docs/semaphore.md")]
pub struct DocsSemaphore;
#[cfg(doctest)]
#[doc = include_str!("../docs/fair-lock.md")]
pub struct DocsFairLock;
#[cfg(doctest)]
#[doc = include_str!("../docs/leader-election.md")]
pub struct DocsLeaderElection;
#[cfg(doctest)]
#[doc = include_str!("../docs/redlock.md")]
pub struct DocsRedlock;
#[cfg(doctest)]
#[doc = include_str!("../docs/run-or-enqueue.md")]
pub struct DocsRunOrEnqueue;
#[cfg(doctest)]
#[doc = include_str!("../docs/advisory-locks.md")]
pub struct DocsAdvisoryLocks;
#[cfg(doctest)]
#[doc = include_str!("../docs/scheduling.md")]
pub struct DocsScheduling;
#[cfg(doctest)]
#[doc = include_str!("../docs/cli.md")]
pub struct DocsCli;
#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
pub struct DocsOperating;
#[cfg(doctest)]
#[doc = include_str!("../docs/protocol.md")]
pub struct DocsProtocol;
#[cfg(doctest)]
#[doc = include_str!("../docs/reliability.md")]
pub struct DocsReliability;
#[cfg(doctest)]
#[doc = include_str!("../docs/benchmarks.md")]
pub struct DocsBenchmarks;

#[cfg(feature = "postgres")]
pub use advisory::{
    AdvisoryGuard, AdvisoryKey, AdvisoryLocks, AdvisoryMode, AdvisoryOptions,
    AdvisoryOptionsBuilder,
};
pub use client::{Client, ClientBuilder, Durability};
pub use error::{ConfigError, Error, ErrorKind};
pub use failover::{
    missed_ticks, AttemptOutcome, AttemptRecord, Check, CheckStatus, Exit, HostSeen,
    OccurrenceRecord, Pause, RecordChange, RecordOptions, RecordedOutcome, ScheduleRecord,
};
pub use failover::{
    Acquired, Attempt, AttemptHandle, CatchUp, Event, FailAttempt, Failover, FailoverConfig,
    FailoverConfigBuilder, IntoJob, JobChange, JobState, JobStatus, JobWatch, OccurrenceOutcome,
    OccurrenceReport, Overlap, Replaced, ResetJob, RunOutcome, ScheduleOptions,
    ScheduleOptionsBuilder, Scheduled, StatusLevel, Trigger, TriggerPoll, Worker,
};
pub use failover::{BackfillPlan, MAX_BACKFILL_TICKS};
pub use failover::{LiveOccurrence, OverlapDecision, WaitedOut};
pub use fair::{FairLocks, FairOptions, FairOptionsBuilder, Reservation};
pub use inspect::{EntryWatch, Inspector, Listing};
pub use leader::{
    ElectionOptions, ElectionOptionsBuilder, Elector, LeaderEvent, LeaderWorker, Leaders, Observed,
    Observer, Term,
};
pub use lease::guard::{Fenced, HeldLease, LeaseGuard};
pub use lease::options::{LockOptions, LockOptionsBuilder};
pub use lease::prelude;
pub use mutex::{
    AcquireOptions, AcquireOptionsBuilder, Expected, FencedValue, FencedWrite, ForceRelease,
    LockGuard, Locks, Taken,
};
pub use queue::{Drain, QueueItem, Queues, RunOrEnqueue};
pub use redlock::{Redlock, RedlockGuard, RedlockOptions, RedlockOptionsBuilder};
pub use rwlock::{ReadGuard, RwLocks, UpgradeableReadGuard, WriteGuard};
pub use schedule::{Occurrence, Schedule, ScheduleSpec, SpecKind};
pub use semaphore::{PermitGuard, Semaphores};
pub use util::metrics::describe_metrics;

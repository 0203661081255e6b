//! What the failover coordinator's job store holds and answers, whichever backend holds the
//! job: the values of the stored state, lease and fence ([`State`], [`Lease`], [`Fence`], read
//! together as an [`Observation`]), the writes a transition makes ([`Write`]), the job's keys
//! ([`JobKeys`]), the operator's view ([`JobStatus`]) and answers ([`FailAttempt`],
//! [`ResetJob`]), and [`JobStore`], the contract each backend's store fulfils for the worker task.
//!
//! They are leaves, below the backends, because both sides name them: the coordinator's pure
//! decisions (`failover::protocol`, which re-exports the values) and its worker read them, and
//! each backend's store (`backend::redis::jobs`, `backend::postgres::jobs`) builds them, which
//! may not import a primitive. Which store serves a job is chosen once, in `backend::jobs`.
//!
//! The rules of what a stored value means ([`state_of_bytes`], [`lease_of`],
//! [`parse_attempt`]) are here too, so that every backend reads the same bytes the same way.

use serde::Serialize;
use tokio::time::Instant;

use crate::error::{preview, Error};
use crate::util::pubsub::Subscription;
use crate::util::settings::{ConnSettings, ReplicaWait};

/// The sentinel stored once the job succeeded.
pub const DONE: &str = "DONE";
/// The sentinel stored once `max_attempts` attempts failed.
pub const EXHAUSTED: &str = "EXHAUSTED";

/// What the state key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum State {
    Absent,
    Attempt(u64),
    Done,
    Exhausted,
    /// A string baton never writes (shown as a bounded preview).
    Corrupt(String),
    /// A non-string type; the server's message.
    WrongType(String),
}

impl State {
    pub fn describe(&self) -> String {
        match self {
            State::Absent => "no state".into(),
            State::Attempt(n) => format!("attempt {n}"),
            State::Done => DONE.into(),
            State::Exhausted => EXHAUSTED.into(),
            State::Corrupt(v) => v.clone(),
            State::WrongType(_) => "a non-string value".into(),
        }
    }
}

/// What the lease key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lease {
    Absent,
    Held {
        token: String,
        holder: String,
        /// Remaining time in ms; `None` when the key has no TTL (a foreign write).
        pttl_ms: Option<u64>,
    },
    Corrupt(String),
    WrongType(String),
}

impl Lease {
    /// The token of a live lease.
    pub fn token(&self) -> Option<&str> {
        match self {
            Lease::Held { token, .. } => Some(token),
            _ => None,
        }
    }
}

/// What the fence key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fence {
    Absent,
    Value(u64),
    Corrupt(String),
    WrongType(String),
}

/// Everything round trip 1 read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Observation {
    pub state: State,
    pub lease: Lease,
    pub fence: Fence,
    /// The server's clock in µs (from `TIME`), the floor of the next fencing token.
    pub now_us: u64,
}

/// Which key a fault concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    State,
    Lease,
    Fence,
}

impl Which {
    /// The key's role in messages (`state`, `lease`, `fence`).
    pub fn name(self) -> &'static str {
        match self {
            Which::State => "state",
            Which::Lease => "lease",
            Which::Fence => "fence",
        }
    }
}

/// A message on the job's channel (`P{J}:events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// `acquired:<n>`: attempt `n` was granted.
    Acquired(u64),
    /// `done`: the job succeeded.
    Done,
    /// `failed`: the holder gave its attempt up; backups take over at once.
    Failed,
    /// `released`: the holder was stopped (or dropped its handle, or ran past `max_hold`).
    Released,
    /// `exhausted`: the last attempt failed.
    Exhausted,
}

impl Message {
    /// The text published.
    pub fn text(self) -> std::borrow::Cow<'static, str> {
        match self {
            Message::Acquired(n) => format!("acquired:{n}").into(),
            Message::Done => "done".into(),
            Message::Failed => "failed".into(),
            Message::Released => "released".into(),
            Message::Exhausted => "exhausted".into(),
        }
    }
}

/// What a transition stores in the state key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateValue {
    Attempt(u64),
    Done,
    Exhausted,
}

/// One command of a transition's `MULTI … EXEC`, in the order it is sent. The worker turns each
/// into a Redis command; the model checker (`src/model/`) applies the same list to its store,
/// so both carry out one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    /// `SET state <value> PX retention`.
    SetState(StateValue),
    /// `PEXPIRE state retention`.
    KeepState,
    /// `SET lease "<token> <holder>" PX lease`.
    SetLease,
    /// `DEL lease`.
    DelLease,
    /// `SET fence <token> PX retention`.
    SetFence(u64),
    /// `PEXPIRE fence retention`: the fence lives as long as the state (DESIGN.md §3).
    KeepFence,
    /// `SET failure <reason> PX retention`.
    SetFailure,
    /// `PUBLISH events <message>`.
    Publish(Message),
}

/// The keys every transition `WATCH`es, in order: the three keys its decision read. Every
/// transition also writes or refreshes the fence (see `failover::protocol`'s `grant_writes` and `finish_writes`), so
/// while the fence key exists its `WATCH` alone aborts every `EXEC` that a change of the state
/// should abort; the model checker shows that dropping only the state's `WATCH` breaks nothing
/// it can reach, and that dropping the state's and the fence's lets a late `done()` and a
/// takeover both commit (`src/model/failover.rs`). The state stays watched: defence in depth
/// that costs nothing in the same `WATCH` command.
pub const WATCHED: [Which; 3] = [Which::State, Which::Lease, Which::Fence];

// ----- What a stored value means ---------------------------------------------------------------

/// Parses a canonical attempt number: decimal digits only, no sign, no leading zero, at least 1,
/// at most `i64::MAX` (what Redis' `INCR` could ever produce).
pub fn parse_attempt(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 || bytes[0] == b'0' {
        return None;
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    (n <= i64::MAX as u64).then_some(n)
}

pub(crate) fn lossy(bytes: &[u8]) -> String {
    preview(&String::from_utf8_lossy(bytes))
}

/// What a stored state value means (the same rules on every backend): `DONE`, `EXHAUSTED`, a
/// canonical attempt number, else corrupt.
pub fn state_of_bytes(b: &[u8]) -> State {
    if b == DONE.as_bytes() {
        State::Done
    } else if b == EXHAUSTED.as_bytes() {
        State::Exhausted
    } else {
        match parse_attempt(b) {
            Some(n) => State::Attempt(n),
            None => State::Corrupt(lossy(b)),
        }
    }
}

/// The stored text of a state value (what [`state_of_bytes`] reads back).
pub fn state_text(v: StateValue) -> String {
    match v {
        StateValue::Attempt(n) => n.to_string(),
        StateValue::Done => DONE.to_string(),
        StateValue::Exhausted => EXHAUSTED.to_string(),
    }
}

/// Formats the lease value: the token, a space, the holder's name.
pub fn lease_value(token: &str, holder: &str) -> String {
    format!("{token} {holder}")
}

/// A live lease's token and holder, checked (the same rules on every backend): a token baton
/// never writes is corrupt.
pub fn lease_of(token: &str, holder: &str, pttl_ms: Option<u64>) -> Lease {
    if token.len() != 32 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Lease::Corrupt(preview(&lease_value(token, holder)));
    }
    Lease::Held {
        token: token.to_string(),
        holder: holder.to_string(),
        pttl_ms,
    }
}

// ----- The job's keys ---------------------------------------------------------------------------

/// The Redis keys and pub/sub channel of one job, in one allocation (tens of thousands of
/// waiting workers each hold one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobKeys {
    /// `P{J}`, `P{J}:lease`, `P{J}:fence`, `P{J}:failure`, `P{J}:events`, back to back.
    buf: String,
    /// Where each of the five ends in `buf`.
    ends: [usize; 5],
}

impl JobKeys {
    pub(crate) fn new(prefix: &str, job: &str) -> Self {
        let state_len = prefix.len() + job.len() + 2;
        let mut buf = String::with_capacity(5 * state_len + 30);
        let mut ends = [0; 5];
        for (i, suffix) in ["", ":lease", ":fence", ":failure", ":events"]
            .iter()
            .enumerate()
        {
            buf.push_str(prefix);
            buf.push('{');
            buf.push_str(job);
            buf.push('}');
            buf.push_str(suffix);
            ends[i] = buf.len();
        }
        JobKeys { buf, ends }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        // The ends were recorded at char boundaries while building `buf`.
        self.buf.get(start..self.ends[i]).unwrap_or_default()
    }

    /// `P{J}`: the attempt counter, or `DONE` / `EXHAUSTED`.
    pub(crate) fn state(&self) -> &str {
        self.part(0)
    }

    /// `P{J}:lease`: the holder's token and name, with TTL `lease`.
    pub(crate) fn lease(&self) -> &str {
        self.part(1)
    }

    /// `P{J}:fence`: the last fencing token granted.
    pub(crate) fn fence(&self) -> &str {
        self.part(2)
    }

    /// `P{J}:failure`: the last failure reason (for operators and `status`).
    pub(crate) fn failure(&self) -> &str {
        self.part(3)
    }

    /// The key of `which`.
    pub(crate) fn of(&self, which: Which) -> &str {
        match which {
            Which::State => self.state(),
            Which::Lease => self.lease(),
            Which::Fence => self.fence(),
        }
    }

    /// `P{J}:events`: the pub/sub channel that wakes backups.
    pub(crate) fn channel(&self) -> &str {
        self.part(4)
    }

    /// `P{J}:stop`: the stop marker of a replaced attempt (see [`Replaced`]), made on demand:
    /// only the operator tools and a replaced holder name it, so the keys every waiting backup
    /// keeps do not grow by it.
    pub(crate) fn stop(&self) -> String {
        format!("{}:stop", self.state())
    }
}

// ----- The operator's view ----------------------------------------------------------------------

/// A job's state as stored in Redis; see [`Failover::job_state`](crate::Failover::job_state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

/// Everything stored about a job; see [`Failover::job_status`](crate::Failover::job_status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// The job name.
    pub key: String,
    /// The state key's value (with the live holder, if any).
    pub state: JobState,
    /// The state key's remaining retention in ms (`None` if absent or without TTL).
    pub state_ttl_ms: Option<u64>,
    /// The last fencing token granted (`None` if absent or unreadable).
    pub fencing_token: Option<u64>,
    /// The last failure reason recorded (`attempt N by NAME: reason`).
    pub last_failure: Option<String>,
}

impl JobStatus {
    /// Whether an attempt's lease is alive (a holder is running it).
    pub fn is_live(&self) -> bool {
        matches!(
            self.state,
            JobState::Attempt {
                holder: Some(_),
                ..
            }
        )
    }

    /// Whether the job ended (`DONE` or `EXHAUSTED`).
    pub fn is_finished(&self) -> bool {
        matches!(self.state, JobState::Done | JobState::Exhausted)
    }
}

/// What an operator sees of a job's stored state and lease (the same on every backend).
pub(crate) fn job_state(state: State, lease: Lease) -> JobState {
    let (holder, lease_remaining_ms) = match lease {
        Lease::Held {
            holder, pttl_ms, ..
        } => (Some(holder), pttl_ms),
        Lease::Corrupt(v) => (Some(format!("unreadable lease {v}")), None),
        _ => (None, None),
    };
    match state {
        State::Absent => JobState::Absent,
        State::Attempt(number) => JobState::Attempt {
            number,
            holder,
            lease_remaining_ms,
        },
        State::Done => JobState::Done,
        State::Exhausted => JobState::Exhausted,
        State::Corrupt(value) => JobState::Corrupt { value },
        State::WrongType(detail) => JobState::Corrupt {
            value: preview(&detail),
        },
    }
}

/// What [`Failover::fail_attempt`](crate::Failover::fail_attempt) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailAttempt {
    /// This attempt, the one expected, was released.
    Released(u64),
    /// No attempt's lease was alive; nothing was done.
    NotLive,
    /// This other attempt is live now; nothing was done.
    Another(u64),
}

/// What [`Failover::replace_attempt`](crate::Failover::replace_attempt) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Replaced {
    /// This attempt, the one expected, was stopped: the job is `DONE`, its lease deleted, and
    /// a stop marker lives until its holder acknowledges or `lease_remaining` (the old lease's
    /// time left, by the server's clock) runs out.
    Stopped {
        /// The attempt stopped.
        attempt: u64,
        /// The old lease's remaining time when it was deleted: the longest its holder may
        /// still be running the work.
        lease_remaining: std::time::Duration,
    },
    /// No attempt's lease was alive; nothing was done.
    NotLive,
    /// This other attempt is live now; nothing was done.
    Other(u64),
}

/// The channel message that tells attempt `attempt`'s holder it was replaced by `by`
/// (`replaced:N:BY`): any message wakes the backups, which then read `DONE`.
pub fn replaced_message(attempt: u64, by: &str) -> String {
    format!("replaced:{attempt}:{by}")
}

/// The stop marker's value: the attempt stopped, a space, who replaced it.
pub fn stop_value(attempt: u64, by: &str) -> String {
    format!("{attempt} {by}")
}

/// Whether a stop marker's value names `attempt` (what an acknowledgement checks).
pub fn stop_names(value: &[u8], attempt: u64) -> bool {
    let first = value.split(|b| *b == b' ').next().unwrap_or_default();
    parse_attempt(first) == Some(attempt)
}

/// What [`Failover::reset_job`](crate::Failover::reset_job) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResetJob {
    /// The job's state was deleted.
    Reset,
    /// This attempt is live and was not the one expected; nothing was done.
    Live(u64),
}

/// Which live attempt an operator's command names (checked against what the store reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named {
    /// No live attempt may be touched.
    None,
    /// Whichever attempt is live.
    Any,
    /// Only this attempt.
    Attempt(u64),
}

impl Named {
    /// Whether live attempt `attempt` is the one named.
    pub(crate) fn names(self, attempt: u64) -> bool {
        match self {
            Named::None => false,
            Named::Any => true,
            Named::Attempt(n) => n == attempt,
        }
    }
}

// ----- The store --------------------------------------------------------------------------------

/// What a lease extension found: confirmed (with its send time, from which the new deadline
/// is measured), or refused, with what the store read instead (for [`decide_holder`]).
///
/// [`decide_holder`]: crate::failover::protocol::decide_holder
pub(crate) enum Extended {
    Confirmed { sent: Instant },
    Refused(Observation),
}

/// A lease extension in flight; it owns what it needs (it runs beside the holder's timers).
pub(crate) type ExtensionFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Extended, Error>> + Send>>;

/// The grant a holder extends or ends.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub attempt: u64,
    pub token: String,
}

/// Where one job's state lives, as the worker task sees it: the worker's loop and its pure
/// decisions are written once, above this trait; a store only reads, writes and wakes.
///
/// A transition is *observe → decide → commit* on one [`JobStore::Conn`]: the observation
/// arms the conditional write (Redis: `WATCH` on the connection; PostgreSQL: the row's version
/// kept with the connection), and the commit applies the decision's [`Write`]s only if nothing
/// observed has changed since, else it returns `None` (the nil `EXEC`) and the worker observes
/// again.
pub(crate) trait JobStore: Send + Sync + 'static {
    /// A connection carrying one transition's observation to its commit.
    type Conn: Send;

    /// The metrics' `backend` label of this store.
    const BACKEND: crate::util::metrics::Backend;

    /// The client's connection settings.
    fn settings(&self) -> &ConnSettings;

    /// Where `which` of this job is stored, for messages (a key name, a table row).
    fn locate(&self, which: Which) -> String;

    /// The worker's name, stored with its lease.
    fn worker_name(&self) -> &str;

    /// Runs the test hook (feature `testing`) between a transition's observation and commit.
    fn before_exec(&self, what: &'static str) -> impl std::future::Future<Output = ()> + Send;

    /// A connection for the next transition, waiting for one until `deadline`.
    fn checkout(
        &self,
        deadline: Instant,
    ) -> impl std::future::Future<Output = Result<Self::Conn, Error>> + Send;

    /// Bounds every later request on `conn` by `deadline` (a holder's, by its lease).
    fn set_deadline(conn: &mut Self::Conn, deadline: Instant);

    /// Reads the job (state, lease, fence, the server's clock) and arms `conn`'s commit.
    fn observe<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
    ) -> impl std::future::Future<Output = Result<Observation, Error>> + Send + 'a;

    /// Ends a transition that writes nothing, without a round trip.
    fn abandon(conn: &mut Self::Conn);

    /// Applies `writes` if nothing observed on `conn` has changed: `Ok(None)` when something
    /// did (nothing was written), else `Ok(Some(acked))`, `acked` being how many replicas
    /// acknowledged when `wait` asked. `token` is the lease's token ([`Write::SetLease`]),
    /// `failure` the text of [`Write::SetFailure`], `context` names the transition in errors.
    #[allow(clippy::too_many_arguments)]
    fn commit<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        writes: &'a [Write],
        token: &'a str,
        failure: &'a str,
        wait: Option<ReplicaWait>,
        context: &'static str,
    ) -> impl std::future::Future<Output = Result<Option<Option<u64>>, Error>> + Send + 'a;

    /// Subscribes to the job's messages ([`Message`]).
    fn subscribe(&self) -> impl std::future::Future<Output = Result<Subscription, Error>> + Send;

    /// A plain read (no commit armed): the state, and `Some(pttl)` while a lease is alive
    /// (`Some(None)`: alive without expiry).
    fn quick_read(
        &self,
    ) -> impl std::future::Future<Output = Result<(State, Option<Option<u64>>), Error>> + Send;

    /// A plain read of state and lease for a holder's check, bounded by `limit`; the fence and
    /// time are not read (`Fence::Absent`, 0).
    fn holder_read(
        &self,
        limit: Instant,
    ) -> impl std::future::Future<Output = Result<Observation, Error>> + Send;

    /// One lease extension of `held`, bounded by `lease_end`: atomic, conditional on the lease
    /// still holding `held`'s token and the state its attempt.
    fn extension(&self, held: Held, lease_end: Instant) -> ExtensionFuture;

    /// Deletes the job's stop marker if it names `attempt` (a replaced holder's
    /// acknowledgement once its work has stopped): `Ok(true)` when it was deleted.
    fn acknowledge_stop(
        &self,
        attempt: u64,
    ) -> impl std::future::Future<Output = Result<bool, Error>> + Send + 'static;

    /// The client's task tracker, for the background work of a holder that outlives its loop
    /// (the acknowledgement above).
    fn tracker(&self) -> &tokio_util::task::TaskTracker;
}

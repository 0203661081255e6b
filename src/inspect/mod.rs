//! An operator's view of everything under a key prefix: every failover job (scheduled
//! occurrences `KEY@DIGEST@TICK` included), mutex, leader election, fair lock, run-or-enqueue
//! queue, semaphore and read-write lock, with its state, holder, time left and fencing token
//! ([`Inspector`], from [`Client::inspect`](crate::Client::inspect)). A semaphore shows its
//! limit and each held permit (slot, fencing token, holder, time left); a read-write lock its
//! mode, each holder (mode, fencing token, time left), the last write's token and whether a
//! writer waits ([`Entry::holders`]).
//!
//! - [`Inspector::list`]: a [`Listing`], read batch by batch through the backend's inspection
//!   seam (`backend::inspect`). On Redis a cursor-based `SCAN MATCH prefix* COUNT n` on every
//!   primary (one server, each primary of a cluster, the followed primary of a Sentinel set),
//!   each batch's values read in one pipeline on the node that returned the keys; never
//!   `KEYS`, and never more than one batch in memory. A semaphore's or read-write lock's
//!   holders are read in a second pipeline on the same node. On PostgreSQL the tables
//!   `baton_jobs`, `baton_locks`, `baton_semaphores` and `baton_rwlocks`, a page at a time
//!   (keyset pagination).
//! - [`Inspector::find`]: what name `K` is, of any kind (a job and a lock may share a name:
//!   their keys differ).
//! - [`Inspector::watch`]: follows one lock, fair lock, election, semaphore or read-write
//!   lock: holder changes, tokens, loss, a semaphore's limit.
//! - [`ScheduleFold`]: a schedule's occurrences folded into one row that shows the worst
//!   open occurrence ([`Entry::severity`]), as `baton status` and `baton dashboard` show them.
//!
//! Standbys (a job's waiting backups, an election's candidates) are registered nowhere: they
//! listen on the entry's pub/sub channel. On Redis an entry's read counts that channel's
//! subscribed clients (`PUBSUB NUMSUB`, `SHARDNUMSUB` on a cluster) into
//! [`Entry::standbys`]; on PostgreSQL nobody can count another session's `LISTEN`s, and it
//! stays unknown (`None`).
//!
//! What a key is comes from the primitives' own key layouts (their `keys` modules): `P{K}` and
//! its `:lease`/`:fence`/`:failure` are a job's, `P` `lock:{K}` a mutex's, `P` `sem:{K}` a
//! semaphore's (its held slots `sem:{K}:<i>` and its fair waiters' line beside it), `P` `rw:{K}` a read-write lock's (its
//! holders' leases `rw:{K}:h:TOKEN` beside it), and so on. A key of
//! the layout that names one entry (a job's state key, a lock's fence) stands for it; keys
//! beside it are skipped, and so is every key that no primitive writes (another application's
//! under the same prefix), and Redlock's (it lives on independent masters, not this server).
//!
//! A listing is not a snapshot: `SCAN` may return a key twice or miss one that is created or
//! deleted while it runs, and each entry is read when its batch is.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

mod fold;
pub use fold::{Occurrence, ScheduleFold, ScheduleRow, LAST_OCCURRENCES};

use crate::backend::inspect::{
    EntryRead, EntryRecord, Found, LockRead, LockRecord, Position, RwRead, RwRecord, SemRead,
    SemRecord, Tables, Waiting,
};
use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::failover::keys::JobKeys;
use crate::failover::{JobState, JobStatus};

/// The default number of keys asked of one `SCAN` call (or rows of one page): the bound of what
/// a listing holds at a time.
pub const DEFAULT_BATCH: usize = 500;

/// What an entry is: which primitive wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Kind {
    /// A failover job (a scheduled occurrence is one too: `KEY@DIGEST@TICK`).
    Job,
    /// A fenced mutex.
    Lock,
    /// A leader election.
    Leader,
    /// A fair lock.
    Fair,
    /// A run-or-enqueue queue.
    Queue,
    /// A semaphore.
    Semaphore,
    /// A read-write lock.
    RwLock,
}

impl Kind {
    /// Every kind, in listing order.
    pub const ALL: [Kind; 7] = [
        Kind::Job,
        Kind::Lock,
        Kind::Leader,
        Kind::Fair,
        Kind::Queue,
        Kind::Semaphore,
        Kind::RwLock,
    ];

    /// Its name, as `--kind` and the JSON say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Job => "job",
            Kind::Lock => "lock",
            Kind::Leader => "leader",
            Kind::Fair => "fair",
            Kind::Queue => "queue",
            Kind::Semaphore => "semaphore",
            Kind::RwLock => "rwlock",
        }
    }

    /// The sub-prefix of the primitive's keys (`None` for a job: `P{K}`).
    fn sub_prefix(self) -> Option<&'static str> {
        match self {
            Kind::Job => None,
            Kind::Lock => Some(crate::mutex::keys::SUB_PREFIX),
            Kind::Leader => Some(crate::leader::keys::SUB_PREFIX),
            Kind::Fair => Some(crate::fair::keys::SUB_PREFIX),
            Kind::Queue => Some(crate::queue::keys::SUB_PREFIX),
            Kind::Semaphore => Some(crate::semaphore::keys::SUB_PREFIX),
            Kind::RwLock => Some(crate::rwlock::keys::SUB_PREFIX),
        }
    }

    /// The suffixes of the keys beside the entry's own (from the primitive's key layout).
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Kind::Job => &[":lease", ":fence", ":failure"],
            Kind::Lock | Kind::Leader => &[":fence"],
            Kind::Fair => &[":fence", ":queue", ":alive", ":reserved"],
            Kind::Queue => &[":fence", ":items"],
            // Besides these, a semaphore's slots (`:<i>`) and a read-write lock's holders
            // (`:h:TOKEN`): see `parse_key`.
            Kind::Semaphore => &[":queue", ":alive"],
            Kind::RwLock => &[":waiting"],
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Kind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Kind, ConfigError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "kind",
                    "one of job, lock, leader, fair, queue, semaphore, rwlock",
                )
            })
    }
}

/// An entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EntryState {
    /// A job whose attempt's lease is alive.
    Running,
    /// A job between attempts: the last one ended without success, a backup may take over.
    Waiting,
    /// A job that succeeded.
    Done,
    /// A job whose every attempt failed.
    Exhausted,
    /// A lock, fair lock, queue, election, semaphore or read-write lock with a live holder.
    Held,
    /// A lock, fair lock, queue, election, semaphore or read-write lock nobody holds (its
    /// fence is kept).
    Free,
    /// A value baton never writes.
    Corrupt,
}

impl EntryState {
    /// Its name, as the listing and the JSON say it.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Running => "running",
            EntryState::Waiting => "waiting",
            EntryState::Done => "done",
            EntryState::Exhausted => "exhausted",
            EntryState::Held => "held",
            EntryState::Free => "free",
            EntryState::Corrupt => "corrupt",
        }
    }
}

impl std::fmt::Display for EntryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a read-write lock's holder holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HoldMode {
    /// A plain read (shared).
    Read,
    /// The upgradeable read (shared with plain readers, one at a time).
    Upgradeable,
    /// The write (exclusive).
    Write,
}

impl HoldMode {
    /// Its name, as the listing and the JSON say it.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldMode::Read => "read",
            HoldMode::Upgradeable => "upgradeable",
            HoldMode::Write => "write",
        }
    }
}

impl std::fmt::Display for HoldMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One holder of a semaphore (a permit) or of a read-write lock (a share or the write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holder {
    /// A semaphore's slot (`BATON_PERMIT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// A read-write lock's holder's mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<HoldMode>,
    /// The holder, by the first characters of its token (tokens are never shown in full): what
    /// `baton unlock --holder` takes.
    pub holder: String,
    /// Its lease's time left, in ms.
    pub remaining_ms: Option<u64>,
    /// Its fencing token: a permit's slot's; a writer's write token; a reader's the last
    /// write's (the version it reads at least).
    pub fencing_token: Option<u64>,
}

/// One job, lock, election, fair lock, queue, semaphore or read-write lock, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// Its name (the `--key` of the command that made it).
    pub name: String,
    /// Its state.
    pub state: EntryState,
    /// Who holds it: a job's worker or a leader by name; a lock's holder (a read-write lock's
    /// writer) by the first characters of its token (tokens are never shown in full). A
    /// semaphore's holders and a read-write lock's readers are in [`Entry::holders`].
    pub holder: Option<String>,
    /// The holder's lease time left, in ms.
    pub remaining_ms: Option<u64>,
    /// The last fencing token granted (an election's term; a read-write lock's last write;
    /// none for a semaphore, whose slots each have theirs: [`Holder::fencing_token`]).
    pub fencing_token: Option<u64>,
    /// A job's last attempt number.
    pub attempt: Option<u64>,
    /// A fair lock's queued waiters, a queue's waiting items, or a semaphore's fair waiters
    /// (only while it has any; on Redis a crashed waiter counts until the next try drops it).
    pub waiting: Option<u64>,
    /// A job's last failure, or what a corrupt value holds.
    pub detail: Option<String>,
    /// An open job's backups waiting to take over, or an election's standby candidates: the
    /// clients subscribed to its channel, the holder's own subscription taken off (a job's
    /// worker and a leader listen there too). A client counts once however many waiters it
    /// runs (one per `baton` process), and a `baton watch` of a job counts as one. Counted
    /// on Redis only, and only where [`Entry::can_have_standbys`]: `None` elsewhere, on
    /// PostgreSQL (another session's `LISTEN`s cannot be counted: unknown, not 0), and when
    /// the server refuses `PUBSUB` (an ACL). A count read beside the state, not with it: a
    /// holder that has not yet subscribed (it does so alongside its work) leaves one more.
    pub standbys: Option<u64>,
    /// A semaphore's stored limit (`None`: none stored, or not a semaphore).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// A semaphore's held permits, by slot; a read-write lock's holders (the writer or the
    /// upgradeable reader first, then the readers). Only holders whose lease lives.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    /// Whether a writer waits on a read-write lock (new readers queue behind it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer_waiting: Option<bool>,
}

impl Entry {
    fn lock(kind: Kind, name: &str) -> Entry {
        Entry {
            kind,
            name: name.to_string(),
            state: EntryState::Free,
            holder: None,
            remaining_ms: None,
            fencing_token: None,
            attempt: None,
            waiting: None,
            detail: None,
            standbys: None,
            limit: None,
            holders: Vec::new(),
            writer_waiting: None,
        }
    }

    /// A semaphore's or read-write lock's holders in a few words, as a listing's holder
    /// column shows them: `2/3` (a semaphore's held permits of its limit); `write`,
    /// `read ×2`, `upgradeable+read ×1`, `upgradeable` or `free` (a read-write lock's mode).
    /// `None` for the other kinds.
    pub fn holders_summary(&self) -> Option<String> {
        match self.kind {
            Kind::Semaphore => Some(format!(
                "{}/{}",
                self.holders.len(),
                self.limit.map_or("?".into(), |l| l.to_string())
            )),
            Kind::RwLock => {
                let count = |m| self.holders.iter().filter(|h| h.mode == Some(m)).count();
                let (w, u, r) = (
                    count(HoldMode::Write),
                    count(HoldMode::Upgradeable),
                    count(HoldMode::Read),
                );
                Some(match (w, u, r) {
                    (w, _, _) if w > 0 => "write".to_string(),
                    (0, 0, 0) => "free".to_string(),
                    (_, 0, r) => format!("read ×{r}"),
                    (_, _, 0) => "upgradeable".to_string(),
                    (_, _, r) => format!("upgradeable+read ×{r}"),
                })
            }
            _ => None,
        }
    }

    /// What a watch compares to tell a change: everything but the times left.
    fn shape(&self) -> impl PartialEq + '_ {
        let holders: Vec<_> = self
            .holders
            .iter()
            .map(|h| (h.slot, h.mode, &h.holder, h.fencing_token))
            .collect();
        (
            (self.state, &self.holder, self.fencing_token),
            (self.limit, holders, self.writer_waiting),
        )
    }

    /// A semaphore's entry from its record; `None` when nothing is stored.
    fn of_semaphore(name: &str, r: &SemRecord) -> Option<Entry> {
        let mut e = Entry::lock(Kind::Semaphore, name);
        if let Some(refused) = &r.refused {
            e.state = EntryState::Corrupt;
            e.detail = Some(refused.clone());
            return Some(e);
        }
        if !r.stored && r.held.is_empty() {
            return None;
        }
        if let Some(l) = &r.limit {
            match l.parse() {
                Ok(l) => e.limit = Some(l),
                Err(_) => {
                    e.state = EntryState::Corrupt;
                    e.detail = Some(format!("limit {}", crate::error::preview(l)));
                }
            }
        }
        for (slot, lease) in &r.held {
            let fence = r.fences.iter().find(|(s, _)| s == slot).map(|(_, f)| f);
            e.holders.push(Holder {
                slot: Some(*slot),
                mode: None,
                holder: crate::util::token::short(&lease.token).to_string(),
                remaining_ms: lease.pttl.map(|d| d.as_millis() as u64),
                fencing_token: fence.and_then(|f| f.parse().ok()),
            });
        }
        // Only a semaphore with a line of fair waiters shows one.
        e.waiting = (r.waiting > 0).then_some(r.waiting);
        if e.state != EntryState::Corrupt && !e.holders.is_empty() {
            e.state = EntryState::Held;
        }
        Some(e)
    }

    /// A read-write lock's entry from its record; `None` when nothing is stored.
    fn of_rwlock(name: &str, r: &RwRecord) -> Option<Entry> {
        let mut e = Entry::lock(Kind::RwLock, name);
        if let Some(refused) = &r.refused {
            e.state = EntryState::Corrupt;
            e.detail = Some(refused.clone());
            return Some(e);
        }
        if !r.stored {
            return None;
        }
        e.writer_waiting = Some(r.writer_waiting);
        if let Some(f) = &r.fence {
            match f.parse::<u64>() {
                // 0: never written.
                Ok(f) => e.fencing_token = (f > 0).then_some(f),
                Err(_) => {
                    e.state = EntryState::Corrupt;
                    e.detail = Some(crate::error::preview(f));
                }
            }
        }
        let holders = r
            .writer
            .iter()
            .map(|h| (HoldMode::Write, h))
            .chain(r.upgrader.iter().map(|h| (HoldMode::Upgradeable, h)))
            .chain(r.readers.iter().map(|h| (HoldMode::Read, h)));
        for (mode, lease) in holders {
            e.holders.push(Holder {
                slot: None,
                mode: Some(mode),
                holder: crate::util::token::short(&lease.token).to_string(),
                remaining_ms: lease.pttl.map(|d| d.as_millis() as u64),
                fencing_token: e.fencing_token,
            });
        }
        if let Some(w) = &r.writer {
            e.holder = Some(crate::util::token::short(&w.token).to_string());
            e.remaining_ms = w.pttl.map(|d| d.as_millis() as u64);
        }
        if e.state != EntryState::Corrupt && !e.holders.is_empty() {
            e.state = EntryState::Held;
        }
        Some(e)
    }

    /// Whether the entry can have standbys ([`Entry::standbys`]): an open job (running or
    /// waiting) or an election.
    pub fn can_have_standbys(&self) -> bool {
        match self.kind {
            Kind::Job => matches!(self.state, EntryState::Running | EntryState::Waiting),
            Kind::Leader => matches!(self.state, EntryState::Held | EntryState::Free),
            _ => false,
        }
    }

    /// Sets [`Entry::standbys`] from the clients subscribed to its channel (`None`: not
    /// counted), taking the holder's own subscription off.
    fn count_standbys(&mut self, listeners: Option<u64>) {
        if !self.can_have_standbys() {
            return;
        }
        let holder_listens = matches!(self.state, EntryState::Running | EntryState::Held);
        self.standbys = listeners.map(|n| n.saturating_sub(u64::from(holder_listens)));
    }

    /// How much an entry needs an operator, the higher the worse: corrupt (5), exhausted (4),
    /// waiting (3: its last attempt failed or its holder's lease ran out, nobody runs it),
    /// running or held (2), free (1), done (0). A schedule's row shows its worst open
    /// occurrence by this order ([`ScheduleFold`]).
    pub fn severity(&self) -> u8 {
        match self.state {
            EntryState::Corrupt => 5,
            EntryState::Exhausted => 4,
            EntryState::Waiting => 3,
            EntryState::Running | EntryState::Held => 2,
            EntryState::Free => 1,
            EntryState::Done => 0,
        }
    }

    /// The entry of job `name` (`None`: absent).
    fn of_job(name: &str, s: JobStatus) -> Option<Entry> {
        let mut e = Entry::lock(Kind::Job, name);
        e.fencing_token = s.fencing_token;
        e.detail = s.last_failure;
        match s.state {
            JobState::Absent => return None,
            JobState::Attempt {
                number,
                holder,
                lease_remaining_ms,
            } => {
                e.state = if holder.is_some() {
                    EntryState::Running
                } else {
                    EntryState::Waiting
                };
                e.attempt = Some(number);
                e.holder = holder;
                e.remaining_ms = lease_remaining_ms;
            }
            JobState::Done => e.state = EntryState::Done,
            JobState::Exhausted => e.state = EntryState::Exhausted,
            JobState::Corrupt { value } => {
                e.state = EntryState::Corrupt;
                e.detail = Some(value);
            }
        }
        Some(e)
    }

    /// The entry of a lock-shaped primitive from its holder's value, fence and lease.
    fn of_lock(
        kind: Kind,
        name: &str,
        value: Option<&str>,
        fence: Option<&str>,
        pttl: Option<Duration>,
    ) -> Entry {
        let mut e = Entry::lock(kind, name);
        if let Some(v) = value {
            e.state = EntryState::Held;
            e.holder = Some(holder_of(kind, v));
            e.remaining_ms = pttl.map(|d| d.as_millis() as u64);
        }
        if let Some(f) = fence {
            match f.parse() {
                Ok(f) => e.fencing_token = Some(f),
                Err(_) => {
                    e.state = EntryState::Corrupt;
                    e.detail = Some(crate::error::preview(f));
                }
            }
        }
        e
    }

    /// Whether a scheduled occurrence's job (`KEY@DIGEST@TICK`): its schedule's key, digest
    /// and tick.
    pub fn occurrence(&self) -> Option<(&str, &str, &str)> {
        if self.kind != Kind::Job {
            return None;
        }
        crate::schedule::split_job_key(&self.name)
    }
}

/// How a holder's stored value is shown: by the name it carries (an election's always carries
/// the leader's, `TOKEN:NAME`); a bare random token by its first characters only.
fn holder_of(kind: Kind, value: &str) -> String {
    match (kind, crate::leader::keys::name_of(value)) {
        (_, Some(name)) => name.to_string(),
        (Kind::Leader, None) => "?".to_string(),
        _ => crate::util::token::short(value).to_string(),
    }
}

/// Which key of an entry's layout a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The entry's own key: a job's state, a lock's holder.
    Own,
    /// Its fence (a lock-shaped entry's: it outlives the holder).
    Fence,
    /// Another key beside it.
    Beside,
}

/// A key of baton's under the prefix, by the primitives' layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parsed<'a> {
    kind: Kind,
    name: &'a str,
    part: Part,
}

impl Parsed<'_> {
    /// Whether the entry is listed from this key: a job from its state key; a lock-shaped one
    /// from its fence (kept while free), or from its own key when the fence is gone (`fence`:
    /// whether it was read).
    fn stands_for_entry(&self, fence_read: bool) -> bool {
        match (self.kind, self.part) {
            (Kind::Job | Kind::Semaphore | Kind::RwLock, part) => part == Part::Own,
            (_, Part::Fence) => fence_read,
            (_, Part::Own) => !fence_read,
            (_, Part::Beside) => false,
        }
    }
}

/// What `key` is under `prefix`, or `None` for a key no primitive writes there (or Redlock's).
fn parse_key<'a>(prefix: &str, key: &'a str) -> Option<Parsed<'a>> {
    let rest = key.strip_prefix(prefix)?;
    let (kind, tagged) = if rest.starts_with('{') {
        (Kind::Job, rest)
    } else {
        Kind::ALL.into_iter().find_map(|k| {
            let tagged = rest.strip_prefix(k.sub_prefix()?)?;
            tagged.starts_with('{').then_some((k, tagged))
        })?
    };
    let inner = tagged.get(1..)?;
    // Names never hold `{` or `}` (checked when they are made): the first `}` closes the tag.
    let close = inner.find('}')?;
    let (name, suffix) = (inner.get(..close)?, inner.get(close + 1..)?);
    if name.is_empty() || name.contains('{') {
        return None;
    }
    let part = match suffix {
        "" => Part::Own,
        ":fence" if !matches!(kind, Kind::Job | Kind::Semaphore | Kind::RwLock) => Part::Fence,
        s if kind.suffixes().contains(&s) => Part::Beside,
        // A semaphore's held slot.
        s if kind == Kind::Semaphore
            && s.strip_prefix(':')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            Part::Beside
        }
        // A read-write lock's holder's lease.
        s if kind == Kind::RwLock && s.strip_prefix(":h:").is_some_and(|t| !t.is_empty()) => {
            Part::Beside
        }
        _ => return None,
    };
    Some(Parsed { kind, name, part })
}

/// An operator's view of one client's backend under one prefix; from
/// [`Client::inspect`](crate::Client::inspect). Cheap to clone.
#[derive(Clone)]
pub struct Inspector {
    backend: Backend,
    prefix: Arc<str>,
    batch: usize,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("prefix", &self.prefix)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl Inspector {
    /// The inspector of `backend` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Inspector {
            backend,
            prefix: Arc::from(crate::util::names::DEFAULT_PREFIX),
            batch: DEFAULT_BATCH,
        }
    }

    /// The same inspector over keys under another prefix.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Inspector, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Inspector {
            prefix: Arc::from(prefix),
            ..self.clone()
        })
    }

    /// The keys of every schedule under the prefix that has a record or a pause in the store,
    /// sorted, each once: what `baton status` and the dashboard list besides the schedules'
    /// occurrences ([`Inspector::list`]). A key with two digests (a rolling change of its
    /// expression) is listed once; read its records with
    /// [`Failover::schedule_records`](crate::Failover::schedule_records).
    ///
    /// On Redis this walks every primary's keys with `SCAN` (each primary of a cluster), as
    /// [`Inspector::list`] does; on PostgreSQL it reads the record's tables.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn schedules(&self) -> Result<Vec<String>, Error> {
        self.backend.list_schedules(&self.prefix).await
    }

    /// The same inspector reading `batch` keys per `SCAN` call (rows per page), 1..=100 000:
    /// what a listing holds at a time. Defaults to [`DEFAULT_BATCH`].
    ///
    /// # Errors
    /// A [`ConfigError`] outside 1..=100 000.
    pub fn with_batch_size(&self, batch: usize) -> Result<Inspector, ConfigError> {
        if !(1..=100_000).contains(&batch) {
            return Err(ConfigError::invalid("batch", "1..=100000"));
        }
        Ok(Inspector {
            batch,
            ..self.clone()
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Everything under the prefix (of `kind` only, when given), batch by batch: see
    /// [`Listing::next_batch`].
    pub fn list(&self, kind: Option<Kind>) -> Listing {
        Listing {
            inspector: self.clone(),
            kind,
            at: Position::default(),
        }
    }

    /// What name `name` is, of every kind (a job, a lock and an election may share a name):
    /// the entries that exist, in [`Kind::ALL`]'s order; empty when none does.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name; connection errors.
    pub async fn find(&self, name: &str) -> Result<Vec<Entry>, Error> {
        crate::util::names::check_name("key", name)?;
        let kinds = Kind::ALL;
        let reads: Vec<EntryRead> = kinds
            .iter()
            .map(|k| entry_read(&self.prefix, *k, name))
            .collect();
        let records = self.backend.read_entries(None, &reads).await?;
        let mut out = Vec::new();
        for (kind, record) in kinds.into_iter().zip(records) {
            match record {
                EntryRecord::Job(status, listeners) => {
                    out.extend(Entry::of_job(name, status?).map(|mut e| {
                        e.count_standbys(listeners);
                        e
                    }))
                }
                EntryRecord::Lock(record) => out.extend(lock_entry(kind, name, &record)),
                EntryRecord::Semaphore(r) => out.extend(Entry::of_semaphore(name, &r)),
                EntryRecord::RwLock(r) => out.extend(Entry::of_rwlock(name, &r)),
            }
        }
        Ok(out)
    }

    /// Follows entry `name` of `kind` (a lock, fair lock, queue, election, semaphore or
    /// read-write lock): [`EntryWatch::next_event`] returns it each time its state, holders,
    /// fencing tokens, limit or waiting writer change, starting with how it is now.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name, or for [`Kind::Job`] (follow a job with
    /// [`Failover::watch_job`](crate::Failover::watch_job)); connection errors while
    /// subscribing.
    pub async fn watch(&self, kind: Kind, name: &str) -> Result<EntryWatch, Error> {
        crate::util::names::check_name("key", name)?;
        let channel = match kind {
            Kind::Job => {
                return Err(ConfigError::invalid(
                    "kind",
                    "a lock, fair lock, queue, election, semaphore or read-write lock \
                     (a job: Failover::watch_job)",
                )
                .into())
            }
            Kind::Lock => Some(
                crate::mutex::keys::LockKeys::new(&self.prefix, name)
                    .channel()
                    .to_string(),
            ),
            Kind::Leader => {
                Some(crate::leader::keys::ElectionKeys::new(&self.prefix, name).channel)
            }
            // A release is announced on the channel its waiters listen on; a grant is not.
            Kind::Semaphore => {
                Some(crate::semaphore::keys::SemKeys::new(&self.prefix, name).channel)
            }
            Kind::RwLock => Some(
                crate::rwlock::keys::RwKeys::new(&self.prefix, name)
                    .channel()
                    .to_string(),
            ),
            // A fair lock wakes each waiter on a channel of its own, a queue nobody: read on a
            // timer only.
            Kind::Fair | Kind::Queue => None,
        };
        let sub = match channel {
            Some(c) => Some(self.backend.subscribe(&c).await?),
            None => None,
        };
        Ok(EntryWatch {
            inspector: self.clone(),
            kind,
            name: name.to_string(),
            sub,
            last: None,
        })
    }

    /// The entry `name` of `kind` as it is now (free when nothing is stored).
    async fn read(&self, kind: Kind, name: &str) -> Result<Entry, Error> {
        Ok(self
            .find(name)
            .await?
            .into_iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| Entry::lock(kind, name)))
    }
}

/// Everything under a prefix, read a batch at a time; from [`Inspector::list`].
pub struct Listing {
    inspector: Inspector,
    kind: Option<Kind>,
    at: Position,
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listing")
            .field("prefix", &self.inspector.prefix)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Listing {
    /// The next batch of entries (never empty), or `None` once every primary (every table)
    /// was read through. A batch holds the entries of one `SCAN` call's keys (one page of
    /// rows): at most the inspector's batch size.
    ///
    /// # Errors
    /// Connection errors; the listing can go on after them (the same batch is asked again).
    ///
    /// # Cancel safety
    /// Cancel safe: the position moves only once a batch is read.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<Entry>>, Error> {
        loop {
            match self.step().await? {
                Some(b) if b.is_empty() => continue,
                other => return Ok(other),
            }
        }
    }

    /// One step of the backend's listing, read (`Some(empty)` when it held nothing listed).
    async fn step(&mut self) -> Result<Option<Vec<Entry>>, Error> {
        let inspector = &self.inspector;
        let wants = |k: Kind| self.kind.map_or(true, |w| w == k);
        let tables = Tables {
            jobs: wants(Kind::Job),
            locks: wants(Kind::Lock) || wants(Kind::Leader),
            semaphores: wants(Kind::Semaphore),
            rwlocks: wants(Kind::RwLock),
        };
        let prefix = &*inspector.prefix;
        let Some((found, next)) = inspector
            .backend
            .list_step(&self.at, prefix, inspector.batch, tables)
            .await?
        else {
            return Ok(None);
        };
        let out = match found {
            Found::Keys { keys, at } => {
                let mut parsed = Vec::new();
                for key in &keys {
                    let Some(p) = parse_key(prefix, key) else {
                        continue;
                    };
                    if self.kind.is_some_and(|k| k != p.kind) || p.part == Part::Beside {
                        continue;
                    }
                    parsed.push(p);
                }
                let reads: Vec<EntryRead> = parsed
                    .iter()
                    .map(|p| entry_read(prefix, p.kind, p.name))
                    .collect();
                let records = inspector.backend.read_entries(Some(&at), &reads).await?;
                let mut out = Vec::with_capacity(parsed.len());
                for (p, record) in parsed.iter().zip(records) {
                    match record {
                        EntryRecord::Job(Ok(status), listeners) => {
                            out.extend(Entry::of_job(p.name, status).map(|mut e| {
                                e.count_standbys(listeners);
                                e
                            }))
                        }
                        EntryRecord::Job(Err(e), _) => {
                            let mut entry = Entry::lock(Kind::Job, p.name);
                            entry.state = EntryState::Corrupt;
                            entry.detail = Some(e.to_string());
                            out.push(entry);
                        }
                        EntryRecord::Lock(record) => {
                            if p.stands_for_entry(record.fence_stored) {
                                out.extend(lock_entry(p.kind, p.name, &record));
                            }
                        }
                        EntryRecord::Semaphore(r) => out.extend(Entry::of_semaphore(p.name, &r)),
                        EntryRecord::RwLock(r) => out.extend(Entry::of_rwlock(p.name, &r)),
                    }
                }
                out
            }
            Found::EntryKeys(keys) => {
                let parsed: Vec<Parsed<'_>> = keys
                    .iter()
                    .filter_map(|key| parse_key(prefix, key))
                    .filter(|p| p.part == Part::Own && self.kind.map_or(true, |k| k == p.kind))
                    .collect();
                let reads: Vec<EntryRead> = parsed
                    .iter()
                    .map(|p| entry_read(prefix, p.kind, p.name))
                    .collect();
                let records = inspector.backend.read_entries(None, &reads).await?;
                let mut out = Vec::with_capacity(parsed.len());
                for (p, record) in parsed.iter().zip(records) {
                    match record {
                        EntryRecord::Semaphore(r) => out.extend(Entry::of_semaphore(p.name, &r)),
                        EntryRecord::RwLock(r) => out.extend(Entry::of_rwlock(p.name, &r)),
                        // Pages of these tables hold nothing else.
                        EntryRecord::Job(..) | EntryRecord::Lock(_) => {}
                    }
                }
                out
            }
            Found::JobRows(rows) => {
                let mut out = Vec::new();
                for (key, status) in rows {
                    if let Some(p) = parse_key(prefix, &key) {
                        if p.kind == Kind::Job && p.part == Part::Own {
                            out.extend(Entry::of_job(p.name, status));
                        }
                    }
                }
                out
            }
            Found::LockRows(rows) => {
                let mut out = Vec::new();
                for (key, record) in rows {
                    let Some(p) = parse_key(prefix, &key) else {
                        continue;
                    };
                    if p.part != Part::Own || self.kind.is_some_and(|k| k != p.kind) {
                        continue;
                    }
                    out.push(Entry::of_lock(
                        p.kind,
                        p.name,
                        record.value.as_deref(),
                        record.fence.as_deref(),
                        record.pttl,
                    ));
                }
                out
            }
        };
        // Moved on only once the batch was read: an error asks for the same batch again.
        self.at = next;
        Ok(Some(out))
    }
}

/// What an entry of `kind` named `name` is read from: a job's keys, or a lock-shaped entry's.
fn entry_read(prefix: &str, kind: Kind, name: &str) -> EntryRead {
    match kind {
        Kind::Job => EntryRead::Job(JobKeys::new(prefix, name), name.to_string()),
        Kind::Semaphore => {
            let k = crate::semaphore::keys::SemKeys::new(prefix, name);
            EntryRead::Semaphore(SemRead {
                meta: k.meta,
                slots: k.slots,
                queue: k.queue,
            })
        }
        Kind::RwLock => {
            let k = crate::rwlock::keys::RwKeys::new(prefix, name);
            let refs = k.refs();
            EntryRead::RwLock(RwRead {
                state: refs.state.to_string(),
                waiting: refs.waiting.to_string(),
                holder_prefix: refs.holder_prefix.to_string(),
            })
        }
        _ => EntryRead::Lock(lock_read(prefix, kind, name)),
    }
}

/// The keys a lock-shaped entry is read from, by its primitive's key layout: its holder, its
/// fence, and what counts its waiters (a fair lock's queue, a queue's items).
fn lock_read(prefix: &str, kind: Kind, name: &str) -> LockRead {
    match kind {
        Kind::Fair => {
            let k = crate::fair::keys::fair_keys(prefix, name);
            LockRead {
                own: k.lock,
                fence: k.fence,
                waiting: Some(Waiting::Members(k.queue)),
                listeners: None,
            }
        }
        Kind::Queue => {
            let k = crate::queue::keys::QueueKeys::new(prefix, name);
            LockRead {
                own: k.lock,
                fence: k.fence,
                waiting: Some(Waiting::Entries(k.items)),
                listeners: None,
            }
        }
        Kind::Leader => {
            let k = crate::leader::keys::ElectionKeys::new(prefix, name);
            // Standbys wait on the election's channel, and the leader's watchdog listens
            // there for a force release.
            LockRead {
                own: k.lease,
                fence: k.fence,
                waiting: None,
                listeners: Some(k.channel),
            }
        }
        // A job, a semaphore and a read-write lock never get here; the mutex's layout is the
        // default.
        Kind::Lock | Kind::Job | Kind::Semaphore | Kind::RwLock => {
            let k = crate::mutex::keys::LockKeys::new(prefix, name);
            LockRead {
                own: k.lock().to_string(),
                fence: k.fence().to_string(),
                waiting: None,
                listeners: None,
            }
        }
    }
}

/// A lock-shaped entry from its record; `None` when nothing is stored.
fn lock_entry(kind: Kind, name: &str, record: &LockRecord) -> Option<Entry> {
    if let Some(refused) = &record.refused {
        let mut entry = Entry::lock(kind, name);
        entry.state = EntryState::Corrupt;
        entry.detail = Some(refused.clone());
        return Some(entry);
    }
    if record.value.is_none() && record.fence.is_none() {
        return None;
    }
    let mut entry = Entry::of_lock(
        kind,
        name,
        record.value.as_deref(),
        record.fence.as_deref(),
        record.pttl,
    );
    if record.waiting.is_some() {
        entry.waiting = record.waiting;
    }
    entry.count_standbys(record.listeners);
    Some(entry)
}

/// A followed lock, fair lock, queue, election, semaphore or read-write lock; from
/// [`Inspector::watch`].
pub struct EntryWatch {
    inspector: Inspector,
    kind: Kind,
    name: String,
    sub: Option<crate::util::pubsub::Subscription>,
    last: Option<Entry>,
}

impl std::fmt::Debug for EntryWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryWatch")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How often a followed entry is read when no message says it changed: a lease that runs out
/// publishes nothing.
const WATCH_EVERY: Duration = Duration::from_millis(200);

impl EntryWatch {
    /// The entry, the first time; then each time its state, holders, fencing tokens, limit or
    /// waiting writer changed (not its times left).
    ///
    /// # Errors
    /// Connection errors while reading; the watch can go on after them.
    ///
    /// # Cancel safety
    /// Cancel safe: a change is only taken as seen when it is returned.
    pub async fn next_event(&mut self) -> Result<Entry, Error> {
        loop {
            let now = self.inspector.read(self.kind, &self.name).await?;
            let changed = self
                .last
                .as_ref()
                .map_or(true, |last| last.shape() != now.shape());
            if changed {
                self.last = Some(now.clone());
                return Ok(now);
            }
            match self.sub.as_mut() {
                // A message (or a reconnect) is a reason to read at once; the timer bounds the
                // wait for what publishes nothing.
                Some(sub) => {
                    let _ = tokio::time::timeout(WATCH_EVERY, sub.rx.recv()).await;
                }
                None => tokio::time::sleep(WATCH_EVERY).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(kind: Kind, name: &str, part: Part) -> Option<Parsed<'_>> {
        Some(Parsed { kind, name, part })
    }

    #[test]
    fn keys_are_told_apart_by_the_primitives_layouts() {
        let p = "baton:";
        let job = crate::failover::keys::JobKeys::new(p, "msg:42");
        assert_eq!(
            parse_key(p, job.state()),
            parsed(Kind::Job, "msg:42", Part::Own)
        );
        for k in [job.lease(), job.fence(), job.failure()] {
            assert_eq!(parse_key(p, k), parsed(Kind::Job, "msg:42", Part::Beside));
        }
        let lock = crate::mutex::keys::LockKeys::new(p, "a");
        assert_eq!(
            parse_key(p, lock.lock()),
            parsed(Kind::Lock, "a", Part::Own)
        );
        assert_eq!(
            parse_key(p, lock.fence()),
            parsed(Kind::Lock, "a", Part::Fence)
        );
        let leader = crate::leader::keys::ElectionKeys::new(p, "a");
        assert_eq!(
            parse_key(p, &leader.lease),
            parsed(Kind::Leader, "a", Part::Own)
        );
        let fair = crate::fair::keys::fair_keys(p, "a");
        for k in [&fair.queue, &fair.alive, &fair.reserved] {
            assert_eq!(parse_key(p, k), parsed(Kind::Fair, "a", Part::Beside));
        }
        let queue = crate::queue::keys::QueueKeys::new(p, "a");
        assert_eq!(
            parse_key(p, &queue.lock),
            parsed(Kind::Queue, "a", Part::Own)
        );
        assert_eq!(
            parse_key(p, &queue.items),
            parsed(Kind::Queue, "a", Part::Beside)
        );
        // A job named like a lock's key is still a job: its tag opens right after the prefix.
        assert_eq!(
            parse_key(p, "baton:{lock:a}"),
            parsed(Kind::Job, "lock:a", Part::Own)
        );
    }

    #[test]
    fn a_semaphores_slots_and_a_rw_locks_holders_stand_beside_their_entry() {
        let p = "baton:";
        let sem = crate::semaphore::keys::SemKeys::new(p, "pool");
        assert_eq!(
            parse_key(p, &sem.meta),
            parsed(Kind::Semaphore, "pool", Part::Own)
        );
        // A held slot is a lock key of the kernel's, but never a mutex of its own.
        assert_eq!(
            parse_key(p, &sem.slot(12)),
            parsed(Kind::Semaphore, "pool", Part::Beside)
        );
        let rw = crate::rwlock::keys::RwKeys::new(p, "cfg");
        assert_eq!(
            parse_key(p, rw.state()),
            parsed(Kind::RwLock, "cfg", Part::Own)
        );
        // The line of its fair waiters stands beside it too.
        for k in [&sem.queue, &sem.alive] {
            assert_eq!(
                parse_key(p, k),
                parsed(Kind::Semaphore, "pool", Part::Beside)
            );
        }
        for k in [rw.holder("0123abcd"), rw.refs().waiting.to_string()] {
            assert_eq!(parse_key(p, &k), parsed(Kind::RwLock, "cfg", Part::Beside));
        }
        for key in [
            "baton:sem:{pool}:x",
            "baton:sem:{pool}:",
            "baton:rw:{cfg}:h:",
        ] {
            assert_eq!(parse_key(p, key), None, "{key}");
        }
    }

    #[test]
    fn keys_no_primitive_writes_are_skipped() {
        let p = "baton:";
        let redlock = crate::redlock::keys::RedlockKeys::new(p, "a");
        for key in [
            redlock.lock.as_str(),
            "baton:other",
            "baton:{a}:mine",
            "baton:lock:{a}:queue",
            "baton:{}",
            "baton:lock:a",
            "baton:{a",
            "other:{a}",
            "baton:",
        ] {
            assert_eq!(parse_key(p, key), None, "{key}");
        }
    }

    #[test]
    fn an_entry_is_listed_once_from_the_key_that_stands_for_it() {
        let own = |kind| Parsed {
            kind,
            name: "a",
            part: Part::Own,
        };
        let fence = Parsed {
            part: Part::Fence,
            ..own(Kind::Lock)
        };
        assert!(own(Kind::Job).stands_for_entry(true));
        assert!(!own(Kind::Lock).stands_for_entry(true));
        assert!(fence.stands_for_entry(true));
        // The fence lost with the data: the holder's key stands for the lock.
        assert!(own(Kind::Lock).stands_for_entry(false));
        assert!(!fence.stands_for_entry(false));
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>().ok(), Some(k));
        }
        assert!("locks".parse::<Kind>().is_err());
    }
}

//! What the read-write lock's store is asked and answers, defined here (a leaf) so that the
//! seam (`backend::rwlocks`), each backend's arm and the primitive (`rwlock`) share one
//! definition without importing each other.

use std::time::Duration;

use tokio::time::Instant;

/// How a holder of a read-write lock holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwMode {
    /// A shared read.
    Read,
    /// The one upgradeable read: shared with plain readers, exclusive among upgradeable ones.
    Upgradeable,
    /// The exclusive write.
    Write,
}

impl RwMode {
    /// The mode's name on the wire (a script's argument).
    pub(crate) fn wire(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Upgradeable => "upgradeable",
            RwMode::Write => "write",
        }
    }
}

/// The keys of one read-write lock, as its store needs them (all in one hash slot on Redis).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RwKeysRef<'a> {
    /// The lock's state: the last write's fencing token, the writer, the upgradeable reader
    /// and the readers (a hash on Redis).
    pub state: &'a str,
    /// The "writer waiting" mark, with its own lease.
    pub waiting: &'a str,
    /// The prefix of a holder's own lease key (the holder's token follows it).
    pub holder_prefix: &'a str,
    /// The channel a release, a downgrade or a lapsed wait is announced on.
    pub channel: &'a str,
}

/// One try to take a read-write lock: `token` holds its own lease (`lease`) in `mode`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RwAcquire<'a> {
    pub keys: RwKeysRef<'a>,
    pub token: &'a str,
    pub mode: RwMode,
    pub lease: Duration,
    /// How long a waiting writer's mark lives unless its next try refreshes it; zero for a
    /// single try, which does not wait and so leaves no mark.
    pub mark: Duration,
}

/// What one try (or one try to upgrade) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RwGrant {
    /// Granted. `fence` is the new write's fencing token for a write (or an upgrade), the
    /// last write's token (0 when none is known) for a read. `sent` is when the request left.
    Granted { fence: u64, sent: Instant },
    /// Not granted now: try again within `retry` (the shortest of the blocking holders'
    /// remaining leases and, for a waiting writer, its mark's refresh time).
    Busy { retry: Option<Duration> },
}

/// The lock's state as a store that reads it before deciding keeps it (PostgreSQL's row): the
/// holders it names and the live "writer waiting" mark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RwState {
    pub writer: Option<String>,
    pub upgrader: Option<String>,
    pub readers: Vec<String>,
    /// The live mark's token and remaining ms (`None`: no mark, or it lapsed).
    pub waiting: Option<(String, u64)>,
}

/// What to do with the "writer waiting" mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkChange {
    Keep,
    /// Set it to the deciding token for this long.
    Set(Duration),
    Clear,
}

/// What one try or upgrade decided: the state to write back (holders whose lease ended
/// dropped), whether it is granted, and the mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwDecision {
    pub granted: bool,
    pub state: RwState,
    pub mark: MarkChange,
    /// When not granted: the shortest remaining lease of what blocks (ms), if known.
    pub retry: Option<u64>,
}

/// The rule of docs/rwlock.md, for a store that reads the state and the holders' remaining
/// leases (`live`: token → ms, only holders whose lease has not ended) and writes back in one
/// transaction; the Redis scripts apply the same rule in Lua. `upgrade`: the try is the
/// upgradeable reader `token`'s upgrade (the caller checked it still is that reader).
pub(crate) fn decide(
    state: &RwState,
    live: &dyn Fn(&str) -> Option<u64>,
    token: &str,
    mode: RwMode,
    upgrade: bool,
    mark: Duration,
) -> RwDecision {
    let mut retry: Option<u64> = None;
    let mut block = |p: u64| retry = Some(retry.map_or(p, |r| r.min(p)));
    let keep = |t: &Option<String>| t.clone().filter(|t| live(t).is_some());
    let writer = keep(&state.writer);
    let upgrader = keep(&state.upgrader);
    let readers: Vec<String> = state
        .readers
        .iter()
        .filter(|t| live(t).is_some())
        .cloned()
        .collect();
    let mut next = RwState {
        writer: writer.clone(),
        upgrader: upgrader.clone(),
        readers: readers.clone(),
        waiting: state.waiting.clone(),
    };
    let mut blocked = false;
    for t in writer.iter() {
        blocked = true;
        block(live(t).unwrap_or(0));
    }
    let own_mark = |m: &Option<(String, u64)>| m.as_ref().is_some_and(|(t, _)| t == token);
    if upgrade || mode == RwMode::Write {
        if !upgrade {
            for t in upgrader.iter() {
                blocked = true;
                block(live(t).unwrap_or(0));
            }
        }
        for t in &readers {
            blocked = true;
            block(live(t).unwrap_or(0));
        }
        if blocked {
            // An upgrade takes the mark whoever holds it; a waiting writer sets it when free
            // or its own (a single try, `mark` zero, leaves none).
            let set = upgrade
                || (!mark.is_zero() && (state.waiting.is_none() || own_mark(&state.waiting)));
            return RwDecision {
                granted: false,
                state: next,
                mark: if set {
                    MarkChange::Set(mark)
                } else {
                    MarkChange::Keep
                },
                retry,
            };
        }
        next.writer = Some(token.to_string());
        if upgrade {
            next.upgrader = None;
        }
        let clear = own_mark(&state.waiting);
        return RwDecision {
            granted: true,
            state: next,
            mark: if clear {
                MarkChange::Clear
            } else {
                MarkChange::Keep
            },
            retry: None,
        };
    }
    if let Some((_, p)) = &state.waiting {
        blocked = true;
        block(*p);
    }
    if mode == RwMode::Upgradeable {
        for t in upgrader.iter() {
            blocked = true;
            block(live(t).unwrap_or(0));
        }
    }
    if !blocked {
        match mode {
            RwMode::Upgradeable => next.upgrader = Some(token.to_string()),
            _ => next.readers.push(token.to_string()),
        }
    }
    RwDecision {
        granted: !blocked,
        state: next,
        mark: MarkChange::Keep,
        retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(writer: Option<&str>, upgrader: Option<&str>, readers: &[&str]) -> RwState {
        RwState {
            writer: writer.map(str::to_string),
            upgrader: upgrader.map(str::to_string),
            readers: readers.iter().map(|r| r.to_string()).collect(),
            waiting: None,
        }
    }

    #[test]
    fn the_rule_as_the_guide_states_it() {
        let all = |_: &str| Some(100);
        let none_but =
            |alive: &'static [&'static str]| move |t: &str| alive.contains(&t).then_some(50);
        let mark = Duration::from_secs(1);
        // Readers share; a writer waits for them and marks itself.
        let s = state(None, None, &["a"]);
        assert!(decide(&s, &all, "b", RwMode::Read, false, mark).granted);
        let d = decide(&s, &all, "w", RwMode::Write, false, mark);
        assert!(!d.granted);
        assert_eq!(d.mark, MarkChange::Set(mark));
        // A single try leaves no mark.
        assert_eq!(
            decide(&s, &all, "w", RwMode::Write, false, Duration::ZERO).mark,
            MarkChange::Keep
        );
        // While the mark lives no new reader enters.
        let mut marked = s.clone();
        marked.waiting = Some(("w".into(), 500));
        let d = decide(&marked, &all, "c", RwMode::Read, false, mark);
        assert!(!d.granted);
        assert_eq!(d.retry, Some(500));
        // A crashed reader's share ends with its lease: the writer gets in and clears its mark.
        let d = decide(&marked, &none_but(&[]), "w", RwMode::Write, false, mark);
        assert!(d.granted);
        assert_eq!(d.mark, MarkChange::Clear);
        assert!(d.state.readers.is_empty());
        assert_eq!(d.state.writer.as_deref(), Some("w"));
        // One upgradeable reader; it upgrades once the plain readers left.
        let s = state(None, Some("u"), &["a"]);
        assert!(!decide(&s, &all, "v", RwMode::Upgradeable, false, mark).granted);
        let d = decide(&s, &all, "u", RwMode::Write, true, mark);
        assert!(!d.granted);
        assert_eq!(d.mark, MarkChange::Set(mark));
        let d = decide(&s, &none_but(&["u"]), "u", RwMode::Write, true, mark);
        assert!(d.granted);
        assert_eq!(d.state.upgrader, None);
        assert_eq!(d.state.writer.as_deref(), Some("u"));
    }
}

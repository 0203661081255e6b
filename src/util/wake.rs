//! Wake one waiter per message: local waiters that share one subscription to a channel, where
//! each message wakes a single one of them (the longest waiting) instead of every one.
//!
//! Why: when a release is published and every local waiter wakes, every one sends a request and
//! all but one lose; with 64 waiters on one client that is 63 wasted round trips (and scripts on
//! the server) per handoff, and the server is then busy refusing instead of granting. Woken one at
//! a time, a handoff costs one try. The same reasoning as a futex's wake-one, or Redisson's
//! per-process semaphore on its unlock channel.
//!
//! Nothing is lost by waking one: a message that arrives while no waiter is parked is kept (one
//! stored wake, as [`tokio::sync::Notify`] keeps a permit), so a waiter returning from a failed
//! try sees it at once; a waiter woken and then dropped before its try passes the wake on
//! ([`Woken`]); a reconnect (messages may have been missed) wakes them all. The oldest waiter
//! still sleeps with a timeout of its own (a crashed holder publishes nothing), so a wake is a
//! shortcut, never the only way forward.
//!
//! Wakes go to the oldest member of the group, in the order they joined ([`Turns`]), whether
//! they are parked or between tries: a wake that comes while the oldest member's try is in
//! flight is kept for it (it looks again as soon as that try fails), not given to a younger one
//! parked meanwhile. Only the oldest member ends a wait on its own timer; a younger one waits on
//! until it is woken or becomes the oldest. So a task that releases the lock and asks again at
//! once, joining behind the waiters, cannot take it back before the waiter its release woke,
//! however late the release's message.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, OnceCell};
use tokio::time::Instant;

use super::pubsub::{Call, HubMsg, Subscription};
use crate::error::Error;
use crate::util::lock;

/// The groups of one hub, by channel (weak: a group lives as long as its waiters).
pub(crate) type Groups = Arc<Mutex<HashMap<String, Weak<Group>>>>;

/// The waiters of one channel on one client.
pub(crate) struct Group {
    channel: String,
    turns: Turns,
    /// The shared subscription, once confirmed (its messages reach [`Turns`] from the hub's
    /// task); dropped with the group's last member, which unsubscribes.
    ready: OnceCell<Subscription>,
    /// The hub went away (client shut down): waiters fall back to their timers.
    closed: AtomicBool,
    registry: Weak<Mutex<HashMap<String, Weak<Group>>>>,
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(reg) = self.registry.upgrade() {
            let mut map = lock(&reg);
            // Only our own (dead) entry: a newer group for the channel may already be there.
            if map
                .get(&self.channel)
                .is_some_and(|w| w.strong_count() == 0)
            {
                map.remove(&self.channel);
            }
        }
    }
}

/// One waiter's membership in its channel's group, with its place in line (its ticket).
pub(crate) struct WakeOne {
    group: Arc<Group>,
    ticket: u64,
}

impl WakeOne {
    fn new(group: Arc<Group>) -> Self {
        let ticket = group.turns.join();
        WakeOne { group, ticket }
    }
}

impl Drop for WakeOne {
    fn drop(&mut self) {
        self.group.turns.leave(self.ticket);
    }
}

/// Joins the wake-one group of `channel` in `groups`, subscribing with `subscribe` (once per
/// group, its messages delivered to the call it is given) if nobody local listens yet. The same
/// for every hub (Redis pub/sub, PostgreSQL `LISTEN`): see `Hub::wake_one` in the Redis backend.
pub(crate) async fn join<F, Fut>(
    groups: &Groups,
    channel: &str,
    subscribe: F,
) -> Result<WakeOne, Error>
where
    F: FnOnce(Call) -> Fut,
    Fut: std::future::Future<Output = Result<Subscription, Error>>,
{
    let group = {
        let mut map = lock(groups);
        match map.get(channel).and_then(Weak::upgrade) {
            Some(g) => g,
            None => {
                let g = Arc::new(Group {
                    channel: channel.to_string(),
                    turns: Turns::default(),
                    ready: OnceCell::new(),
                    closed: AtomicBool::new(false),
                    registry: Arc::downgrade(groups),
                });
                map.insert(channel.to_string(), Arc::downgrade(&g));
                g
            }
        }
    };
    group
        .ready
        .get_or_try_init(|| {
            let deliver = Deliver {
                group: Arc::downgrade(&group),
            };
            subscribe(Arc::new(move |msg| deliver.call(msg)))
        })
        .await?;
    Ok(WakeOne::new(group))
}

/// The group name of a line of its own on `channel` (see [`join`]): waiters of one kind (a
/// read-write lock's writers) whom a message must reach even while waiters of another kind,
/// older and unable to use it, hold the channel's first place.
pub(crate) fn line_key(channel: &str, line: &str) -> String {
    format!("{channel}\n{line}")
}

/// This client's waiters on `channel`, joined without subscribing: `Some` only while another
/// local waiter is on it (a live group whose subscription is confirmed and whose hub is up).
/// A new caller then queues behind them instead of trying at once (see `Locks::acquire`).
pub(crate) fn join_waiting(groups: &Groups, channel: &str) -> Option<WakeOne> {
    // The map's lock is released at the end of this statement, before `group` can be dropped
    // (a group's drop takes the same lock).
    let group = lock(groups).get(channel).and_then(Weak::upgrade)?;
    (group.ready.initialized() && !group.closed.load(Ordering::Acquire))
        .then(|| WakeOne::new(group))
}

/// Hands a group's messages to its [`Turns`], on the hub's task.
struct Deliver {
    group: Weak<Group>,
}

impl Deliver {
    /// `false` once the group is gone (the hub then forgets this subscriber).
    fn call(&self, msg: HubMsg) -> bool {
        let Some(g) = self.group.upgrade() else {
            return false;
        };
        match msg {
            HubMsg::Message(_) => g.turns.notify_one(),
            // Messages may have been missed: everyone looks again, and a waiter between tries
            // finds a kept wake.
            HubMsg::Reconnected => g.turns.notify_all(),
        }
        true
    }
}

impl Drop for Deliver {
    /// The hub let go of this subscriber while its group lives with a confirmed subscription:
    /// the hub is gone (the client shut down), so waiters fall back to their timers. (A group
    /// that unsubscribed is gone already; one whose subscription failed is not confirmed.)
    fn drop(&mut self) {
        if let Some(g) = self.group.upgrade() {
            if g.ready.initialized() {
                g.closed.store(true, Ordering::Release);
                g.turns.notify_all();
            }
        }
    }
}

impl WakeOne {
    /// Takes a wake kept for this waiter (it came while this waiter's try was in flight, and
    /// this waiter is the group's oldest), if there is one: the try about to be made sees
    /// whatever that message announced. Hold it like one from [`WakeOne::wait`].
    pub(crate) fn take_stored(&self) -> Option<Woken> {
        self.group
            .turns
            .take_stored(self.ticket)
            .then(|| self.woken())
    }

    /// Whether the hub is gone (the client shut down): waiting on the group would only time out.
    pub(crate) fn closed(&self) -> bool {
        self.group.closed.load(Ordering::Acquire)
    }

    /// Waits for this waiter's turn to be woken (a kept wake, if this waiter is the oldest, at
    /// once), or for `timeout` to pass while it is the group's oldest member (a younger one
    /// waits on: only the oldest tries on its own timer), or for `until`. `Some` when woken:
    /// hold the [`Woken`] until the try it prompted is made, so a waiter dropped in between
    /// passes its wake on.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake that reached this waiter as it was dropped goes to the next one.
    pub(crate) async fn wait(&self, timeout: Duration, until: Option<Instant>) -> Option<Woken> {
        self.group
            .turns
            .wait(self.ticket, timeout, until, &self.group.closed)
            .await
            .then(|| self.woken())
    }

    /// Leaves the group and wakes the next waiter, if one is left: for a grant that others
    /// waiting may share (a read of the read-write lock), so they need not wait for a release
    /// that may never come while the lock stays shared. No waiter left: nothing is kept.
    pub(crate) fn wake_next(self) {
        let group = self.group.clone();
        drop(self);
        group.turns.notify_members();
    }

    fn woken(&self) -> Woken {
        Woken {
            group: self.group.clone(),
            armed: true,
        }
    }
}

/// A wake taken by one waiter; passed on to the next unless [`Woken::used`] says the try it
/// prompted was made.
pub(crate) struct Woken {
    group: Arc<Group>,
    armed: bool,
}

impl Woken {
    /// The try was made (whatever it found): the wake did its job.
    pub(crate) fn used(mut self) {
        self.armed = false;
    }
}

impl Drop for Woken {
    fn drop(&mut self) {
        if self.armed {
            self.group.turns.notify_one();
        }
    }
}

/// The members of one group in the order they joined (by ticket), which of them are parked,
/// and the one wake kept for the oldest member while its try is in flight (or for whoever
/// joins when nobody is a member).
///
/// Invariant, restored by [`TurnsState::pass`] after every change: a kept wake never waits
/// while the oldest member is parked.
#[derive(Default)]
struct Turns {
    state: Mutex<TurnsState>,
}

#[derive(Default)]
struct TurnsState {
    stored: bool,
    members: BTreeSet<u64>,
    parked: BTreeMap<u64, oneshot::Sender<()>>,
    next_ticket: u64,
}

impl TurnsState {
    /// Hands a kept wake to the oldest member if it is parked; keeps it while that member's
    /// try is in flight (or while nobody is a member).
    fn pass(&mut self) {
        while self.stored {
            let Some(&oldest) = self.members.first() else {
                return;
            };
            let Some(tx) = self.parked.remove(&oldest) else {
                return;
            };
            if tx.send(()).is_ok() {
                self.stored = false;
            }
        }
    }
}

impl Turns {
    fn join(&self) -> u64 {
        let mut s = lock(&self.state);
        let ticket = s.next_ticket;
        s.next_ticket = s.next_ticket.wrapping_add(1);
        s.members.insert(ticket);
        ticket
    }

    /// A member leaves (its acquire returned): a wake kept for it goes to the next.
    fn leave(&self, ticket: u64) {
        let mut s = lock(&self.state);
        s.members.remove(&ticket);
        s.parked.remove(&ticket);
        s.pass();
    }

    /// A message: wakes the oldest member, or keeps the wake for it.
    fn notify_one(&self) {
        let mut s = lock(&self.state);
        s.stored = true;
        s.pass();
    }

    /// A wake for the oldest member, only if there is one (see [`WakeOne::wake_next`]).
    fn notify_members(&self) {
        let mut s = lock(&self.state);
        if !s.members.is_empty() {
            s.stored = true;
            s.pass();
        }
    }

    /// Wakes every parked member and keeps one wake for a member between tries.
    fn notify_all(&self) {
        let mut s = lock(&self.state);
        for (_, tx) in std::mem::take(&mut s.parked) {
            let _ = tx.send(());
        }
        s.stored = true;
    }

    /// Takes the kept wake if there is one and `ticket` is the oldest member.
    fn take_stored(&self, ticket: u64) -> bool {
        let mut s = lock(&self.state);
        let mine = s.stored && s.members.first() == Some(&ticket);
        if mine {
            s.stored = false;
        }
        mine
    }

    /// `true` when woken, `false` when the time ran out: `timeout` for the oldest member, or
    /// `until`. A younger member whose `timeout` ends waits on, as long as an older one is a
    /// member: only the oldest tries on its own timer (its naps are bounded by the holder's
    /// lease), so a younger member never takes the lock before an older one by the accident of
    /// a timer, however late a release's message or the older member's try. As with tokio's
    /// fair `Mutex`, an older member whose future is held but never polled holds the others up
    /// (until their own `until`).
    async fn wait(
        &self,
        ticket: u64,
        timeout: Duration,
        until: Option<Instant>,
        closed: &AtomicBool,
    ) -> bool {
        let (tx, mut rx) = oneshot::channel();
        {
            let mut s = lock(&self.state);
            s.parked.insert(ticket, tx);
            s.pass();
        }
        let mut place = Place {
            turns: self,
            ticket,
            left: false,
        };
        loop {
            let mut end = Instant::now() + timeout;
            if let Some(u) = until {
                end = end.min(u);
            }
            match tokio::time::timeout_at(end, &mut rx).await {
                Ok(Ok(())) => {
                    place.left = true;
                    return true;
                }
                Err(_)
                    if until.map_or(true, |u| Instant::now() < u)
                        && !closed.load(Ordering::Acquire)
                        && lock(&self.state).members.first() != Some(&ticket) => {}
                // The sender went without a wake (not done by this module), or the time ran
                // out: still parked means not woken; otherwise the wake came as the time ran
                // out.
                Ok(Err(_)) | Err(_) => return place.leave(),
            }
        }
    }
}

/// A member's place among the parked: dropped while parked it leaves; dropped after a wake was
/// sent to it (which it never saw), it passes the wake on.
struct Place<'a> {
    turns: &'a Turns,
    ticket: u64,
    left: bool,
}

impl Place<'_> {
    /// Stops being parked: `true` if a wake had already been sent to this place.
    fn leave(&mut self) -> bool {
        self.left = true;
        lock(&self.turns.state)
            .parked
            .remove(&self.ticket)
            .is_none()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.left && self.leave() {
            self.turns.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> Arc<Group> {
        Arc::new(Group {
            channel: "c".into(),
            turns: Turns::default(),
            ready: OnceCell::new(),
            closed: AtomicBool::new(false),
            registry: Weak::new(),
        })
    }

    fn waiter(g: &Arc<Group>) -> tokio::task::JoinHandle<bool> {
        let w = WakeOne::new(g.clone());
        tokio::spawn(async move {
            match w.wait(Duration::from_secs(5), None).await {
                Some(woken) => {
                    woken.used();
                    true
                }
                None => false,
            }
        })
    }

    #[tokio::test]
    async fn one_message_wakes_one_waiter() {
        let g = group();
        let (a, b) = (waiter(&g), waiter(&g));
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.turns.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            usize::from(a.is_finished()) + usize::from(b.is_finished()),
            1
        );
        g.turns.notify_one();
        assert!(
            a.await.unwrap() && b.await.unwrap(),
            "the second message woke the other"
        );
    }

    #[tokio::test]
    async fn a_shared_grant_wakes_the_next_waiter_and_keeps_nothing_when_none_is_left() {
        let g = group();
        let first = WakeOne::new(g.clone());
        let next = waiter(&g);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The oldest was granted a read: the next one is woken with no message.
        first.wake_next();
        assert!(next.await.unwrap(), "the next waiter was woken");
        // Nobody left: no wake is kept for whoever joins later.
        WakeOne::new(g.clone()).wake_next();
        let late = WakeOne::new(g.clone());
        assert!(late.take_stored().is_none(), "nothing kept");
    }

    #[tokio::test]
    async fn a_wake_dropped_before_its_try_passes_on() {
        let g = group();
        let c = WakeOne::new(g.clone());
        let dropper = tokio::spawn(async move {
            // Woken, then gone before trying (a cancelled acquire).
            assert!(c.wait(Duration::from_secs(5), None).await.is_some());
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let d = waiter(&g);
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.turns.notify_one();
        dropper.await.unwrap();
        assert!(d.await.unwrap(), "the dropped wake reached the next waiter");
    }

    #[tokio::test]
    async fn a_message_while_nobody_waits_is_kept_once() {
        let g = group();
        let a = WakeOne::new(g.clone());
        g.turns.notify_one();
        g.turns.notify_one();
        a.wait(Duration::from_millis(10), None)
            .await
            .expect("kept")
            .used();
        assert!(
            a.wait(Duration::from_millis(10), None).await.is_none(),
            "only one kept"
        );
        assert!(a.take_stored().is_none(), "nothing stored");
        g.turns.notify_one();
        a.take_stored().expect("the stored wake").used();
        assert!(
            a.wait(Duration::from_millis(10), None).await.is_none(),
            "taken"
        );
    }

    #[tokio::test]
    async fn wakes_go_to_the_oldest_member_and_wait_for_it_while_its_try_is_in_flight() {
        let g = group();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Members join in order 0..4 and park in the reverse order.
        let members: Vec<WakeOne> = (0..4).map(|_| WakeOne::new(g.clone())).collect();
        let mut tasks = Vec::new();
        for (i, w) in members.into_iter().enumerate().rev() {
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let woken = w.wait(Duration::from_secs(5), None).await.expect("woken");
                woken.used();
                tx.send(i).unwrap();
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for expected in 0..4 {
            g.turns.notify_one();
            assert_eq!(
                rx.recv().await,
                Some(expected),
                "woken in the order they joined"
            );
        }
        // The oldest member is between tries (not parked) when a message comes: a younger one
        // parked meanwhile is not woken; the wake is kept for the oldest.
        let oldest = WakeOne::new(g.clone());
        let younger = WakeOne::new(g.clone());
        let parked = tokio::spawn(async move {
            younger
                .wait(
                    Duration::from_millis(50),
                    Some(Instant::now() + Duration::from_millis(200)),
                )
                .await
                .map(Woken::used)
                .is_some()
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        g.turns.notify_one();
        assert!(!parked.await.unwrap(), "the younger member was not woken");
        oldest.take_stored().expect("kept for the oldest").used();
        drop(oldest);
        // A member that leaves with a wake kept for it passes it to the next one.
        let (first, second) = (WakeOne::new(g.clone()), WakeOne::new(g.clone()));
        let next = tokio::spawn(async move {
            second
                .wait(Duration::from_secs(5), None)
                .await
                .map(Woken::used)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        g.turns.notify_one();
        drop(first);
        assert!(next.await.unwrap().is_some(), "passed on");
        assert!(!lock(&g.turns.state).stored, "nothing left kept");
    }

    #[tokio::test]
    async fn only_the_oldest_member_ends_its_wait_on_its_own_timer() {
        let g = group();
        let (older, younger) = (WakeOne::new(g.clone()), WakeOne::new(g.clone()));
        let nap = Duration::from_millis(50);
        // The older member is between tries (or its wake is slow to come): the younger one's
        // naps end, and it waits on instead of trying.
        let start = Instant::now();
        let until = start + Duration::from_millis(300);
        assert!(younger.wait(nap, Some(until)).await.is_none(), "not woken");
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "the younger member's wait ended after {:?}, before its bound, while an older \
             member waited",
            start.elapsed()
        );
        // A message while it waits wakes the oldest, not the younger one.
        let waiting = tokio::spawn(async move {
            let woken = younger.wait(nap, None).await.map(Woken::used).is_some();
            (woken, younger)
        });
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            !waiting.is_finished(),
            "the younger member waits on past its naps"
        );
        g.turns.notify_one();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            !waiting.is_finished(),
            "the wake is kept for the older member"
        );
        older.take_stored().expect("kept for the oldest").used();
        // The older member got its lock and left: the younger, now the oldest, ends its wait on
        // its own timer.
        let left = Instant::now();
        drop(older);
        let (woken, younger) = waiting.await.unwrap();
        assert!(!woken, "no wake was sent to it");
        assert!(
            left.elapsed() < Duration::from_secs(2),
            "{:?}",
            left.elapsed()
        );
        let start = Instant::now();
        assert!(younger.wait(nap, None).await.is_none());
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the oldest's nap: {:?}",
            start.elapsed()
        );
    }
}

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
//! ([`Woken`]); a reconnect (messages may have been missed) wakes them all. Waiters still sleep
//! with a timeout of their own (a crashed holder publishes nothing), so a wake is a shortcut,
//! never the only way forward.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::pubsub::{HubMsg, Subscription};
use crate::error::Error;
use crate::util::lock;

/// The groups of one hub, by channel (weak: a group lives as long as its waiters).
pub(crate) type Groups = Arc<Mutex<HashMap<String, Weak<Group>>>>;

/// The waiters of one channel on one client.
pub(crate) struct Group {
    channel: String,
    notify: Notify,
    /// Set once the shared subscription is confirmed and its pump runs.
    ready: OnceCell<()>,
    /// The hub went away (client shut down): waiters fall back to their timers.
    closed: AtomicBool,
    /// Stops the pump when the last waiter leaves.
    stop: CancellationToken,
    registry: Weak<Mutex<HashMap<String, Weak<Group>>>>,
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop.cancel();
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

/// One waiter's membership in its channel's group.
pub(crate) struct WakeOne {
    group: Arc<Group>,
}

/// Joins the wake-one group of `channel` in `groups`, subscribing with `subscribe` (once per
/// group) if nobody local listens yet; the pump runs on `tracker` and stops with `cancel`. The
/// same for every hub (Redis pub/sub, PostgreSQL `LISTEN`): see `Hub::wake_one` in the Redis backend.
pub(crate) async fn join<F, Fut>(
    groups: &Groups,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
    channel: &str,
    subscribe: F,
) -> Result<WakeOne, Error>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Subscription, Error>>,
{
    let group = {
        let mut map = lock(groups);
        match map.get(channel).and_then(Weak::upgrade) {
            Some(g) => g,
            None => {
                let g = Arc::new(Group {
                    channel: channel.to_string(),
                    notify: Notify::new(),
                    ready: OnceCell::new(),
                    closed: AtomicBool::new(false),
                    stop: cancel.child_token(),
                    registry: Arc::downgrade(groups),
                });
                map.insert(channel.to_string(), Arc::downgrade(&g));
                g
            }
        }
    };
    group
        .ready
        .get_or_try_init(|| async {
            let sub = subscribe().await?;
            spawn_pump(tracker, sub, &group);
            Ok::<(), Error>(())
        })
        .await?;
    Ok(WakeOne { group })
}

fn spawn_pump(tracker: &TaskTracker, mut sub: Subscription, group: &Arc<Group>) {
    let weak = Arc::downgrade(group);
    let stop = group.stop.clone();
    tracker.spawn(async move {
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = sub.rx.recv() => m,
            };
            let Some(g) = weak.upgrade() else { return };
            match msg {
                Some(HubMsg::Message(_)) => g.notify.notify_one(),
                // Messages may have been missed: everyone looks again, and a waiter between
                // tries finds a stored wake.
                Some(HubMsg::Reconnected) => {
                    g.notify.notify_waiters();
                    g.notify.notify_one();
                }
                None => {
                    g.closed.store(true, Ordering::Release);
                    g.notify.notify_waiters();
                    return;
                }
            }
        }
    });
}

impl WakeOne {
    /// Takes a wake stored while nobody waited, if there is one: the try about to be made sees
    /// whatever that message announced. Hold it like one from [`WakeOne::wait`].
    pub(crate) fn take_stored(&self) -> Option<Woken> {
        let mut n = std::pin::pin!(self.group.notify.notified());
        let mut cx = std::task::Context::from_waker(&NOOP_WAKER);
        // Ready consumes the stored wake; Pending registers nothing that outlives `n`.
        std::future::Future::poll(n.as_mut(), &mut cx)
            .is_ready()
            .then(|| self.woken())
    }

    /// Whether the hub is gone (the client shut down): waiting on the group would only time out.
    pub(crate) fn closed(&self) -> bool {
        self.group.closed.load(Ordering::Acquire)
    }

    /// Waits for this waiter's turn to be woken, or `timeout`. `Some` when woken: hold the
    /// [`Woken`] until the try it prompted is made, so a waiter dropped in between passes its
    /// wake on.
    ///
    /// # Cancel safety
    /// Cancel safe: a wake that reached this waiter as it was dropped goes to the next one.
    pub(crate) async fn wait(&self, timeout: Duration) -> Option<Woken> {
        match tokio::time::timeout(timeout, self.group.notify.notified()).await {
            Ok(()) => Some(self.woken()),
            Err(_) => None,
        }
    }

    fn woken(&self) -> Woken {
        Woken {
            group: self.group.clone(),
            armed: true,
        }
    }
}

/// A waker that does nothing, for polling a future once (`Waker::noop` needs Rust 1.85).
static NOOP_WAKER: std::sync::LazyLock<std::task::Waker> =
    std::sync::LazyLock::new(|| std::task::Waker::from(Arc::new(Noop)));

struct Noop;

impl std::task::Wake for Noop {
    fn wake(self: Arc<Self>) {}
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
            self.group.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> Arc<Group> {
        Arc::new(Group {
            channel: "c".into(),
            notify: Notify::new(),
            ready: OnceCell::new(),
            closed: AtomicBool::new(false),
            stop: CancellationToken::new(),
            registry: Weak::new(),
        })
    }

    fn waiter(g: &Arc<Group>) -> tokio::task::JoinHandle<bool> {
        let w = WakeOne { group: g.clone() };
        tokio::spawn(async move {
            match w.wait(Duration::from_secs(5)).await {
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
        g.notify.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            usize::from(a.is_finished()) + usize::from(b.is_finished()),
            1
        );
        g.notify.notify_one();
        assert!(
            a.await.unwrap() && b.await.unwrap(),
            "the second message woke the other"
        );
    }

    #[tokio::test]
    async fn a_wake_dropped_before_its_try_passes_on() {
        let g = group();
        let c = WakeOne { group: g.clone() };
        let dropper = tokio::spawn(async move {
            // Woken, then gone before trying (a cancelled acquire).
            assert!(c.wait(Duration::from_secs(5)).await.is_some());
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let d = waiter(&g);
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.notify.notify_one();
        dropper.await.unwrap();
        assert!(d.await.unwrap(), "the dropped wake reached the next waiter");
    }

    #[tokio::test]
    async fn a_message_while_nobody_waits_is_kept_once() {
        let g = group();
        let a = WakeOne { group: g.clone() };
        g.notify.notify_one();
        g.notify.notify_one();
        a.wait(Duration::from_millis(10))
            .await
            .expect("kept")
            .used();
        assert!(
            a.wait(Duration::from_millis(10)).await.is_none(),
            "only one kept"
        );
        assert!(a.take_stored().is_none(), "nothing stored");
        g.notify.notify_one();
        a.take_stored().expect("the stored wake").used();
        assert!(a.wait(Duration::from_millis(10)).await.is_none(), "taken");
    }
}

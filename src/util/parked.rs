//! Wake channels kept subscribed between waits: a waiter of a queue-shaped lock (the fair lock)
//! is woken on a channel of its own, and subscribing to a fresh one for every wait cost a
//! `SUBSCRIBE` and an `UNSUBSCRIBE` per contended acquisition, and a second try (a release
//! between the first try and the subscription would have been missed). A waiter now takes an
//! idle channel of its lock, already subscribed, and gives it back when its wait ends.
//!
//! A channel's messages may outlive the wait they were for (a wake published just before its
//! waiter was granted): the next user drains them before each try, so a stale message costs at
//! most one try, as a waiter's own timer would.
//!
//! Bounds: at most [`PER_LOCK`] idle channels per lock and [`MAX_IDLE`] in all per client, each
//! kept at most [`IDLE_FOR`] (pruned whenever a channel is taken or given back; a client that
//! stops waiting keeps its last ones until then, unsubscribed when the client shuts down).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::pubsub::Subscription;

/// Idle channels kept per lock: as many as a client's tasks wait on one lock at once, usually.
pub(crate) const PER_LOCK: usize = 32;

/// Idle channels kept per client in all.
pub(crate) const MAX_IDLE: usize = 256;

/// How long an idle channel is kept.
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(30);

/// A wake channel's name (what follows the lock's wake prefix) and its subscription.
pub(crate) struct Channel {
    pub name: String,
    pub sub: Subscription,
}

struct Idle {
    lock: String,
    channel: Channel,
    since: Instant,
}

/// One client's idle wake channels, oldest first.
#[derive(Default)]
pub(crate) struct Parked {
    idle: Mutex<VecDeque<Idle>>,
}

impl Parked {
    /// An idle channel of `lock` (the most recently given back), if there is one.
    pub(crate) fn take(&self, lock: &str) -> Option<Channel> {
        self.take_at(lock, Instant::now())
    }

    fn take_at(&self, lock: &str, now: Instant) -> Option<Channel> {
        let (found, stale) = {
            let mut idle = crate::util::lock(&self.idle);
            let stale = prune(&mut idle, now);
            let found = idle
                .iter()
                .rposition(|i| i.lock == lock)
                .and_then(|at| idle.remove(at))
                .map(|i| i.channel);
            (found, stale)
        };
        // Unsubscribed outside the lock.
        drop(stale);
        found
    }

    /// Keeps `channel` of `lock` for the next waiter, within the bounds.
    pub(crate) fn give_back(&self, lock: &str, channel: Channel) {
        let (refused, stale) = {
            let mut idle = crate::util::lock(&self.idle);
            let stale = prune(&mut idle, Instant::now());
            let of_lock = idle.iter().filter(|i| i.lock == lock).count();
            if of_lock >= PER_LOCK || idle.len() >= MAX_IDLE {
                (Some(channel), stale)
            } else {
                idle.push_back(Idle {
                    lock: lock.to_string(),
                    channel,
                    since: Instant::now(),
                });
                (None, stale)
            }
        };
        drop((refused, stale));
    }

    /// How many channels are idle (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        crate::util::lock(&self.idle).len()
    }
}

/// Takes out the channels idle longer than [`IDLE_FOR`] (the caller drops them, which
/// unsubscribes).
fn prune(idle: &mut VecDeque<Idle>, now: Instant) -> Vec<Channel> {
    let mut stale = Vec::new();
    while idle
        .front()
        .is_some_and(|i| now.saturating_duration_since(i.since) >= IDLE_FOR)
    {
        if let Some(i) = idle.pop_front() {
            stale.push(i.channel);
        }
    }
    stale
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn channel(name: &str, cmds: &mpsc::UnboundedSender<super::super::pubsub::HubCmd>) -> Channel {
        let (_tx, rx) = crate::util::mailbox::unbounded();
        Channel {
            name: name.to_string(),
            sub: Subscription::new(rx, format!("c:{name}"), 1, cmds.clone()),
        }
    }

    #[tokio::test]
    async fn channels_are_kept_per_lock_within_the_bounds_and_for_a_while() {
        let (cmds, mut unsubscribed) = mpsc::unbounded_channel();
        let parked = Parked::default();
        assert!(parked.take("a").is_none());
        for i in 0..PER_LOCK + 2 {
            parked.give_back("a", channel(&format!("a{i}"), &cmds));
        }
        parked.give_back("b", channel("b0", &cmds));
        assert_eq!(parked.len(), PER_LOCK + 1, "at most PER_LOCK per lock");
        let mut refused = 0;
        while unsubscribed.try_recv().is_ok() {
            refused += 1;
        }
        assert_eq!(refused, 2, "the refused ones unsubscribe");
        // The most recently given back first, and only the lock's own.
        let last = format!("a{}", PER_LOCK - 1);
        assert_eq!(parked.take("a").map(|c| c.name), Some(last));
        assert_eq!(parked.take("b").map(|c| c.name).as_deref(), Some("b0"));
        assert!(parked.take("b").is_none());
        // Idle past IDLE_FOR: dropped (unsubscribed) at the next use.
        assert!(parked.take_at("a", Instant::now() + IDLE_FOR).is_none());
        assert_eq!(parked.len(), 0);
        let mut pruned = 0;
        while unsubscribed.try_recv().is_ok() {
            pruned += 1;
        }
        // The two taken (dropped by this test) and the PER_LOCK − 1 pruned.
        assert_eq!(pruned, 2 + PER_LOCK - 1);
    }
}

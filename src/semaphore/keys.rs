//! Key naming of the semaphore, under its own sub-prefix (`sem:`), one hash tag per semaphore.
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `sem:{K}` | hash: `limit`, `span` (slots that may hold permits), `f<i>` (slot `i`'s last fencing token) | max(24 h, 2 × lease), refreshed by every try, grant and extension |
//! | `P` `sem:{K}:<i>` | slot `i`'s holder's random token | the permit's lease |
//! | `P` `sem:{K}:queue` | sorted set: the fair waiters' ids, scored by arrival | the record's, refreshed by every queued try |
//! | `P` `sem:{K}:alive` | sorted set: the fair waiters' ids, scored by the server time (ms) their place ends | as `…:queue` |
//! | `P` `sem:{K}:released` | pub/sub channel: `released` | — |
//!
//! `{K}` is a Redis Cluster hash tag: the record and every slot share a Cluster slot, so one
//! script reads them all.

use crate::backend::Backend;
use crate::lease::held::{FencedAt, HeldKeys, ReleaseFuture};

/// The sub-prefix of the semaphore's keys after the key prefix.
pub(crate) const SUB_PREFIX: &str = "sem:";

/// The keys of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SemKeys {
    /// `P` `sem:{K}`.
    pub(crate) meta: String,
    /// `P` `sem:{K}:`: slot `i`'s key is this followed by `i`.
    pub(crate) slots: String,
    /// `P` `sem:{K}:released`.
    pub(crate) channel: String,
    /// `P` `sem:{K}:queue`.
    pub(crate) queue: String,
    /// `P` `sem:{K}:alive`.
    pub(crate) alive: String,
}

impl SemKeys {
    /// The keys of semaphore `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let meta = format!("{prefix}{SUB_PREFIX}{{{name}}}");
        SemKeys {
            slots: format!("{meta}:"),
            channel: format!("{meta}:released"),
            queue: format!("{meta}:queue"),
            alive: format!("{meta}:alive"),
            meta,
        }
    }

    /// Slot `slot`'s key.
    pub(crate) fn slot(&self, slot: u32) -> String {
        format!("{}{slot}", self.slots)
    }
}

/// One granted slot, as the lease kernel holds it: the slot key is the lease, the record (which
/// keeps the slot's fence) the key an extension refreshes.
#[derive(Debug)]
pub(crate) struct PermitKeys {
    pub(crate) slot_key: String,
    pub(crate) meta: String,
    pub(crate) channel: String,
}

impl FencedAt for PermitKeys {
    fn lock_key(&self) -> &str {
        &self.slot_key
    }
    fn fence_key(&self) -> &str {
        &self.meta
    }
}

/// A permit's release: the mutex's compare-and-delete on the slot key, then `released` on the
/// semaphore's channel wakes one waiter per client.
impl HeldKeys for PermitKeys {
    fn what(&self) -> &'static str {
        "permit"
    }

    fn primitive(&self) -> crate::util::metrics::Primitive {
        crate::util::metrics::primitive::SEMAPHORE
    }

    fn release<'a>(
        &'a self,
        backend: &'a Backend,
        token: &'a str,
        limit: tokio::time::Instant,
    ) -> ReleaseFuture<'a> {
        Box::pin(backend.release(&self.slot_key, &self.channel, token, limit))
    }

    fn release_in_background(self: std::sync::Arc<Self>, backend: &Backend, token: String) {
        backend.release_in_background(&self.slot_key, &self.channel, token);
    }

    fn taken_channel(&self) -> String {
        self.channel.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_under_their_sub_prefix() {
        let k = SemKeys::new("baton:", "pool");
        assert_eq!(k.meta, "baton:sem:{pool}");
        assert_eq!(k.slot(3), "baton:sem:{pool}:3");
        assert_eq!(k.channel, "baton:sem:{pool}:released");
        assert_eq!(k.queue, "baton:sem:{pool}:queue");
        assert_eq!(k.alive, "baton:sem:{pool}:alive");
    }
}

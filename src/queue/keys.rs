//! Key naming of run-or-enqueue, under its own sub-prefix (`queue:`), so a queue and a lock or
//! a failover job with the same name never collide.
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `queue:{K}` | the holder's random 128-bit token (hex) | the lease's TTL, extended by the watchdog while draining |
//! | `P` `queue:{K}:fence` | the last fencing token granted | max(24 h, 2 × TTL), refreshed by extensions |
//! | `P` `queue:{K}:items` | a Redis Stream: one entry per item, field `b` = the body | none while it holds items (they outlive any holder); max(24 h, 2 × TTL) once released empty (kept so ids never repeat) |
//!
//! `{K}` is a Redis Cluster hash tag: all three share a slot, so one script touches them all.

/// The sub-prefix of this primitive's keys after the key prefix (`P` `queue:{K}`): what tells
/// its keys from the other primitives' (a failover job's have none: `P{K}`), also for the
/// listing of everything under a prefix.
pub(crate) const SUB_PREFIX: &str = "queue:";

/// The keys of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueKeys {
    pub lock: String,
    pub fence: String,
    pub items: String,
}

impl QueueKeys {
    /// The keys of queue `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = format!("{prefix}{SUB_PREFIX}{{{name}}}");
        QueueKeys {
            fence: format!("{lock}:fence"),
            items: format!("{lock}:items"),
            lock,
        }
    }

    /// The kernel's view of them.
    pub(crate) fn kernel(&self) -> crate::queue::items::ItemKeys<'_> {
        crate::queue::items::ItemKeys {
            lock: &self.lock,
            fence: &self.fence,
            items: &self.items,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = QueueKeys::new("baton:", "mail:7");
        assert_eq!(k.lock, "baton:queue:{mail:7}");
        assert_eq!(k.fence, "baton:queue:{mail:7}:fence");
        assert_eq!(k.items, "baton:queue:{mail:7}:items");
        assert_ne!(k.lock, "baton:lock:{mail:7}");
    }
}

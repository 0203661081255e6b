//! Key naming of the fair lock, under its own sub-prefix (`baton:fair:{K}` is neither the
//! mutex's `baton:lock:{K}` nor a failover job's `baton:{K}`).
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `fair:{K}` | the holder's random 128-bit id (hex) | the lock's TTL |
//! | `P` `fair:{K}:fence` | the last fencing token granted | max(24 h, 2 × TTL), refreshed by extensions |
//! | `P` `fair:{K}:queue` | sorted set: waiter id → arrival number (the server's order) | at least 2 × the longest waiter timeout, refreshed by waiters |
//! | `P` `fair:{K}:alive` | sorted set: waiter id → server time (ms) at which it counts as dead | as the queue |
//! | `P` `fair:{K}:reserved` | the reserver's id | the reservation's lifetime, renewed while it waits |
//! | `P` `fair:{K}:wake:<c>` | pub/sub channel of one waiter (`<c>` follows the last `.` of its id, the whole id without one): `go` | — |
//! | `P` `fair:{K}:taken` | pub/sub channel the holder's watchdog listens on: `taken:<fencing token>` after an operator's force release | — |
//!
//! `{K}` is a Redis Cluster hash tag: every key and every wake channel of one lock share a slot,
//! so one script reads and writes them all and publishes with `SPUBLISH` on a cluster. That is
//! why `{` and `}` are rejected in names and prefixes.

/// The sub-prefix of this primitive's keys after the key prefix (`P` `fair:{K}`): what tells
/// its keys from the other primitives' (a failover job's have none: `P{K}`), also for the
/// listing of everything under a prefix.
pub(crate) const SUB_PREFIX: &str = "fair:";

use crate::fair::queue::QueueKeys;

/// The default key prefix (shared with the other primitives; each adds its own sub-prefix).
pub const DEFAULT_PREFIX: &str = crate::util::names::DEFAULT_PREFIX;

/// The longest lock name, in bytes.
pub const MAX_KEY_BYTES: usize = crate::util::names::MAX_NAME_BYTES;

/// The keys of fair lock `name` under `prefix` (both already validated).
pub(crate) fn fair_keys(prefix: &str, name: &str) -> QueueKeys {
    let lock = format!("{prefix}{SUB_PREFIX}{{{name}}}");
    QueueKeys {
        fence: format!("{lock}:fence"),
        queue: format!("{lock}:queue"),
        alive: format!("{lock}:alive"),
        reserved: format!("{lock}:reserved"),
        wake_prefix: format!("{lock}:wake:"),
        lock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = fair_keys("baton:", "msg:42");
        assert_eq!(k.lock, "baton:fair:{msg:42}");
        assert_eq!(k.fence, "baton:fair:{msg:42}:fence");
        assert_eq!(k.queue, "baton:fair:{msg:42}:queue");
        assert_eq!(k.alive, "baton:fair:{msg:42}:alive");
        assert_eq!(k.reserved, "baton:fair:{msg:42}:reserved");
        assert_eq!(k.wake("ab12"), "baton:fair:{msg:42}:wake:ab12");
        assert_ne!(k.lock, "baton:lock:{msg:42}");
    }
}

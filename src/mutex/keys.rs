//! Key naming of the mutex, under its own sub-prefix so that a lock and a failover job with the
//! same name never collide (`baton:lock:{msg:42}` is not `baton:{msg:42}`).
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `lock:{K}` | the holder's random 128-bit token (hex) | the lock's TTL |
//! | `P` `lock:{K}:fence` | the last fencing token granted | max(24 h, 2 × TTL), refreshed by extensions |
//! | `P` `lock:{K}:released` | pub/sub channel: `released` | — |
//!
//! On PostgreSQL the lock is the row of `baton_locks` whose `key` is `P` `lock:{K}` (token,
//! expiry, fence and the fence's retention in columns), and a release notifies `released` on
//! the topic `P` `lock:{K}:released`.
//!
//! `{K}` is a Redis Cluster hash tag: the lock and its fence share a slot, so one script can
//! touch both. That is why `{` and `}` are rejected in names and prefixes.

/// The sub-prefix of this primitive's keys after the key prefix (`P` `lock:{K}`): what tells
/// its keys from the other primitives' (a failover job's have none: `P{K}`), also for the
/// listing of everything under a prefix.
pub(crate) const SUB_PREFIX: &str = "lock:";

/// The default key prefix (shared with the other primitives; each adds its own sub-prefix).
pub const DEFAULT_PREFIX: &str = crate::util::names::DEFAULT_PREFIX;

/// The longest lock name, in bytes.
pub const MAX_KEY_BYTES: usize = crate::util::names::MAX_NAME_BYTES;

/// The keys and channel of one lock, formatted once into one buffer (`lock`, `:fence`, then
/// `lock` again and `:released`): the lock is a prefix of the fence key, and a handle's three
/// names cost one allocation instead of three on every acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    all: String,
    /// Where the lock key ends in `all` (the fence key goes on to `fence_end`).
    lock_end: usize,
    /// Where the fence key ends in `all` (the channel is the rest).
    fence_end: usize,
}

impl crate::lease::pending::LockAt for LockKeys {
    fn lock(&self) -> &str {
        self.lock()
    }
    fn channel(&self) -> &str {
        self.channel()
    }
}

impl crate::backend::locks::BatchKeys for LockKeys {
    fn lock(&self) -> &str {
        self.lock()
    }
    fn fence(&self) -> &str {
        self.fence()
    }
    fn channel(&self) -> &str {
        self.channel()
    }
}

impl crate::lease::held::FencedAt for LockKeys {
    fn lock_key(&self) -> &str {
        self.lock()
    }
    fn fence_key(&self) -> &str {
        self.fence()
    }
}

impl LockKeys {
    /// The keys of lock `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        const FENCE: &str = ":fence";
        const RELEASED: &str = ":released";
        let lock_len = prefix.len() + SUB_PREFIX.len() + name.len() + 2;
        let mut all = String::with_capacity(2 * lock_len + FENCE.len() + RELEASED.len());
        for part in [prefix, SUB_PREFIX, "{", name, "}"] {
            all.push_str(part);
        }
        let lock_end = all.len();
        all.push_str(FENCE);
        let fence_end = all.len();
        for part in [prefix, SUB_PREFIX, "{", name, "}", RELEASED] {
            all.push_str(part);
        }
        LockKeys {
            all,
            lock_end,
            fence_end,
        }
    }

    /// The lock key: `P` `lock:{K}`.
    pub(crate) fn lock(&self) -> &str {
        &self.all[..self.lock_end]
    }

    /// The fence key: `P` `lock:{K}:fence`.
    pub(crate) fn fence(&self) -> &str {
        &self.all[..self.fence_end]
    }

    /// The release channel: `P` `lock:{K}:released`.
    pub(crate) fn channel(&self) -> &str {
        &self.all[self.fence_end..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = LockKeys::new("baton:", "msg:42");
        assert_eq!(k.lock(), "baton:lock:{msg:42}");
        assert_eq!(k.fence(), "baton:lock:{msg:42}:fence");
        assert_eq!(k.channel(), "baton:lock:{msg:42}:released");
        // A failover job of the same name uses `baton:{msg:42}`: no collision.
        assert_ne!(k.lock(), "baton:{msg:42}");
    }
}

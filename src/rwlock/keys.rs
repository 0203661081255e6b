//! Key naming of the read-write lock, under its own sub-prefix (`P` `rw:{K}`), so that a
//! read-write lock and a mutex of the same name never collide.
//!
//! | key | what |
//! | --- | --- |
//! | `P` `rw:{K}` | the lock's state: the last write's fencing token, the writer, the upgradeable reader, the readers |
//! | `P` `rw:{K}:h:TOKEN` | one holder's own lease |
//! | `P` `rw:{K}:waiting` | the "writer waiting" mark, with its own lease |
//! | `P` `rw:{K}:released` | the channel releases are announced on |
//!
//! `{K}` is a Redis Cluster hash tag: every key of one lock lives in one slot, so one script
//! reads and writes them all.

use crate::util::rw_replies::RwKeysRef;

/// The sub-prefix of this primitive's keys after the key prefix.
pub(crate) const SUB_PREFIX: &str = "rw:";

/// The keys of one read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwKeys {
    state: String,
    waiting: String,
    holder_prefix: String,
    channel: String,
}

impl RwKeys {
    /// The keys of lock `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let state = format!("{prefix}{SUB_PREFIX}{{{name}}}");
        RwKeys {
            waiting: format!("{state}:waiting"),
            holder_prefix: format!("{state}:h:"),
            channel: format!("{state}:released"),
            state,
        }
    }

    /// The keys as the store seam takes them.
    pub(crate) fn refs(&self) -> RwKeysRef<'_> {
        RwKeysRef {
            state: &self.state,
            waiting: &self.waiting,
            holder_prefix: &self.holder_prefix,
            channel: &self.channel,
        }
    }

    /// The state key: `P` `rw:{K}`.
    pub(crate) fn state(&self) -> &str {
        &self.state
    }

    /// The release channel: `P` `rw:{K}:released`.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// The lease key of holder `token`: `P` `rw:{K}:h:TOKEN`.
    pub(crate) fn holder(&self, token: &str) -> String {
        format!("{}{token}", self.holder_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = RwKeys::new("baton:", "cfg");
        assert_eq!(k.state(), "baton:rw:{cfg}");
        assert_eq!(k.refs().waiting, "baton:rw:{cfg}:waiting");
        assert_eq!(k.holder("ab"), "baton:rw:{cfg}:h:ab");
        assert_eq!(k.channel(), "baton:rw:{cfg}:released");
    }
}

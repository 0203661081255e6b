//! Key naming of leader election, under its own sub-prefix so that an election, a mutex and a
//! failover job with the same name never collide (`baton:leader:{K}`).
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `leader:{K}` | the leader's random 128-bit token (hex), `:`, its name | the lease |
//! | `P` `leader:{K}:fence` | the last term granted (the fencing token) | max(24 h, 2 × lease), refreshed by renewals |
//! | `P` `leader:{K}:events` | pub/sub channel: `released` (a resignation), `elected` | — |
//!
//! `{K}` is a Redis Cluster hash tag: the lease and its fence share a slot, so one script can
//! touch both. A term is the fence's value at the grant: `max(previous + 1, server time in µs)`,
//! so terms strictly increase per election name, also after the fence was lost with the data.

/// The sub-prefix of this primitive's keys after the key prefix (`P` `leader:{K}`): what tells
/// its keys from the other primitives' (a failover job's have none: `P{K}`), also for the
/// listing of everything under a prefix.
pub(crate) const SUB_PREFIX: &str = "leader:";

/// The length of a holder token ([`crate::util::token::new_token`]: 128 bits in hex).
const TOKEN_HEX_LEN: usize = 32;

/// The keys and channel of one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElectionKeys {
    pub lease: String,
    pub fence: String,
    pub channel: String,
}

impl crate::lease::pending::LockAt for ElectionKeys {
    fn lock(&self) -> &str {
        &self.lease
    }
    fn channel(&self) -> &str {
        &self.channel
    }
}

impl ElectionKeys {
    /// The keys of election `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lease = format!("{prefix}{SUB_PREFIX}{{{name}}}");
        ElectionKeys {
            fence: format!("{lease}:fence"),
            channel: format!("{lease}:events"),
            lease,
        }
    }
}

/// The lease's value: the holder's token, then its name (names are free of `:`-ambiguity since
/// the token is fixed-length hex).
pub(crate) fn lease_value(token: &str, name: &str) -> String {
    format!("{token}:{name}")
}

/// The name part of a lease value (`None` if it is not one baton writes).
pub(crate) fn name_of(value: &str) -> Option<&str> {
    let (token, name) = value.split_once(':')?;
    (token.len() == TOKEN_HEX_LEN && token.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = ElectionKeys::new("baton:", "report");
        assert_eq!(k.lease, "baton:leader:{report}");
        assert_eq!(k.fence, "baton:leader:{report}:fence");
        assert_eq!(k.channel, "baton:leader:{report}:events");
        assert_ne!(k.lease, "baton:lock:{report}");
    }

    #[test]
    fn lease_values_carry_the_name() {
        let token = crate::util::token::new_token();
        let v = lease_value(&token, "host-1:42");
        assert_eq!(name_of(&v), Some("host-1:42"));
        assert_eq!(name_of("garbage"), None);
        assert_eq!(name_of("abc:def"), None);
        assert_eq!(name_of(""), None);
    }
}

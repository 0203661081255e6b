//! Key naming: the layout of one job's keys ([`JobKeys`]).
//!
//! Every key of one job carries the job name as a Redis Cluster hash tag (`{J}`), so the state,
//! lease, fence and failure keys live in one slot and a single WATCH/MULTI/EXEC can cover them
//! all. That is why `{` and `}` are rejected in prefixes and job names: a name containing them
//! would change which part of the key Redis hashes.

/// The keys and channel of one job: a leaf, because each backend's job store names them too.
pub(crate) use crate::util::jobs::JobKeys;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = JobKeys::new("baton:", "msg:42");
        assert_eq!(k.state(), "baton:{msg:42}");
        assert_eq!(k.lease(), "baton:{msg:42}:lease");
        assert_eq!(k.fence(), "baton:{msg:42}:fence");
        assert_eq!(k.channel(), "baton:{msg:42}:events");
        assert_eq!(k.failure(), "baton:{msg:42}:failure");
    }

    #[test]
    fn unicode_job_names_are_kept_byte_exact() {
        let k = JobKeys::new("p:", "ジョブ 🔒\r\n");
        assert_eq!(k.state(), "p:{ジョブ 🔒\r\n}");
    }
}

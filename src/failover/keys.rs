//! Key naming and token generation.
//!
//! Every key of one job carries the job name as a Redis Cluster hash tag (`{J}`), so the state,
//! lease, fence and failure keys live in one slot and a single WATCH/MULTI/EXEC can cover them
//! all. That is why `{` and `}` are rejected in prefixes and job names: a name containing them
//! would change which part of the key Redis hashes.

/// The Redis keys and pub/sub channel of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobKeys {
    /// `P{J}`: the attempt counter, or `DONE` / `EXHAUSTED`.
    pub state: String,
    /// `P{J}:lease`: the holder's token and name, with TTL `lock_timeout`.
    pub lease: String,
    /// `P{J}:fence`: the last fencing token granted.
    pub fence: String,
    /// `P{J}:failure`: the last failure reason (for operators and `status`).
    pub failure: String,
    /// `P{J}:events`: the pub/sub channel that wakes backups.
    pub channel: String,
}

impl JobKeys {
    pub(crate) fn new(prefix: &str, job: &str) -> Self {
        let state = format!("{prefix}{{{job}}}");
        JobKeys {
            lease: format!("{state}:lease"),
            fence: format!("{state}:fence"),
            failure: format!("{state}:failure"),
            channel: format!("{state}:events"),
            state,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = JobKeys::new("baton:", "msg:42");
        assert_eq!(k.state, "baton:{msg:42}");
        assert_eq!(k.lease, "baton:{msg:42}:lease");
        assert_eq!(k.fence, "baton:{msg:42}:fence");
        assert_eq!(k.channel, "baton:{msg:42}:events");
        assert_eq!(k.failure, "baton:{msg:42}:failure");
    }

    #[test]
    fn unicode_job_names_are_kept_byte_exact() {
        let k = JobKeys::new("p:", "ジョブ 🔒\r\n");
        assert_eq!(k.state, "p:{ジョブ 🔒\r\n}");
    }
}

//! Key naming and token generation.
//!
//! Every key of one job carries the job name as a Redis Cluster hash tag (`{J}`), so the state,
//! lease, fence and failure keys live in one slot and a single WATCH/MULTI/EXEC can cover them
//! all. That is why `{` and `}` are rejected in prefixes and job names: a name containing them
//! would change which part of the key Redis hashes.

/// The Redis keys and pub/sub channel of one job, in one allocation (tens of thousands of
/// waiting workers each hold one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobKeys {
    /// `P{J}`, `P{J}:lease`, `P{J}:fence`, `P{J}:failure`, `P{J}:events`, back to back.
    buf: String,
    /// Where each of the five ends in `buf`.
    ends: [usize; 5],
}

impl JobKeys {
    pub(crate) fn new(prefix: &str, job: &str) -> Self {
        let state_len = prefix.len() + job.len() + 2;
        let mut buf = String::with_capacity(5 * state_len + 30);
        let mut ends = [0; 5];
        for (i, suffix) in ["", ":lease", ":fence", ":failure", ":events"]
            .iter()
            .enumerate()
        {
            buf.push_str(prefix);
            buf.push('{');
            buf.push_str(job);
            buf.push('}');
            buf.push_str(suffix);
            ends[i] = buf.len();
        }
        JobKeys { buf, ends }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        // The ends were recorded at char boundaries while building `buf`.
        self.buf.get(start..self.ends[i]).unwrap_or_default()
    }

    /// `P{J}`: the attempt counter, or `DONE` / `EXHAUSTED`.
    pub(crate) fn state(&self) -> &str {
        self.part(0)
    }

    /// `P{J}:lease`: the holder's token and name, with TTL `lock_timeout`.
    pub(crate) fn lease(&self) -> &str {
        self.part(1)
    }

    /// `P{J}:fence`: the last fencing token granted.
    pub(crate) fn fence(&self) -> &str {
        self.part(2)
    }

    /// `P{J}:failure`: the last failure reason (for operators and `status`).
    pub(crate) fn failure(&self) -> &str {
        self.part(3)
    }

    /// The key of `which`.
    pub(crate) fn of(&self, which: super::protocol::Which) -> &str {
        use super::protocol::Which;
        match which {
            Which::State => self.state(),
            Which::Lease => self.lease(),
            Which::Fence => self.fence(),
        }
    }

    /// `P{J}:events`: the pub/sub channel that wakes backups.
    pub(crate) fn channel(&self) -> &str {
        self.part(4)
    }
}

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

//! The fair line's keys and the answers of its store (defined at the seam, `backend::fair`, so
//! the Redis scripts can read and build them), and how a held fair lock names its lock and
//! fence to the lease kernel.

pub(crate) use crate::backend::fair::{Enqueue, QueueKeys, Turn};

impl crate::lease::held::FencedAt for QueueKeys {
    fn lock_key(&self) -> &str {
        &self.lock
    }
    fn fence_key(&self) -> &str {
        &self.fence
    }
}

//! Run-or-enqueue's view of its store: the types that cross the seam (`backend::queue`, where
//! they are defined so the Redis scripts can read and build them), named here for the queue.

pub(crate) use crate::backend::queue::{Enqueue, ItemKeys, Release, Stored, ACK_GROUP};

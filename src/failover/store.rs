//! The failover coordinator's seam to its backend, as the worker task sees it: [`JobStore`],
//! what the worker ([`super::worker`]) needs from wherever a job's state lives. Its
//! implementations live in the backends' folders; `backend::jobs` chooses one per client
//! ([`Backend::with_job_store`](crate::backend::Backend::with_job_store)). The worker's loop and
//! the pure decisions of [`super::protocol`] are written once, above this trait; a store only
//! reads, writes and wakes.

pub(crate) use crate::backend::jobs::{Extended, Held, JobStore};

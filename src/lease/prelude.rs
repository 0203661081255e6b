//! The traits every held lease answers through, to import at once: `use baton::prelude::*;`.
//! The guards' accessors (`key`, `lease_deadline`, `lost`, `lost_token`, `is_lost`,
//! `loss_reason`, `fencing_token`) and their owners' `extend`, `release` and `start_watchdog`
//! are these traits' methods, written once for every lease-holding type.

pub use super::guard::{Fenced, HeldLease, LeaseGuard};

//! The lock store as the lease-holding primitives name it: an operator's `force_release` and
//! what it reports ([`Expected`], [`ForceRelease`], [`Taken`]), and the loop it runs
//! ([`take_expected`]). The store's operations themselves (acquire, extend, release by token,
//! read, notify, take) are methods of the store seam's `Backend`, defined with their types in
//! `backend::locks`, one arm per backend; they are re-exported here so the primitives keep one
//! place to name them.

pub(crate) use crate::backend::locks::{is_taken, is_taken_holder, take_expected};
pub use crate::backend::locks::{Expected, ForceRelease, Taken};

//! Redlock's options: [`LockOptions`], the one options type of the lock-shaped primitives (how
//! [`Redlock::acquire`](super::Redlock::acquire) retries: exponential backoff with full jitter
//! from 50 ms up to `max_backoff`, bounded by `max_tries` and/or `wait`; whether the guard
//! starts with a watchdog). Redlock refuses the fields it has no use for (`replica_ack`,
//! `waiter_timeout`, `heartbeat`) with [`Error::Unsupported`](crate::Error::Unsupported).

pub use crate::lease::options::{LockOptions, LockOptionsBuilder, DEFAULT_MAX_BACKOFF};

/// The former name of [`LockOptions`], kept so existing code compiles.
pub type RedlockOptions = LockOptions;
/// The former name of [`LockOptionsBuilder`], kept so existing code compiles.
pub type RedlockOptionsBuilder = LockOptionsBuilder;

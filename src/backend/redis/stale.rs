//! Whether the routing may be out of date: set by a reply that says so (or by one that never
//! comes), read by the next lookup, which refreshes the routing first (see [`super::node`]).

use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

use crate::error::{Error, ErrorKind};

/// Whether a reply said the routing may be out of date; shared by a router and its nodes.
#[derive(Debug, Default)]
pub(crate) struct Stale(AtomicBool);

// The cluster's slot map reads the mark; a single server has nothing to refresh.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
impl Stale {
    /// Marks the routing stale if `e` says a key may live elsewhere now.
    pub(crate) fn note(&self, e: &Error) {
        if matches!(
            e.kind(),
            ErrorKind::Moved
                | ErrorKind::ReadOnly
                | ErrorKind::Busy
                | ErrorKind::Connection
                | ErrorKind::Timeout
        ) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Marks the routing stale if one of `values` (a pipeline's replies, errors kept as
    /// values) is a server error that says so.
    pub(crate) fn note_values(&self, values: &[Value]) {
        for v in values {
            if let Value::ServerError(e) = v {
                self.note(&super::classify::from_server_error(e));
            }
        }
    }

    /// Whether the routing was marked stale.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Marks the routing stale.
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Clears the mark (a refresh is under way).
    pub(crate) fn clear(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

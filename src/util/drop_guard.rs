//! [`Armed`]: runs a cleanup when dropped unless disarmed first. Every "release (or leave, or
//! give up) unless we got as far as handing it out" guard is this one shape: the cleanup is
//! armed before a request leaves, so a dropped future, an early `?` or a lost reply all clean
//! up, and the one path that succeeds disarms it.

/// Runs `on_drop` when dropped, unless [`Armed::disarm`] ran first.
///
/// The cleanup runs inside `Drop`, so it must not block: the primitives' cleanups spawn a task
/// on the client's tracker and return.
pub(crate) struct Armed<F: FnOnce()> {
    on_drop: Option<F>,
}

impl<F: FnOnce()> Armed<F> {
    /// Armed: dropped before [`Armed::disarm`], it runs `on_drop` (once).
    pub(crate) fn new(on_drop: F) -> Self {
        Armed {
            on_drop: Some(on_drop),
        }
    }

    /// Nothing to clean up any more (the outcome is known, or someone else took over).
    pub(crate) fn disarm(&mut self) {
        self.on_drop = None;
    }

    /// Whether dropping it would still run the cleanup.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_armed(&self) -> bool {
        self.on_drop.is_some()
    }
}

/// An [`Armed`] seen without its cleanup's type, for code that may only call it off (the
/// group commit of lock scripts disarms a queued acquisition's release, since nothing was
/// sent).
pub(crate) trait Disarm: Send {
    /// As [`Armed::disarm`].
    fn disarm(&mut self);
}

impl<F: FnOnce() + Send> Disarm for Armed<F> {
    fn disarm(&mut self) {
        Armed::disarm(self);
    }
}

impl<F: FnOnce()> Drop for Armed<F> {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

impl<F: FnOnce()> std::fmt::Debug for Armed<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed")
            .field("armed", &self.on_drop.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn runs_once_when_dropped_armed_and_never_when_disarmed() {
        let ran = Cell::new(0);
        {
            let a = Armed::new(|| ran.set(ran.get() + 1));
            assert!(a.is_armed());
        }
        assert_eq!(ran.get(), 1);
        {
            let mut a = Armed::new(|| ran.set(ran.get() + 1));
            a.disarm();
            assert!(!a.is_armed());
        }
        assert_eq!(ran.get(), 1);
    }
}

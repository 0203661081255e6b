//! Redis as the models see it: one linearizable key space with `WATCH` semantics.
//!
//! Only what the protocols rely on is modelled, each as Redis 7 and Valkey 8 behave:
//! - `WATCH` marks keys on a connection; any later change to one of them by anyone (`SET`, a
//!   `DEL` or `PEXPIRE` of a key that exists, the key expiring or being evicted) makes that
//!   connection's next `EXEC` return nil. `DEL` or `PEXPIRE` of a missing key changes nothing
//!   and breaks no watch. `EXEC` (and `UNWATCH`) clear the connection's watches.
//! - A connection that broke (the server restarted, the link dropped) cannot `EXEC`: the reply
//!   is an error and nothing is applied.
//! - Expiry is not a clock here but a step of the model (`expire`), so time stays logical and
//!   the state space finite.
//!
//! Keys are indices `0..N` chosen by each model; values are the model's own type.

/// Connections are numbered `0..16` (a model gives each worker one, and each request in flight
/// whose reply was lost keeps its own until the server processes or drops it).
pub(crate) const MAX_CONNS: usize = 16;

/// The key space and the watches on it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Store<V, const N: usize> {
    vals: [Option<V>; N],
    /// Per key, the connections watching it (bit `c` = connection `c`).
    watchers: [u16; N],
    /// Connections whose watch was broken by a change.
    dirty: u16,
    /// Connections that broke (their next `EXEC` fails).
    broken: u16,
}

/// What an `EXEC` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exec {
    /// No watched key changed: the caller applies its writes now.
    Applied,
    /// A watched key changed: nil reply, nothing applied.
    Aborted,
    /// The connection broke: an error reply, nothing applied.
    Broken,
}

impl<V: Clone + Eq, const N: usize> Store<V, N> {
    /// An empty key space.
    pub(crate) fn new() -> Self {
        Store {
            vals: std::array::from_fn(|_| None),
            watchers: [0; N],
            dirty: 0,
            broken: 0,
        }
    }

    /// `GET key`.
    pub(crate) fn get(&self, key: usize) -> Option<&V> {
        self.vals.get(key).and_then(Option::as_ref)
    }

    fn touch(&mut self, key: usize) {
        if let Some(w) = self.watchers.get(key) {
            self.dirty |= *w;
        }
    }

    /// `SET key v`.
    pub(crate) fn set(&mut self, key: usize, v: V) {
        if let Some(slot) = self.vals.get_mut(key) {
            *slot = Some(v);
            self.touch(key);
        }
    }

    /// `DEL key` (also a key's expiry or eviction): a change only if the key exists.
    pub(crate) fn del(&mut self, key: usize) -> bool {
        let existed = self.vals.get_mut(key).and_then(Option::take).is_some();
        if existed {
            self.touch(key);
        }
        existed
    }

    /// `PEXPIRE key ttl` (a new TTL, the value kept): a change only if the key exists.
    pub(crate) fn refresh(&mut self, key: usize) -> bool {
        let exists = self.get(key).is_some();
        if exists {
            self.touch(key);
        }
        exists
    }

    /// `WATCH keys…` on connection `conn` (after an implicit `UNWATCH` of what it watched).
    pub(crate) fn watch(&mut self, conn: usize, keys: &[usize]) {
        self.unwatch(conn);
        for &k in keys {
            if let Some(w) = self.watchers.get_mut(k) {
                *w |= 1 << conn;
            }
        }
    }

    /// `UNWATCH` on `conn` (or the connection closing).
    pub(crate) fn unwatch(&mut self, conn: usize) {
        let bit = 1u16 << conn;
        for w in &mut self.watchers {
            *w &= !bit;
        }
        self.dirty &= !bit;
        self.broken &= !bit;
    }

    /// `MULTI … EXEC` on `conn`: whether the caller may apply its writes. Clears the watches.
    pub(crate) fn exec(&mut self, conn: usize) -> Exec {
        let bit = 1u16 << conn;
        let result = if self.broken & bit != 0 {
            Exec::Broken
        } else if self.dirty & bit != 0 {
            Exec::Aborted
        } else {
            Exec::Applied
        };
        self.unwatch(conn);
        result
    }

    /// Hands `from`'s watches to `to` (a request in flight keeps the connection it was sent on
    /// while its sender moves on to a new one).
    pub(crate) fn move_conn(&mut self, from: usize, to: usize) {
        self.unwatch(to);
        let (f, t) = (1u16 << from, 1u16 << to);
        for w in &mut self.watchers {
            if *w & f != 0 {
                *w = (*w & !f) | t;
            }
        }
        for flags in [&mut self.dirty, &mut self.broken] {
            if *flags & f != 0 {
                *flags = (*flags & !f) | t;
            }
        }
    }

    /// The bits of `conn`: whether it watches each key (bit `k`), is dirty (bit 14), is broken
    /// (bit 15). For telling connections apart when a model permutes its actors.
    pub(crate) fn conn_bits(&self, conn: usize) -> u16 {
        let mut bits = 0;
        for (k, w) in self.watchers.iter().enumerate() {
            if w >> conn & 1 != 0 {
                bits |= 1 << k.min(13);
            }
        }
        bits | (self.dirty >> conn & 1) << 14 | (self.broken >> conn & 1) << 15
    }

    /// Renumbers connections `0..map.len()`: connection `c` becomes `map[c]` (a permutation);
    /// the others keep their numbers.
    pub(crate) fn rename_conns(&mut self, map: &[usize]) {
        let rename = |bits: u16| {
            let mut out = bits;
            for from in 0..map.len() {
                out &= !(1 << from);
            }
            for (from, &to) in map.iter().enumerate() {
                if bits >> from & 1 != 0 {
                    out |= 1 << to;
                }
            }
            out
        };
        for w in &mut self.watchers {
            *w = rename(*w);
        }
        self.dirty = rename(self.dirty);
        self.broken = rename(self.broken);
    }

    /// The server restarts: every connection breaks; without persistence every key is lost
    /// (an `appendfsync always` AOF keeps them all).
    pub(crate) fn restart(&mut self, keep_data: bool) {
        let watching = self.watchers.iter().fold(0, |a, w| a | w);
        self.broken |= watching;
        if !keep_data {
            for v in &mut self.vals {
                *v = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_semantics() {
        let mut s: Store<u8, 2> = Store::new();
        s.watch(0, &[0]);
        s.watch(1, &[1]);
        s.set(1, 7);
        assert_eq!(s.exec(0), Exec::Applied);
        assert_eq!(s.exec(1), Exec::Aborted);
        // A DEL or PEXPIRE of a missing key breaks no watch.
        s.watch(0, &[0]);
        assert!(!s.del(0));
        assert!(!s.refresh(0));
        assert_eq!(s.exec(0), Exec::Applied);
        // ...of an existing one does.
        s.watch(0, &[1]);
        assert!(s.refresh(1));
        assert_eq!(s.exec(0), Exec::Aborted);
        // A watch moves with its request; a restart breaks it and, without AOF, empties the store.
        s.watch(0, &[1]);
        s.move_conn(0, 5);
        assert_eq!(s.exec(0), Exec::Applied, "connection 0 watches nothing now");
        s.restart(false);
        assert_eq!(s.get(1), None);
        assert_eq!(s.exec(5), Exec::Broken);
        // Renaming connections carries their watches.
        let mut s: Store<u8, 2> = Store::new();
        s.watch(0, &[0]);
        s.watch(1, &[1]);
        s.set(1, 1);
        let (a, b) = (s.conn_bits(0), s.conn_bits(1));
        s.rename_conns(&[1, 0]);
        assert_eq!((s.conn_bits(1), s.conn_bits(0)), (a, b));
        assert_eq!(s.exec(0), Exec::Aborted);
        assert_eq!(s.exec(1), Exec::Applied);
    }
}

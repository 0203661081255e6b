//! [`AdvisoryKey`]: what an advisory lock is named by, in PostgreSQL's two key spaces, and the
//! stable 64-bit hash of a string name.

use std::fmt;

/// FNV-1a 64's offset basis (the FNV specification, draft-eastlake-fnv).
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64's prime, 2⁴⁰ + 2⁸ + 0xb3.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`: for each byte, `hash ^= byte; hash *= prime` (wrapping). Fixed by its
/// specification, so it never changes between baton versions, platforms or languages.
pub(crate) fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut hash = FNV_OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The name of an advisory lock.
///
/// PostgreSQL has **two separate key spaces** for advisory locks, and a lock in one never
/// conflicts with a lock in the other:
///
/// - one `bigint` ([`AdvisoryKey::from`]`(i64)`, and [`AdvisoryKey::hashed`]):
///   `pg_advisory_lock(bigint)`; in `pg_locks` it shows as `classid` = the high 32 bits,
///   `objid` = the low 32 bits, `objsubid = 1`;
/// - two `integer`s ([`AdvisoryKey::from`]`((i32, i32))`): `pg_advisory_lock(int4, int4)`;
///   in `pg_locks`, `classid` = the first, `objid` = the second, `objsubid = 2`.
///
/// So `AdvisoryKey::from(1_i64)` and `AdvisoryKey::from((0, 1))` are different locks, although
/// `classid`/`objid` are the same: every process that shares a lock must name it the same way.
///
/// # Hashed names
/// [`AdvisoryKey::hashed`] maps a string to the `bigint` space with **FNV-1a 64** over its UTF-8
/// bytes (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`), the 64-bit result taken as
/// an `i64` (two's complement). FNV-1a is fixed by its specification, needs no dependency, and
/// gives the same key in every language (a shell script or a Python worker can compute it), so
/// a name maps to the same lock in every baton version on every platform; e.g. `"foobar"` →
/// `0x85944171f73967e8`.
///
/// Two different names may hash to one key. The odds, by the birthday bound, are about
/// n²/2⁶⁵ for n distinct names: 1 in 3.7×10¹³ for a thousand names, 1 in 3.7×10⁷ for a million,
/// about 1 in 37 for a billion. A collision never breaks mutual exclusion: two names then share
/// one lock and merely wait for each other. FNV-1a is not a cryptographic hash: someone who
/// chooses the names can make two of them collide on purpose, so do not hash names taken from
/// untrusted input if that contention matters. Hashed keys share the `bigint` space with
/// explicit `i64` keys (your own and any other application's in the same database).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdvisoryKey(Repr);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Repr {
    /// The `bigint` key space.
    Int(i64),
    /// The `(integer, integer)` key space.
    Pair(i32, i32),
}

impl AdvisoryKey {
    /// The key of a string name: FNV-1a 64 of its UTF-8 bytes, in the `bigint` key space (see
    /// the type's docs for the hash and the collision odds).
    pub fn hashed(name: &str) -> AdvisoryKey {
        // Two's complement: the same 64 bits, as PostgreSQL's `bigint` holds them.
        AdvisoryKey(Repr::Int(fnv1a_64(name.as_bytes()) as i64))
    }

    /// The `bigint` value, if this key is in the `bigint` key space.
    pub fn as_i64(&self) -> Option<i64> {
        match self.0 {
            Repr::Int(k) => Some(k),
            Repr::Pair(..) => None,
        }
    }

    /// The two `integer`s, if this key is in the two-integer key space.
    pub fn as_pair(&self) -> Option<(i32, i32)> {
        match self.0 {
            Repr::Pair(a, b) => Some((a, b)),
            Repr::Int(_) => None,
        }
    }

    /// The `(classid, objid, objsubid)` under which `pg_locks` lists this lock.
    pub fn pg_locks_ids(&self) -> (u32, u32, i16) {
        match self.0 {
            // The high and low halves of the 64 bits (the truncations are the point).
            Repr::Int(k) => (((k as u64) >> 32) as u32, k as u64 as u32, 1),
            Repr::Pair(a, b) => (a as u32, b as u32, 2),
        }
    }

    pub(crate) fn repr(&self) -> Repr {
        self.0
    }
}

impl From<i64> for AdvisoryKey {
    fn from(key: i64) -> Self {
        AdvisoryKey(Repr::Int(key))
    }
}

impl From<(i32, i32)> for AdvisoryKey {
    fn from((a, b): (i32, i32)) -> Self {
        AdvisoryKey(Repr::Pair(a, b))
    }
}

impl fmt::Display for AdvisoryKey {
    /// `advisory(42)` or `advisory(1, 2)`: the arguments `pg_advisory_lock` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Repr::Int(k) => write!(f, "advisory({k})"),
            Repr::Pair(a, b) => write!(f, "advisory({a}, {b})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_64_matches_the_specification_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv, fnv64a).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hashed_names_are_pinned_forever() {
        // Changing any of these breaks every deployment that mixes baton versions.
        assert_eq!(
            AdvisoryKey::hashed("foobar").as_i64(),
            Some(0x8594_4171_f739_67e8_u64 as i64)
        );
        assert_eq!(
            AdvisoryKey::hashed("baton:job:42").as_i64(),
            Some(0x7f3a_fc63_f949_df6c)
        );
        assert!(AdvisoryKey::hashed("foobar")
            .as_i64()
            .is_some_and(|k| k < 0));
        assert_ne!(AdvisoryKey::hashed("a"), AdvisoryKey::hashed("b"));
    }

    #[test]
    fn the_two_key_spaces_never_meet() {
        let int = AdvisoryKey::from(1_i64);
        let pair = AdvisoryKey::from((0, 1));
        assert_ne!(int, pair);
        // Same classid/objid, told apart by objsubid, as in PostgreSQL.
        assert_eq!(int.pg_locks_ids(), (0, 1, 1));
        assert_eq!(pair.pg_locks_ids(), (0, 1, 2));
        assert_eq!(int.as_pair(), None);
        assert_eq!(pair.as_i64(), None);
        assert_eq!(pair.as_pair(), Some((0, 1)));
        let neg = AdvisoryKey::from(-2_i64);
        assert_eq!(neg.pg_locks_ids(), (0xffff_ffff, 0xffff_fffe, 1));
        assert_eq!(
            AdvisoryKey::from((-1, 7)).pg_locks_ids(),
            (0xffff_ffff, 7, 2)
        );
        assert_eq!(int.to_string(), "advisory(1)");
        assert_eq!(pair.to_string(), "advisory(0, 1)");
    }
}

//! Redis Cluster's key placement: which of the 16384 hash slots a key lives in.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384 — the
/// function Redis Cluster uses to place keys.
///
/// The hash tag is the part between the first `{` and the first `}` after it, if that part is
/// not empty; keys with the same tag always share a slot (`{user1000}.following` and
/// `{user1000}.followers`).
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), as in Redis' `crc16.c`.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag hashes the whole key; only the first `{` counts.
        assert_eq!(slot(b"{}foo"), crc16(b"{}foo") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"{foo"), crc16(b"{foo") % SLOTS);
    }
}

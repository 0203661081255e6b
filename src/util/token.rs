//! Tokens that name lease holders, jitter, and the default worker name.

/// A fresh 128-bit random token, hex encoded (32 characters).
///
/// Tokens name a lease holder; they must be unguessable by other workers so a stale holder can
/// never match a successor's lease by accident. If the OS random source fails (it practically
/// never does on Linux after boot), we fall back to a mix of time, pid and a counter: still unique
/// per process, which is all the protocol needs for correctness.
pub(crate) fn new_token() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let c = COUNTER.fetch_add(1, Ordering::Relaxed);
        bytes[..8].copy_from_slice(&nanos.to_le_bytes());
        bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        bytes[12..].copy_from_slice(&(c as u32).to_le_bytes());
    }
    hex(&bytes)
}

/// Lower-case hex, in one allocation (tokens are made on every lock acquisition).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The first 8 characters of a token: enough to tell holders apart in logs, too little to
/// impersonate one (tokens are never logged in full).
pub(crate) fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

/// A random number for backoff jitter.
pub(crate) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // Jitter quality does not matter for correctness; zeros just mean no jitter.
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// The default worker name: `host:pid`, read once per process and shared (every worker of
/// a process has it, and there may be tens of thousands of them).
pub(crate) fn default_worker_name() -> std::sync::Arc<str> {
    static NAME: std::sync::OnceLock<std::sync::Arc<str>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| read_worker_name().into()).clone()
}

fn read_worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_hex() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(short(&a).len(), 8);
    }

    #[test]
    fn hex_matches_the_formatter() {
        let bytes = [0x00, 0x0f, 0x10, 0xa5, 0xff, 0x7e];
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&bytes), expected);
        assert_eq!(hex(&[]), "");
    }
}

//! What a Redis server says about its durability (`CONFIG GET`), and what of it keeps
//! acknowledged writes from surviving a crash: read by the Redis backend, shown by the client.

/// The durability settings Redis reports (`CONFIG GET`); see
/// [`Client::durability`](crate::Client::durability).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Durability {
    /// `appendonly` (`yes` is needed).
    pub appendonly: Option<String>,
    /// `appendfsync` (`always` is needed).
    pub appendfsync: Option<String>,
    /// `maxmemory-policy` (`noeviction` is needed).
    pub maxmemory_policy: Option<String>,
}

impl Durability {
    /// What keeps acknowledged writes from surviving a crash or memory pressure (empty if safe).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut want = |name: &str, have: &Option<String>, need: &str| {
            if have.as_deref() != Some(need) {
                out.push(format!(
                    "{name} is {} (needs {need})",
                    have.as_deref().unwrap_or("unknown")
                ));
            }
        };
        want("appendonly", &self.appendonly, "yes");
        want("appendfsync", &self.appendfsync, "always");
        want("maxmemory-policy", &self.maxmemory_policy, "noeviction");
        out
    }

    /// Whether every acknowledged write survives a crash and is never evicted.
    pub fn is_safe(&self) -> bool {
        self.problems().is_empty()
    }
}

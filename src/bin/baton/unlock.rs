//! `baton unlock`: take a mutex, a fair lock or an election's term from a hung holder. One
//! library call (`force_release`, the same name on `Locks`, `FairLocks` and `Leaders`) that
//! names the grant it takes (the fencing token shown, or the holder), like the job tools of
//! admin.rs: without a name it only describes the holder and prints the command that names it.

use baton::inspect::{EntryState, Kind};
use baton::{Client, Expected, ForceRelease};

use super::admin::{shell_word, Named};
use super::exit::{fail_with, usage_config, EX_TEMPFAIL, EX_USAGE};
use super::out;

/// The kinds `unlock` takes.
const TAKEN: [Kind; 3] = [Kind::Lock, Kind::Fair, Kind::Leader];

pub(crate) async fn unlock(
    client: &Client,
    prefix: &str,
    key: &str,
    kind: Option<Kind>,
    named: Named,
) -> u8 {
    if let Some(k @ (Kind::Job | Kind::Queue)) = kind {
        return refuse(k, key);
    }
    let inspect = match client.inspect().with_prefix(prefix) {
        Ok(i) => i,
        Err(e) => return usage_config(&e),
    };
    let found = match inspect.find(key).await {
        Ok(f) => f,
        Err(e) => return fail_with(&e),
    };
    let held: Vec<_> = found
        .iter()
        .filter(|e| TAKEN.contains(&e.kind) && kind.map_or(true, |k| k == e.kind))
        .filter(|e| e.state == EntryState::Held)
        .collect();
    let entry = match held.as_slice() {
        [] => {
            if kind.is_none() {
                if let Some(job) = found.iter().find(|e| e.kind == Kind::Job) {
                    if job.state == EntryState::Running {
                        return refuse(Kind::Job, key);
                    }
                }
            }
            doneln!("{key}: nothing holds it; nothing to unlock");
            tell!(
                "baton: a Redlock lock or a PostgreSQL advisory lock is not taken here: see \
                 `baton unlock --help`"
            );
            return 0;
        }
        [one] => *one,
        several => {
            let kinds: Vec<&str> = several.iter().map(|e| e.kind.as_str()).collect();
            say!(
                "baton: {key} is held as {}; pass --kind to say which to take",
                kinds.join(" and ")
            );
            return EX_USAGE;
        }
    };
    let who = entry.holder.as_deref().unwrap_or("?");
    let Some(expected) = &named.expected else {
        // Nothing named: describe the holder and print the command that names this grant.
        let (shown, flag) = match (entry.fencing_token, &entry.holder) {
            (Some(t), _) => (format!(", fencing token {t}"), format!("--token {t}")),
            (None, Some(h)) => (String::new(), format!("--holder {}", shell_word(h))),
            // Neither is shown: only --any can name it.
            (None, None) => (String::new(), "--any".to_string()),
        };
        let kind_arg = match kind {
            Some(k) => format!(" --kind {k}"),
            None => String::new(),
        };
        return named.refuse(
            &format!(
                "{} {key} is held by {who}{shown}; name that grant to take it",
                entry.kind
            ),
            &format!("unlock --key {}{kind_arg} {flag}", shell_word(key)),
        );
    };
    let taken = match entry.kind {
        Kind::Lock => match client.locks().with_prefix(prefix) {
            Ok(l) => l.force_release(key, expected).await,
            Err(e) => return usage_config(&e),
        },
        Kind::Fair => match client.fair_locks().with_prefix(prefix) {
            Ok(f) => f.force_release(key, expected).await,
            Err(e) => return usage_config(&e),
        },
        _ => match client.leaders().with_prefix(prefix) {
            Ok(l) => l.force_release(key, expected).await,
            Err(e) => return usage_config(&e),
        },
    };
    match taken {
        Ok(ForceRelease::Released(t)) => {
            let token = t
                .fencing_token
                .map_or(String::new(), |f| format!(" (fencing token {f})"));
            doneln!(
                "took {} {key} from {}{token}; the next holder's token is higher",
                entry.kind,
                t.holder
            );
            0
        }
        Ok(ForceRelease::HeldByAnother(t)) => {
            let token = t
                .fencing_token
                .map_or(String::new(), |f| format!(", fencing token {f}"));
            say!(
                "baton: {} {key} is now held by another grant ({}{token}), not the {expected} \
                 named; nothing done",
                entry.kind,
                t.holder
            );
            EX_TEMPFAIL
        }
        Ok(_) => {
            doneln!("{key}: released meanwhile; nothing to unlock");
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// What to do instead for what `unlock` does not take.
fn refuse(kind: Kind, key: &str) -> u8 {
    match kind {
        Kind::Job => {
            say!("baton: {key} is a job: release its attempt with `baton fail --key {key}`")
        }
        _ => say!("baton: a queue's holder drains it; stop that process (its lease then runs out)"),
    }
    EX_USAGE
}

/// What `--token`, `--holder` and `--any` name (clap lets at most one through).
pub(crate) fn expected(token: Option<u64>, holder: Option<&str>, any: bool) -> Option<Expected> {
    match (token, holder, any) {
        (Some(t), _, _) => Some(Expected::Token(t)),
        (None, Some(h), _) => Some(Expected::Holder(h.to_string())),
        (None, None, true) => Some(Expected::Any),
        (None, None, false) => None,
    }
}

//! `baton unlock`: take a mutex, a fair lock or an election's term, a semaphore's permit or a
//! read-write lock's holder from a hung holder. One library call (`force_release`, the same
//! name on `Locks`, `FairLocks`, `Leaders`, `Semaphores` and `RwLocks`) that names the grant it
//! takes (the fencing token shown, or the holder; a semaphore's slot beside it), like the job
//! tools of admin.rs: without a name it only describes the holders and prints the commands that
//! name each.

use baton::inspect::{Entry, EntryState, HoldMode, Holder, Kind};
use baton::{Client, Expected, ForceRelease, Taken};

use super::admin::{shell_word, Named};
use super::exit::{fail_with, usage_config, EX_TEMPFAIL, EX_USAGE};
use super::out;

/// The kinds `unlock` takes.
const TAKEN: [Kind; 5] = [
    Kind::Lock,
    Kind::Fair,
    Kind::Leader,
    Kind::Semaphore,
    Kind::RwLock,
];

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
    let kind_arg = match kind {
        Some(k) => format!(" --kind {k}"),
        None => String::new(),
    };
    if named.permit.is_some() && entry.kind != Kind::Semaphore {
        say!(
            "baton: {key} is a {}: --permit names a semaphore's slot",
            entry.kind
        );
        return EX_USAGE;
    }
    match entry.kind {
        Kind::Semaphore => {
            return unlock_semaphore(client, prefix, key, entry, &kind_arg, &named).await
        }
        Kind::RwLock => return unlock_rwlock(client, prefix, key, entry, &kind_arg, &named).await,
        _ => {}
    }
    let who = entry.holder.as_deref().unwrap_or("?");
    let Some(expected) = &named.expected else {
        // Nothing named: describe the holder and print the command that names this grant.
        let (shown, flag) = match (entry.fencing_token, &entry.holder) {
            (Some(t), _) => (format!(", fencing token {t}"), format!("--token {t}")),
            (None, Some(h)) => (String::new(), format!("--holder {}", shell_word(h))),
            // Neither is shown: only --any can name it.
            (None, None) => (String::new(), "--any".to_string()),
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

/// A semaphore's permit: the slot named by `--permit`, or found by the token or holder named
/// (a token two slots show is refused: each slot steps its own fence).
async fn unlock_semaphore(
    client: &Client,
    prefix: &str,
    key: &str,
    entry: &Entry,
    kind_arg: &str,
    named: &Named,
) -> u8 {
    let command = |h: &Holder| {
        let slot = h.slot.unwrap_or(0);
        let flag = match h.fencing_token {
            Some(t) => format!("--token {t}"),
            None => format!("--holder {}", shell_word(&h.holder)),
        };
        format!(
            "unlock --key {}{kind_arg} --permit {slot} {flag}",
            shell_word(key)
        )
    };
    let described = |h: &Holder| {
        let token = h
            .fencing_token
            .map_or(String::new(), |t| format!(", fencing token {t}"));
        format!("slot {} by {}{token}", h.slot.unwrap_or(0), h.holder)
    };
    let refuse_these = |what: &str, these: &[&Holder]| {
        let listed: Vec<String> = these.iter().map(|h| described(h)).collect();
        let commands: Vec<String> = these.iter().map(|h| command(h)).collect();
        named.refuse_each(&format!("{what}: {}", listed.join("; ")), &commands)
    };
    let all: Vec<&Holder> = entry.holders.iter().collect();
    let Some(expected) = &named.expected else {
        // Nothing named: describe the permits (or the one slot named) and print the commands.
        let these: Vec<&Holder> = all
            .iter()
            .copied()
            .filter(|h| named.permit.map_or(true, |p| h.slot == Some(p)))
            .collect();
        if these.is_empty() {
            doneln!(
                "semaphore {key}: slot {} is free; nothing to unlock",
                named.permit.unwrap_or(0)
            );
            return 0;
        }
        return refuse_these(
            &format!("semaphore {key} has permits held; name one to take it"),
            &these,
        );
    };
    let slot = match named.permit {
        Some(p) => p,
        None => {
            let matching: Vec<&Holder> = all
                .iter()
                .copied()
                .filter(|h| match expected {
                    Expected::Token(t) => h.fencing_token == Some(*t),
                    Expected::Holder(id) => h.holder == *id,
                    _ => true,
                })
                .collect();
            match matching.as_slice() {
                [] => {
                    say!(
                        "baton: no permit of semaphore {key} is held by the {expected} named now; \
                         nothing done"
                    );
                    return EX_TEMPFAIL;
                }
                [one] => one.slot.unwrap_or(0),
                several => {
                    return refuse_these(
                        &format!(
                            "the {expected} names {} permits of semaphore {key}; name the slot \
                             with --permit",
                            several.len()
                        ),
                        several,
                    );
                }
            }
        }
    };
    let sems = match client.semaphores().with_prefix(prefix) {
        Ok(s) => s,
        Err(e) => return usage_config(&e),
    };
    report(
        &format!("semaphore {key} slot {slot}"),
        expected,
        sems.force_release(key, slot, expected).await,
    )
}

/// A read-write lock's holder: the writer by its write token, any holder by `--holder` (a
/// reader's share carries the last write's token, which every reader shows).
async fn unlock_rwlock(
    client: &Client,
    prefix: &str,
    key: &str,
    entry: &Entry,
    kind_arg: &str,
    named: &Named,
) -> u8 {
    let command = |h: &Holder| {
        let flag = match (h.mode, h.fencing_token) {
            (Some(HoldMode::Write), Some(t)) => format!("--token {t}"),
            _ => format!("--holder {}", shell_word(&h.holder)),
        };
        format!("unlock --key {}{kind_arg} {flag}", shell_word(key))
    };
    let described = |h: &Holder| {
        let mode = h.mode.map_or("holder", |m| m.as_str());
        let token = h
            .fencing_token
            .map_or(String::new(), |t| format!(", fencing token {t}"));
        format!("{mode} by {}{token}", h.holder)
    };
    let refuse_these = |what: &str, these: &[&Holder]| {
        let listed: Vec<String> = these.iter().map(|h| described(h)).collect();
        let commands: Vec<String> = these.iter().map(|h| command(h)).collect();
        named.refuse_each(&format!("{what}: {}", listed.join("; ")), &commands)
    };
    let all: Vec<&Holder> = entry.holders.iter().collect();
    let writer = all.iter().any(|h| h.mode == Some(HoldMode::Write));
    match &named.expected {
        None => {
            return refuse_these(
                &format!("rwlock {key} is held; name a holder to take it"),
                &all,
            )
        }
        Some(Expected::Token(t)) if !writer && all.iter().any(|h| h.fencing_token == Some(*t)) => {
            return refuse_these(
                &format!(
                    "fencing token {t} is rwlock {key}'s last write, which every reader carries; \
                     name a reader by --holder"
                ),
                &all,
            )
        }
        Some(Expected::Any) if all.len() > 1 => {
            return refuse_these(
                &format!(
                    "rwlock {key} has {} holders; name one to take it",
                    all.len()
                ),
                &all,
            )
        }
        Some(_) => {}
    }
    let Some(expected) = &named.expected else {
        return EX_USAGE;
    };
    let rw = match client.rw_locks().with_prefix(prefix) {
        Ok(r) => r,
        Err(e) => return usage_config(&e),
    };
    report(
        &format!("rwlock {key}"),
        expected,
        rw.force_release(key, expected).await,
    )
}

/// Prints what a semaphore's or a read-write lock's force release did (`what` names it), and
/// its exit status.
fn report(what: &str, expected: &Expected, taken: Result<ForceRelease, baton::Error>) -> u8 {
    let token = |t: &Taken| {
        t.fencing_token
            .map_or(String::new(), |f| format!(", fencing token {f}"))
    };
    match taken {
        Ok(ForceRelease::Released(t)) => {
            doneln!(
                "took {what} from {}{}; the next write's (or the slot's next) token is higher",
                t.holder,
                token(&t)
            );
            0
        }
        Ok(ForceRelease::HeldByAnother(t)) => {
            say!(
                "baton: {what} is now held by another grant ({}{}), not the {expected} named; \
                 nothing done",
                t.holder,
                token(&t)
            );
            EX_TEMPFAIL
        }
        Ok(_) => {
            doneln!("{what}: released meanwhile; nothing to unlock");
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

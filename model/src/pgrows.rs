//! The PostgreSQL lock table (`baton_locks`, statements in `src/backend/postgres/locks.rs`)
//! under its retention cleanup, as a model for the checker: row versions, row locks, and what a
//! `DELETE` re-checks when it meets a row another transaction changed under it.
//!
//! Why a model of its own: the Redis models take each script as one atomic step, which is true
//! on Redis. On PostgreSQL a statement is not atomic against a concurrent transaction. Under
//! READ COMMITTED, the cleanup's `DELETE … WHERE key IN (SELECT … WHERE <retention passed and
//! lock free>)` evaluates its subquery on the snapshot taken when the statement starts. When a
//! selected row is locked by another open transaction (a grant in flight), the `DELETE` waits
//! for it, and once it commits, re-evaluates *only the outer `WHERE`* on the row's newest
//! version (PostgreSQL's EvalPlanQual), not the subquery. With `key IN (…)` alone there, the
//! row just granted is deleted, and the next acquisition inserts a fresh row: two holders. The
//! fixed statement repeats the conditions in the outer `WHERE`, so the re-check sees the grant.
//!
//! What is modelled, for one lock key:
//! - the committed row (absent, or a version of one tuple: its holder, whether its lease and its
//!   fence retention have passed), with a tuple number that changes when a row is inserted
//!   anew (a `DELETE` waiting on a tuple never touches a later one);
//! - the acquisition (`ACQUIRE`: `INSERT … ON CONFLICT DO UPDATE … WHERE <free>`) run in an
//!   open transaction, as the two-session test does: it waits for the row lock, decides on the
//!   newest committed version, and holds the row lock with its new version until it commits;
//! - the release (an `UPDATE` by token, under the row lock);
//! - the cleanup: its snapshot step (the subquery), then, once the row lock is free, the
//!   re-check on the newest version and the delete;
//! - time: a holder's deadline passing (it then knows it lost the lock; it errs early, so the
//!   server's lease ends only after it), the lease running out on the server, then the fence's
//!   retention running out (it is set far longer than the lease at each grant).
//!
//! Property: at most one client holds the lock at a time (holds: granted, committed, and its
//! deadline not passed). Liveness: fault-free steps end every client and the cleanup.
//! `baton_jobs`' cleanup has the same shape (a grant's `UPDATE` moves `expires_at`, which the
//! fixed statement re-checks); `cleanup_statements_re_check_the_row_they_delete` ties the
//! model's `rechecks` to both of the library's statements.

use super::check::Model;

/// One committed version of the lock's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Row {
    /// Which tuple: a new number for each `INSERT` of the key.
    tuple: u8,
    /// The client whose token the row holds (`None`: released).
    holder: Option<u8>,
    /// `expires_at` is in the future.
    lease_live: bool,
    /// `fence_expires_at` is in the future.
    fence_live: bool,
}

impl Row {
    /// The cleanup's condition: the fence's retention passed and the lock is free.
    fn deletable(&self) -> bool {
        !self.fence_live && (self.holder.is_none() || !self.lease_live)
    }

    /// The acquisition's `ON CONFLICT … WHERE`: the lock is free.
    fn free(&self) -> bool {
        self.holder.is_none() || !self.lease_live
    }
}

/// A client's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Client {
    /// Not holding; `rounds` acquisitions left.
    Idle { rounds: u8 },
    /// Its acquisition ran in a transaction not yet committed (it holds the row lock).
    Granting { rounds: u8 },
    /// Granted and committed, its deadline not passed.
    Holding { rounds: u8 },
    /// Every round done.
    Done,
}

/// The cleanup's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Cleanup {
    /// Between runs; `runs` left.
    Idle { runs: u8 },
    /// Its subquery selected this tuple; the `DELETE` waits for the row lock.
    Selected { tuple: u8, runs: u8 },
    /// No runs left.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    /// The newest committed version (`None`: no row).
    row: Option<Row>,
    /// An open transaction's new version and its client (it holds the row lock).
    pending: Option<(u8, Row)>,
    clients: Vec<Client>,
    cleanup: Cleanup,
    next_tuple: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// Client `c` runs the acquisition in its transaction.
    Acquire(u8),
    /// Client `c` commits it.
    Commit(u8),
    /// Client `c` releases by token.
    Release(u8),
    /// Client `c`'s deadline passes: it knows it no longer holds the lock.
    Deadline(u8),
    /// The row's lease runs out on the server.
    LeaseEnds,
    /// The row's fence retention runs out.
    RetentionEnds,
    /// The cleanup's subquery runs on its snapshot.
    Select,
    /// The cleanup's `DELETE` takes the row lock, re-checks and deletes (or not).
    Delete,
}

/// The lock table with `clients` clients of `rounds` rounds each and a cleanup that runs
/// `runs` times; `rechecks`: whether the cleanup's outer `WHERE` repeats its conditions.
pub(crate) struct PgRowsModel {
    clients: u8,
    rounds: u8,
    runs: u8,
    rechecks: bool,
}

impl PgRowsModel {
    pub(crate) fn new(clients: u8, rounds: u8, runs: u8, rechecks: bool) -> Self {
        PgRowsModel {
            clients,
            rounds,
            runs,
            rechecks,
        }
    }
}

fn after_round(rounds: u8) -> Client {
    match rounds.saturating_sub(1) {
        0 => Client::Done,
        rounds => Client::Idle { rounds },
    }
}

impl Model for PgRowsModel {
    type State = State;
    type Action = Action;

    fn init(&self) -> Vec<State> {
        vec![State {
            row: None,
            pending: None,
            clients: vec![
                Client::Idle {
                    rounds: self.rounds
                };
                usize::from(self.clients)
            ],
            cleanup: if self.runs == 0 {
                Cleanup::Done
            } else {
                Cleanup::Idle { runs: self.runs }
            },
            next_tuple: 0,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for c in 0..self.clients {
            match s.clients[usize::from(c)] {
                // The acquisition waits for the row lock (an open transaction's version).
                Client::Idle { .. } if s.pending.is_none() => out.push(Action::Acquire(c)),
                Client::Granting { .. } => out.push(Action::Commit(c)),
                Client::Holding { .. } => {
                    if s.pending.is_none() {
                        out.push(Action::Release(c));
                    }
                    out.push(Action::Deadline(c));
                }
                _ => {}
            }
        }
        if let Some(row) = s.row {
            // The server's lease ends only after its holder's deadline (the holder errs early).
            let holder_vouches = row
                .holder
                .is_some_and(|h| matches!(s.clients[usize::from(h)], Client::Holding { .. }));
            if row.holder.is_some() && row.lease_live && !holder_vouches {
                out.push(Action::LeaseEnds);
            }
            if row.fence_live && row.free() {
                out.push(Action::RetentionEnds);
            }
        }
        match s.cleanup {
            Cleanup::Idle { .. } => out.push(Action::Select),
            Cleanup::Selected { tuple, .. } => {
                // A row lock held on the selected tuple makes the `DELETE` wait.
                if !s.pending.is_some_and(|(_, p)| p.tuple == tuple) {
                    out.push(Action::Delete);
                }
            }
            Cleanup::Done => {}
        }
    }

    fn next(&self, s: &State, a: &Action) -> Option<State> {
        let mut n = s.clone();
        match *a {
            Action::Acquire(c) => {
                let Client::Idle { rounds } = s.clients[usize::from(c)] else {
                    return None;
                };
                let granted = match s.row {
                    None => {
                        n.next_tuple = s.next_tuple.checked_add(1)?;
                        Row {
                            tuple: s.next_tuple,
                            holder: Some(c),
                            lease_live: true,
                            fence_live: true,
                        }
                    }
                    Some(row) if row.free() => Row {
                        holder: Some(c),
                        lease_live: true,
                        fence_live: true,
                        ..row
                    },
                    // Held: not granted; the client waits (no change).
                    Some(_) => return None,
                };
                n.pending = Some((c, granted));
                n.clients[usize::from(c)] = Client::Granting { rounds };
            }
            Action::Commit(c) => {
                let Client::Granting { rounds } = s.clients[usize::from(c)] else {
                    return None;
                };
                let (_, row) = s.pending?;
                n.row = Some(row);
                n.pending = None;
                n.clients[usize::from(c)] = Client::Holding { rounds };
            }
            Action::Release(c) => {
                let Client::Holding { rounds } = s.clients[usize::from(c)] else {
                    return None;
                };
                if let Some(row) = s.row.filter(|r| r.holder == Some(c)) {
                    n.row = Some(Row {
                        holder: None,
                        ..row
                    });
                }
                n.clients[usize::from(c)] = after_round(rounds);
            }
            Action::Deadline(c) => {
                let Client::Holding { rounds } = s.clients[usize::from(c)] else {
                    return None;
                };
                n.clients[usize::from(c)] = after_round(rounds);
            }
            Action::LeaseEnds => {
                n.row = Some(Row {
                    lease_live: false,
                    ..s.row?
                });
            }
            Action::RetentionEnds => {
                n.row = Some(Row {
                    fence_live: false,
                    ..s.row?
                });
            }
            Action::Select => {
                let Cleanup::Idle { runs } = s.cleanup else {
                    return None;
                };
                // The subquery sees the committed version of its snapshot.
                n.cleanup = match s.row.filter(Row::deletable) {
                    Some(row) => Cleanup::Selected {
                        tuple: row.tuple,
                        runs,
                    },
                    None if runs > 1 => Cleanup::Idle { runs: runs - 1 },
                    None => Cleanup::Done,
                };
            }
            Action::Delete => {
                let Cleanup::Selected { tuple, runs } = s.cleanup else {
                    return None;
                };
                // EvalPlanQual: the newest version of the same tuple, re-checked against the
                // outer `WHERE` only. A tuple deleted meanwhile (or a new one) is not touched.
                if let Some(row) = s.row.filter(|r| r.tuple == tuple) {
                    if !self.rechecks || row.deletable() {
                        n.row = None;
                    }
                }
                n.cleanup = if runs > 1 {
                    Cleanup::Idle { runs: runs - 1 }
                } else {
                    Cleanup::Done
                };
            }
        }
        Some(n)
    }

    fn is_fault(&self, _: &Action) -> bool {
        // Every step here is an ordinary interleaving or the passing of time.
        false
    }

    fn check(&self, s: &State) -> Result<(), String> {
        let holders: Vec<usize> = (0..s.clients.len())
            .filter(|&c| matches!(s.clients[c], Client::Holding { .. }))
            .collect();
        if holders.len() > 1 {
            return Err(format!(
                "two holders of one lock: clients {holders:?} both hold it (row {:?})",
                s.row
            ));
        }
        Ok(())
    }

    fn is_terminal(&self, s: &State) -> bool {
        s.cleanup == Cleanup::Done && s.clients.iter().all(|c| *c == Client::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::{check_exhaustive, Limits, Outcome};
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_states: 1_000_000,
            timeout: std::time::Duration::from_secs(60),
            liveness_steps: Some(64),
            fair_cycles: true,
        }
    }

    #[test]
    fn a_cleanup_that_re_checks_the_row_it_deletes_never_makes_two_holders() {
        let r = check_exhaustive(&PgRowsModel::new(2, 2, 2, true), &limits());
        assert!(
            matches!(r.outcome, Outcome::Exhausted),
            "{:?} after {} states",
            r.outcome,
            r.states
        );
    }

    #[test]
    fn the_old_cleanup_deletes_a_row_granted_while_it_waited() {
        let r = check_exhaustive(&PgRowsModel::new(2, 2, 1, false), &limits());
        let Outcome::Violation(cx) = r.outcome else {
            panic!("no counterexample for the cleanup without its re-check: {r:?}");
        };
        assert!(cx.message.contains("two holders"), "{}", cx.message);
        // The trace is the interleaving of the report: a grant in flight when the cleanup's
        // snapshot selected the row, committed before the delete, then a second grant.
        let steps: Vec<&str> = cx.steps.iter().map(|(a, _)| a.as_str()).collect();
        let select = steps.iter().rposition(|a| *a == "Select");
        let delete = steps.iter().rposition(|a| *a == "Delete");
        assert!(
            select.is_some() && delete.is_some() && select < delete,
            "{steps:?}"
        );
    }
}

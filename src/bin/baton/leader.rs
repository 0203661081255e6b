//! `baton leader`: campaign, run a long-lived PROGRAM while leading, campaign again after a
//! lost term, resign and exit on SIGTERM or SIGINT.

use std::os::unix::process::ExitStatusExt;

use baton::{Client, ElectionOptions, Fenced};

use super::cli::LeaderArgs;
use super::exit::{exit_code, fail_with, EX_LOST};
use super::metrics::Health;
use super::out;
use super::signals::{install_signals, signal_status};
use super::sink::Sink;
use super::supervisor::{run_held, Held, Stopping, Supervised};
use super::text;
use super::LEASE_CHECK_TIMEOUT;

/// `baton leader`: campaign, run PROGRAM while leading, campaign again after a loss.
pub(crate) async fn leader(
    client: &Client,
    args: &LeaderArgs,
    opts: ElectionOptions,
    mut sink: Sink,
    prefix: &str,
    health: Option<Health>,
) -> u8 {
    let elector = match client
        .leaders()
        .with_prefix(prefix)
        .map_err(baton::Error::from)
        .and_then(|l| l.elector(&args.key, &opts))
    {
        Ok(e) => e,
        Err(e) => return fail_with(&e),
    };
    // `/healthz` follows the election as an observer sees it: a standby that cannot read it
    // is cut off, not standing by. The observer ends with the client.
    if let Some(health) = &health {
        if let Ok(mut observer) = client
            .leaders()
            .with_prefix(prefix)
            .map_err(baton::Error::from)
            .and_then(|l| l.observe(&args.key))
        {
            let health = health.clone();
            tokio::spawn(async move {
                while let Some(seen) = observer.next_event().await {
                    health.set_reachable(!matches!(seen, baton::Observed::Error { .. }));
                }
            });
        }
    }
    let leading = |now: bool| {
        if let Some(h) = &health {
            h.set_leading(now);
        }
    };
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // SIGTERM and SIGINT end a leader gracefully (exit 0); SIGHUP and SIGQUIT the same way
    // with their own status.
    let graceful = |sig: libc::c_int| {
        if sig == libc::SIGTERM || sig == libc::SIGINT {
            0
        } else {
            signal_status(sig)
        }
    };
    loop {
        sink.note("campaigning");
        let got = tokio::select! {
            sig = signals.recv() => Err(sig),
            got = elector.campaign() => Ok(got),
        };
        let term = match got {
            Ok(Ok(term)) => term,
            Ok(Err(e)) => return fail_with(&e),
            Err(sig) => {
                // A dropped campaign releases a lease its script may just have taken, in a task
                // of the client: let it finish (bounded).
                drop(elector);
                client.shutdown(LEASE_CHECK_TIMEOUT).await;
                return graceful(sig);
            }
        };
        sink.note(&format!("elected (term {})", term.fencing_token()));
        leading(true);
        let env = [
            ("BATON_LEADER_KEY", args.key.clone()),
            ("BATON_FENCING_TOKEN", term.fencing_token().to_string()),
        ];
        let done = match run_held(
            &term,
            Held::Leadership,
            &args.program,
            &env,
            args.lease,
            args.kill_grace,
            &mut sink,
            &mut signals,
            &mut sigchld,
        )
        .await
        {
            Ok(done) => done,
            Err(code) => {
                let _ = elector.resign().await;
                return code;
            }
        };
        leading(false);
        // Resigned in every case: after a loss the token check makes this a no-op on a lease
        // that passed on, and it lets a standby lead at once otherwise.
        if let Err(e) = elector.resign().await {
            sink.warn(&format!(
                "resigning failed (the lease runs out by itself): {}",
                text::error_message(&e),
            ));
        }
        let status = match done.status {
            Ok(s) => s,
            Err(e) => {
                say!("baton: lost track of PROGRAM: {e}");
                return EX_LOST;
            }
        };
        match done.stopping.or_else(|| terminal_signal(&done, &status)) {
            Some(Stopping::Lost) => {
                sink.warn(&format!(
                    "term {} ended; PROGRAM was stopped; campaigning again",
                    term.fencing_token()
                ));
            }
            Some(Stopping::Signal(sig)) => return graceful(sig),
            None => return exit_code(&status),
        }
    }
}

/// In a terminal, Ctrl-C and Ctrl-\ reach only the foreground group, PROGRAM's, never baton:
/// PROGRAM ended by SIGINT or SIGQUIT while it had the terminal is taken for that key typed at
/// baton, so `baton leader` keeps the meaning its help gives those signals (SIGINT: stop
/// PROGRAM, resign, exit 0). A PROGRAM that catches them and exits with a status of its own is
/// taken at its word.
pub(crate) fn terminal_signal(
    done: &Supervised,
    status: &std::process::ExitStatus,
) -> Option<Stopping> {
    let sig = status.signal()?;
    (done.had_terminal && matches!(sig, libc::SIGINT | libc::SIGQUIT))
        .then_some(Stopping::Signal(sig))
}

//! The signals baton forwards to PROGRAM's group (SIGHUP, SIGINT, SIGQUIT, SIGTERM), the ones
//! it inherited as ignored, and the shell's status for a signal. Separate from program.rs: these
//! are baton's own signals, which arrive whatever PROGRAM does.

use std::task::Poll;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast;

// The status a signal ends baton with is the exit table's (exit.rs); named here too, next to the
// signals, for the commands that handle them.
pub(crate) use super::exit::signal_status;
use super::exit::EX_UNAVAILABLE;
use super::out;

/// The signals baton forwards to PROGRAM's group; each ends the attempt (exit 128 + n).
pub(crate) const FORWARDED: [libc::c_int; 4] =
    [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM];

/// The forwarded signals baton listens to: its own handlers, or a share of them ([`Fan`]).
pub(crate) struct Signals(Source);

enum Source {
    Own(Vec<(libc::c_int, tokio::signal::unix::Signal)>),
    Fanned(broadcast::Receiver<libc::c_int>),
}

/// One set of handlers shared by every occurrence `baton schedule` runs at once: the command
/// listens ([`Signals::install`]) and passes each signal on here, and each occurrence's run
/// reads its own copy ([`Fan::subscribe`]) as `baton run` reads its handlers. So a signal
/// reaches every PROGRAM and every waiting backup, and what the command does (stop waiting for
/// ticks) and what each run does (stop its PROGRAM, fail its attempt) stay apart.
pub(crate) struct Fan(broadcast::Sender<libc::c_int>);

impl Fan {
    pub(crate) fn new() -> Fan {
        // A handful of signals at most before the runs read them; a lagging run skips to the
        // latest ones, which say the same thing (stop).
        Fan(broadcast::channel(16).0)
    }

    /// Passes `sig` on to every subscribed run.
    pub(crate) fn send(&self, sig: libc::c_int) {
        let _ = self.0.send(sig);
    }

    /// The signals passed on from now on, for one run.
    pub(crate) fn subscribe(&self) -> Signals {
        Signals(Source::Fanned(self.0.subscribe()))
    }
}

impl Signals {
    /// Listens to every forwarded signal that baton did not inherit as ignored: `nohup` leaves
    /// SIGHUP ignored, a script's `&` SIGINT and SIGQUIT. Those stay ignored, for PROGRAM too
    /// (an ignored signal stays ignored across `exec`).
    pub(crate) fn install() -> std::io::Result<Signals> {
        let mut streams = Vec::new();
        for sig in FORWARDED {
            if !inherited_ignored(sig) {
                streams.push((sig, signal(SignalKind::from_raw(sig))?));
            }
        }
        Ok(Signals(Source::Own(streams)))
    }

    /// The next forwarded signal received. Cancel safe (as `Signal::recv` and
    /// `broadcast::Receiver::recv`).
    pub(crate) async fn recv(&mut self) -> libc::c_int {
        match &mut self.0 {
            Source::Own(streams) => {
                std::future::poll_fn(|cx| {
                    for (sig, stream) in streams.iter_mut() {
                        if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                            return Poll::Ready(*sig);
                        }
                    }
                    Poll::Pending
                })
                .await
            }
            Source::Fanned(rx) => loop {
                match rx.recv().await {
                    Ok(sig) => return sig,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    // The command is gone: no signal can come any more.
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            },
        }
    }
}

/// The next delivery of `sig`, or never without a stream. Cancel safe.
pub(crate) async fn recv_or_pending(sig: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = sig {
        if s.recv().await.is_some() {
            return;
        }
    }
    std::future::pending().await
}

pub(crate) fn inherited_ignored(sig: libc::c_int) -> bool {
    // SAFETY: an all-zero `sigaction` is a valid value to write into; sigaction(2) with a null
    // new action only reads the current disposition into it.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

pub(crate) fn signal_name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGTSTP => "SIGTSTP".into(),
        libc::SIGTTIN => "SIGTTIN".into(),
        libc::SIGTTOU => "SIGTTOU".into(),
        n => format!("signal {n}"),
    }
}

/// The forwarded signals and SIGCHLD, listened to before PROGRAM exists so none of its status
/// changes can be missed; `Err` is the exit status (reported).
pub(crate) fn install_signals() -> Result<(Signals, tokio::signal::unix::Signal), u8> {
    let installed = Signals::install().and_then(|s| Ok((s, signal(SignalKind::child())?)));
    installed.map_err(|e| {
        say!("baton: cannot install signal handlers: {e}");
        EX_UNAVAILABLE
    })
}

pub(crate) fn is_job_control_stop(sig: libc::c_int) -> bool {
    matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn forwarded_signals_exit_128_plus_n() {
        let codes: Vec<u8> = FORWARDED.iter().map(|&s| signal_status(s)).collect();
        assert_eq!(codes, [129, 130, 131, 143]);
    }
}

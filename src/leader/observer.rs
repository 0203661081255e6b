//! [`Observer`]: who leads an election, as it changes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::election::{read_leader, Election};
use super::EVENT_BUFFER;
use crate::error::ErrorKind;
use crate::util::backoff::Backoff;
use crate::util::pubsub::HubMsg;

/// Who leads an election, as [`Observer`] reports it. `serde::Serialize` like every event
/// type (`{"event":"Leader","name":"a","term":3}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event")]
#[non_exhaustive]
pub enum Observed {
    /// `name` leads in `term`.
    Leader {
        /// The leader's name.
        name: String,
        /// Its term (0 when the fence key was deleted by someone else).
        term: u64,
    },
    /// Nobody leads.
    NoLeader,
    /// The state could not be read (retried; the stream goes on).
    Error {
        /// The stable classification.
        kind: ErrorKind,
        /// What happened.
        message: String,
    },
}

/// A stream of [`Observed`] changes ([`Leaders::observe`](crate::Leaders::observe)); ends with the client. Each change
/// is reported once (consecutive equal observations are merged).
pub struct Observer {
    rx: mpsc::Receiver<Observed>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl tokio_stream::Stream for Observer {
    type Item = Observed;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Observed>> {
        self.rx.poll_recv(cx)
    }
}

/// The observer's safety-net re-read interval.
const OBSERVE_REFRESH: Duration = Duration::from_secs(10);

impl Observer {
    /// The next change; `None` once the stream ended (the client shut down).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn next_event(&mut self) -> Option<Observed> {
        self.rx.recv().await
    }

    pub(super) fn start(election: Arc<Election>) -> Observer {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let stop = CancellationToken::new();
        let cancel = election.backend.cancel().clone();
        let task_stop = stop.clone();
        let tracker = election.backend.tracker().clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = task_stop.cancelled() => {}
                _ = cancel.cancelled() => {}
                _ = observe(election, tx) => {}
            }
        });
        Observer { rx, stop }
    }
}

async fn observe(election: Arc<Election>, tx: mpsc::Sender<Observed>) {
    let backend = &election.backend;
    let mut sub = None;
    let mut last: Option<Observed> = None;
    let mut backoff = Backoff::new(Duration::from_secs(1));
    loop {
        if sub.is_none() {
            let limit = backend.connect_timeout();
            if let Ok(Ok(s)) =
                tokio::time::timeout(limit, backend.subscribe(&election.keys.channel)).await
            {
                sub = Some(s);
            }
        }
        let (seen, next) = match read_leader(&election).await {
            Ok((seen, pttl)) => {
                backoff.reset();
                let next = pttl
                    .map(|p| p + Duration::from_millis(1))
                    .unwrap_or(OBSERVE_REFRESH)
                    .min(OBSERVE_REFRESH);
                (seen, next)
            }
            Err(e) => (
                Observed::Error {
                    kind: e.kind(),
                    message: e.to_string(),
                },
                backoff.next_delay(),
            ),
        };
        if last.as_ref() != Some(&seen) {
            if tx.send(seen.clone()).await.is_err() {
                return;
            }
            last = Some(seen);
        }
        match &mut sub {
            Some(s) => {
                match tokio::time::timeout(next, s.rx.recv()).await {
                    // A message (elected, released), a reconnect, or the timer: read again.
                    Ok(Some(HubMsg::Message(_) | HubMsg::Reconnected)) | Err(_) => {}
                    // The hub is gone: fall back to timers.
                    Ok(None) => sub = None,
                }
            }
            None => tokio::time::sleep(next).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_are_tagged_event_like_every_event_type() {
        let o = Observed::Leader {
            name: "a".into(),
            term: 3,
        };
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"event":"Leader","name":"a","term":3}"#
        );
        assert_eq!(
            serde_json::to_string(&Observed::NoLeader).unwrap(),
            r#"{"event":"NoLeader"}"#
        );
    }
}

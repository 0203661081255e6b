//! A small unbounded single-consumer queue for per-worker streams (events, pub/sub messages).
//!
//! `tokio::sync::mpsc` allocates its first block of 32 slots and a cache-padded channel header
//! (about 2 KB for events) for every channel, even one that never carries more than a couple of
//! items. A waiting backup owns two such channels, so with tens of thousands of waiting workers
//! on one client they dominated the process's memory. This queue costs one small allocation and
//! grows only while items wait unread.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;

struct State<T> {
    items: VecDeque<T>,
    rx_waker: Option<Waker>,
    senders: usize,
    receiver_alive: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Woken when the receiver is dropped (for [`Sender::closed`]).
    receiver_gone: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The state stays consistent across a panic (every update is a single assignment or a
        // VecDeque operation), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sending half; cloneable.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A new queue.
pub(crate) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            rx_waker: None,
            senders: 1,
            receiver_alive: true,
        }),
        receiver_gone: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Queues `item`; gives it back when the receiver is gone.
    pub(crate) fn send(&self, item: T) -> Result<(), T> {
        let waker = {
            let mut s = self.shared.lock();
            if !s.receiver_alive {
                return Err(item);
            }
            s.items.push_back(item);
            s.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Queues `item`, first taking out the oldest items unread while `capacity` of them wait:
    /// a bounded queue whose sender never waits. Returns those taken out (dropped by the
    /// caller, outside the lock); gives `item` back when the receiver is gone.
    pub(crate) fn send_evicting(&self, item: T, capacity: usize) -> Result<Vec<T>, T> {
        let (evicted, waker) = {
            let mut s = self.shared.lock();
            if !s.receiver_alive {
                return Err(item);
            }
            let over = (s.items.len() + 1).saturating_sub(capacity.max(1));
            let evicted: Vec<T> = s.items.drain(..over).collect();
            s.items.push_back(item);
            (evicted, s.rx_waker.take())
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(evicted)
    }

    /// How many items wait unread.
    pub(crate) fn len(&self) -> usize {
        self.shared.lock().items.len()
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !self.shared.lock().receiver_alive
    }

    /// Resolves once the receiver is gone.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.shared.receiver_gone.notified();
            tokio::pin!(notified);
            // Register before checking, so a drop between the check and the await is not missed.
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.shared.lock();
            s.senders -= 1;
            if s.senders == 0 {
                s.rx_waker.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item; `Ready(None)` once every sender is gone and the queue is empty.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        // Take part in tokio's cooperative budget, as its own channels do: a consumer that keeps
        // polling in a loop (a busy `select!`, an ended stream) still lets the runtime's drivers
        // run.
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut s = self.shared.lock();
        if let Some(item) = s.items.pop_front() {
            if s.items.is_empty() {
                // Drained: give the buffer back. Most queues carry an item now and then (a
                // waiting backup's one `Locked`), and thousands of idle workers each keeping a
                // 4-slot buffer was a third of a waiting backup's memory; re-allocating on the
                // next push costs little at that rate.
                s.items = VecDeque::new();
            }
            coop.made_progress();
            return Poll::Ready(Some(item));
        }
        if s.senders == 0 {
            coop.made_progress();
            return Poll::Ready(None);
        }
        match &mut s.rx_waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next item, or `None` once every sender is gone and the queue is empty.
    ///
    /// Cancel safe: an item is only taken when this resolves.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next item if one is queued now.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.shared.lock().items.pop_front()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("queued", &self.shared.lock().items.len())
            .finish()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let items = {
            let mut s = self.shared.lock();
            s.receiver_alive = false;
            std::mem::take(&mut s.items)
        };
        // Dropped outside the lock: an item's own Drop may do anything.
        drop(items);
        self.shared.receiver_gone.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn items_arrive_in_order_and_the_end_is_seen() {
        let (tx, mut rx) = unbounded();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        drop(tx);
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "ended while a sender was alive");
        drop(tx2);
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send() {
        let (tx, mut rx) = unbounded();
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send("x").unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap()
                .unwrap(),
            Some("x")
        );
    }

    #[tokio::test]
    async fn senders_learn_that_the_receiver_is_gone() {
        let (tx, rx) = unbounded::<u8>();
        assert!(!tx.is_closed());
        let tx2 = tx.clone();
        let closed = tokio::spawn(async move { tx2.closed().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!closed.is_finished());
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .unwrap()
            .unwrap();
        assert!(tx.is_closed());
        assert_eq!(tx.send(7), Err(7));
        // Already closed: resolves at once.
        tokio::time::timeout(Duration::from_secs(5), tx.closed())
            .await
            .unwrap();
    }

    #[test]
    fn a_burst_gives_its_memory_back() {
        let (tx, mut rx) = unbounded();
        for i in 0..1000 {
            tx.send(i).unwrap();
        }
        let waker = futures_noop_waker();
        let mut cx = Context::from_waker(&waker);
        for i in 0..1000 {
            assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(i)));
        }
        assert!(rx.shared.lock().items.capacity() <= 16);
    }

    #[test]
    fn a_bounded_send_takes_out_the_oldest() {
        let (tx, mut rx) = unbounded();
        for i in 0..3 {
            assert_eq!(tx.send_evicting(i, 3), Ok(vec![]));
        }
        assert_eq!(tx.send_evicting(3, 3), Ok(vec![0]));
        assert_eq!(tx.send_evicting(4, 3), Ok(vec![1]));
        assert_eq!(tx.len(), 3);
        let waker = futures_noop_waker();
        let mut cx = Context::from_waker(&waker);
        for i in 2..5 {
            assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(i)));
        }
        drop(rx);
        assert_eq!(tx.send_evicting(5, 3), Err(5));
    }

    fn futures_noop_waker() -> Waker {
        struct Noop;
        impl std::task::Wake for Noop {
            fn wake(self: Arc<Self>) {}
        }
        Waker::from(Arc::new(Noop))
    }
}

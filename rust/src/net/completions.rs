//! Outcomes of started calls, queued in the order they arrived for the threads that take them:
//! one consumer that is always there (`next`) and, while they wait for something of their own,
//! helpers (`help`), which are handed an outcome first: a caller waiting for its call's answer
//! takes it itself, with no other thread woken in between.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::Failure;

pub type Outcome = (u64, Result<Bytes, Failure>);

#[derive(Default)]
struct State {
    outcomes: VecDeque<Outcome>,
    closed: bool,
    helpers: usize,   // threads waiting in `help`
    consumers: usize, // threads waiting in `next`
    nudges: u64,      // bumped by `nudge`: helpers waiting then return
}

#[derive(Default)]
pub struct Completions {
    state: Mutex<State>,
    consumer: Condvar,
    helpers: Condvar,
}

impl Completions {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue a call's outcome (dropped once closed: nobody takes it any more) and wake a helper
    /// if one waits, else the consumer.
    pub fn push(&self, outcome: Outcome) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.outcomes.push_back(outcome);
        let helped = state.helpers > 0;
        drop(state);
        if helped {
            self.helpers.notify_one();
        } else {
            self.consumer.notify_one();
        }
    }

    /// The next outcome, waiting for one; None once closed.
    pub fn next(&self) -> Option<Outcome> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            if let Some(outcome) = state.outcomes.pop_front() {
                return Some(outcome);
            }
            state.consumers += 1;
            state = self.consumer.wait(state).unwrap_or_else(|e| e.into_inner());
            state.consumers -= 1;
        }
    }

    /// The next outcome if one comes within `timeout`; None after it, once closed, or after a
    /// `nudge`. An outcome is never left behind: one queued when a helper leaves wakes the
    /// consumer.
    pub fn help(&self, timeout: Duration) -> Option<Outcome> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        let nudges = state.nudges;
        state.helpers += 1;
        let outcome = loop {
            if state.closed {
                break None;
            }
            if let Some(outcome) = state.outcomes.pop_front() {
                break Some(outcome);
            }
            let now = Instant::now();
            if state.nudges != nudges || now >= deadline {
                break None;
            }
            state = self
                .helpers
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        state.helpers -= 1;
        let stranded = !state.outcomes.is_empty() && state.helpers == 0;
        drop(state);
        if stranded {
            self.consumer.notify_one();
        }
        outcome
    }

    /// Make every helper waiting now return (what it waits for may have happened elsewhere).
    pub fn nudge(&self) {
        let mut state = self.lock();
        if state.helpers == 0 {
            return;
        }
        state.nudges += 1;
        drop(state);
        self.helpers.notify_all();
    }

    /// (threads waiting in `help`, threads waiting in `next`)
    #[cfg(test)]
    pub fn waiting(&self) -> (usize, usize) {
        let state = self.lock();
        (state.helpers, state.consumers)
    }

    /// Wake every thread waiting with None; outcomes still queued or to come are dropped.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.outcomes.clear();
        drop(state);
        self.consumer.notify_all();
        self.helpers.notify_all();
    }
}

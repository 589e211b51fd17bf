//! Outcomes of started calls, queued for one consumer thread in the order they arrived.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use bytes::Bytes;

use super::Failure;

pub type Outcome = (u64, Result<Bytes, Failure>);

#[derive(Default)]
pub struct Completions {
    state: Mutex<(VecDeque<Outcome>, bool)>, // (outcomes, closed)
    ready: Condvar,
}

impl Completions {
    /// Queue a call's outcome (dropped once closed: nobody takes it any more).
    pub fn push(&self, outcome: Outcome) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.1 {
            return;
        }
        state.0.push_back(outcome);
        drop(state);
        self.ready.notify_one();
    }

    /// The next outcome, waiting for one; None once closed.
    pub fn next(&self) -> Option<Outcome> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.1 {
                return None;
            }
            if let Some(outcome) = state.0.pop_front() {
                return Some(outcome);
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wake the consumer with None; outcomes still queued or to come are dropped.
    pub fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1 = true;
        state.0.clear();
        drop(state);
        self.ready.notify_all();
    }
}

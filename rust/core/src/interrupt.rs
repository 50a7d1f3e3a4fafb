//! Stopping long searches early (Ctrl-C in Python).
//!
//! A caller that can be interrupted runs the core under an [`Active`] guard and calls
//! [`request_stop`] when the user asks to stop; every long loop (refine, the QAP search behind
//! `map_ranks`, repair) polls [`interrupted`] next to its time limit and ends as if the limit
//! had passed. The flag is process-wide, as the signal is; it clears when the last guarded
//! call returns, so the next call starts fresh.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// True once a stop was requested for the calls now running.
#[inline]
pub fn interrupted() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Ask every running guarded call to stop at its next poll.
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Marks one interruptible call as running; the stop flag clears when the last one ends.
pub struct Active(());

impl Active {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Active {
        ACTIVE.fetch_add(1, Ordering::SeqCst);
        Active(())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if ACTIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
            STOP.store(false, Ordering::SeqCst);
        }
    }
}

//! Errors and the one way into the core.
//!
//! Every core error becomes the matching `gpuplace.errors` class ([`to_pyerr`]); the classes
//! are imported once and cached (`import_exception!`), not looked up by name on every error.
//! Errors the bindings find themselves (arrays of different lengths, an unknown code) are core
//! errors too, so Python never sees a bare `ValueError`.
//!
//! [`enter`] is how every call that does real work enters the core: it releases the GIL and
//! maps errors, and runs the call on the caller's thread. A search that may run long (refine,
//! map_ranks, repair, placing with refine) enters with [`Stop::OnSignal`]: while it runs, a
//! SIGINT handler (see `sigint`) asks the core to stop ([`gpuplace_core::interrupt`]) before
//! passing the signal on to Python's handler; the search ends at its next poll and the call
//! raises `KeyboardInterrupt`. (Running the search on another thread while the caller polls
//! Python for signals costs two thread wake-ups per call, several milliseconds on a loaded
//! machine: more than a repair takes.) On platforms without POSIX signals the searches run to
//! their limits.

use gpuplace_core::interrupt;
use gpuplace_core::CoreError;
use pyo3::prelude::*;

pyo3::import_exception!(gpuplace.errors, InvalidTopology);
pyo3::import_exception!(gpuplace.errors, InvalidJob);
pyo3::import_exception!(gpuplace.errors, InvalidState);
pyo3::import_exception!(gpuplace.errors, Infeasible);

/// Map a core error onto the matching `gpuplace.errors` class.
pub(crate) fn to_pyerr(err: CoreError) -> PyErr {
    match err {
        CoreError::InvalidTopology(m) => InvalidTopology::new_err(m),
        CoreError::InvalidJob(m) => InvalidJob::new_err(m),
        CoreError::InvalidState(m) => InvalidState::new_err(m),
        CoreError::Infeasible(m) => Infeasible::new_err(m),
    }
}

/// `result.py()?`: a core result as a Python result.
pub(crate) trait CoreResultExt<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> CoreResultExt<T> for Result<T, CoreError> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

/// Shorthands for errors the bindings raise themselves.
pub(crate) fn invalid_topology(msg: impl Into<String>) -> PyErr {
    to_pyerr(CoreError::InvalidTopology(msg.into()))
}
pub(crate) fn invalid_job(msg: impl Into<String>) -> PyErr {
    to_pyerr(CoreError::InvalidJob(msg.into()))
}
pub(crate) fn invalid_state(msg: impl Into<String>) -> PyErr {
    to_pyerr(CoreError::InvalidState(msg.into()))
}

/// How the caller learns of Ctrl-C while the core runs without the GIL on its thread: for
/// the duration of an interruptible call a C-level SIGINT handler is installed that sets the
/// core's stop flag and then calls the handler it replaced (Python's, which records the signal
/// for `check_signals`). It is not installed when SIGINT is ignored or left to the default.
#[cfg(unix)]
mod sigint {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use gpuplace_core::interrupt;

    /// The replaced handler and whether it takes siginfo, for the handler to chain to.
    static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
    static PREVIOUS_SIGINFO: AtomicUsize = AtomicUsize::new(0);
    /// Calls in flight, and the action to restore when the last ends.
    static INSTALLED: Mutex<(usize, Option<libc::sigaction>)> = Mutex::new((0, None));

    extern "C" fn on_sigint(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        interrupt::request_stop();
        let previous = PREVIOUS.load(Ordering::SeqCst);
        if previous == libc::SIG_DFL || previous == libc::SIG_IGN {
            return;
        }
        // SAFETY: `previous` is the handler sigaction reported for SIGINT, with the signature
        // its SA_SIGINFO flag says; calling it is what the kernel would have done.
        unsafe {
            if PREVIOUS_SIGINFO.load(Ordering::SeqCst) != 0 {
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(previous);
                handler(sig, info, ctx);
            } else {
                let handler: extern "C" fn(libc::c_int) = std::mem::transmute(previous);
                handler(sig);
            }
        }
    }

    /// Installs the handler while alive (shared by concurrent calls).
    pub(super) struct Guard(bool);

    impl Guard {
        pub(super) fn new() -> Guard {
            let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
            if installed.0 == 0 {
                // SAFETY: plain sigaction calls on zeroed, then filled, structs.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old) != 0 {
                        return Guard(false);
                    }
                    if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
                        return Guard(false);
                    }
                    PREVIOUS.store(old.sa_sigaction, Ordering::SeqCst);
                    PREVIOUS_SIGINFO.store(
                        usize::from(old.sa_flags & libc::SA_SIGINFO != 0),
                        Ordering::SeqCst,
                    );
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = on_sigint as *const () as usize;
                    new.sa_flags = libc::SA_SIGINFO | (old.sa_flags & libc::SA_RESTART);
                    libc::sigemptyset(&mut new.sa_mask);
                    if libc::sigaction(libc::SIGINT, &new, std::ptr::null_mut()) != 0 {
                        return Guard(false);
                    }
                    installed.1 = Some(old);
                }
            }
            installed.0 += 1;
            Guard(true)
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if !self.0 {
                return;
            }
            let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
            installed.0 -= 1;
            if installed.0 == 0 {
                if let Some(old) = installed.1.take() {
                    // SAFETY: restores the action read when the handler was installed.
                    unsafe {
                        libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut());
                    }
                }
            }
        }
    }
}

/// Whether a call into the core can be stopped with Ctrl-C.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Short: no Ctrl-C check.
    Never,
    /// A search that may run long: stoppable (see the module docs).
    OnSignal,
}

/// Run `f` in the core without the GIL, errors mapped; with [`Stop::OnSignal`], stoppable
/// with Ctrl-C (see the module docs).
pub(crate) fn enter<T, F>(py: Python<'_>, stop: Stop, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, CoreError> + Send,
{
    if stop == Stop::Never {
        return py.detach(f).py();
    }
    let active = interrupt::Active::new();
    #[cfg(unix)]
    let handler = sigint::Guard::new();
    let result = py.detach(f);
    #[cfg(unix)]
    drop(handler);
    let stopped = interrupt::interrupted();
    drop(active);
    if stopped {
        // Python's handler recorded the signal: raise it (KeyboardInterrupt for Ctrl-C).
        py.check_signals()?;
    }
    result.py()
}

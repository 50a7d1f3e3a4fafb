//! Errors and the one way into the core.
//!
//! Every core error becomes the matching `gpuplace.errors` class ([`to_pyerr`]); the classes
//! are imported once and cached (`import_exception!`), not looked up by name on every error.
//! Errors the bindings find themselves (arrays of different lengths, an unknown code) are core
//! errors too, so Python never sees a bare `ValueError`.
//!
//! [`enter`] is how every call that does real work enters the core: it releases the GIL and
//! maps errors. A search that may run long (refine, map_ranks, repair, placing with refine)
//! enters with [`Stop::OnSignal`]: the call runs on a worker thread while the caller
//! re-acquires the GIL every few milliseconds to let Python handle signals; on Ctrl-C it asks
//! the core to stop ([`gpuplace_core::interrupt`]), waits for the search to end (promptly:
//! the loops poll the flag) and raises `KeyboardInterrupt`. Short calls enter with
//! [`Stop::Never`] and run on the caller's thread (no thread start on the greedy hot path).

use std::sync::mpsc;
use std::time::Duration;

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

/// How often a call waiting in [`enter`] lets Python check for signals.
const SIGNAL_POLL: Duration = Duration::from_millis(20);

/// Whether a call into the core can be stopped with Ctrl-C.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Short: runs on the caller's thread.
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
    let _active = interrupt::Active::new();
    let (result, signal) = py.detach(|| {
        std::thread::scope(|scope| {
            let (done, finished) = mpsc::channel();
            let worker = scope.spawn(move || {
                let out = f();
                let _ = done.send(());
                out
            });
            let mut signal = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(SIGNAL_POLL) {
                if signal.is_none() {
                    if let Err(err) = Python::attach(|py| py.check_signals()) {
                        interrupt::request_stop();
                        signal = Some(err);
                    }
                }
            }
            let result = match worker.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            (result, signal)
        })
    });
    match signal {
        Some(err) => Err(err),
        None => result.py(),
    }
}

//! The core's one error type. The bindings map each variant onto one Python exception class
//! (`gpuplace.errors`), so a message here is what the user reads: say what is wrong in the
//! user's terms and what was expected.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CoreError {
    /// The topology arrays are inconsistent (a domain with two parents, a bad matrix size, ...).
    #[error("{0}")]
    InvalidTopology(String),
    /// The job description is inconsistent (a group naming a rank that does not exist, ...).
    #[error("{0}")]
    InvalidJob(String),
    /// An operation on the cluster state is not allowed (a GPU already taken, an unknown job),
    /// or a placement does not fit the state.
    #[error("{0}")]
    InvalidState(String),
    /// The request cannot be satisfied on this cluster in its current state.
    #[error("{0}")]
    Infeasible(String),
}

pub type Result<T> = std::result::Result<T, CoreError>;

impl From<crate::qap::QapError> for CoreError {
    fn from(err: crate::qap::QapError) -> Self {
        CoreError::InvalidJob(err.to_string())
    }
}

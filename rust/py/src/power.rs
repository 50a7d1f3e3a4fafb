//! Power budgets (`gpuplace_core::power`): the compiled power domains of a topology, and the
//! ledger of a state's running jobs that says each domain's draw, whether an allocation
//! exceeds a budget, and how many free GPUs a job may take per domain and phase slot.

use std::collections::HashMap;
use std::sync::Arc;

use gpuplace_core::power::{Cause, Draw, JobPower, Ledger, PowerDomain, PowerModel, Running};
use gpuplace_core::request::PowerRequest;
use gpuplace_core::CoreError;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::convert::{f64s, gpus_from, id_array, ids};
use crate::errors::CoreResultExt;
use crate::state::PyClusterState;

/// A job's declared draw from Python: `(peak_w, average_w, synchronized)`, None when it
/// declares none.
pub(crate) type Declared = Option<(Option<f64>, Option<f64>, bool)>;

/// Per domain: (free GPUs, allowed, why fewer, headroom W).
type Limits = Vec<(usize, usize, Option<&'static str>, f64)>;

fn declared(power: Declared) -> Option<JobPower> {
    power.map(|(peak_w, average_w, synchronized)| JobPower {
        peak_w,
        average_w,
        synchronized,
    })
}

fn cause_name(cause: Option<Cause>) -> Option<&'static str> {
    cause.map(|c| match c {
        Cause::Budget => "budget",
        Cause::MaxSynchronized => "max_synchronized",
    })
}

/// `(peak W, average W, synchronised)` per GPU of a job with declaration `power` on a GPU of
/// `board_w` (`gpuplace.model.power.job_power`).
#[pyfunction]
fn job_draw(power: Declared, board_w: f64) -> (f64, f64, bool) {
    let d = Draw::of(declared(power).as_ref(), board_w);
    (d.peak, d.average, d.synchronized)
}

/// The power domains of a topology, compiled.
#[pyclass(frozen, module = "gpuplace._core", name = "PowerModel")]
pub struct PyPowerModel {
    inner: Arc<PowerModel>,
}

#[pymethods]
impl PyPowerModel {
    /// `budgets_w[d]`, `max_synchronized[d]` (None: no bound) and `domain_gpus[d]` (GPU ids)
    /// of each domain; `board_w`: every GPU's board power (NaN when unknown).
    #[new]
    fn new(
        budgets_w: Vec<f64>,
        max_synchronized: Vec<Option<u32>>,
        phases: u32,
        board_w: PyReadonlyArray1<'_, f64>,
        domain_gpus: Vec<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<PyPowerModel> {
        if max_synchronized.len() != budgets_w.len() {
            return Err(CoreError::InvalidTopology(
                "power domains: one max_synchronized per budget".into(),
            ))
            .py();
        }
        let domains = budgets_w
            .into_iter()
            .zip(max_synchronized)
            .map(|(budget_w, max_synchronized)| PowerDomain {
                budget_w,
                max_synchronized,
            })
            .collect();
        let gpus = domain_gpus
            .iter()
            .map(|a| ids("power domain GPU", a, CoreError::InvalidTopology))
            .collect::<PyResult<Vec<_>>>()?;
        let inner = PowerModel::new(domains, phases, f64s(&board_w), gpus).py()?;
        Ok(PyPowerModel {
            inner: Arc::new(inner),
        })
    }

    /// Does every GPU have a known board power?
    fn boards_known(&self) -> bool {
        self.inner.boards_known()
    }

    /// The budgets' account of the jobs allocated in `state`: `powers` maps a job to its
    /// declared draw (jobs not in it draw their board power), `slots` to its phase slot
    /// (default 0).
    fn ledger(
        &self,
        state: &PyClusterState,
        powers: HashMap<String, (Option<f64>, Option<f64>, bool)>,
        slots: HashMap<String, u32>,
    ) -> PyResult<PyPowerLedger> {
        let powers: HashMap<String, JobPower> = powers
            .into_iter()
            .map(|(k, v)| (k, declared(Some(v)).unwrap_or_default()))
            .collect();
        let (ledger, jobs) = self
            .inner
            .ledger_of_state(&state.inner, |name| {
                (powers.get(name), slots.get(name).copied().unwrap_or(0))
            })
            .py()?;
        Ok(PyPowerLedger {
            model: Arc::clone(&self.inner),
            ledger,
            jobs,
        })
    }
}

/// Per power domain and phase slot, the draw of a state's running jobs.
#[pyclass(frozen, module = "gpuplace._core", name = "PowerLedger")]
pub struct PyPowerLedger {
    model: Arc<PowerModel>,
    ledger: Ledger,
    jobs: Vec<(String, Running)>,
}

impl PyPowerLedger {
    /// The budgets a placement request for a job with declaration `power` stays within.
    pub(crate) fn request(&self, power: Declared) -> PowerRequest {
        PowerRequest {
            model: Arc::clone(&self.model),
            ledger: self.ledger.clone(),
            job: declared(power),
        }
    }

    fn domain(&self, d: usize) -> PyResult<usize> {
        if d < self.model.domains().len() {
            Ok(d)
        } else {
            Err(CoreError::InvalidTopology(format!("no power domain {d}"))).py()
        }
    }
}

#[pymethods]
impl PyPowerLedger {
    /// Every domain's draw (W): the averages plus the worst slot's synchronised peak margin.
    fn draws(&self) -> Vec<f64> {
        (0..self.model.domains().len())
            .map(|d| self.ledger.draw(d))
            .collect()
    }

    /// The synchronised jobs with GPUs in domain `d`, and their phase slots.
    fn synchronized_jobs(&self, d: usize) -> PyResult<Vec<(String, u32)>> {
        let d = self.domain(d)? as u32;
        Ok(self
            .jobs
            .iter()
            .filter(|(_, r)| r.draw.synchronized && r.gpus_in.iter().any(|&(e, n)| e == d && n > 0))
            .map(|(name, r)| (name.clone(), r.slot))
            .collect())
    }

    /// Would allocating `gpus` to a job with declaration `power` in phase slot `slot` exceed a
    /// budget or a `max_synchronized`? None, or `(domain index, "budget" or
    /// "max_synchronized", the domain's draw with the job W, the slot modulo the slots)`.
    fn check(
        &self,
        gpus: PyReadonlyArray1<'_, i64>,
        power: Declared,
        slot: u32,
    ) -> PyResult<Option<(usize, &'static str, f64, u32)>> {
        let gpus = gpus_from(&gpus)?;
        let job = self
            .model
            .running(&gpus, declared(power).as_ref(), slot)
            .py()?;
        Ok(self.ledger.check(&self.model, &job).map(|o| {
            let cause = cause_name(Some(o.cause)).unwrap_or("budget");
            (o.domain, cause, o.draw, o.slot)
        }))
    }

    /// Per domain, what it lets a job with declaration `power` take in `slot`, given the free
    /// mask `free`: `(free GPUs, allowed, cause or None, headroom W)`, where the cause
    /// ("budget" or "max_synchronized") says why `allowed` is below the free count.
    fn limits(
        &self,
        free: PyReadonlyArray1<'_, bool>,
        power: Declared,
        slot: u32,
    ) -> PyResult<Limits> {
        let free = free.as_slice()?;
        let power = declared(power);
        let model = &self.model;
        if free.len() != model.num_gpus() {
            return Err(CoreError::InvalidState(format!(
                "free mask of {} GPUs, the topology has {}",
                free.len(),
                model.num_gpus()
            )))
            .py();
        }
        Ok((0..model.domains().len())
            .map(|d| {
                let n_free = model
                    .domain_gpus(d)
                    .iter()
                    .filter(|&&g| free[g as usize])
                    .count();
                let draw = model.draw_in(d, power.as_ref());
                let (allowed, cause) = self.ledger.allowed(model, d, draw, slot, n_free);
                let headroom = model.domains()[d].budget_w - self.ledger.draw(d);
                (n_free, allowed, cause_name(cause), headroom)
            })
            .collect())
    }

    /// The free GPUs a job with declaration `power` may not take in `slot` (per domain not in
    /// `relax`, its free GPUs beyond what the budget allows, the lowest ids kept).
    fn held<'py>(
        &self,
        py: Python<'py>,
        free: PyReadonlyArray1<'_, bool>,
        power: Declared,
        slot: u32,
        relax: Vec<usize>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let free = free.as_slice()?;
        if free.len() != self.model.num_gpus() {
            return Err(CoreError::InvalidState(format!(
                "free mask of {} GPUs, the topology has {}",
                free.len(),
                self.model.num_gpus()
            )))
            .py();
        }
        let power = declared(power);
        let held = self
            .ledger
            .held(&self.model, free, power.as_ref(), slot, &relax);
        Ok(id_array(py, &held))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPowerModel>()?;
    m.add_class::<PyPowerLedger>()?;
    m.add_function(wrap_pyfunction!(job_draw, m)?)?;
    Ok(())
}

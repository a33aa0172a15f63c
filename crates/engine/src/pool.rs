//! Warm cells: cells built up to just before their payload's exec and parked, so that a
//! run of the same plan shape starts by handing the parked cell its command. Kept in
//! pools keyed by plan shape (everything but the command), refilled in the background
//! by one thread, each cell used once and destroyed. Parked cells count against the
//! engine's capacity like running ones, and die with the engine (their supervisors see
//! EOF on their control sockets; the factory kills what it forked).

use crate::cells::wait_parked;
use crate::factory::{CellFactory, CellHost};
use crate::host::{HostMode, HostRequest};
use crate::lifecycle::EvidenceArea;
use airlock_contract::CellPlan;
use airlock_contract::PlanTransfer;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

/// What two plans must share for a cell built for one to serve the other: all of the
/// plan but its command (argv). The environment, mounts, limits, network and identity
/// are part of the shape.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlanShape(String);

impl PlanShape {
    pub fn of(plan: &CellPlan) -> PlanShape {
        PlanShape::of_own(&mut plan.clone())
    }

    /// [`PlanShape::of`] of a plan the caller owns, without copying it (a plan is
    /// thousands of small allocations): its argv is set aside while the rest is hashed,
    /// then put back. The JSON is hashed as it is written, never held whole.
    pub(crate) fn of_own(plan: &mut CellPlan) -> PlanShape {
        let argv = std::mem::take(&mut plan.argv);
        let mut hasher = Sha256::new();
        let hashed = serde_json::to_writer(&mut hasher, &*plan);
        plan.argv = argv;
        // A plan serialises infallibly (no maps with non-string keys). Were it ever not
        // to, the empty shape is no hash: a pool of such a template never parks a cell
        // (its plan cannot be sent to the factory either), so none is claimed for it.
        match hashed {
            Ok(()) => PlanShape(hex::encode(hasher.finalize())),
            Err(_) => PlanShape(String::new()),
        }
    }
}

struct Pool {
    template: CellPlan,
    size: usize,
    parked: VecDeque<CellHost>,
}

#[derive(Default)]
struct PoolState {
    pools: BTreeMap<PlanShape, Pool>,
    stopping: bool,
}

/// The engine's pools and their refill thread.
#[derive(Default)]
pub(crate) struct Pools {
    shared: Arc<(Mutex<PoolState>, Condvar)>,
    refill: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What `doctor` and the benchmarks see of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    pub shape: PlanShape,
    pub size: usize,
    pub parked: usize,
    /// The supervisor processes of the parked cells.
    pub supervisors: Vec<i32>,
}

impl Pools {
    /// Keeps `size` cells of `template`'s shape parked (0 removes the pool and destroys
    /// its cells).
    pub fn keep(
        &self,
        factory: Arc<CellFactory>,
        evidence: EvidenceArea,
        template: CellPlan,
        size: usize,
    ) {
        let shape = PlanShape::of(&template);
        let (state, wake) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        if size == 0 {
            state.pools.remove(&shape);
            return;
        }
        state
            .pools
            .entry(shape)
            .and_modify(|pool| pool.size = size)
            .or_insert(Pool {
                template,
                size,
                parked: VecDeque::new(),
            });
        drop(state);
        wake.notify_all();
        let mut refill = self.refill.lock().unwrap_or_else(|p| p.into_inner());
        if refill.is_none() {
            let shared = Arc::clone(&self.shared);
            *refill = Some(
                std::thread::Builder::new()
                    .name("warm-pool-refill".into())
                    .spawn(move || refill_loop(&shared, &factory, &evidence))
                    .expect("spawning the pool refill thread"),
            );
        }
    }

    /// A parked cell of `shape`, if one is ready. The pool is refilled once the claimed
    /// run is over ([`Pools::refill`]): building its replacement meanwhile would take the
    /// CPU the claimed cell needs to start (this project's VM has two).
    /// Whether a pool is kept for `shape` (its cells may all be claimed right now).
    pub fn keeps(&self, shape: &PlanShape) -> bool {
        let (state, _) = &*self.shared;
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.pools.contains_key(shape)
    }

    pub fn claim(&self, shape: &PlanShape) -> Option<CellHost> {
        let (state, _) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.pools.get_mut(shape)?.parked.pop_front()
    }

    /// A guard that wakes the refill thread when dropped (see [`PoolRefill`]).
    pub fn refill_on_drop(&self) -> PoolRefill {
        PoolRefill(Arc::clone(&self.shared))
    }

    pub fn status(&self) -> Vec<PoolStatus> {
        let (state, _) = &*self.shared;
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .pools
            .iter()
            .map(|(shape, pool)| PoolStatus {
                shape: shape.clone(),
                size: pool.size,
                parked: pool.parked.len(),
                supervisors: pool.parked.iter().map(|h| h.pid).collect(),
            })
            .collect()
    }

    /// Stops refilling and destroys every parked cell.
    pub fn shut_down(&self) {
        let (state, wake) = &*self.shared;
        let pools = {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.stopping = true;
            std::mem::take(&mut state.pools)
        };
        wake.notify_all();
        drop(pools);
        if let Some(refill) = self.refill.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = refill.join();
        }
    }
}

/// Wakes the refill thread when dropped: a claimed run is over, and its caller has
/// answered. Held by the run's [`crate::FinishedRun`] (dropped when its record is
/// complete, or taken by a caller that answers its client later) because building the
/// next cell (a clone, its namespaces and mounts: milliseconds of CPU on a 2-vCPU host)
/// otherwise competes with the run's end for the CPU: the reply, the finish record and
/// the waiting client (docs/benchmarks.md, 2026-12-02 third round).
pub struct PoolRefill(Arc<(Mutex<PoolState>, Condvar)>);

impl Drop for PoolRefill {
    fn drop(&mut self) {
        self.0 .1.notify_all();
    }
}

/// The refill thread: builds one cell at a time for the pool furthest below its size.
fn refill_loop(
    shared: &(Mutex<PoolState>, Condvar),
    factory: &CellFactory,
    evidence: &EvidenceArea,
) {
    let (state, wake) = shared;
    loop {
        let wanted = {
            let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if guard.stopping {
                    return;
                }
                if let Some(wanted) = most_wanted(&guard) {
                    break wanted;
                }
                guard = wake.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (shape, plan) = wanted;
        let built = factory
            .spawn(HostRequest {
                plan,
                credentials: Vec::new(),
                secrets: Vec::new(),
                artifacts: None,
                mode: HostMode::OneShot,
                // Its own evidence directory, used by the run that claims it (cells.rs
                // takes it from the host): a warm cell's writable paths are copied too.
                on_suspected_escape: evidence.for_one_cell(),
            })
            .ok()
            .filter(|host| wait_parked(&host.control).is_ok());
        let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
        let stopping = guard.stopping;
        match (built, guard.pools.get_mut(&shape)) {
            (Some(host), Some(pool)) if !stopping => pool.parked.push_back(host),
            // A cell that could not be built (capacity, a host problem): wait for the
            // next claim or change before trying again, instead of spinning.
            (None, _) => drop(wake.wait_timeout(guard, std::time::Duration::from_millis(200))),
            _ => {}
        }
    }
}

/// The pool with the most missing cells, and its template as the factory is sent it
/// (the one copy of the plan a refill makes).
fn most_wanted(state: &PoolState) -> Option<(PlanShape, PlanTransfer)> {
    state
        .pools
        .iter()
        .filter(|(_, pool)| pool.parked.len() < pool.size)
        .max_by_key(|(_, pool)| pool.size - pool.parked.len())
        .map(|(shape, pool)| (shape.clone(), PlanTransfer::of(&pool.template)))
}

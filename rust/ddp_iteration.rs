//! One DDP iteration, owned in one place: the plan that tells the Reducer what to do next.
//!
//! torch's Reducer keeps an iteration's whole state in one C++ object. ferrodist's Reducer is
//! split by language, and this module is the half that decides. The Python side does the
//! tensor work (copying gradients into buckets, starting all-reduces, writing results back) and
//! is told each time what to do:
//! * take a large gradient into its bucket the moment it arrives;
//! * launch buckets `from..to`, and which of them to leave out;
//! * sum the used-parameter map, and finish once backward has ended.
//!
//! Everything those answers depend on lives here, across iterations too: static graph or not,
//! `find_unused_parameters`, how many backward passes ran, whether the buckets were rebuilt,
//! the parameters the forward pass did not reach, which gradients are copied on arrival. The
//! Python side arms an iteration with `begin_backward(unused)` and asks no more of itself.
//!
//! Why the plan is not in Python, measured with a backward over 5,000 `Linear(8, 8)` (10,000
//! gradients, world 1): a Python hook per gradient made the backward 176.6 ms -> 186.4 ms
//! (about 1 µs a gradient), so the per-gradient path stays native and the decisions go with it.

use crate::error::Result;
use crate::readiness::{Mode, Readiness, Ready};

/// The DDP options that change how an iteration is counted (fixed at construction).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// `find_unused_parameters`: search the graph for parameters the forward pass did not use.
    pub find_unused: bool,
    /// `skip_all_reduce_unused_params`: leave out buckets whose parameters were all unused.
    pub skip_unused: bool,
}

/// Buckets the Reducer launches now, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// First bucket of the run.
    pub from: usize,
    /// One past the last bucket of the run.
    pub to: usize,
    /// This run reaches the last bucket: finish once backward has ended.
    pub finish: bool,
    /// Also sum the used-parameter map across ranks (dynamic `find_unused_parameters`).
    pub reduce_used_map: bool,
}

/// What the Reducer does after one gradient arrived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Copy this gradient into its bucket now (before any launch).
    pub copy_now: bool,
    /// Buckets that may start their reduction.
    pub launch: Option<Launch>,
}

/// One DDP Reducer's plan, from construction to the last iteration.
#[derive(Debug)]
pub struct DdpIteration {
    readiness: Readiness,
    settings: Settings,
    /// The parameters of each bucket (for the buckets left out as unused).
    buckets: Vec<Vec<usize>>,
    /// Whether each parameter's gradient is copied as it arrives (the Python side's choice:
    /// large dense gradients).
    copy_on_arrival: Vec<bool>,
    static_graph: bool,
    forward_calls: u64,
    backward_calls: u64,
    rebuilt: bool,
    /// Parameters the forward pass did not reach (dynamic graphs: this iteration's; static
    /// graphs: those whose hook never fired in the first iteration).
    unused: Vec<usize>,
    unused_mask: Vec<bool>,
    /// Whether gradients are copied on arrival in this iteration.
    copying: bool,
    /// Buckets launched (and not left out) in this iteration, as torch's Logger counts them.
    buckets_reduced: usize,
}

impl DdpIteration {
    /// A plan for `copy_on_arrival.len()` parameters laid out in `buckets` (parameter indices).
    ///
    /// Fails unless every parameter index appears in exactly one bucket.
    pub fn new(
        buckets: Vec<Vec<usize>>,
        settings: Settings,
        copy_on_arrival: Vec<bool>,
    ) -> Result<Self> {
        let count = copy_on_arrival.len();
        let mut plan = DdpIteration {
            readiness: Readiness::new(count, &buckets)?,
            settings,
            buckets,
            copy_on_arrival,
            static_graph: false,
            forward_calls: 0,
            backward_calls: 0,
            rebuilt: false,
            unused: Vec::new(),
            unused_mask: vec![false; count],
            copying: false,
            buckets_reduced: 0,
        };
        plan.rearm(false);
        Ok(plan)
    }

    /// Replaces the bucket layout (a change of gradient dtype); the iteration starts over.
    pub fn set_buckets(&mut self, buckets: Vec<Vec<usize>>) -> Result<()> {
        self.readiness.set_buckets(&buckets)?;
        self.buckets = buckets;
        self.copying = false;
        Ok(())
    }

    /// The gradient arrival order to rebuild the buckets in, when they are due a rebuild and
    /// an order was recorded; leaves the record empty.
    pub fn rebuild_order(&mut self) -> Option<Vec<usize>> {
        if !self.should_rebuild() || self.readiness.rebuild_order_len() == 0 {
            return None;
        }
        Some(self.readiness.take_rebuild_order())
    }

    /// Installs the rebuilt layout; buckets are rebuilt only once.
    pub fn rebuilt(&mut self, buckets: Vec<Vec<usize>>) -> Result<()> {
        self.set_buckets(buckets)?;
        self.rebuilt = true;
        Ok(())
    }

    /// Replaces the recorded rebuild order (Join: every parameter, in index order).
    pub fn set_rebuild_order(&mut self, indices: Vec<usize>) {
        self.readiness.set_rebuild_order(indices);
    }

    /// Declares the graph static; false (and nothing changes) once a forward pass ran.
    pub fn set_static_graph(&mut self) -> bool {
        if self.forward_calls > 0 {
            return false;
        }
        self.static_graph = true;
        self.rearm(false);
        true
    }

    /// A forward pass starts.
    pub fn begin_forward(&mut self) {
        self.forward_calls += 1;
    }

    /// Whether `begin_backward` uses the unused parameters (only a dynamic graph with
    /// `find_unused_parameters` searches for them; the search walks the autograd graph).
    pub fn searches_unused(&self) -> bool {
        self.dynamic_find_unused()
    }

    /// Arms the hooks for the next backward; `unused` are the parameters the forward pass did
    /// not reach (read only when [`Self::searches_unused`]).
    pub fn begin_backward(&mut self, unused: Vec<usize>) {
        if self.static_graph {
            self.backward_calls += 1;
        }
        if self.dynamic_find_unused() {
            self.set_unused(unused);
        }
        self.rearm(true);
        self.buckets_reduced = 0;
        // A gradient is final at its hook only without a static graph: there a reused
        // parameter's hook fires more than once, and the first iteration reduces at the end.
        self.copying = !self.static_graph;
    }

    /// Parameter `index`'s gradient arrived.
    ///
    /// Fails with [`crate::Error::InvalidArgument`] when `index` is out of range or its
    /// gradient already arrived in this iteration.
    pub fn on_gradient(&mut self, index: usize) -> Result<Report> {
        let ready = self.readiness.on_hook(index)?;
        let copy_now = self.copying && self.copy_on_arrival[index];
        let launch = match ready {
            Ready::Nothing => None,
            Ready::Launch {
                from,
                to,
                all_launched,
            } => {
                self.buckets_reduced += (from..to).filter(|&b| !self.skips(b)).count();
                Some(Launch {
                    from,
                    to,
                    finish: all_launched,
                    reduce_used_map: all_launched && self.dynamic_find_unused(),
                })
            }
        };
        Ok(Report { copy_now, launch })
    }

    /// Backward ended with every bucket launched: a static graph that still owes its rebuild
    /// puts the parameters that never had a gradient at the end of the order.
    pub fn end_of_backward(&mut self) {
        if self.static_graph && self.should_rebuild() {
            let unused = self.unused.clone();
            self.readiness.extend_rebuild_order(&unused);
        }
    }

    /// Static graph's first iteration, after backward: every bucket is reduced at once. The
    /// parameters whose hook never fired are the graph's unused ones from now on. Returns the
    /// buckets to launch (all of them), or None when none is left.
    pub fn reduce_all_at_end(&mut self) -> Option<(usize, usize)> {
        let never = self.readiness.never_hooked();
        self.set_unused(never);
        match self.readiness.mark_all() {
            Ready::Nothing => None,
            Ready::Launch { from, to, .. } => Some((from, to)),
        }
    }

    /// Whether bucket `bucket` stays out of this iteration's reduction: with
    /// `skip_all_reduce_unused_params`, a bucket whose parameters were all unused (torch's
    /// contract: every rank leaves the same ones unused, or the collectives no longer pair up).
    pub fn skips(&self, bucket: usize) -> bool {
        self.settings.skip_unused && self.buckets[bucket].iter().all(|&i| self.unused_mask[i])
    }

    /// The reduction of this iteration is over (results are being written back): hooks are
    /// ignored until the next `begin_backward`.
    pub fn finish_backward(&mut self) {
        self.readiness.reset();
        self.copying = false;
        if self.dynamic_find_unused() {
            self.readiness.clear_used();
        }
    }

    /// Forgets the iteration under way (torch's `_reset_state`).
    pub fn reset(&mut self) {
        self.readiness.reset();
        self.copying = false;
    }

    /// The parameters whose gradient has not arrived, when a reduction is under way (some
    /// gradient arrived and the iteration was not finished); None otherwise.
    pub fn unfinished(&self) -> Option<Vec<usize>> {
        self.readiness
            .any_ready()
            .then(|| self.readiness.not_ready())
    }

    /// Whether some parameter may have been unused on some rank in this iteration: tracked
    /// with `find_unused_parameters` or a static graph, and not every hook fired here.
    pub fn may_have_unused(&self) -> bool {
        (self.static_graph || self.settings.find_unused) && self.readiness.used().contains(&0)
    }

    /// Whether every forward so far used every parameter (torch's `_ddp_graph_static`).
    pub fn graph_static(&self) -> bool {
        self.forward_calls > 0 && self.unused.is_empty()
    }

    /// Forward passes so far (torch's iteration count).
    pub fn iterations(&self) -> u64 {
        self.forward_calls
    }

    /// The parameters counted as unused (see the field).
    pub fn unused(&self) -> &[usize] {
        &self.unused
    }

    /// Buckets reduced in this iteration.
    pub fn buckets_reduced(&self) -> usize {
        self.buckets_reduced
    }

    /// Whether the one-time rebuild happened.
    pub fn has_rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// Whether the graph was declared static.
    pub fn static_graph(&self) -> bool {
        self.static_graph
    }

    /// Parameters in the order their gradients arrived in this (or the last) iteration.
    pub fn arrival_order(&self) -> &[usize] {
        self.readiness.arrival_order()
    }

    /// The local used map: 1 where the parameter's hook fired (torch's int32 map).
    pub fn used(&self) -> &[i32] {
        self.readiness.used()
    }

    fn dynamic_find_unused(&self) -> bool {
        self.settings.find_unused && !self.static_graph
    }

    fn should_rebuild(&self) -> bool {
        (self.static_graph || !self.settings.find_unused) && !self.rebuilt
    }

    fn set_unused(&mut self, unused: Vec<usize>) {
        self.unused_mask.fill(false);
        for &i in &unused {
            if let Some(slot) = self.unused_mask.get_mut(i) {
                *slot = true;
            }
        }
        self.unused = unused;
    }

    /// Derives how hooks count from the plan's state and starts the iteration over.
    fn rearm(&mut self, armed: bool) {
        let first_static = self.static_graph && self.backward_calls == 1;
        let mode = Mode {
            armed,
            record_used: self.dynamic_find_unused() || first_static,
            count_only: first_static,
            use_hook_counts: self.static_graph && !first_static,
            record_rebuild: self.should_rebuild(),
        };
        self.readiness.arm(mode, self.unused.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(buckets: Vec<Vec<usize>>, settings: Settings, large: &[usize]) -> DdpIteration {
        let count = buckets.iter().map(Vec::len).sum();
        let copy = (0..count).map(|i| large.contains(&i)).collect();
        DdpIteration::new(buckets, settings, copy).unwrap()
    }

    fn launch(from: usize, to: usize, finish: bool) -> Option<Launch> {
        Some(Launch {
            from,
            to,
            finish,
            reduce_used_map: false,
        })
    }

    #[test]
    fn hooks_before_the_first_backward_do_nothing() {
        let mut p = plan(vec![vec![0]], Settings::default(), &[0]);
        assert_eq!(p.on_gradient(0).unwrap(), Report::default());
        assert_eq!(p.unfinished(), None);
    }

    #[test]
    fn large_gradients_are_copied_and_buckets_launch_in_order() {
        let mut p = plan(vec![vec![1], vec![0]], Settings::default(), &[0]);
        p.begin_backward(vec![]);
        let first = p.on_gradient(0).unwrap();
        assert_eq!(
            first,
            Report {
                copy_now: true,
                launch: None
            }
        );
        assert_eq!(p.unfinished(), Some(vec![1]));
        assert_eq!(p.on_gradient(1).unwrap().launch, launch(0, 2, true));
        assert_eq!(p.buckets_reduced(), 2);
        assert!(p.on_gradient(1).is_err(), "ready twice");
        p.finish_backward();
        assert_eq!(p.unfinished(), None);
    }

    #[test]
    fn the_rebuild_order_is_offered_once() {
        let mut p = plan(vec![vec![0, 1]], Settings::default(), &[]);
        assert_eq!(p.rebuild_order(), None, "nothing recorded yet");
        p.begin_backward(vec![]);
        p.on_gradient(1).unwrap();
        p.on_gradient(0).unwrap();
        p.finish_backward();
        assert_eq!(p.rebuild_order(), Some(vec![1, 0]));
        p.rebuilt(vec![vec![1, 0]]).unwrap();
        assert!(p.has_rebuilt());
        p.begin_backward(vec![]);
        p.on_gradient(0).unwrap();
        p.on_gradient(1).unwrap();
        assert_eq!(p.rebuild_order(), None);
    }

    #[test]
    fn find_unused_marks_the_unused_and_sums_the_used_map() {
        let settings = Settings {
            find_unused: true,
            skip_unused: true,
        };
        let mut p = plan(vec![vec![2], vec![1, 0]], settings, &[]);
        assert!(p.searches_unused());
        p.begin_backward(vec![2]);
        assert!(p.skips(0));
        assert!(!p.skips(1));
        let first = p.on_gradient(0).unwrap().launch;
        assert_eq!(
            first,
            launch(0, 1, false),
            "the unused bucket launches at once"
        );
        let last = p.on_gradient(1).unwrap().launch.unwrap();
        assert_eq!(
            last,
            Launch {
                from: 1,
                to: 2,
                finish: true,
                reduce_used_map: true
            }
        );
        assert_eq!(p.buckets_reduced(), 1, "the skipped bucket is not counted");
        assert!(p.may_have_unused());
        assert_eq!(p.used(), &[1, 1, 0]);
        p.finish_backward();
        assert_eq!(p.used(), &[0, 0, 0], "cleared for the next iteration");
        assert!(!p.graph_static());
    }

    #[test]
    fn static_graph_counts_first_then_reduces_on_the_last_hook() {
        let mut p = plan(vec![vec![0, 1, 2]], Settings::default(), &[0]);
        p.begin_forward();
        assert!(!p.set_static_graph(), "too late after a forward");
        let mut p = plan(vec![vec![0, 1, 2]], Settings::default(), &[0]);
        assert!(p.set_static_graph());
        p.begin_forward();
        p.begin_backward(vec![]);
        for i in [0, 1, 0] {
            assert_eq!(
                p.on_gradient(i).unwrap(),
                Report::default(),
                "counting only"
            );
        }
        assert_eq!(p.reduce_all_at_end(), Some((0, 1)));
        assert_eq!(p.unused(), &[2]);
        p.finish_backward();
        assert_eq!(
            p.rebuild_order(),
            None,
            "the first iteration records no order"
        );
        p.begin_backward(vec![]);
        assert_eq!(p.on_gradient(0).unwrap(), Report::default(), "not copied");
        assert_eq!(p.on_gradient(1).unwrap().launch, None);
        assert_eq!(p.on_gradient(0).unwrap().launch, launch(0, 1, true));
        p.end_of_backward();
        assert_eq!(p.rebuild_order(), Some(vec![1, 0, 2]), "unused last");
    }
}

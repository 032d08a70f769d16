//! DDP gradient readiness: which buckets may start their all-reduce as gradients arrive.
//!
//! During backward every parameter's gradient hook reports "parameter `i` is ready". This module
//! is the bookkeeping behind that report, kept out of Python because it runs once per parameter
//! tensor per iteration: it checks that no parameter is ready twice, counts down each bucket, and
//! answers with the run of buckets that may launch now. Buckets launch strictly in order, so a
//! full bucket waits for every earlier one (torch's Reducer does the same, which keeps the
//! collectives of all ranks in one order). The first report of an iteration also marks the
//! parameters known to be unused, so buckets holding only those do not wait forever.
//!
//! Also recorded here, because it is updated on the same per-gradient path: the order in which
//! gradients arrived (for the one-time bucket rebuild and the Logger), which parameters were
//! used locally (`find_unused_parameters`, and static graph's first iteration) and, for static
//! graphs, how many times each parameter's hook fires in one backward.

use crate::error::{Error, Result};

/// What the Reducer must do after a gradient report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Nothing to launch: the report was ignored or its bucket still waits.
    Nothing,
    /// Buckets `from..to` are complete and may launch now, in that order; `all_launched` says
    /// that this run reaches the last bucket, so backward's reduction can be finalized.
    Launch {
        /// First bucket of the run.
        from: usize,
        /// One past the last bucket of the run.
        to: usize,
        /// Whether every bucket of the iteration has now been launched.
        all_launched: bool,
    },
}

/// How the hooks of the current backward are handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    /// Whether reports count at all (torch's `expect_autograd_hooks_`).
    pub armed: bool,
    /// Record locally used parameters (dynamic `find_unused_parameters`, static first iteration).
    pub record_used: bool,
    /// Static graph, first iteration: only count how often each hook fires, reduce nothing.
    pub count_only: bool,
    /// Static graph after its first iteration: a parameter is ready on its last expected hook.
    pub use_hook_counts: bool,
    /// Record the arrival order for the one-time bucket rebuild.
    pub record_rebuild: bool,
}

/// Per-iteration readiness of every parameter and bucket.
#[derive(Debug, Default)]
pub struct Readiness {
    /// Bucket of each parameter.
    bucket_of: Vec<usize>,
    /// Parameter count of each bucket.
    bucket_len: Vec<usize>,
    /// Parameters each bucket still waits for, this iteration.
    pending: Vec<usize>,
    /// Whether each parameter was marked ready this iteration.
    ready: Vec<bool>,
    /// How many parameters were marked ready this iteration.
    ready_count: usize,
    /// The first bucket not launched yet.
    next_bucket: usize,
    /// Parameters the forward pass did not reach; marked ready on the first report.
    unused: Vec<usize>,
    unused_marked: bool,
    mode: Mode,
    /// Parameters in hook order, this iteration (the Logger's backward stats).
    arrival: Vec<usize>,
    /// Parameters in readiness order, kept until the rebuild takes them.
    rebuild_order: Vec<usize>,
    /// 1 where the parameter's hook fired (int32, torch's local-used map).
    used: Vec<i32>,
    /// Static graph: hook firings per parameter seen in the first iteration.
    hook_counts: Vec<u32>,
    /// Static graph: firings still expected this iteration.
    hook_counts_left: Vec<u32>,
}

impl Readiness {
    /// Readiness for `param_count` parameters laid out in `buckets` (parameter indices).
    ///
    /// Fails unless every index below `param_count` appears in exactly one bucket.
    pub fn new(param_count: usize, buckets: &[Vec<usize>]) -> Result<Self> {
        let mut readiness = Readiness {
            used: vec![0; param_count],
            hook_counts: vec![0; param_count],
            ..Readiness::default()
        };
        readiness.set_buckets(buckets)?;
        Ok(readiness)
    }

    /// Replaces the bucket layout (after a rebuild); resets the iteration.
    pub fn set_buckets(&mut self, buckets: &[Vec<usize>]) -> Result<()> {
        let n = self.used.len();
        let mut bucket_of = vec![usize::MAX; n];
        for (b, members) in buckets.iter().enumerate() {
            for &i in members {
                match bucket_of.get_mut(i) {
                    Some(slot) if *slot == usize::MAX => *slot = b,
                    _ => {
                        return Err(Error::InvalidArgument(
                            "bucket_indices must name every parameter index exactly once.".into(),
                        ))
                    }
                }
            }
        }
        if bucket_of.contains(&usize::MAX) {
            return Err(Error::InvalidArgument(
                "bucket_indices must name every parameter index exactly once.".into(),
            ));
        }
        self.bucket_of = bucket_of;
        self.bucket_len = buckets.iter().map(Vec::len).collect();
        self.reset();
        Ok(())
    }

    /// Starts a new iteration: nothing ready, no bucket launched, under `mode`.
    pub fn arm(&mut self, mode: Mode, unused: Vec<usize>) {
        self.reset();
        self.mode = mode;
        self.unused = unused;
        self.arrival.clear();
        if mode.use_hook_counts {
            self.hook_counts_left.clone_from(&self.hook_counts);
        }
    }

    /// Forgets this iteration's readiness and stops counting reports.
    pub fn reset(&mut self) {
        self.pending.clone_from(&self.bucket_len);
        self.ready = vec![false; self.bucket_of.len()];
        self.ready_count = 0;
        self.next_bucket = 0;
        self.unused_marked = false;
        self.mode.armed = false;
    }

    /// A gradient hook fired for parameter `index`.
    ///
    /// Fails with [`Error::InvalidArgument`] when `index` is out of range or already ready.
    pub fn on_hook(&mut self, index: usize) -> Result<Ready> {
        if index >= self.bucket_of.len() {
            return Err(Error::InvalidArgument(format!(
                "parameter index {index} is out of range"
            )));
        }
        if self.mode.record_used {
            self.used[index] = 1;
        }
        if self.mode.count_only {
            self.hook_counts[index] += 1;
            return Ok(Ready::Nothing);
        }
        if !self.mode.armed {
            return Ok(Ready::Nothing);
        }
        self.arrival.push(index);
        let from = self.next_bucket;
        if !self.unused_marked {
            self.unused_marked = true;
            for k in 0..self.unused.len() {
                self.mark(self.unused[k])?;
            }
        }
        if self.mode.use_hook_counts {
            let left = &mut self.hook_counts_left[index];
            *left = left.saturating_sub(1);
            if *left != 0 {
                return Ok(self.launch_from(from));
            }
        }
        if self.mode.record_rebuild {
            self.rebuild_order.push(index);
        }
        self.mark(index)?;
        Ok(self.launch_from(from))
    }

    /// Marks every parameter not ready yet as ready and launches every bucket (static graph's
    /// first iteration, reduced all at once after backward).
    pub fn mark_all(&mut self) -> Ready {
        let from = self.next_bucket;
        for i in 0..self.ready.len() {
            if !self.ready[i] {
                // cannot fail: in range and not ready
                let _ = self.mark(i);
            }
        }
        self.launch_from(from)
    }

    fn mark(&mut self, index: usize) -> Result<()> {
        if self.ready[index] {
            return Err(Error::InvalidArgument(format!(
                "parameter {index} was marked ready twice"
            )));
        }
        self.ready[index] = true;
        self.ready_count += 1;
        self.pending[self.bucket_of[index]] -= 1;
        while self.next_bucket < self.pending.len() && self.pending[self.next_bucket] == 0 {
            self.next_bucket += 1;
        }
        Ok(())
    }

    fn launch_from(&self, from: usize) -> Ready {
        if self.next_bucket == from {
            return Ready::Nothing;
        }
        Ready::Launch {
            from,
            to: self.next_bucket,
            all_launched: self.next_bucket == self.pending.len(),
        }
    }

    /// Whether any parameter was marked ready since the last reset (a reduction is under way).
    pub fn any_ready(&self) -> bool {
        self.ready_count > 0
    }

    /// Parameters not marked ready this iteration, ascending.
    pub fn not_ready(&self) -> Vec<usize> {
        (0..self.ready.len()).filter(|&i| !self.ready[i]).collect()
    }

    /// Parameters in the order their hooks fired this iteration.
    pub fn arrival_order(&self) -> &[usize] {
        &self.arrival
    }

    /// Appends `indices` to the recorded rebuild order (static graph's unused parameters).
    pub fn extend_rebuild_order(&mut self, indices: &[usize]) {
        self.rebuild_order.extend_from_slice(indices);
    }

    /// Replaces the rebuild order (Join: every parameter, in index order).
    pub fn set_rebuild_order(&mut self, indices: Vec<usize>) {
        self.rebuild_order = indices;
    }

    /// Hands over the rebuild order recorded so far, leaving it empty.
    pub fn take_rebuild_order(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.rebuild_order)
    }

    /// Length of the rebuild order recorded so far.
    pub fn rebuild_order_len(&self) -> usize {
        self.rebuild_order.len()
    }

    /// The local used map: 1 where the parameter's hook fired since the last clear.
    pub fn used(&self) -> &[i32] {
        &self.used
    }

    /// Clears the local used map.
    pub fn clear_used(&mut self) {
        self.used.fill(0);
    }

    /// Parameters whose hook never fired in static graph's first iteration.
    pub fn never_hooked(&self) -> Vec<usize> {
        (0..self.hook_counts.len())
            .filter(|&i| self.hook_counts[i] == 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed() -> Mode {
        Mode {
            armed: true,
            ..Mode::default()
        }
    }

    #[test]
    fn bucket_launches_when_its_last_gradient_arrives() {
        let mut r = Readiness::new(4, &[vec![3, 2], vec![1, 0]]).unwrap();
        r.arm(armed(), vec![]);
        assert_eq!(r.on_hook(3).unwrap(), Ready::Nothing);
        assert_eq!(
            r.on_hook(2).unwrap(),
            Ready::Launch {
                from: 0,
                to: 1,
                all_launched: false
            }
        );
        assert_eq!(r.on_hook(0).unwrap(), Ready::Nothing);
        assert_eq!(
            r.on_hook(1).unwrap(),
            Ready::Launch {
                from: 1,
                to: 2,
                all_launched: true
            }
        );
    }

    #[test]
    fn later_full_bucket_waits_for_earlier_ones() {
        let mut r = Readiness::new(3, &[vec![0], vec![1], vec![2]]).unwrap();
        r.arm(armed(), vec![]);
        assert_eq!(r.on_hook(2).unwrap(), Ready::Nothing);
        assert_eq!(r.on_hook(1).unwrap(), Ready::Nothing);
        assert_eq!(
            r.on_hook(0).unwrap(),
            Ready::Launch {
                from: 0,
                to: 3,
                all_launched: true
            }
        );
    }

    #[test]
    fn ready_twice_is_an_error_and_unarmed_reports_are_ignored() {
        let mut r = Readiness::new(2, &[vec![0, 1]]).unwrap();
        assert_eq!(r.on_hook(0).unwrap(), Ready::Nothing);
        r.arm(armed(), vec![]);
        r.on_hook(0).unwrap();
        assert!(r.on_hook(0).is_err());
        assert_eq!(r.not_ready(), vec![1]);
        assert!(r.any_ready());
    }

    #[test]
    fn unused_parameters_are_marked_on_the_first_report() {
        let mut r = Readiness::new(3, &[vec![2], vec![1, 0]]).unwrap();
        r.arm(armed(), vec![2, 0]);
        assert_eq!(
            r.on_hook(1).unwrap(),
            Ready::Launch {
                from: 0,
                to: 2,
                all_launched: true
            }
        );
    }

    #[test]
    fn static_graph_counts_hooks_then_waits_for_the_last_one() {
        let mut r = Readiness::new(2, &[vec![0, 1]]).unwrap();
        let first = Mode {
            count_only: true,
            record_used: true,
            ..Mode::default()
        };
        r.arm(first, vec![]);
        for i in [0, 1, 0] {
            assert_eq!(r.on_hook(i).unwrap(), Ready::Nothing);
        }
        assert_eq!(r.used(), &[1, 1]);
        let later = Mode {
            armed: true,
            use_hook_counts: true,
            ..Mode::default()
        };
        r.arm(later, vec![]);
        assert_eq!(r.on_hook(0).unwrap(), Ready::Nothing);
        assert_eq!(r.on_hook(1).unwrap(), Ready::Nothing);
        assert!(matches!(r.on_hook(0).unwrap(), Ready::Launch { .. }));
    }

    #[test]
    fn layout_must_cover_every_parameter_once() {
        assert!(Readiness::new(2, &[vec![0]]).is_err());
        assert!(Readiness::new(2, &[vec![0, 1, 1]]).is_err());
        assert!(Readiness::new(2, &[vec![0, 2]]).is_err());
    }
}

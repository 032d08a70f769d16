//! A budget of log lines per second for one call site, so no client can flood the log.
//!
//! The server warns when it closes a connection for a protocol breach and when `accept` fails.
//! Both happen at whatever rate a client (or a descriptor shortage) dictates: the fault hunt
//! made a server write 160 MiB of log in 1.7 s, and out of descriptors it logged 89 "accept
//! failed" lines a second. Each site now logs at most its budget per second; the first line
//! after a suppressed stretch says how many were left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The budget window.
const WINDOW: Duration = Duration::from_secs(1);

/// Lines allowed per second at one call site.
pub struct LogBudget {
    per_second: u32,
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    /// A budget of `per_second` lines a second.
    pub const fn new(per_second: u32) -> LogBudget {
        LogBudget {
            per_second,
            window: Mutex::new(Window {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be logged now, `n` being the lines suppressed since the last
    /// one logged; `None` when this second's budget is spent (the line is counted instead).
    pub fn admit(&self) -> Option<u64> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if window
            .started
            .is_none_or(|at| now.duration_since(at) >= WINDOW)
        {
            window.started = Some(now);
            window.logged = 0;
        }
        if window.logged >= self.per_second {
            window.suppressed += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_its_budget_and_then_counts_what_it_left_out() {
        let budget = LogBudget::new(3);
        let admitted: Vec<Option<u64>> = (0..10).map(|_| budget.admit()).collect();
        assert_eq!(&admitted[..3], &[Some(0), Some(0), Some(0)]);
        assert!(admitted[3..].iter().all(Option::is_none));
        budget.window.lock().unwrap().started = Some(Instant::now() - WINDOW);
        assert_eq!(
            budget.admit(),
            Some(7),
            "the next window reports the 7 left out"
        );
    }
}

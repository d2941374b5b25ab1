//! Automatic drafter choice: measure each (drafter, depth) arm in tokens
//! per millisecond of its rounds, ride the best, and re-probe the others
//! with a backoff that doubles each time they lose. Plain rounds (no
//! drafts) are an arm too, so drafting is never kept when it loses.
//!
//! Probes are costly where drafts are rejected (a deep round costs several
//! plain ones), so a drafter's deeper arm is only tried once its shallower
//! arm has had a round accepting every draft, and a round whose drafter
//! proposed nothing counts as the plain round it was.

use crate::Drafter;
use std::time::Duration;

/// One way to run a round.
#[derive(Debug, Clone)]
pub struct Arm {
    /// Index into the drafters; `None` is a plain round.
    pub drafter: Option<usize>,
    pub depth: usize,
    /// Smoothed tokens per millisecond; `None` until measured.
    pub rate: Option<f64>,
    backoff: usize,
    next_probe: usize,
    /// A round accepted every draft at this depth.
    full: bool,
}

pub struct AutoDrafter {
    drafters: Vec<Box<dyn Drafter>>,
    arms: Vec<Arm>,
    current: usize,
    round: usize,
}

/// Weight of the newest round in an arm's smoothed rate.
const SMOOTHING: f64 = 0.3;

impl AutoDrafter {
    /// Arms: a plain round, and each drafter at each depth.
    pub fn new(drafters: Vec<Box<dyn Drafter>>, depths: &[usize]) -> AutoDrafter {
        let mut arms = vec![Arm {
            drafter: None,
            depth: 0,
            rate: None,
            backoff: 1,
            next_probe: 0,
            full: false,
        }];
        for d in 0..drafters.len() {
            for &depth in depths {
                arms.push(Arm {
                    drafter: Some(d),
                    depth,
                    rate: None,
                    backoff: 1,
                    next_probe: 0,
                    full: false,
                });
            }
        }
        AutoDrafter {
            drafters,
            arms,
            current: 0,
            round: 0,
        }
    }

    pub fn arms(&self) -> &[Arm] {
        &self.arms
    }

    fn best(&self) -> usize {
        (0..self.arms.len())
            .filter(|&i| self.arms[i].rate.is_some())
            .max_by(|&a, &b| self.arms[a].rate.partial_cmp(&self.arms[b].rate).unwrap())
            .unwrap_or(0)
    }

    /// Plain rounds and each drafter's shallowest arm are always open; a
    /// deeper arm opens once the arm before it accepted a full round.
    fn open(&self, i: usize) -> bool {
        i == 0 || self.arms[i - 1].drafter != self.arms[i].drafter || self.arms[i - 1].full
    }

    fn choose(&self) -> usize {
        // First measure every open arm once, then probe those whose time has come.
        if let Some(i) = (0..self.arms.len()).find(|&i| self.open(i) && self.arms[i].rate.is_none())
        {
            return i;
        }
        let best = self.best();
        (0..self.arms.len())
            .find(|&i| i != best && self.open(i) && self.arms[i].next_probe <= self.round)
            .unwrap_or(best)
    }

    /// Records a round of the arm chosen by the last `propose`.
    fn record(&mut self, tokens: usize, elapsed: Duration) {
        let rate = tokens as f64 / (elapsed.as_secs_f64() * 1e3).max(1e-6);
        let best_before = self.best();
        let arm = &mut self.arms[self.current];
        arm.rate = Some(
            arm.rate
                .map_or(rate, |r| r * (1.0 - SMOOTHING) + rate * SMOOTHING),
        );
        self.round += 1;
        if self.current != best_before && self.best() != self.current {
            let arm = &mut self.arms[self.current];
            arm.backoff = (arm.backoff * 2).min(256);
            arm.next_probe = self.round + arm.backoff;
        }
    }
}

impl Drafter for AutoDrafter {
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        self.current = self.choose();
        let arm = &self.arms[self.current];
        match arm.drafter {
            None => Vec::new(),
            Some(d) => {
                let depth = arm.depth.min(max);
                self.drafters[d].propose(context, depth)
            }
        }
    }

    fn observe(&mut self, proposed: usize, accepted: usize, elapsed: Duration) {
        if let Some(d) = self.arms[self.current].drafter {
            self.drafters[d].observe(proposed, accepted, elapsed);
            if proposed == 0 {
                // Nothing to verify: a plain round, measured as one.
                self.current = 0;
            } else if accepted == proposed && proposed >= self.arms[self.current].depth {
                self.arms[self.current].full = true;
            }
        }
        self.record(accepted + 1, elapsed);
    }

    fn name(&self) -> &str {
        match self.arms[self.current].drafter {
            None => "none",
            Some(d) => self.drafters[d].name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Drafter for Fixed {
        fn propose(&mut self, _: &[u32], max: usize) -> Vec<u32> {
            vec![0; max]
        }
        fn name(&self) -> &str {
            "fixed"
        }
    }

    #[test]
    fn a_losing_drafter_is_left_and_reprobed_with_backoff() {
        let mut auto = AutoDrafter::new(vec![Box::new(Fixed)], &[4]);
        let mut probes = Vec::new();
        for round in 0..200 {
            let drafts = auto.propose(&[1, 2, 3], 8);
            if !drafts.is_empty() {
                probes.push(round);
                // Drafting costs time and never helps.
                auto.observe(4, 0, Duration::from_millis(20));
            } else {
                auto.observe(0, 0, Duration::from_millis(10));
            }
        }
        assert!(probes.len() < 12, "{probes:?}");
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.windows(2).all(|g| g[1] >= g[0]),
            "backoff grows: {gaps:?}"
        );
    }

    #[test]
    fn a_winning_drafter_is_kept() {
        let mut auto = AutoDrafter::new(vec![Box::new(Fixed)], &[4]);
        let mut drafted = 0;
        for _ in 0..100 {
            if auto.propose(&[1], 8).is_empty() {
                auto.observe(0, 0, Duration::from_millis(10));
            } else {
                drafted += 1;
                auto.observe(4, 3, Duration::from_millis(12));
            }
        }
        assert!(drafted > 90, "{drafted}");
    }

    #[test]
    fn deeper_arms_wait_for_a_full_round() {
        let mut auto = AutoDrafter::new(vec![Box::new(Fixed)], &[2, 4, 8]);
        let mut depths = Vec::new();
        for _ in 0..40 {
            let drafts = auto.propose(&[1], 8);
            depths.push(drafts.len());
            // Never a draft accepted: only the shallow arm is ever tried.
            auto.observe(
                drafts.len(),
                0,
                Duration::from_millis(10 + drafts.len() as u64),
            );
        }
        assert!(depths.iter().all(|&d| d <= 2), "{depths:?}");
    }
}

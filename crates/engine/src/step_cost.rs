//! What a step costs per token, learned from the steps run so far, so the
//! scheduler can hold batch-class work to a time instead of a token count:
//! on a slow CPU a few dozen tokens already make a step that an interactive
//! request would notice, on a GPU hundreds do not.

use std::time::Duration;

/// Steps with fewer tokens than this are dominated by fixed costs (thread
/// wake-ups, sampling) and would overstate the cost of a token.
const MIN_TOKENS: usize = 8;

/// Weight of the newest step in the running mean.
const ALPHA: f64 = 0.2;

/// An exponentially weighted mean of seconds per token over the steps seen.
#[derive(Debug, Default, Clone)]
pub(crate) struct StepCost {
    secs_per_token: Option<f64>,
}

impl StepCost {
    /// Records a step of `tokens` tokens that took `elapsed`.
    pub(crate) fn observe(&mut self, tokens: usize, elapsed: Duration) {
        if tokens < MIN_TOKENS {
            return;
        }
        let x = elapsed.as_secs_f64() / tokens as f64;
        self.secs_per_token = Some(match self.secs_per_token {
            None => x,
            Some(mean) => mean + ALPHA * (x - mean),
        });
    }

    /// Tokens that fit in `time` at the learned cost, at least one; before
    /// any step was measured, `fallback`.
    pub(crate) fn tokens_within(&self, time: Duration, fallback: usize) -> usize {
        match self.secs_per_token {
            Some(s) if s > 0.0 => ((time.as_secs_f64() / s) as usize).max(1),
            _ => fallback.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmeasured_gives_the_fallback() {
        let cost = StepCost::default();
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 64), 64);
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 0), 1);
    }

    #[test]
    fn small_steps_are_not_counted() {
        let mut cost = StepCost::default();
        cost.observe(1, Duration::from_millis(50));
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 64), 64);
    }

    #[test]
    fn the_mean_follows_the_measured_steps() {
        let mut cost = StepCost::default();
        // 1 ms per token: 20 tokens fit in 20 ms.
        cost.observe(32, Duration::from_millis(32));
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 64), 20);
        // The machine slows to 4 ms per token: the budget shrinks towards 5.
        for _ in 0..40 {
            cost.observe(16, Duration::from_millis(64));
        }
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 64), 5);
        // Never below one token, however slow.
        cost.observe(8, Duration::from_secs(100));
        assert_eq!(cost.tokens_within(Duration::from_millis(20), 64), 1);
    }
}

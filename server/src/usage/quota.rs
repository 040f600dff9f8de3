//! Token buckets for quotas: a bucket holds up to `capacity` tokens and
//! refills at `rate` per second. A request is admitted when the bucket
//! holds what it needs now (its prompt, or the whole capacity for prompts
//! larger than that); what it spends later (its output) is taken as it is
//! produced and may leave the bucket in debt, which later requests wait out.

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Bucket {
    level: f64,
    capacity: f64,
    /// Tokens per second.
    rate: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `capacity` refilling `per_minute` a minute.
    pub fn new(per_minute: u64, capacity: u64, now: Instant) -> Self {
        Self {
            level: capacity as f64,
            capacity: capacity as f64,
            rate: per_minute as f64 / 60.0,
            at: now,
        }
    }

    /// Follows a changed limit, keeping what was spent.
    pub fn set_limit(&mut self, per_minute: u64, capacity: u64) {
        self.rate = per_minute as f64 / 60.0;
        self.capacity = capacity as f64;
        self.level = self.level.min(self.capacity);
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.rate).min(self.capacity);
        self.at = now;
    }

    /// Whether `need` tokens are there at `now`; if not, the whole seconds
    /// until they will be. Takes nothing.
    pub fn check(&mut self, need: u64, now: Instant) -> Result<(), u64> {
        self.refill(now);
        let need = (need as f64).clamp(1.0, self.capacity);
        if self.level >= need {
            Ok(())
        } else {
            let wait = (need - self.level) / self.rate;
            Err((wait.ceil() as u64).max(1))
        }
    }

    /// Spends `tokens` (may go into debt).
    pub fn take(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.level -= tokens as f64;
    }

    /// Returns tokens taken for a request that did not run.
    pub fn take_back(&mut self, tokens: u64) {
        self.level = (self.level + tokens as f64).min(self.capacity);
    }

    #[cfg(test)]
    fn level(&self) -> f64 {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn admits_what_fits_and_says_how_long_to_wait() {
        let t0 = Instant::now();
        // 600 a minute = 10 a second, 60 at once.
        let mut b = Bucket::new(600, 60, t0);
        assert!(b.check(40, t0).is_ok());
        b.take(40, t0);
        b.take(10, t0); // output, as it is produced
        assert_eq!(b.check(40, t0), Err(3)); // 10 there, 30 more at 10/s
                                             // Once waited, it fits.
        let later = t0 + Duration::from_secs(3);
        assert!(b.check(40, later).is_ok());
        // Debt is waited out too.
        b.take(100, later);
        assert_eq!(b.check(1, later), Err(7)); // level -60: 61 tokens to go
                                               // A prompt larger than the bucket needs a full bucket, not forever.
        let full = later + Duration::from_secs(60);
        assert!(b.check(10_000, full).is_ok());
        assert!((b.level() - 60.0).abs() < 1e-9);
        // Lowering the limit clamps what is there.
        b.set_limit(60, 5);
        assert_eq!(b.check(6, full), Ok(()));
        b.take(5, full);
        assert_eq!(b.check(1, full), Err(1));
    }
}

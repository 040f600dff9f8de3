//! Stop strings over streamed text.
//!
//! [`StopMatcher`] receives decoded text chunk by chunk (token boundaries fall
//! anywhere) and tells what may be emitted now. It holds back only the tail that
//! could still grow into a stop string: the longest suffix of the pending text
//! that is a proper prefix of some stop string (holding less could let a stop
//! string slip out). Once a stop string is complete, the text before it is
//! released and generation ends; the stop string itself is never emitted.

/// What to do after pushing a chunk of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// No stop string yet; this text is safe to emit now (maybe empty).
    Continue(String),
    /// A stop string matched; this is the text before it. Generation ends.
    Stopped(String),
}

/// Finds stop strings in streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted (a possible start of a stop string).
    pending: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored; an empty list passes all text through.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            pending: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds a chunk of text. After `Stopped`, further pushes return `Stopped("")`.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::Stopped(String::new());
        }
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);

        // The earliest complete stop string wins.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let mut before = std::mem::take(&mut self.pending);
            before.truncate(at);
            return StopOutcome::Stopped(before);
        }

        let hold = self.held_len();
        let emit_len = self.pending.len() - hold;
        let rest = self.pending.split_off(emit_len);
        StopOutcome::Continue(std::mem::replace(&mut self.pending, rest))
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_len(&self) -> usize {
        let p = self.pending.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(p.len());
            for k in (best + 1..=max).rev() {
                // `stop[..k]` must end on a char boundary; then `p[len-k..]` starts on one too.
                if stop.is_char_boundary(k) && p.ends_with(&stop[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// Releases the held text at the end of generation (empty after a stop).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn no_stop_strings_pass_everything_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("Hello"), StopOutcome::Continue("Hello".into()));
        assert_eq!(m.push(" wor"), StopOutcome::Continue(" wor".into()));
        assert_eq!(m.flush(), "");
        let mut m = matcher(&[""]);
        assert_eq!(m.push("x"), StopOutcome::Continue("x".into()));
    }

    #[test]
    fn stop_spanning_three_pushes() {
        let mut m = matcher(&["END!"]);
        assert_eq!(m.push("abc E"), StopOutcome::Continue("abc ".into()));
        assert_eq!(m.push("N"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("D!tail"), StopOutcome::Stopped("".into()));
        assert!(m.is_stopped());
        assert_eq!(m.flush(), "");
        assert_eq!(m.push("more"), StopOutcome::Stopped("".into()));
    }

    #[test]
    fn text_before_stop_in_same_push_is_returned() {
        let mut m = matcher(&["\n\n"]);
        assert_eq!(m.push("one\n"), StopOutcome::Continue("one".into()));
        assert_eq!(m.push("\ntwo"), StopOutcome::Stopped("".into()));
        let mut m = matcher(&["stop"]);
        assert_eq!(
            m.push("go go stop now"),
            StopOutcome::Stopped("go go ".into())
        );
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        let mut m = matcher(&["<end>"]);
        assert_eq!(m.push("a <e"), StopOutcome::Continue("a ".into()));
        assert_eq!(m.push("n"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("x"), StopOutcome::Continue("<enx".into()));
        assert_eq!(m.push(" <"), StopOutcome::Continue(" ".into()));
        assert_eq!(m.flush(), "<");
    }

    #[test]
    fn holds_the_longest_possible_start() {
        // "aba" could become "abab"; holding only "a" would leak the match.
        let mut m = matcher(&["abab"]);
        assert_eq!(m.push("xaba"), StopOutcome::Continue("x".into()));
        assert_eq!(m.push("b"), StopOutcome::Stopped("".into()));
        let mut m = matcher(&["abab"]);
        assert_eq!(m.push("xaba"), StopOutcome::Continue("x".into()));
        assert_eq!(m.push("c"), StopOutcome::Continue("abac".into()));
    }

    #[test]
    fn one_stop_is_a_prefix_of_another() {
        let mut m = matcher(&["ab", "abc"]);
        assert_eq!(m.push("xa"), StopOutcome::Continue("x".into()));
        assert_eq!(m.push("bc"), StopOutcome::Stopped("".into()));
        let mut m = matcher(&["abcd", "bc"]);
        assert_eq!(m.push("zab"), StopOutcome::Continue("z".into()));
        // "bc" completes first (earlier end, earliest start wins among complete ones).
        assert_eq!(m.push("c"), StopOutcome::Stopped("a".into()));
    }

    #[test]
    fn earliest_stop_wins() {
        let mut m = matcher(&["world", "lo"]);
        assert_eq!(m.push("hello world"), StopOutcome::Stopped("hel".into()));
    }

    #[test]
    fn multibyte_text_and_stops_respect_char_boundaries() {
        let mut m = matcher(&["日本", "é!"]);
        assert_eq!(m.push("caf"), StopOutcome::Continue("caf".into()));
        assert_eq!(m.push("é"), StopOutcome::Continue("".into()));
        assert_eq!(m.push("x日"), StopOutcome::Continue("éx".into()));
        assert_eq!(m.push("本語"), StopOutcome::Stopped("".into()));
        let mut m = matcher(&["€x"]);
        assert_eq!(m.push("a€"), StopOutcome::Continue("a".into()));
        assert_eq!(m.flush(), "€");
    }
}

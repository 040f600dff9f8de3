//! Prompts of a chosen approximate length made of varied common words.
//!
//! Each request gets its own word sequence (seeded by its index), so that no
//! two prompts share more than a few leading tokens and a server-side prefix
//! cache cannot skip prefill. Common lowercase English words are one token
//! each in the byte-level BPE vocabularies of small Llama-style models; with
//! the punctuation and the leading tag, `words_for(n)` words come to about
//! `n` tokens (100 asked gives 96 to 104 with SmolLM2's tokenizer).

const WORDS: &[&str] = &[
    "river", "stone", "village", "morning", "garden", "market", "winter", "bridge", "window",
    "teacher", "letter", "forest", "harbor", "valley", "engine", "station", "kitchen", "music",
    "summer", "island", "mountain", "story", "paper", "silver", "castle", "family", "doctor",
    "farmer", "city", "road", "water", "light", "house", "field", "train", "school", "night",
    "friend", "book", "table", "north", "south", "old", "new", "small", "large", "green", "quiet",
    "bright", "early", "late", "warm", "cold", "walked", "carried", "found", "built", "watched",
    "opened", "painted", "counted", "wrote", "sold", "heard", "near", "under", "over", "after",
    "before", "with", "from", "the", "and", "a", "of", "their",
];

/// How many words to use for about `tokens` prompt tokens.
pub fn words_for(tokens: usize) -> usize {
    (tokens * 85 / 100).max(1)
}

/// A prompt of about `tokens` tokens for request `idx`. With `tag`, the
/// prompt starts `Request {idx}/{tag}.` (unique per request and run).
pub fn prompt(idx: i64, tokens: usize, tag: Option<&str>) -> String {
    let mut out = match tag {
        Some(t) => format!("Request {idx}/{t}."),
        None => String::new(),
    };
    // A small linear congruential generator: deterministic, varied per idx.
    let mut state = (idx as u64)
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    let n = words_for(tokens);
    for i in 0..n {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let word = WORDS[(state >> 33) as usize % WORDS.len()];
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        if i % 12 == 11 || i + 1 == n {
            out.push('.');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_and_tag() {
        let p = prompt(3, 100, Some("42"));
        assert!(p.starts_with("Request 3/42. "));
        assert!(p.ends_with('.'));
        let words = p.split_whitespace().count();
        assert_eq!(words, 2 + words_for(100));
    }

    #[test]
    fn prompts_differ_between_requests_and_repeat_within_one() {
        assert_eq!(prompt(5, 100, None), prompt(5, 100, None));
        let (a, b) = (prompt(1, 100, None), prompt(2, 100, None));
        assert_ne!(a, b);
        // Not just a different first word: most positions differ.
        let same = a
            .split_whitespace()
            .zip(b.split_whitespace())
            .filter(|(x, y)| x == y)
            .count();
        assert!(same < 20, "{same} shared words");
    }
}

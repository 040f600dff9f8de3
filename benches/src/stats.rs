//! Summary statistics: percentiles by linear interpolation between closest
//! ranks (numpy's default, and what the Python reference script computes) and
//! means.

/// The `p`-th percentile (0 to 100) of `values`, interpolating linearly
/// between the two closest ranks. `None` when `values` is empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.len() == 1 {
        return Some(v[0]);
    }
    let rank = (v.len() - 1) as f64 * p.clamp(0.0, 100.0) / 100.0;
    let lo = rank.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// The arithmetic mean; `None` when `values` is empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Rounds to `digits` decimal places (for the summary's JSON).
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_of_empty_and_single() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
    }

    #[test]
    fn percentile_interpolates_between_ranks() {
        let v = [4.0, 1.0, 3.0, 2.0]; // sorted: 1 2 3 4
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        // rank 1.5 -> halfway between 2 and 3
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        // rank 0.95 * 3 = 2.85 -> 3 + 0.85
        assert!((percentile(&v, 95.0).unwrap() - 3.85).abs() < 1e-12);
    }

    #[test]
    fn percentile_matches_numpy_on_1_to_100() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        // numpy.percentile(range(1, 101), [50, 95]) == [50.5, 95.05]
        assert!((percentile(&v, 50.0).unwrap() - 50.5).abs() < 1e-9);
        assert!((percentile(&v, 95.0).unwrap() - 95.05).abs() < 1e-9);
    }

    #[test]
    fn mean_and_round() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(round(1.23456, 2), 1.23);
        assert_eq!(round(2.5, 0), 3.0);
    }
}

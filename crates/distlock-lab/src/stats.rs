//! Percentiles of latency samples.

/// The `p`-th percentile (0–100, nearest rank) of `samples`, sorting them in place; `None`
/// when there are none.
pub fn percentile(samples: &mut [u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    let i = rank.clamp(1, samples.len()) - 1;
    samples.get(i).copied()
}

/// p50 and p99 of `samples`.
pub fn p50_p99(samples: &mut [u64]) -> (Option<u64>, Option<u64>) {
    (percentile(samples, 50.0), percentile(samples, 99.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(percentile(&mut [5], 99.0), Some(5));
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(p50_p99(&mut v), (Some(50), Some(99)));
        assert_eq!(percentile(&mut v, 100.0), Some(100));
        assert_eq!(percentile(&mut v, 0.0), Some(1));
    }
}

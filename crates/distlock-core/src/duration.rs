//! Human durations (`500ms`, `10s`, `2m`) for URLs and the command line.

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses `250ms`, `10s`, `1.5s`, `2m`, `1h`, or a bare number of milliseconds.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock_core::parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert_eq!(distlock_core::parse_duration("2m").unwrap(), Duration::from_secs(120));
/// assert!(distlock_core::parse_duration("soon").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        Error::invalid(format!(
            "`{s}` is not a duration; write e.g. `500ms`, `10s`, `2m` or `1h`"
        ))
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" | "ms" => n,
        "us" | "µs" => n / 1000.0,
        "s" => n * 1000.0,
        "m" | "min" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        _ => return Err(bad()),
    };
    if !ms.is_finite() || !(0.0..=1e15).contains(&ms) {
        return Err(bad());
    }
    Ok(Duration::from_micros((ms * 1000.0).round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("15").unwrap(), Duration::from_millis(15));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(
            parse_duration(" 3h ").unwrap(),
            Duration::from_secs(3 * 3600)
        );
        assert_eq!(parse_duration("20us").unwrap(), Duration::from_micros(20));
        for bad in ["", "s", "-1s", "1d", "1..2s", "ms5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

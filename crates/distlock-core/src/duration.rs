//! Human durations (`500ms`, `10s`, `2m`) for URLs and the command line.

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses `250ms`, `10s`, `1.5s`, `2m`, `1h`, compounds such as `1h30m` or `2m 30s`, or a
/// bare number of milliseconds.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock_core::parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert_eq!(distlock_core::parse_duration("2m").unwrap(), Duration::from_secs(120));
/// assert_eq!(distlock_core::parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
/// assert!(distlock_core::parse_duration("soon").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration> {
    let bad = || {
        Error::invalid(format!(
            "`{s}` is not a duration; write e.g. `500ms`, `10s`, `2m`, `1h` or `1h30m`"
        ))
    };
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut ms = 0.0;
    let mut parts = 0;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(split);
        let tail = tail.trim_start();
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let n: f64 = num.parse().map_err(|_| bad())?;
        ms += match unit {
            // A bare number stands alone.
            "" if parts == 0 && tail.trim().is_empty() => n,
            "ms" => n,
            "us" | "µs" => n / 1000.0,
            "s" => n * 1000.0,
            "m" | "min" => n * 60_000.0,
            "h" => n * 3_600_000.0,
            _ => return Err(bad()),
        };
        parts += 1;
        rest = tail.trim_start();
    }
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
        assert_eq!(
            parse_duration("1h30m").unwrap(),
            Duration::from_secs(90 * 60)
        );
        assert_eq!(
            parse_duration("2m 30.5s").unwrap(),
            Duration::from_millis(150_500)
        );
        assert_eq!(
            parse_duration("1s500ms").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in [
            "", "s", "-1s", "1d", "1..2s", "ms5", "1h30", "30 1h", "1h-30m", "1 2",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

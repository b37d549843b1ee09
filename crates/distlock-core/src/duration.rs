//! Human durations (`500ms`, `10s`, `2m`) for URLs and the command line.

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses `250ms`, `10s`, `1.5s`, `2m`, `1h`, `1d`, compounds such as `1h30m` or `2m 30s`
/// (the grammar of the `humantime` crate), or a bare number of milliseconds.
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
    let t = s.trim();
    // humantime reads `30 1h` as 301 hours: a number is one run of digits.
    let words: Vec<&str> = t.split_whitespace().collect();
    if words.windows(2).any(|w| {
        w[0].ends_with(|c: char| c.is_ascii_digit())
            && w[1].starts_with(|c: char| c.is_ascii_digit())
    }) {
        return Err(bad());
    }
    let d = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        // A bare number: milliseconds.
        humantime::parse_duration(&format!("{t}ms"))
    } else {
        humantime::parse_duration(t)
    };
    d.ok().filter(|d| d.as_secs() <= MAX_SECS).ok_or_else(bad)
}

/// About 31,000 years: longer is a typo (and would overflow deadlines).
const MAX_SECS: u64 = 1_000_000_000_000;

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
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
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
            "", "s", "-1s", "1x", "1..2s", "ms5", "1h30", "30 1h", "1h-30m", "1 2",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}

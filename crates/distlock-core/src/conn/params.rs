//! Query parameters: typed getters and the check for unknown ones.
//!
//! Every getter reads the **last** occurrence of a key (`?a=1&a=2` is `a=2`), returns
//! `Ok(None)` when the key is absent, and fails with an [`Error::InvalidUrl`](crate::Error::InvalidUrl) that names the
//! parameter, the value given and what is accepted.

use super::ConnectionString;
use crate::error::Result;
use std::time::Duration;

impl ConnectionString {
    /// Every `(key, value)` pair of the query, decoded, in the order written.
    pub fn params(&self) -> &[(String, String)] {
        &self.params
    }

    /// The value of `key` (its last occurrence), decoded.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses a parameter that is not in `known`, naming it and listing the known ones (a
    /// backend that hands the rest to its driver reads its own and does not call this).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl): `unknown parameter `x` (known: a, b)`, or `… the s:// URL takes
    /// no parameters` when `known` is empty.
    ///
    /// ```
    /// use distlock_core::conn::ConnectionString;
    /// let cs = ConnectionString::parse("zk://h?namespace=a&sesion_timeout=5s")?;
    /// let e = cs.check_params(&["namespace", "session_timeout"]).unwrap_err();
    /// assert!(e.to_string().contains("unknown parameter `sesion_timeout` (known: namespace, session_timeout)"));
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    pub fn check_params(&self, known: &[&str]) -> Result<()> {
        match self
            .params
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, _)) if known.is_empty() => Err(self.invalid(format!(
                "unknown parameter `{k}`: the {}:// URL takes no parameters",
                self.scheme
            ))),
            Some((k, _)) => Err(self.invalid(format!(
                "unknown parameter `{k}` (known: {})",
                known.join(", ")
            ))),
        }
    }

    /// Reads `key` with `parse`; `what` says what is accepted, for the error.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) `key=`value` is not WHAT` when `parse` returns `None`.
    pub fn parse_param<T>(
        &self,
        key: &str,
        what: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.param(key) {
            None => Ok(None),
            Some(v) => match parse(v) {
                Some(t) => Ok(Some(t)),
                None => Err(self.invalid(format!("{key}=`{v}` is not {what}"))),
            },
        }
    }

    /// A duration (`250ms`, `10s`, `1.5s`, `2m`, `1h`, or bare milliseconds), read with
    /// [`crate::parse_duration`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) naming the parameter when the value is not a duration.
    pub fn duration(&self, key: &str) -> Result<Option<Duration>> {
        self.parse_param(key, "a duration; write e.g. 500ms, 10s, 2m or 1h", |v| {
            crate::parse_duration(v).ok()
        })
    }

    /// A whole number from 0 to 4294967295.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) naming the parameter when the value is not such a number.
    pub fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.parse_param(key, "a whole number from 0 to 4294967295", |v| {
            v.trim().parse().ok()
        })
    }

    /// A switch: `on`/`off`, `true`/`false`, `yes`/`no` or `1`/`0` (any case).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) naming the parameter and the accepted words otherwise.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.parse_param(key, "on or off (or true/false, yes/no, 1/0)", |v| {
            match v.trim().to_ascii_lowercase().as_str() {
                "on" | "true" | "yes" | "1" => Some(true),
                "off" | "false" | "no" | "0" => Some(false),
                _ => None,
            }
        })
    }

    /// One of the words in `accepted` (exact match), returned as the entry of `accepted`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) `key=`value` is not one of: a, b` otherwise.
    ///
    /// ```
    /// use distlock_core::conn::ConnectionString;
    /// let cs = ConnectionString::parse("postgres://u@h/db?mode=lease")?;
    /// assert_eq!(cs.choice("mode", &["session", "lease"])?, Some("lease"));
    /// let cs = ConnectionString::parse("postgres://u@h/db?mode=pool")?;
    /// let e = cs.choice("mode", &["session", "lease"]).unwrap_err().to_string();
    /// assert!(e.contains("mode=`pool` is not one of: session, lease"), "{e}");
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    pub fn choice<'a>(&self, key: &str, accepted: &[&'a str]) -> Result<Option<&'a str>> {
        let what = format!("one of: {}", accepted.join(", "));
        self.parse_param(key, &what, |v| accepted.iter().copied().find(|a| *a == v))
    }
}

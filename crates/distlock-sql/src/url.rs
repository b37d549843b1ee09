//! What the URL parsers of both SQL backends share: redaction, the `mode` and `namespace`
//! parameters, and percent-encoding of the parameters handed on to the driver.

use distlock_core::{Error, Result};

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            if u.query_pairs().any(|(k, _)| k == "password") {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if k == "password" {
                            "***".to_string()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => redact_raw(url),
    }
}

/// Masks `user:password@` in a string that is not a valid URL.
fn redact_raw(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[start..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!("{}{}:***{}", &url[..start], &rest[..colon], &rest[at..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// An [`Error::InvalidUrl`] for `url` (redacted) with `reason`.
pub fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl {
        url: redact(url),
        reason: reason.into(),
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The query of `pairs`, percent-encoded by hand (`query_pairs_mut` writes a space as `+`,
/// which not every driver decodes); `None` when empty.
pub fn query(pairs: &[(String, String)]) -> Option<String> {
    if pairs.is_empty() {
        return None;
    }
    let q: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", pct(k), pct(v)))
        .collect();
    Some(q.join("&"))
}

/// The parameters every SQL backend reads from its URL; the others are handed on.
#[derive(Debug)]
pub struct Params<M> {
    /// `mode=`, or the default.
    pub mode: M,
    /// `namespace=`, if given.
    pub namespace: Option<String>,
    /// Every other parameter, in order.
    pub rest: Vec<(String, String)>,
}

/// Parses `url` (a scheme of `schemes`), reading `mode=` (one of `modes`, the first the
/// default; `mode_hint` tells what they are) and `namespace=` (1 to 64 printable characters).
pub fn parse<M: Copy>(
    url: &str,
    schemes: &[&str],
    modes: &[(&str, M)],
    mode_hint: &str,
) -> Result<(url::Url, Params<M>)> {
    let u = url::Url::parse(url).map_err(|e| invalid(url, e.to_string()))?;
    if !schemes.contains(&u.scheme()) {
        let names: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        return Err(invalid(
            url,
            format!("scheme `{}` is not {}", u.scheme(), names.join(" or ")),
        ));
    }
    let Some(&(_, default)) = modes.first() else {
        return Err(Error::invalid("no mode to choose from"));
    };
    let mut p = Params {
        mode: default,
        namespace: None,
        rest: Vec::new(),
    };
    for (k, v) in u.query_pairs() {
        match k.as_ref() {
            "mode" => {
                p.mode = match modes.iter().find(|(n, _)| *n == v) {
                    Some((_, m)) => *m,
                    None => {
                        return Err(invalid(
                            url,
                            format!("mode=`{v}` is unknown; use {mode_hint}"),
                        ))
                    }
                }
            }
            "namespace" => {
                if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) {
                    return Err(invalid(
                        url,
                        "namespace must be 1 to 64 printable characters",
                    ));
                }
                p.namespace = Some(v.into_owned());
            }
            _ => p.rest.push((k.into_owned(), v.into_owned())),
        }
    }
    Ok((u, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts() {
        assert_eq!(
            redact("postgres://u:secret@h:1/d"),
            "postgres://u:***@h:1/d"
        );
        assert_eq!(redact("mysql://u:secret@h:x/d"), "mysql://u:***@h:x/d");
        assert!(!redact("postgres://u@h/d?password=secret").contains("secret"));
        assert_eq!(redact("no url"), "no url");
    }

    #[test]
    fn params() {
        let (_, p) = parse(
            "x://u@h/d?mode=b&namespace=n&k=v%20w",
            &["x"],
            &[("a", 1), ("b", 2)],
            "a or b",
        )
        .expect("parse");
        assert_eq!(p.mode, 2);
        assert_eq!(p.namespace.as_deref(), Some("n"));
        assert_eq!(query(&p.rest).as_deref(), Some("k=v%20w"));
        for bad in [
            "y://u@h/d",
            "x://u@h/d?mode=c",
            "x://u@h/d?namespace=",
            "nope",
        ] {
            assert!(parse(bad, &["x"], &[("a", 1)], "a").is_err(), "{bad}");
        }
    }
}

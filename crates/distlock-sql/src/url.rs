//! The URL parameters both SQL backends read beyond the core's
//! [`ConnectionString`]: `mode=` and `namespace=`, and the URL handed on to the driver.

use distlock_core::conn::ConnectionString;
use distlock_core::Result;

/// The parameters every SQL backend reads from its URL.
#[derive(Debug)]
#[non_exhaustive]
pub struct Params<M> {
    /// `mode=`, or the default.
    pub mode: M,
    /// `namespace=`, if given.
    pub namespace: Option<String>,
}

/// Reads `mode=` (one of `modes`, the first the default; `hint` says what they are, as
/// "mode=a (…) or mode=b (…)") and `namespace=` (1 to 64 printable characters) of `cs`.
///
/// # Errors
/// [`distlock_core::Error::InvalidUrl`] (redacted) for an unknown mode or a bad namespace.
pub fn params<M: Copy>(
    cs: &ConnectionString,
    modes: &[(&str, M)],
    hint: &str,
) -> Result<Params<M>> {
    let Some(&(_, default)) = modes.first() else {
        return Err(cs.invalid("no mode to choose from"));
    };
    let mode = match cs.param("mode") {
        None => default,
        Some(v) => match modes.iter().find(|(n, _)| *n == v) {
            Some((_, m)) => *m,
            None => return Err(cs.invalid(format!("mode=`{v}` is unknown; use {hint}"))),
        },
    };
    let namespace = match cs.param("namespace") {
        None => None,
        Some(v) if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) => {
            return Err(cs.invalid("namespace must be 1 to 64 printable characters"));
        }
        Some(v) => Some(v.to_owned()),
    };
    Ok(Params { mode, namespace })
}

/// The URL for the driver: `cs` without the parameters in `ours` (which the driver would
/// refuse), its query re-encoded with `%20` for a space (which every driver decodes).
pub fn driver_url(cs: &ConnectionString, ours: &[&str]) -> String {
    let mut d = cs.clone();
    d.retain_params(|k, _| !ours.contains(&k));
    d.expose_url().to_owned()
}

/// `user:password@` for the URL of a builder made on an application's own driver settings,
/// so that they stand as a URL's would (`""` without a user; the password only when UTF-8:
/// the driver's settings keep any other).
pub fn userinfo(user: Option<&str>, password: Option<&[u8]>) -> String {
    use distlock_core::conn::percent_encode;
    let Some(user) = user else {
        return String::new();
    };
    match password.and_then(|p| std::str::from_utf8(p).ok()) {
        Some(p) => format!("{}:{}@", percent_encode(user), percent_encode(p)),
        None => format!("{}@", percent_encode(user)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mode_and_namespace() {
        let cs = ConnectionString::parse("x://u@h/d?mode=b&namespace=n&k=v%20w").expect("parse");
        let p = params(&cs, &[("a", 1), ("b", 2)], "a or b").expect("params");
        assert_eq!(p.mode, 2);
        assert_eq!(p.namespace.as_deref(), Some("n"));
        assert_eq!(driver_url(&cs, &["mode", "namespace"]), "x://u@h/d?k=v%20w");
        assert_eq!(userinfo(Some("a b"), Some(b"p@ss")), "a%20b:p%40ss@");
        assert_eq!(userinfo(Some("a"), Some(&[0xff])), "a@");
        assert_eq!(userinfo(None, Some(b"p")), "");
        for bad in ["x://u@h/d?mode=c", "x://u@h/d?namespace="] {
            let cs = ConnectionString::parse(bad).expect("parse");
            assert!(params(&cs, &[("a", 1)], "a").is_err(), "{bad}");
        }
    }
}

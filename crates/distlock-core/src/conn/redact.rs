//! Masking the password of a connection string, parsed or not.

/// Parameter names whose values are masked like the password (compared case-insensitively).
const SECRET_PARAMS: [&str; 5] = ["password", "passwd", "pass", "secret", "token"];

/// How [`mask`] found the password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// No `user:password@` part.
    Nothing,
    /// A `user:password@` before the first `/`, `?` or `#`.
    InAuthority,
    /// A host part, then an `@` after the first `/`, `?` or `#` with a `:` before it: a
    /// password with an unencoded `/`, `?` or `#` (or an `@` in a path or parameter);
    /// everything from the first `:` to the last `@` is masked.
    Ambiguous,
}

/// `url` with the password and any `password=`-like parameter value (also a prefixed one such
/// as `sentinel_password=`) replaced by `***`.
///
/// Works on any text, also one that does not parse: when it cannot tell where a password
/// ends it masks more, never less.
///
/// ```
/// use distlock_core::conn::redact;
/// assert_eq!(redact("redis://u:secret@h:6379/0"), "redis://u:***@h:6379/0");
/// assert_eq!(redact("postgres://u@h/db?password=secret&mode=lease"), "postgres://u@h/db?password=***&mode=lease");
/// assert_eq!(redact("redis://u:se/cr?et@h"), "redis://u:***@h");
/// assert_eq!(redact("etcd://h1:2379,h2/prefix"), "etcd://h1:2379,h2/prefix");
/// assert_eq!(redact("redis+sentinel://s1/m?sentinel_password=x&namespace=n"), "redis+sentinel://s1/m?sentinel_password=***&namespace=n");
/// ```
pub fn redact(url: &str) -> String {
    mask(url).0
}

pub(super) fn mask(url: &str) -> (String, Found) {
    let (prefix, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let (head, found, tail) = if let Some(at) = authority.rfind('@') {
        let userinfo = &authority[..at];
        match userinfo.find(':') {
            Some(colon) => (
                format!("{}:***", &userinfo[..colon]),
                Found::InAuthority,
                &rest[at..],
            ),
            None => (String::new(), Found::Nothing, rest),
        }
    } else if authority.is_empty() {
        // `file:///a:b@c`, `postgres:///db?…`: no user info can start after an empty host.
        (String::new(), Found::Nothing, rest)
    } else {
        match rest.rfind('@') {
            Some(at) => match rest[..at].find(':') {
                Some(colon) => (
                    format!("{}:***", &rest[..colon]),
                    Found::Ambiguous,
                    &rest[at..],
                ),
                None => (String::new(), Found::Nothing, rest),
            },
            None => (String::new(), Found::Nothing, rest),
        }
    };
    (format!("{prefix}{head}{}", mask_params(tail)), found)
}

/// Masks the values of secret parameters in `tail` (the text from the hosts on).
fn mask_params(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_owned();
    };
    let (before, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if is_secret(k) => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}{}{fragment}", pairs.join("&"))
}

pub(super) fn is_secret(key: &str) -> bool {
    let key = super::decode_form(key);
    let lower = key.to_ascii_lowercase();
    // `sentinel_password=` and the like: a password for something else is still a secret.
    SECRET_PARAMS
        .iter()
        .any(|s| lower == *s || lower.ends_with(&format!("_{s}")))
}

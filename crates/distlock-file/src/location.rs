//! `file://` URLs, the default directory and the namespace subdirectory.

use crate::record::fnv1a_128;
use distlock_core::conn::{redact, ConnectionString};
use distlock_core::{Error, Result};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

const FORMS: &str =
    "use `file://` for the default directory or `file:///absolute/dir` (three slashes)";

/// Parses a `file://` URL (with the core's [`ConnectionString`]: one parser, redacted errors)
/// into the directory it names: `file:///abs/dir`, or `None` for `file://` (the default one).
pub(crate) fn parse_url(url: &str) -> Result<Option<PathBuf>> {
    // `file:/x` and `file:x` are not `scheme://` URLs: say what to write instead.
    if let Some((scheme, rest)) = url.split_once(':') {
        if scheme.eq_ignore_ascii_case("file") && !rest.starts_with("//") {
            return Err(Error::invalid_url(
                redact(url),
                format!("a `file:` URL starts with `file://`; {FORMS}"),
            ));
        }
    }
    let cs = ConnectionString::parse(url)?;
    if cs.scheme() != "file" {
        return Err(cs.invalid(format!(
            "the file backend takes `file:` URLs, not `{}:`; {FORMS}",
            cs.scheme()
        )));
    }
    if url.contains(['?', '#']) {
        return Err(cs.invalid(format!(
            "query strings and fragments are not supported (options come from ClientOptions); {FORMS}"
        )));
    }
    if cs.user().is_some() || cs.password().is_some() {
        return Err(cs.invalid(format!("a `file:` URL names no user or password; {FORMS}")));
    }
    match cs.hosts() {
        [] => {}
        [h] if h.host.eq_ignore_ascii_case("localhost") && h.port.is_none() => {}
        [h, ..] => {
            return Err(cs.invalid(format!(
                "`{h}` is read as a host name, and file locks only work on this host; for a path write `file:///{h}{}`",
                cs.raw_path()
            )))
        }
    }
    if cs.raw_path().is_empty() {
        return Ok(None);
    }
    let bytes = cs.path_bytes()?;
    if bytes.contains(&0) {
        return Err(cs.invalid("the path contains a NUL byte (%00)"));
    }
    let dir = PathBuf::from(OsString::from_vec(bytes));
    if dir == Path::new("/") {
        return Err(cs.invalid(format!(
            "the root directory cannot hold lock files; {FORMS}"
        )));
    }
    Ok(Some(dir))
}

/// The subdirectory of namespace `ns`: the namespace itself, with every byte outside
/// `[A-Za-z0-9._-]` (and a leading `.`) percent-encoded; `ns-<FNV-1a-128 hex>` when that is
/// longer than 128 bytes.
pub(crate) fn namespace_dir(ns: &str) -> String {
    let mut out = String::with_capacity(ns.len());
    for (i, b) in ns.bytes().enumerate() {
        match b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            true => out.push(char::from(b)),
            false => out.push_str(&format!("%{b:02X}")),
        }
    }
    match out.len() {
        1..=128 => out,
        _ => format!("ns-{:032x}", fnv1a_128(ns.as_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason of the error `parse_url(url)` fails with.
    fn reason(url: &str) -> String {
        match parse_url(url) {
            Err(Error::InvalidUrl { reason, .. }) => reason,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn urls() {
        let ok = |url: &str| parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(ok("file://"), None);
        assert_eq!(ok("FILE://"), None);
        assert_eq!(ok("file://localhost"), None);
        assert_eq!(
            ok("file:///var/lib/app/locks"),
            Some("/var/lib/app/locks".into())
        );
        assert_eq!(ok("file://localhost/a%20b/"), Some("/a b/".into()));
        // `:` and `@` in a path are path bytes, not a port or user info.
        assert_eq!(
            ok("file:///srv/a:b@c/locks"),
            Some("/srv/a:b@c/locks".into())
        );
        let e = reason("file://tmp/x");
        assert!(e.contains("file:///tmp/x"), "{e}");
        assert!(reason("file:/tmp/x").contains("file://"));
        assert!(reason("redis://x").contains("`redis:`"));
        assert!(reason("/tmp/x").contains("scheme"));
        assert!(reason("file:///tmp?x=1").contains("query"));
        assert!(reason("file:///tmp?").contains("query"));
        assert!(reason("file:///").contains("root"));
        assert!(reason("file:///a%zz").contains("%25"));
        assert!(reason("file:///a%00").contains("NUL"));
        assert!(reason("file://localhost:1/x").contains("host name"));
        // A user or password is refused, and never shown.
        let e = parse_url("file://me:s3cret@localhost/x").unwrap_err();
        assert!(e.to_string().contains("no user or password"), "{e}");
        assert!(!format!("{e} {e:?}").contains("s3cret"), "{e:?}");
    }

    #[test]
    fn namespaces() {
        assert_eq!(namespace_dir("dlock"), "dlock");
        assert_eq!(namespace_dir("my-app_1.x"), "my-app_1.x");
        assert_eq!(namespace_dir(".."), "%2E.");
        assert_eq!(namespace_dir("a/b c"), "a%2Fb%20c");
        assert!(namespace_dir(&"π".repeat(64)).starts_with("ns-"));
        assert!(namespace_dir("").starts_with("ns-"));
    }
}

//! `file://` URLs, the default directory and the namespace subdirectory.

use crate::record::fnv1a_128;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Where a `file://` URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// `file://`: the default directory.
    Default,
    /// `file:///abs/dir`.
    Dir(PathBuf),
}

const FORMS: &str =
    "use `file://` for the default directory or `file:///absolute/dir` (three slashes)";

/// Parses a `file://` URL; `Err` is the reason, for [`distlock_core::Error::InvalidUrl`].
pub(crate) fn parse_url(url: &str) -> Result<Target, String> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(format!("it has no scheme; {FORMS}"));
    };
    if !scheme.eq_ignore_ascii_case("file") {
        return Err(format!(
            "the file backend takes `file:` URLs, not `{scheme}:`; {FORMS}"
        ));
    }
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(format!("a `file:` URL starts with `file://`; {FORMS}"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "query strings and fragments are not supported (options come from ClientOptions); {FORMS}"
        ));
    }
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
        return Err(format!(
            "`{host}` is read as a host name, and file locks only work on this host; for a path write `file:///{}`",
            rest.trim_start_matches('/')
        ));
    }
    if path.is_empty() {
        return Ok(Target::Default);
    }
    let bytes = percent_decode(path)?;
    if bytes.contains(&0) {
        return Err("the path contains a NUL byte (%00)".into());
    }
    let dir = PathBuf::from(OsString::from_vec(bytes));
    if dir == Path::new("/") {
        return Err(format!(
            "the root directory cannot hold lock files; {FORMS}"
        ));
    }
    Ok(Target::Dir(dir))
}

fn percent_decode(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    format!(
                        "`%` at byte {i} of the path is not followed by two hex digits (write `%25` for a literal `%`)"
                    )
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// The directory `file://` uses: `$XDG_RUNTIME_DIR/dlock` when `XDG_RUNTIME_DIR` is set to an
/// absolute path, else `/tmp/dlock-$UID`.
pub(crate) fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d).join("dlock"),
        _ => PathBuf::from(format!("/tmp/dlock-{}", crate::sys::uid())),
    }
}

/// The subdirectory of namespace `ns`: the namespace itself, with every byte outside
/// `[A-Za-z0-9._-]` (and a leading `.`) percent-encoded; `ns-<FNV-1a-128 hex>` when that is
/// longer than 128 bytes.
pub(crate) fn namespace_dir(ns: &str) -> String {
    let mut out = String::with_capacity(ns.len());
    for (i, b) in ns.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if plain {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() || out.len() > 128 {
        format!("ns-{:032x}", fnv1a_128(ns.as_bytes()))
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("file://"), Ok(Target::Default));
        assert_eq!(parse_url("FILE://"), Ok(Target::Default));
        assert_eq!(parse_url("file://localhost"), Ok(Target::Default));
        assert_eq!(
            parse_url("file:///var/lib/app/locks"),
            Ok(Target::Dir("/var/lib/app/locks".into()))
        );
        assert_eq!(
            parse_url("file://localhost/a%20b/"),
            Ok(Target::Dir("/a b/".into()))
        );
        let e = parse_url("file://tmp/x").unwrap_err();
        assert!(e.contains("file:///tmp/x"), "{e}");
        assert!(parse_url("file:/tmp/x").unwrap_err().contains("file://"));
        assert!(parse_url("redis://x").unwrap_err().contains("`redis:`"));
        assert!(parse_url("/tmp/x").unwrap_err().contains("scheme"));
        assert!(parse_url("file:///tmp?x=1").unwrap_err().contains("query"));
        assert!(parse_url("file:///").unwrap_err().contains("root"));
        assert!(parse_url("file:///a%zz").unwrap_err().contains("%25"));
        assert!(parse_url("file:///a%00").unwrap_err().contains("NUL"));
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

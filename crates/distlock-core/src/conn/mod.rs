//! One parser for every backend's connection string.
//!
//! Every dlock URL has the same outline, whatever the backend:
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]…][/path][?key=value&…][#fragment]
//! ```
//!
//! [`ConnectionString::parse`] splits it into those parts without knowing the scheme: the
//! scheme (lower-cased), the user and password (percent-decoded; the password is a
//! [`Password`], whose `Debug` and `Display` print `***`), the list of hosts (`h1:p1,h2:p2`,
//! IPv6 as `[::1]:p`, the port left for the backend's default), the path (raw, with
//! [`ConnectionString::path`] to decode it) and the query parameters (decoded like an HTML
//! form: `%XX` and `+` for a space). A backend then reads what it knows with typed getters
//! ([`duration`](ConnectionString::duration), [`u32`](ConnectionString::u32),
//! [`bool`](ConnectionString::bool), [`choice`](ConnectionString::choice)) and refuses the rest
//! with [`check_params`](ConnectionString::check_params); every error is an
//! [`Error::InvalidUrl`] that carries the [`redacted`](ConnectionString::redacted) URL, never
//! the password.
//!
//! ```
//! use distlock_core::conn::ConnectionString;
//! use std::time::Duration;
//!
//! let cs = ConnectionString::parse("redlock://app:s%40cret@a:7000,b,[::1]:7002/2?node_timeout=20ms")?;
//! assert_eq!(cs.scheme(), "redlock");
//! assert_eq!(cs.user(), Some("app"));
//! assert_eq!(cs.password().map(|p| p.expose()), Some("s@cret"));
//! let nodes: Vec<String> = cs.hosts().iter().map(|h| h.endpoint(6379)).collect();
//! assert_eq!(nodes, ["a:7000", "b:6379", "[::1]:7002"]);
//! assert_eq!(cs.path()?, "/2");
//! cs.check_params(&["node_timeout", "namespace"])?;
//! assert_eq!(cs.duration("node_timeout")?, Some(Duration::from_millis(20)));
//! assert_eq!(cs.redacted(), "redlock://app:***@a:7000,b,[::1]:7002/2?node_timeout=20ms");
//! assert!(!format!("{cs:?}").contains("cret"));
//! # Ok::<(), distlock_core::Error>(())
//! ```
//!
//! Parsing never panics, whatever the input; [`redact`] masks the password of any text, even
//! one that does not parse.

mod builder;
mod classify;
mod files;
mod params;
mod redact;
mod scrub;
mod secret;
#[cfg(test)]
mod tests;
mod tls;
pub mod tlsmode;
#[cfg(feature = "rustls")]
mod verify;

pub use builder::{
    Builder, Connect, CredentialRule, Credentials, EcosystemQuery, EcosystemRule, Env, Settings,
};
pub use files::{TlsFiles, TlsNames};
pub use redact::redact;
pub use scrub::MIN_SCRUBBED_LEN;
pub use secret::{read_password_file, resolve_password, PasswordSource};
#[cfg(feature = "rustls")]
pub use tls::{crypto_provider, install_crypto_provider, rustls_error, system_roots};
pub use tls::{ClientCert, TlsError, TlsErrorKind, TlsWords};
#[cfg(feature = "rustls")]
pub use verify::ServerCheck;

use crate::error::{Error, Result};
use std::fmt;

/// Whether `host` — a name, an address, or `host:port` (IPv6 in brackets) — is this
/// machine's loopback (`localhost`, `127.0.0.0/8`, `::1`): what `doctor` checks before it
/// warns about a clear-text connection.
///
/// ```
/// use distlock_core::conn::is_loopback;
///
/// assert!(is_loopback("localhost") && is_loopback("127.0.0.2:6379") && is_loopback("[::1]:1"));
/// assert!(!is_loopback("10.0.0.1") && !is_loopback("db.example:5432"));
/// ```
pub fn is_loopback(host: &str) -> bool {
    let bare = |h: &str| {
        let h = h.trim_start_matches('[').trim_end_matches(']');
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    bare(host) || host.rsplit_once(':').is_some_and(|(h, _)| bare(h))
}

/// A password from a connection string. `Debug` and `Display` print `***`; the text is only
/// reachable through [`Password::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    /// The password itself, for the driver that sends it. Never put it in a message.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One entry of the host list: a name or address and an optional port.
///
/// An IPv6 address is kept without its brackets (`::1`); [`Host::endpoint`] and `Display`
/// put them back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Host {
    /// Host name or address as written (not percent-decoded), IPv6 without brackets.
    pub host: String,
    /// The port, when the URL gives one.
    pub port: Option<u16>,
}

impl Host {
    /// A host entry.
    pub fn new(host: impl Into<String>, port: Option<u16>) -> Self {
        Host {
            host: host.into(),
            port,
        }
    }

    /// The port, or `default` when the URL gives none.
    pub fn port_or(&self, default: u16) -> u16 {
        self.port.unwrap_or(default)
    }

    /// True for an IPv6 address (written in brackets in the URL).
    pub fn is_ipv6(&self) -> bool {
        self.host.contains(':')
    }

    /// `host:port` (`[v6]:port`), with `default_port` when the URL gives none.
    pub fn endpoint(&self, default_port: u16) -> String {
        Host::new(self.host.clone(), Some(self.port_or(default_port))).to_string()
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ipv6() {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// A parsed connection string; see the [module documentation](self).
///
/// `Debug` and `Display` show the [redacted](Self::redacted) URL.
#[derive(Clone)]
pub struct ConnectionString {
    /// The text as given (password included): only [`Self::expose_url`] hands it out.
    raw: String,
    redacted: String,
    scheme: String,
    user: Option<String>,
    password: Option<Password>,
    hosts: Vec<Host>,
    path: String,
    params: Vec<(String, String)>,
    fragment: Option<String>,
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnectionString")
            .field(&self.redacted)
            .finish()
    }
}

impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::str::FromStr for ConnectionString {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ConnectionString::parse(s)
    }
}

/// The scheme of `url` (lower-cased), when it starts with a well-formed `scheme://`.
///
/// ```
/// assert_eq!(distlock_core::conn::scheme_of("Redis://h"), Some("redis".to_owned()));
/// assert_eq!(distlock_core::conn::scheme_of("localhost:6379"), None);
/// ```
pub fn scheme_of(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    valid_scheme(scheme).then(|| scheme.to_ascii_lowercase())
}

/// RFC 3986: `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
pub(crate) fn valid_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

impl ConnectionString {
    /// Splits `url` into its parts; see the [module documentation](self).
    ///
    /// Percent-escapes in the user, password and parameters are decoded; a `%` not followed by
    /// two hex digits is kept as it is (as browsers and the `url` crate do). The path is kept
    /// raw: [`Self::path`] decodes it strictly.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the redacted URL) when there is no `scheme://`, when an
    /// entry of the host list is empty or not `host[:port]` (ports are 1 to 65535, IPv6
    /// addresses go in brackets), or when the user or password is not UTF-8 once decoded.
    pub fn parse(url: &str) -> Result<Self> {
        let (redacted, found) = redact::mask(url);
        let bad = |reason: String| Error::InvalidUrl {
            url: redacted.clone(),
            reason,
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad(
                "no scheme; write e.g. redis://127.0.0.1:6379 or file:///tmp/locks".into(),
            ));
        };
        if found == redact::Found::Ambiguous {
            // Part of a password may sit in the path or the parameters: refuse rather than
            // read it as a host, a path or a value that messages would show.
            return Err(bad(
                "an `@` after the host list, with a `:` before it: percent-encode `/`, `?`, `#` \
                 and `@` in a password (`%2F`, `%3F`, `%23`, `%40`), and `@` in a path or a \
                 parameter (`%40`)"
                    .into(),
            ));
        }
        if !valid_scheme(scheme) {
            return Err(bad(format!(
                "`{scheme}` is not a scheme (a letter, then letters, digits, `+`, `-` or `.`)"
            )));
        }
        let rest_all = rest;
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, f)) => (r, Some(f.to_owned())),
            None => (rest, None),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (u, p) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode_text(u, false)
                    .ok_or_else(|| bad("the user is not UTF-8 once percent-decoded".into()))?;
                let password = match p {
                    Some(p) => Some(Password(decode_text(p, false).ok_or_else(|| {
                        bad("the password is not UTF-8 once percent-decoded".into())
                    })?)),
                    None => None,
                };
                (Some(user), password)
            }
        };
        let hosts = if hostlist.is_empty() {
            Vec::new()
        } else {
            hostlist
                .split(',')
                .map(|entry| parse_host(entry, hostlist).map_err(&bad))
                .collect::<Result<Vec<_>>>()?
        };
        let params = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (decode_form(k), decode_form(v))
            })
            .collect();
        Ok(ConnectionString {
            // Drivers compare schemes in lower case (tokio-postgres, redlock's own check).
            raw: format!("{}://{rest_all}", scheme.to_ascii_lowercase()),
            redacted,
            scheme: scheme.to_ascii_lowercase(),
            user,
            password,
            hosts,
            path: path.to_owned(),
            params,
            fragment,
        })
    }

    /// The scheme, lower-cased (`redis`, `rediss`, `zk`, …).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded, when the URL has a `user@` or `user:password@` part
    /// (possibly empty: `:pw@host` gives `Some("")`).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, percent-decoded, when the user info has a `:`.
    pub fn password(&self) -> Option<&Password> {
        self.password.as_ref()
    }

    /// The host list, in the order written; empty for `scheme:///path` or `scheme://`.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The one host of a single-server URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] "no host; write EXAMPLE" when the host list is empty, "one host
    /// only …; write EXAMPLE" when it has several.
    ///
    /// ```
    /// use distlock_core::conn::ConnectionString;
    /// let cs = ConnectionString::parse("redis://a:1,b:2")?;
    /// let e = cs.single_host("redis://host:port").unwrap_err().to_string();
    /// assert!(e.contains("one host only"), "{e}");
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    pub fn single_host(&self, example: &str) -> Result<&Host> {
        match self.hosts.as_slice() {
            [one] => Ok(one),
            [] => Err(self.invalid(format!("no host; write {example}"))),
            many => Err(self.invalid(format!(
                "one host only ({} given); write {example}",
                many.len()
            ))),
        }
    }

    /// `host:port` of every host, with `default_port` where the URL gives none, joined by
    /// `,`: the endpoint text for messages (it never holds credentials).
    pub fn endpoints(&self, default_port: u16) -> String {
        let all: Vec<String> = self
            .hosts
            .iter()
            .map(|h| h.endpoint(default_port))
            .collect();
        all.join(",")
    }

    /// The path as written (still percent-encoded), with its leading `/`; empty when none.
    pub fn raw_path(&self) -> &str {
        &self.path
    }

    /// The path, percent-decoded, with its leading `/` (`""` when the URL has none).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when a `%` is not followed by two hex digits or the decoded path
    /// is not UTF-8 (use [`Self::path_bytes`] for file names that need not be UTF-8).
    pub fn path(&self) -> Result<String> {
        String::from_utf8(self.path_bytes()?)
            .map_err(|_| self.invalid("the path is not UTF-8 once percent-decoded"))
    }

    /// The path, percent-decoded to bytes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] when a `%` is not followed by two hex digits.
    pub fn path_bytes(&self) -> Result<Vec<u8>> {
        percent_decode_strict(&self.path).map_err(|at| {
            self.invalid(format!(
                "`%` at byte {at} of the path is not followed by two hex digits \
                 (write `%25` for a literal `%`)"
            ))
        })
    }

    /// The text after `#`, when there is one (no backend uses it; most refuse it).
    pub fn fragment(&self) -> Option<&str> {
        self.fragment.as_deref()
    }

    /// The URL with the password (and any `password=`-like parameter) replaced by `***`: the
    /// form for every message, error and log line.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The URL as given, its scheme in lower case (or rebuilt from the parts after [`Self::set_scheme`],
    /// [`Self::set_hosts`] or [`Self::retain_params`]), password included, for a driver that
    /// parses it itself. Never put it in a message; use [`Self::redacted`].
    pub fn expose_url(&self) -> &str {
        &self.raw
    }

    /// An [`Error::InvalidUrl`] about this URL (redacted) with `reason`.
    pub fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: self.redacted.clone(),
            reason: reason.into(),
        }
    }

    /// Replaces the scheme (e.g. `redlock` → `redis` for the URL of one node).
    pub fn set_scheme(&mut self, scheme: &str) {
        self.scheme = scheme.to_ascii_lowercase();
        self.refresh();
    }

    /// Replaces the host list (e.g. one node of a multi-host URL).
    pub fn set_hosts(&mut self, hosts: Vec<Host>) {
        self.hosts = hosts;
        self.refresh();
    }

    /// Keeps only the parameters for which `keep(key, value)` is true (e.g. those a driver
    /// understands, once the backend has read its own).
    pub fn retain_params(&mut self, mut keep: impl FnMut(&str, &str) -> bool) {
        self.params.retain(|(k, v)| keep(k, v));
        self.refresh();
    }

    /// After an edit: the raw text is rebuilt from the parts, and redacted again.
    fn refresh(&mut self) {
        self.fragment = None;
        self.raw = self.to_url();
        self.redacted = redact(&self.raw);
    }

    /// The URL rebuilt from its parts (user, password and parameters percent-encoded; a space
    /// as `%20`, which every driver decodes).
    fn to_url(&self) -> String {
        let mut out = format!("{}://", self.scheme);
        if let Some(u) = &self.user {
            out.push_str(&percent_encode(u));
            if let Some(p) = &self.password {
                out.push(':');
                out.push_str(&percent_encode(&p.0));
            }
            out.push('@');
        }
        let hosts: Vec<String> = self.hosts.iter().map(Host::to_string).collect();
        out.push_str(&hosts.join(","));
        out.push_str(&self.path);
        let q: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect();
        if !q.is_empty() {
            out.push('?');
            out.push_str(&q.join("&"));
        }
        if let Some(f) = &self.fragment {
            out.push('#');
            out.push_str(f);
        }
        out
    }
}

/// One entry of the host list: `host`, `host:port`, `[v6]`, `[v6]:port`.
fn parse_host(entry: &str, list: &str) -> std::result::Result<Host, String> {
    let shape = || {
        if list.contains(',') {
            format!("`{entry}` in the host list `{list}` is not host[:port]")
        } else {
            format!("`{entry}` is not host[:port]")
        }
    };
    if entry.is_empty() {
        return Err(format!(
            "an empty entry in the host list `{list}`; write host1:port1,host2:port2"
        ));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{entry}`: unclosed `[` in an IPv6 address"))?;
        let port = match after {
            "" => None,
            a => Some(
                a.strip_prefix(':')
                    .ok_or_else(|| format!("`{entry}`: expected `:port` after `]`"))?,
            ),
        };
        if h.is_empty()
            || !h.contains(':')
            || h.contains(|c: char| !c.is_ascii_hexdigit() && !matches!(c, ':' | '.' | '%'))
        {
            return Err(format!("`[{h}]` is not an IPv6 address"));
        }
        (h, port)
    } else {
        let (h, port) = match entry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err(format!(
                "`{entry}`: write an IPv6 address in brackets, e.g. [::1]:6379"
            ));
        }
        if h.is_empty()
            || h.contains(|c: char| {
                c.is_whitespace() || c.is_control() || "[]<>\\^`{|}\"".contains(c)
            })
        {
            return Err(shape());
        }
        (h, port)
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("`{p}` in `{entry}` is not a port number (1 to 65535)"))?,
        ),
    };
    Ok(Host::new(host, port))
}

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Percent-decodes `s`; a `%` without two hex digits after it stays as it is; `plus` turns
/// `+` into a space (the form encoding of query strings).
fn decode_bytes(s: &str, plus: bool) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => match (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

fn decode_text(s: &str, plus: bool) -> Option<String> {
    String::from_utf8(decode_bytes(s, plus)).ok()
}

/// Query keys and values: bytes that are not UTF-8 once decoded become U+FFFD.
fn decode_form(s: &str) -> String {
    String::from_utf8_lossy(&decode_bytes(s, true)).into_owned()
}

/// Percent-decodes `s` strictly: `Err(byte offset)` of a `%` not followed by two hex digits.
pub fn percent_decode_strict(s: &str) -> std::result::Result<Vec<u8>, usize> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            match (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => out.push(h * 16 + l),
                _ => return Err(i),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Percent-encodes every byte but the unreserved ones of RFC 3986 (`A-Z a-z 0-9 - . _ ~`).
///
/// ```
/// assert_eq!(distlock_core::conn::percent_encode("p@ss word/1"), "p%40ss%20word%2F1");
/// ```
pub fn percent_encode(s: &str) -> String {
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

//! The TLS modes of the SQL clients: libpq's `sslmode` and MySQL's `--ssl-mode` name the same
//! five, each in its own spelling ([`SslModeNames`]); the checks they share are here, the
//! driver glue stays with each backend.

use super::ConnectionString;
use crate::Result;

/// Whether a connection is encrypted and what of the server's certificate is checked (libpq's
/// `sslmode`, MySQL's `--ssl-mode`). Each backend's docs have the table of its own rules.
/// Exhaustive: the backends match every mode (libpq's `allow` is refused, not a mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Never encrypt.
    Disable,
    /// Encrypt if the server supports TLS, else go on unencrypted (the clients' default).
    #[default]
    Prefer,
    /// Encrypt or fail.
    Require,
    /// Encrypt, and the server's certificate must chain to the CA given.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must be valid for the host name connected to.
    VerifyFull,
}

const ALL: [SslMode; 5] = [
    SslMode::Disable,
    SslMode::Prefer,
    SslMode::Require,
    SslMode::VerifyCa,
    SslMode::VerifyFull,
];

impl SslMode {
    /// Whether the mode checks the server's certificate against a CA.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// Whether the mode may go unencrypted (a build without TLS can do it).
    pub fn may_be_plain(self) -> bool {
        matches!(self, SslMode::Disable | SslMode::Prefer)
    }

    /// What of the server's certificate is checked, in words (for `doctor`).
    pub fn checked(chain: bool, name: bool) -> &'static str {
        match (chain, name) {
            (true, true) => "certificate chain and host name checked",
            (true, false) => "certificate chain checked, host name not",
            (false, _) => "certificate not checked",
        }
    }
}

/// How a client ecosystem spells [`SslMode`] and its TLS settings, in URLs and messages.
#[derive(Debug, Clone, Copy)]
pub struct SslModeNames {
    /// The URL parameter (`sslmode`, `ssl-mode`).
    pub param: &'static str,
    /// The spellings, in the order of [`SslMode`]'s variants.
    pub modes: [&'static str; 5],
    /// Whether case and `-` / `_` are ignored when parsing (the mysql client's rule).
    pub loose: bool,
    /// What to give for a verifying mode without a CA (`sslrootcert=PATH (PEM)`).
    pub ca_hint: &'static str,
    /// Whether `VerifyFull` may go without a CA (built-in public roots).
    pub builtin_roots: bool,
    /// The backend crate, for the message of a build without its `tls` feature.
    pub krate: &'static str,
}

impl SslModeNames {
    /// `mode`'s spelling.
    pub fn of(&self, mode: SslMode) -> &'static str {
        self.modes[mode as usize]
    }

    /// `param=spelling`, for messages.
    pub fn setting(&self, mode: SslMode) -> String {
        format!("{}={}", self.param, self.of(mode))
    }

    /// The mode spelled `v`.
    pub fn parse(&self, v: &str) -> Option<SslMode> {
        let norm = |s: &str| match self.loose {
            true => s.to_ascii_uppercase().replace('-', "_"),
            false => s.to_owned(),
        };
        ALL.into_iter().find(|m| norm(self.of(*m)) == norm(v))
    }

    /// The URL's mode, given as `v` (`None`: not given).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) naming the spellings, for an unknown one.
    pub fn from_url(&self, cs: &ConnectionString, v: Option<&str>) -> Result<Option<SslMode>> {
        let Some(v) = v else { return Ok(None) };
        self.parse(v).map(Some).ok_or_else(|| {
            let [a, b, c, d, e] = self.modes;
            cs.invalid(format!(
                "{}=`{v}` is unknown; use {a}, {b}, {c}, {d} or {e}",
                self.param
            ))
        })
    }

    /// The combinations both clients refuse: a verifying mode without a CA (unless built-in
    /// roots serve `VerifyFull`), and TLS in a build without it (`tls_built`: the backend's
    /// `tls` feature).
    ///
    /// # Errors
    /// The reason, for the caller's error.
    pub fn check(
        &self,
        mode: SslMode,
        ca: bool,
        files: bool,
        tls_built: bool,
    ) -> std::result::Result<(), String> {
        let roots_built_in = self.builtin_roots && mode == SslMode::VerifyFull;
        if mode.verifies() && !ca && !roots_built_in {
            return Err(format!(
                "{} checks the server's certificate against a CA: give {}",
                self.setting(mode),
                self.ca_hint
            ));
        }
        if !tls_built && (!mode.may_be_plain() || files) {
            return Err(format!(
                "{} needs TLS, and {} is built without its `tls` feature; enable it, or use {}",
                self.setting(mode),
                self.krate,
                self.setting(SslMode::Disable)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOSE: SslModeNames = SslModeNames {
        param: "ssl-mode",
        modes: ["OFF", "MAYBE", "ON", "CA", "FULL_CHECK"],
        loose: true,
        ca_hint: "ssl-ca=PATH",
        builtin_roots: true,
        krate: "x",
    };

    #[test]
    fn spellings_and_checks() {
        let strict = SslModeNames {
            modes: ["off", "maybe", "on", "ca", "full-check"],
            loose: false,
            builtin_roots: false,
            ..LOOSE
        };
        assert_eq!(LOOSE.parse("full-Check"), Some(SslMode::VerifyFull));
        assert_eq!(strict.parse("full-check"), Some(SslMode::VerifyFull));
        assert_eq!(strict.parse("FULL-CHECK"), None);
        assert_eq!(strict.setting(SslMode::Prefer), "ssl-mode=maybe");
        let cs = ConnectionString::parse("x://u:pw@h/?ssl-mode=no").expect("url");
        let e = LOOSE.from_url(&cs, Some("no")).unwrap_err().to_string();
        assert!(e.contains("use OFF, MAYBE, ON, CA or FULL_CHECK"), "{e}");
        assert!(!e.contains("pw"), "{e}");
        assert_eq!(LOOSE.from_url(&cs, None).ok(), Some(None));
        assert!(LOOSE.check(SslMode::VerifyFull, false, false, true).is_ok());
        assert!(strict
            .check(SslMode::VerifyFull, false, false, true)
            .is_err());
        assert!(LOOSE.check(SslMode::VerifyCa, false, false, true).is_err());
        assert!(LOOSE.check(SslMode::VerifyCa, true, true, true).is_ok());
        assert!(LOOSE.check(SslMode::Prefer, false, false, false).is_ok());
        let e = LOOSE
            .check(SslMode::Prefer, false, true, false)
            .unwrap_err();
        assert!(
            e.contains("x is built without") && e.ends_with("ssl-mode=OFF"),
            "{e}"
        );
        assert_eq!(
            SslMode::checked(true, false),
            "certificate chain checked, host name not"
        );
    }
}

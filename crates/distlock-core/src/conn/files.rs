//! The PEM files of a TLS connection — the CA to trust, a client certificate and its key —
//! read once for every backend, with the errors that name the setting and the file (never
//! what is in it).

use super::ConnectionString;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// How a backend names its TLS file settings (URL parameters and builder setters), for
/// messages and for [`TlsFiles::from_url`]: each list is the name, then its aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsNames {
    /// The CA certificates to trust (e.g. `["sslrootcert"]`, `["ca_file", "cacert"]`).
    pub ca: &'static [&'static str],
    /// The client certificate chain.
    pub cert: &'static [&'static str],
    /// The client certificate's private key.
    pub key: &'static [&'static str],
}

impl TlsNames {
    /// `cacert=`, `cert=` and `key=` (etcd's and ZooKeeper's spelling).
    pub const CACERT: TlsNames = TlsNames {
        ca: &["cacert"],
        cert: &["cert"],
        key: &["key"],
    };

    pub(crate) fn first(names: &'static [&'static str]) -> &'static str {
        names.first().copied().unwrap_or("tls")
    }
}

/// The TLS files of a connection: the CA certificates to trust (else the system's, or none,
/// as the backend says) and a client certificate with its key. Reading checks that each file
/// holds what it should, and every error is an [`Error::InvalidArgument`] naming the setting
/// and the path.
///
/// ```
/// use distlock_core::conn::{ConnectionString, TlsFiles, TlsNames};
///
/// let cs = ConnectionString::parse("etcds://h?cacert=/nonexistent/ca.pem")?;
/// let files = TlsFiles::from_url(&cs, TlsNames::CACERT)?;
/// assert_eq!(files.ca(), Some(std::path::Path::new("/nonexistent/ca.pem")));
/// let e = files.read_ca().expect_err("no such file");
/// assert!(e.to_string().contains("cannot read `cacert=/nonexistent/ca.pem`"), "{e}");
/// # Ok::<(), distlock_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
    names: TlsNames,
    der: bool,
}

/// What a PEM file of each kind must hold.
const CERTIFICATE: &str = "CERTIFICATE";
const PRIVATE_KEY: &str = "PRIVATE KEY";

impl TlsFiles {
    /// No file yet, the settings named `names`.
    pub fn new(names: TlsNames) -> Self {
        TlsFiles {
            ca: None,
            client: None,
            names,
            der: false,
        }
    }

    /// Files that are not text are taken as DER and passed on unchecked (for a driver that
    /// reads both forms).
    #[must_use]
    pub fn der_too(mut self) -> Self {
        self.der = true;
        self
    }

    /// The files `cs` names with `names` (an alias given with its name is refused, as is a
    /// certificate without its key or a key without its certificate).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] (redacted) for a setting given twice, an empty path, or half a
    /// client pair.
    pub fn from_url(cs: &ConnectionString, names: TlsNames) -> Result<Self> {
        let one = |list: &'static [&'static str]| -> Result<Option<PathBuf>> {
            let given: Vec<(&str, &str)> = list
                .iter()
                .filter_map(|n| cs.param(n).map(|v| (*n, v)))
                .collect();
            match given.as_slice() {
                [] => Ok(None),
                [(n, "")] => {
                    Err(cs.invalid(format!("`{n}=` is empty; give the path of a PEM file")))
                }
                [(_, v)] => Ok(Some(PathBuf::from(v))),
                _ => Err(cs.invalid(format!(
                    "give the file once: `{}` are the same setting",
                    list.join("=` or `")
                ))),
            }
        };
        let (cert_name, key_name) = (TlsNames::first(names.cert), TlsNames::first(names.key));
        let client = match (one(names.cert)?, one(names.key)?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(cs.invalid(format!(
                    "`{cert_name}=` needs the client certificate's key too: add `&{key_name}=PATH`"
                )))
            }
            (None, Some(_)) => {
                return Err(cs.invalid(format!(
                    "`{key_name}=` needs its client certificate too: add `&{cert_name}=PATH`"
                )))
            }
        };
        Ok(TlsFiles {
            ca: one(names.ca)?,
            client,
            ..TlsFiles::new(names)
        })
    }

    /// The TLS files of a URL of a backend with a plain scheme and a TLS one (`etcd://` and
    /// `etcds://`, `zk://` and `zks://`): `None` for `plain`, where a TLS setting is refused;
    /// `Some` for `secure`, the files `names` names read as [`TlsFiles::from_url`] does.
    ///
    /// ```
    /// use distlock_core::conn::{ConnectionString, TlsFiles, TlsNames};
    ///
    /// let of = |url| {
    ///     let cs = ConnectionString::parse(url)?;
    ///     TlsFiles::of_scheme(&cs, ["zk", "zks"], TlsNames::CACERT, "write zks://…")
    /// };
    /// assert_eq!(of("zk://h")?, None);
    /// assert_eq!(of("zks://h?cacert=/ca.pem")?.and_then(|f| f.ca().map(|p| p.to_owned())),
    ///            Some("/ca.pem".into()));
    /// assert!(of("zk://h?cacert=/ca.pem").is_err());
    /// assert!(of("http://h").is_err());
    /// # Ok::<(), distlock_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] (redacted) for another scheme; for a TLS setting with `plain`
    /// (`hint` says what to write, as for
    /// [`Settings::tls_files`](super::Settings::tls_files)); and as [`TlsFiles::from_url`].
    pub fn of_scheme(
        cs: &ConnectionString,
        [plain, secure]: [&str; 2],
        names: TlsNames,
        hint: &str,
    ) -> Result<Option<Self>> {
        match cs.scheme() {
            s if s == secure => TlsFiles::from_url(cs, names).map(Some),
            s if s == plain => {
                let mut all = names.ca.iter().chain(names.cert).chain(names.key);
                match all.find(|n| cs.param(n).is_some()) {
                    Some(n) => Err(cs.invalid(format!("`{n}=` is a TLS setting: {hint}"))),
                    None => Ok(None),
                }
            }
            s => Err(cs.invalid(format!("scheme `{s}` is not {plain}:// or {secure}://"))),
        }
    }

    /// Trust the CA certificates in `path` (PEM).
    #[must_use]
    pub fn with_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Show the client certificate chain `cert` with its private key `key` (both PEM).
    #[must_use]
    pub fn with_client(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    /// The CA file, if given.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The client certificate and key files, if given.
    pub fn client(&self) -> Option<(&Path, &Path)> {
        self.client
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The names of the settings.
    pub fn names(&self) -> TlsNames {
        self.names
    }

    /// The error about the file of setting `param` at `path`: it says which, and `detail`.
    pub fn file_error(param: &str, path: &Path, detail: impl std::fmt::Display) -> Error {
        Error::InvalidArgument(format!(
            "`{param}={}`: {detail}; give a readable PEM file",
            path.display()
        ))
    }

    /// The bytes of `path` (setting `param`), checked to hold a PEM block of `what` (unless
    /// they are binary and DER is taken too).
    fn read(&self, param: &str, path: &Path, what: &str) -> Result<Vec<u8>> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot read `{param}={}`: {e}; give a readable PEM file",
                path.display()
            ))
        })?;
        let Ok(text) = std::str::from_utf8(&bytes) else {
            if self.der {
                return Ok(bytes);
            }
            return Err(Self::file_error(
                param,
                path,
                "it is not a PEM file (not text)",
            ));
        };
        if !text.contains("-----BEGIN ") || !text.contains(&format!("{what}-----")) {
            return Err(Self::file_error(
                param,
                path,
                format!("it is not a PEM file with a {what} (`-----BEGIN …{what}-----`)"),
            ));
        }
        Ok(bytes)
    }

    /// The CA file's bytes (PEM, with at least one certificate), if given.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the setting for a file that cannot be read or holds
    /// no certificate.
    pub fn read_ca(&self) -> Result<Option<Vec<u8>>> {
        let param = TlsNames::first(self.names.ca);
        self.ca
            .as_deref()
            .map(|p| self.read(param, p, CERTIFICATE))
            .transpose()
    }

    /// The client certificate's and key's bytes (PEM), if given.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the setting for a file that cannot be read or does
    /// not hold a certificate (or a private key).
    pub fn read_client(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let Some((cert, key)) = &self.client else {
            return Ok(None);
        };
        let chain = self.read(TlsNames::first(self.names.cert), cert, CERTIFICATE)?;
        let key = self.read(TlsNames::first(self.names.key), key, PRIVATE_KEY)?;
        Ok(Some((chain, key)))
    }
}

#[cfg(feature = "rustls")]
mod parsed {
    use super::{TlsFiles, TlsNames};
    use crate::error::Result;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::RootCertStore;
    use std::path::Path;

    fn certs(param: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| TlsFiles::file_error(param, path, e))?;
        if certs.is_empty() {
            return Err(TlsFiles::file_error(param, path, "no certificate in it"));
        }
        Ok(certs)
    }

    impl TlsFiles {
        /// The CA file's certificates as rustls roots, if given (feature `rustls`).
        ///
        /// # Errors
        /// As [`TlsFiles::read_ca`], and for a certificate rustls cannot use.
        pub fn roots(&self) -> Result<Option<RootCertStore>> {
            let (Some(path), Some(pem)) = (self.ca(), self.read_ca()?) else {
                return Ok(None);
            };
            let param = TlsNames::first(self.names.ca);
            let mut store = RootCertStore::empty();
            for c in certs(param, path, &pem)? {
                store
                    .add(c)
                    .map_err(|e| TlsFiles::file_error(param, path, e))?;
            }
            Ok(Some(store))
        }

        /// The client certificate chain and its private key, parsed (feature `rustls`).
        ///
        /// # Errors
        /// As [`TlsFiles::read_client`], and for a chain or key rustls cannot parse.
        pub fn identity(
            &self,
        ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>> {
            let (Some((cert, key)), Some((chain_pem, key_pem))) =
                (self.client(), self.read_client()?)
            else {
                return Ok(None);
            };
            let chain = certs(TlsNames::first(self.names.cert), cert, &chain_pem)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                TlsFiles::file_error(
                    TlsNames::first(self.names.key),
                    key,
                    format!("no private key: {e}"),
                )
            })?;
            Ok(Some((chain, key)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG: TlsNames = TlsNames {
        ca: &["sslrootcert"],
        cert: &["sslcert"],
        key: &["sslkey"],
    };

    #[test]
    fn url_settings() {
        let names = TlsNames {
            ca: &["ca_file", "cacert"],
            ..TlsNames::CACERT
        };
        let cs = ConnectionString::parse("x://h?cacert=/ca&cert=/c&key=/k").expect("url");
        let f = TlsFiles::from_url(&cs, names).expect("files");
        assert_eq!(f.ca(), Some(Path::new("/ca")));
        assert_eq!(f.client(), Some((Path::new("/c"), Path::new("/k"))));
        for (bad, want) in [
            ("x://h?cacert=/a&ca_file=/b", "`ca_file=` or `cacert`"),
            ("x://h?cert=/c", "add `&key=PATH`"),
            ("x://h?key=/k", "add `&cert=PATH`"),
            ("x://h?cacert=", "`cacert=` is empty"),
        ] {
            let cs = ConnectionString::parse(bad).expect("url");
            let e = TlsFiles::from_url(&cs, names).expect_err(bad).to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn the_scheme_says_whether_tls_files_may_be_given() {
        let of = |url: &str| {
            let cs = ConnectionString::parse(url).expect("url");
            TlsFiles::of_scheme(&cs, ["x", "xs"], PG, "write xs://… (x:// is plain)")
        };
        assert_eq!(of("x://h?other=1").expect("plain"), None);
        assert_eq!(of("xs://h").expect("tls"), Some(TlsFiles::new(PG)));
        let f = of("xs://h?sslrootcert=/ca").expect("tls").expect("files");
        assert_eq!(f.ca(), Some(Path::new("/ca")));
        for (bad, want) in [
            (
                "x://h?sslkey=/k",
                "`sslkey=` is a TLS setting: write xs://… (x:// is plain)",
            ),
            ("y://h", "scheme `y` is not x:// or xs://"),
            ("xs://h?sslcert=/c", "add `&sslkey=PATH`"),
        ] {
            let e = of(bad).expect_err(bad).to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn files_are_checked_and_named() {
        let dir = std::env::temp_dir().join(format!("dlock-tls-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let missing = TlsFiles::new(PG).with_ca(dir.join("missing.pem"));
        let e = missing.read_ca().expect_err("missing").to_string();
        assert!(e.contains("cannot read `sslrootcert="), "{e}");
        let e = TlsFiles::new(PG)
            .with_client(&junk, &junk)
            .read_client()
            .expect_err("junk")
            .to_string();
        assert!(
            e.contains("`sslcert=") && e.contains("not a PEM file with a CERTIFICATE"),
            "{e}"
        );
        assert_eq!(TlsFiles::new(PG).read_client().expect("none"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

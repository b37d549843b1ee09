//! Throwaway TLS certificates for test servers, made in-process with `rcgen` (ECDSA P-256).

use crate::{Error, Result, TempDir};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A test CA and a server certificate for `127.0.0.1`/`localhost` it signed, as PEM files in a
/// temp dir removed on drop; [`client`](Self::client) signs client certificates.
pub struct TestCerts {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: TempDir,
}

impl std::fmt::Debug for TestCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCerts")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

fn cert_error(e: rcgen::Error) -> Error {
    Error::Start {
        what: "test certificates".into(),
        detail: e.to_string(),
    }
}

fn leaf(cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Result<CertificateParams> {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).map_err(cert_error)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    Ok(params)
}

impl TestCerts {
    /// Generates a CA and a server certificate for `127.0.0.1` and `localhost` signed by it:
    /// `ca.pem`, `server.pem` and `server.key` in [`dir`](Self::dir).
    pub fn generate() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("dlock-certs").tempdir()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "dlock-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(cert_error)?;
        let ca = CertifiedIssuer::self_signed(params, key).map_err(cert_error)?;
        std::fs::write(dir.path().join("ca.pem"), ca.pem())?;
        let certs = TestCerts { ca, dir };
        certs.sign(
            "server",
            leaf(
                "127.0.0.1",
                &["127.0.0.1", "localhost"],
                ExtendedKeyUsagePurpose::ServerAuth,
            )?,
        )?;
        Ok(certs)
    }

    /// Signs a client certificate (extended key usage `clientAuth`) with common name `name`,
    /// for servers that check clients (`--tls-auth-clients yes`). Returns the certificate and
    /// its key, `NAME.pem` and `NAME.key` in [`dir`](Self::dir).
    pub fn client(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.sign(name, leaf(name, &[], ExtendedKeyUsagePurpose::ClientAuth)?)
    }

    fn sign(&self, file: &str, params: CertificateParams) -> Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params.signed_by(&key, &self.ca).map_err(cert_error)?;
        let (pem, key_file) = (
            self.dir.path().join(format!("{file}.pem")),
            self.dir.path().join(format!("{file}.key")),
        );
        std::fs::write(&pem, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok((pem, key_file))
    }

    /// The CA certificate (PEM) clients must trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server key (PEM, PKCS#8).
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_ca_server_and_client_pems() {
        let certs = TestCerts::generate().expect("certs");
        for f in [certs.ca(), certs.cert()] {
            let text = std::fs::read_to_string(&f).expect("read");
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        }
        let key = std::fs::read_to_string(certs.key()).expect("key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        let (cert, key) = certs.client("alice").expect("client cert");
        assert!(cert.ends_with("alice.pem") && key.ends_with("alice.key"));
        assert!(std::fs::read_to_string(cert)
            .expect("read")
            .starts_with("-----BEGIN CERTIFICATE-----"));
    }
}

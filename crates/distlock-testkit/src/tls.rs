//! Throwaway TLS certificates for test servers, made with the `openssl` command.

use crate::{Error, Result, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A test CA and a server certificate for `127.0.0.1`/`localhost`, in a temp dir removed on drop.
#[derive(Debug)]
pub struct TestCerts {
    dir: TempDir,
}

impl TestCerts {
    /// Generates a CA and a server certificate signed by it (RSA 2048, valid 2 days).
    pub fn generate() -> Result<Self> {
        let dir = TempDir::with_prefix("dlock-certs")?;
        let d = dir.path();
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )?;
        let steps: [&[&str]; 3] = [
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=dlock-test-ca",
            ],
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Error::BinaryMissing {
                        binary: "openssl".into(),
                        package: "openssl".into(),
                    },
                    _ => Error::Io(e),
                })?;
            if !out.status.success() {
                return Err(Error::Start {
                    what: format!("openssl {}", args.join(" ")),
                    detail: String::from_utf8_lossy(&out.stderr).into_owned(),
                });
            }
        }
        Ok(TestCerts { dir })
    }

    /// The CA certificate (PEM) clients must trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server key (PEM).
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

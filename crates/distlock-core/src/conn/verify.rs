//! A rustls client configuration from a backend's [`TlsFiles`], with the server check its
//! mode asks for (feature `rustls`): none (encrypt only), the chain, or the chain and the
//! host name. The handshake's signatures are always checked, so the session key belongs to
//! the certificate's key.

use super::{crypto_provider, TlsFiles, TlsNames};
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// What of the server's certificate a connection checks.
#[derive(Debug, Clone)]
pub enum ServerCheck {
    /// Nothing (encrypted, not authenticated: libpq's `require` without a root certificate).
    None,
    /// That it chains to these roots, whatever host name it is for.
    Chain(RootCertStore),
    /// That it chains to these roots and is valid for the host name connected to.
    ChainAndName(RootCertStore),
}

impl TlsFiles {
    /// The rustls client configuration of these files: the server checked as `check` says,
    /// and the client certificate presented if one is given (feature `rustls`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a client certificate or key that cannot be read or
    /// parsed, or a key that does not go with its certificate.
    pub fn client_config(&self, check: ServerCheck) -> Result<ClientConfig> {
        let provider = crypto_provider();
        let (roots, check_name) = match check {
            ServerCheck::None => (None, false),
            ServerCheck::Chain(r) => (Some(Arc::new(r)), false),
            ServerCheck::ChainAndName(r) => (Some(Arc::new(r)), true),
        };
        let verifier = Arc::new(Verifier {
            roots,
            check_name,
            algorithms: provider.signature_verification_algorithms,
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::InvalidArgument(format!("TLS setup: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let (Some((cert, key)), Some((chain, key_der))) = (self.client(), self.identity()?) else {
            return Ok(builder.with_no_client_auth());
        };
        let names = self.names();
        builder.with_client_auth_cert(chain, key_der).map_err(|e| {
            let cert = format!("{}={}", TlsNames::first(names.cert), cert.display());
            TlsFiles::file_error(
                TlsNames::first(names.key),
                key,
                format!("does not go with {cert}: {e}"),
            )
        })
    }
}

/// The server certificate check of [`ServerCheck`].
#[derive(Debug)]
struct Verifier {
    roots: Option<Arc<RootCertStore>>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(roots) = &self.roots else {
            return Ok(ServerCertVerified::assertion());
        };
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if self.check_name {
            verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_and_file_errors() {
        let files = TlsFiles::new(TlsNames::CACERT);
        for check in [
            ServerCheck::None,
            ServerCheck::Chain(RootCertStore::empty()),
            ServerCheck::ChainAndName(RootCertStore::empty()),
        ] {
            let config = files.client_config(check).expect("a config without files");
            assert!(!config.client_auth_cert_resolver.has_certs());
        }
        let e = files
            .with_client("/nonexistent/c.pem", "/nonexistent/k.pem")
            .client_config(ServerCheck::None)
            .expect_err("no such file");
        assert!(e.to_string().contains("`cert=/nonexistent/c.pem`"), "{e}");
    }
}

//! Mapping etcd-client errors onto dlock's error type.

use distlock_core::conn::ClientCert;
use distlock_core::Error;
use tonic::Code;

/// Backend kind, as reported by [`Backend::kind`](distlock_core::Backend::kind).
pub(crate) const KIND: &str = "etcd";

/// Maps an etcd-client error to a dlock error.
pub(crate) fn map(endpoint: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let conn = |e: etcd_client::Error| Error::connection(KIND, endpoint.to_owned(), e);
    if let Some(tls) = crate::tls::classify(&e, ClientCert::Unknown) {
        return Error::connection(KIND, endpoint.to_owned(), tls);
    }
    match e {
        E::GRpcStatus(ref s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Unknown
            | Code::Internal => conn(e),
            Code::Unauthenticated | Code::PermissionDenied => {
                Error::auth(KIND, endpoint.to_owned(), s.message().to_owned())
            }
            Code::InvalidArgument
                if s.message().contains("authentication failed")
                    || s.message().contains("user name is empty")
                    || s.message().contains("invalid auth token") =>
            {
                Error::auth(KIND, endpoint.to_owned(), s.message().to_owned())
            }
            _ => Error::unexpected(KIND, format!("etcd refused the request: {s}")),
        },
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            conn(e)
        }
        other => Error::unexpected(KIND, other.to_string()),
    }
}

/// True if the error says the lease does not exist (any more).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("lease not found")
        }
        _ => false,
    }
}

/// An error for a reply that does not have the shape dlock wrote.
pub(crate) fn shape(message: impl Into<String>) -> Error {
    Error::unexpected(KIND, message)
}

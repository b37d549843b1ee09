//! Taking the password back out of messages that a backend or driver wrote.

use super::{decode_form, redact, ConnectionString};
use crate::error::{BoxError, Error};

/// Secrets shorter than this (in characters) are not searched for in messages: replacing
/// every `a` of a message would make it unreadable.
pub const MIN_SCRUBBED_LEN: usize = 4;

/// The password and secret parameter values of `raw`, as written (still percent-encoded).
fn written_secrets(raw: &str) -> Vec<String> {
    let rest = raw.split_once("://").map_or(raw, |(_, r)| r);
    let rest = rest.split('#').next().unwrap_or(rest);
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = main.split('/').next().unwrap_or(main);
    let mut out = Vec::new();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if let Some((_, pw)) = userinfo.split_once(':') {
            out.push(pw.to_owned());
        }
    }
    for pair in query.split('&') {
        if let Some((k, v)) = pair.split_once('=') {
            if super::redact::is_secret(k) {
                out.push(v.to_owned());
                out.push(decode_form(v));
            }
        }
    }
    out
}

impl ConnectionString {
    /// Every text of this URL that must not appear in a message, longest first.
    fn secrets(&self) -> Vec<String> {
        let mut all = written_secrets(&self.raw);
        if let Some(p) = &self.password {
            all.push(p.expose().to_owned());
        }
        all.retain(|s| s.chars().count() >= MIN_SCRUBBED_LEN);
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        all.dedup();
        all
    }

    /// `text` with every occurrence of the password (decoded or as written) and of secret
    /// parameter values replaced by `***` (those of at least [`MIN_SCRUBBED_LEN`] characters).
    pub fn scrub(&self, text: &str) -> String {
        scrub_with(&self.secrets(), text)
    }

    /// `err` with the password taken out of every text it carries (see [`Self::scrub`]): the
    /// safety net for messages a backend or driver built from the raw URL. A driver error
    /// that shows the password is replaced by its scrubbed text.
    pub fn scrub_error(&self, err: Error) -> Error {
        let secrets = self.secrets();
        if secrets.is_empty() {
            return err;
        }
        let s = |t: String| scrub_with(&secrets, &t);
        match err {
            Error::InvalidUrl { url, reason } => Error::InvalidUrl {
                url: s(redact(&url)),
                reason: s(reason),
            },
            Error::InvalidArgument(m) => Error::InvalidArgument(s(m)),
            Error::Runtime(m) => Error::Runtime(s(m)),
            Error::Unsupported { backend, operation } => Error::Unsupported {
                backend,
                operation: s(operation),
            },
            Error::Connection {
                backend,
                endpoint,
                source,
            } => {
                let shown = format!("{source} {source:?}");
                let source: BoxError = if secrets.iter().any(|p| shown.contains(p.as_str())) {
                    s(source.to_string()).into()
                } else {
                    source
                };
                Error::Connection {
                    backend,
                    endpoint: s(endpoint),
                    source,
                }
            }
            Error::Auth {
                backend,
                endpoint,
                message,
            } => Error::Auth {
                backend,
                endpoint: s(endpoint),
                message: s(message),
            },
            Error::UnexpectedReply { backend, message } => Error::UnexpectedReply {
                backend,
                message: s(message),
            },
            other => other,
        }
    }
}

fn scrub_with(secrets: &[String], text: &str) -> String {
    let mut out = text.to_owned();
    for p in secrets {
        if out.contains(p.as_str()) {
            out = out.replace(p.as_str(), "***");
        }
    }
    out
}

//! Backends by URL scheme: which constructor `connect("scheme://…")` calls.
//!
//! A [`Registry`] maps a scheme to an async constructor of a [`Backend`]. It also knows the
//! schemes of backends that exist but are not built into this program, so that
//! `postgres://…` in a build without PostgreSQL says which cargo feature to enable instead of
//! "unknown scheme". Every error shows the URL [redacted](crate::conn::redact).
//!
//! The `distlock` facade builds the default registry from its cargo features; a program adds
//! its own scheme with `distlock::register`, or keeps a registry of its own:
//!
//! ```
//! use distlock_core::registry::Registry;
//! use distlock_core::{Backend, ClientOptions};
//! use std::sync::Arc;
//!
//! # async fn demo() -> distlock_core::Result<()> {
//! let mut registry = Registry::new();
//! registry.register_not_built("postgres", "postgres")?;
//! registry.register("mem", |url, _opts| async move {
//!     // Build the backend from the parsed URL: url.hosts(), url.param("…"), …
//!     Err::<Arc<dyn Backend>, _>(url.invalid("this example has no backend"))
//! })?;
//! let opts = ClientOptions::default();
//! let Err(err) = registry.open("postgres://u:secret@h/db", &opts).await else { panic!() };
//! assert!(err.to_string().contains("enable the `postgres` cargo feature"));
//! assert!(!err.to_string().contains("secret"));
//! let Err(err) = registry.open("nope://h", &opts).await else { panic!() };
//! assert!(err.to_string().contains("unknown scheme `nope`; this program understands mem://"));
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

use crate::conn::{self, ConnectionString};
use crate::{Backend, Client, ClientOptions, Error, Result};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed, `Send` future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A backend constructor as the registry stores it.
pub type Connector = Arc<
    dyn Fn(ConnectionString, ClientOptions) -> BoxFuture<'static, Result<Arc<dyn Backend>>>
        + Send
        + Sync,
>;

#[derive(Clone)]
enum Entry {
    Built(Connector),
    /// The cargo feature that builds it.
    NotBuilt(String),
}

/// Schemes and their backend constructors; see the [module documentation](self).
///
/// Cloning is cheap (the constructors are shared).
#[derive(Clone, Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("schemes", &self.schemes())
            .field("not_built", &self.not_built())
            .finish()
    }
}

fn check_scheme(scheme: &str) -> Result<String> {
    if conn::valid_scheme(scheme) {
        Ok(scheme.to_ascii_lowercase())
    } else {
        Err(Error::invalid(format!(
            "`{scheme}` is not a URL scheme (a letter, then letters, digits, `+`, `-` or `.`; \
             no `://`)"
        )))
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Makes `scheme://…` URLs open a backend with `connect(url, opts)`. The URL is parsed
    /// before `connect` is called; a scheme registered before is replaced. Schemes are
    /// compared without regard to case.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `scheme` is not a URL scheme (`redis`, `my+tls`).
    pub fn register<F, Fut, B>(&mut self, scheme: &str, connect: F) -> Result<&mut Self>
    where
        F: Fn(ConnectionString, ClientOptions) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<B>> + Send + 'static,
        B: IntoBackend,
    {
        let scheme = check_scheme(scheme)?;
        let connector: Connector = Arc::new(move |url, opts| {
            let fut = connect(url, opts);
            Box::pin(async move { fut.await.map(IntoBackend::into_backend) })
        });
        self.entries.insert(scheme, Entry::Built(connector));
        Ok(self)
    }

    /// Makes `scheme://…` URLs open the backend of settings type `X` (see
    /// [`Connect`](crate::conn::Connect)): the parsed URL goes to
    /// [`Builder::parsed`](crate::conn::Builder::parsed), credentials come from it and the
    /// environment, and the backend connects with one [`Settings`](crate::conn::Settings).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `scheme` is not a URL scheme.
    pub fn register_connect<X: crate::conn::Connect>(&mut self, scheme: &str) -> Result<&mut Self> {
        self.register(scheme, |url, opts| {
            crate::conn::Builder::<X>::parsed(url)
                .options(opts)
                .connect()
        })
    }

    /// Records `scheme` as a backend this program was built without: opening it fails with
    /// a message that names the cargo `feature` of `distlock` that builds it. Replaces a
    /// built backend of that scheme.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `scheme` is not a URL scheme.
    pub fn register_not_built(&mut self, scheme: &str, feature: &str) -> Result<&mut Self> {
        let scheme = check_scheme(scheme)?;
        self.entries
            .insert(scheme, Entry::NotBuilt(feature.to_owned()));
        Ok(self)
    }

    /// Forgets `scheme`; true when it was there.
    pub fn unregister(&mut self, scheme: &str) -> bool {
        self.entries.remove(&scheme.to_ascii_lowercase()).is_some()
    }

    /// The schemes that open a backend, sorted.
    pub fn schemes(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Built(_)))
            .map(|(s, _)| s.as_str())
            .collect()
    }

    /// The schemes known but not built, with the feature that builds each, sorted.
    pub fn not_built(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .filter_map(|(s, e)| match e {
                Entry::NotBuilt(f) => Some((s.as_str(), f.as_str())),
                Entry::Built(_) => None,
            })
            .collect()
    }

    /// True when `scheme://…` opens a backend.
    pub fn is_built(&self, scheme: &str) -> bool {
        matches!(
            self.entries.get(&scheme.to_ascii_lowercase()),
            Some(Entry::Built(_))
        )
    }

    /// The constructor for `url`'s scheme, and the parsed URL.
    fn resolve(&self, url: &str) -> Result<(Connector, ConnectionString)> {
        let Some(scheme) = conn::scheme_of(url) else {
            // No `scheme://`: the parser's error says so.
            return Err(match ConnectionString::parse(url) {
                Err(e) => e,
                Ok(_) => Error::InvalidUrl {
                    url: conn::redact(url),
                    reason: "no scheme".into(),
                },
            });
        };
        match self.entries.get(&scheme) {
            Some(Entry::Built(c)) => Ok((c.clone(), ConnectionString::parse(url)?)),
            Some(Entry::NotBuilt(feature)) => Err(Error::InvalidUrl {
                url: conn::redact(url),
                reason: format!(
                    "the {scheme}:// backend is not built into this program; enable the \
                     `{feature}` cargo feature of distlock (distlock = {{ features = [\"{feature}\"] }})"
                ),
            }),
            None => Err(Error::InvalidUrl {
                url: conn::redact(url),
                reason: self.unknown(&scheme),
            }),
        }
    }

    fn unknown(&self, scheme: &str) -> String {
        let built: Vec<String> = self.schemes().iter().map(|s| format!("{s}://")).collect();
        let mut reason = if built.is_empty() {
            format!("unknown scheme `{scheme}`; this program has no backend built in")
        } else {
            format!(
                "unknown scheme `{scheme}`; this program understands {}",
                built.join(", ")
            )
        };
        let missing: Vec<String> = self
            .not_built()
            .iter()
            .map(|(s, f)| format!("{s}:// (feature `{f}`)"))
            .collect();
        if !missing.is_empty() {
            reason.push_str(&format!("; not built in: {}", missing.join(", ")));
        }
        reason
    }

    /// Opens the backend named by `url`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (with the redacted URL) when the URL has no scheme, when the
    /// scheme is unknown (the message lists the known ones) or not built (the message names
    /// the cargo feature), or when the URL does not parse; then whatever the backend's
    /// constructor returns (a bad parameter, [`Error::Connection`], [`Error::Auth`], …).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the constructor's future: a connection being set up is
    /// closed, nothing is left on the server.
    pub async fn open(&self, url: &str, opts: &ClientOptions) -> Result<Arc<dyn Backend>> {
        let (connect, parsed) = self.resolve(url)?;
        // A backend may have built a message from the raw URL: take the password out again.
        connect(parsed.clone(), opts.clone())
            .await
            .map_err(|e| parsed.scrub_error(e))
    }

    /// Checks `opts`, opens the backend named by `url` and builds a [`Client`] on it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `opts` are inconsistent (see
    /// [`ClientOptions::validate`]); then as [`Registry::open`].
    ///
    /// # Cancel safety
    ///
    /// As [`Registry::open`]: dropping the future leaves nothing behind.
    pub async fn connect(&self, url: &str, opts: ClientOptions) -> Result<Client> {
        opts.validate()?;
        let backend = self.open(url, &opts).await?;
        Client::new(backend, opts)
    }
}

/// What a constructor given to [`Registry::register`] may return: a backend type, or an
/// `Arc<dyn Backend>`.
pub trait IntoBackend {
    /// The backend, shared.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

impl<B: Backend + 'static> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ClientOptions {
        ClientOptions::default()
    }

    /// A constructor that reports what it was given, as an error.
    fn echo(mut r: Registry, scheme: &str) -> Registry {
        let name = scheme.to_owned();
        r.register(scheme, move |url: ConnectionString, _| {
            let name = name.clone();
            async move {
                Err::<Arc<dyn Backend>, _>(Error::Runtime(format!(
                    "{name} got {} hosts={}",
                    url.redacted(),
                    url.endpoints(1)
                )))
            }
        })
        .expect("scheme");
        r
    }

    async fn message(r: &Registry, url: &str) -> String {
        match r.open(url, &opts()).await {
            Ok(b) => panic!("{url} opened {}", b.kind()),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn dispatches_by_scheme() {
        let mut r = echo(echo(Registry::new(), "one"), "Two+x");
        r.register_not_built("pg", "postgres").expect("scheme");
        assert_eq!(r.schemes(), ["one", "two+x"]);
        assert_eq!(r.not_built(), [("pg", "postgres")]);
        assert!(r.is_built("ONE") && !r.is_built("pg"));
        let m = message(&r, "one://u:hunter2@a:1,b").await;
        assert_eq!(m, "one got one://u:***@a:1,b hosts=a:1,b:1");
        let m = message(&r, "TWO+X://h").await;
        assert!(m.starts_with("Two+x got TWO+X://h"), "{m}");
        let m = message(&r, "pg://u:hunter2@h/db").await;
        assert!(
            m.contains("pg:// backend is not built") && m.contains("`postgres` cargo feature"),
            "{m}"
        );
        let m = message(&r, "three://u:hunter2@h").await;
        assert!(
            m.contains("unknown scheme `three`")
                && m.contains("one://, two+x://")
                && m.contains("pg:// (feature `postgres`)"),
            "{m}"
        );
        for url in ["h:1", "u:hunter2@h", "one://u:hunter2@h:x", "://x", ""] {
            let m = message(&r, url).await;
            assert!(m.contains("invalid backend URL"), "{url}: {m}");
            assert!(!m.contains("hunter2"), "{url}: {m}");
        }
        assert!(r.unregister("One") && !r.unregister("one"));
        assert!(message(&r, "one://h").await.contains("unknown scheme"));
        assert!(message(&Registry::new(), "x://h")
            .await
            .contains("no backend built in"));
        for bad in ["", "1x", "a://", "a b"] {
            assert!(r.register_not_built(bad, "f").is_err(), "{bad}");
        }
        let err = r
            .connect(
                "one://h",
                opts().watchdog_lease(std::time::Duration::from_millis(1)),
            )
            .await
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.starts_with("invalid argument")));
    }
}

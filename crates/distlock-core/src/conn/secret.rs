//! Passwords that come from somewhere other than the URL: a builder's value, a file, the
//! environment — resolved in one order by every backend that takes them.

use super::Password;
use crate::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// Where a password given to a backend's builder comes from. `Debug` shows `***` for a value
/// and the path for a file, never a password.
#[derive(Clone)]
pub enum PasswordSource {
    /// The password itself.
    Text(Password),
    /// A file whose first line is the password (read when the backend connects).
    File(PathBuf),
}

impl fmt::Debug for PasswordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordSource::Text(_) => f.write_str("***"),
            PasswordSource::File(p) => write!(f, "file {}", p.display()),
        }
    }
}

impl PasswordSource {
    /// The password: the value, or the first line of the file (`backend` names the service in
    /// errors, e.g. `"Redis"`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the file cannot be read or its first line is empty.
    pub fn read(&self, backend: &str) -> Result<Password> {
        match self {
            PasswordSource::Text(p) => Ok(p.clone()),
            PasswordSource::File(path) => read_password_file(path, backend, "password_file"),
        }
    }
}

/// Reads a password file: its first line, without the line end. `what` says where the path
/// came from (a parameter or variable name). The error names the file, never its content.
///
/// # Errors
///
/// [`Error::InvalidArgument`] when the file cannot be read or its first line is empty.
pub fn read_password_file(path: &Path, backend: &str, what: &str) -> Result<Password> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the {backend} password file {} ({what}): {e}",
            path.display()
        ))
    })?;
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(Error::invalid(format!(
            "the {backend} password file {} ({what}) is empty",
            path.display()
        )));
    }
    Ok(Password::new(line))
}

/// The password by the order every builder documents: 1. the builder's `source`, 2. the URL's
/// `from_url`, 3. the environment variable `password_var`, 4. the file named by `file_var`.
/// `env` reads a variable (`None` when unset or when the builder ignores the environment).
///
/// # Errors
///
/// [`Error::InvalidArgument`] when a password file cannot be read or is empty.
pub fn resolve_password(
    source: Option<&PasswordSource>,
    from_url: Option<Password>,
    env: impl Fn(&str) -> Option<String>,
    (password_var, file_var): (&str, &str),
    backend: &str,
) -> Result<Option<Password>> {
    if let Some(s) = source {
        return s.read(backend).map(Some);
    }
    if from_url.is_some() {
        return Ok(from_url);
    }
    if let Some(p) = env(password_var) {
        return Ok(Some(Password::new(p)));
    }
    match env(file_var) {
        Some(f) => read_password_file(Path::new(&f), backend, file_var).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_redaction() {
        let dir = tempfile_dir();
        let file = dir.join("pw");
        std::fs::write(&file, "from-file\nsecond line\n").expect("write");
        let none = |_: &str| None;
        let vars = ("PW", "PW_FILE");
        let text = PasswordSource::Text(Password::new("s3cret"));
        assert_eq!(format!("{text:?}"), "***");
        let got = resolve_password(Some(&text), Some(Password::new("url")), none, vars, "X");
        assert_eq!(got.expect("ok").expect("some").expose(), "s3cret");
        let got = resolve_password(None, Some(Password::new("url")), none, vars, "X");
        assert_eq!(got.expect("ok").expect("some").expose(), "url");
        let f = file.to_string_lossy().into_owned();
        let env = |v: &str| (v == "PW_FILE").then(|| f.clone());
        let got = resolve_password(None, None, env, vars, "X");
        assert_eq!(got.expect("ok").expect("some").expose(), "from-file");
        assert!(resolve_password(None, None, none, vars, "X")
            .expect("ok")
            .is_none());
        let missing = PasswordSource::File(dir.join("missing"));
        let e = missing.read("Redis").expect_err("missing file");
        assert!(e.to_string().contains("Redis password file"), "{e}");
        std::fs::write(&file, "\n").expect("write");
        let e = read_password_file(&file, "etcd", "PW_FILE").expect_err("empty");
        assert!(e.to_string().contains("is empty"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("distlock-secret-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }
}

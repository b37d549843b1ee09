//! Where the password comes from, first found wins: the builder
//! ([`PostgresBuilder::password`](crate::PostgresBuilder::password)), the URL, the
//! environment variable [`PASSWORD_ENV`], then a password file in libpq's `.pgpass` format:
//! the builder's [`password_file`](crate::PostgresBuilder::password_file), the URL's
//! `passfile=`, the environment variable [`PASSFILE_ENV`], or `~/.pgpass`.

use distlock_core::conn::Password;
use distlock_core::{Error, Result};
use std::path::{Path, PathBuf};
use tokio_postgres::config::Host;

/// The environment variable holding the password when neither the code nor the URL gives one
/// (libpq's).
pub const PASSWORD_ENV: &str = "PGPASSWORD";
/// The environment variable naming the password file when neither the code nor the URL does
/// (libpq's). Unset: `~/.pgpass`, if it exists.
pub const PASSFILE_ENV: &str = "PGPASSFILE";

/// Sets `config`'s password from the first source that has one.
///
/// # Errors
/// [`Error::InvalidArgument`] for a password file that was named (not the default
/// `~/.pgpass`) but does not exist, cannot be read or is readable by others.
pub(crate) fn resolve(
    config: &mut tokio_postgres::Config,
    given: Option<&Password>,
    passfile: Option<&Path>,
) -> Result<()> {
    if let Some(p) = given {
        config.password(p.expose());
        return Ok(());
    }
    if config.get_password().is_some() {
        return Ok(());
    }
    if let Some(p) = std::env::var_os(PASSWORD_ENV).filter(|p| !p.is_empty()) {
        use std::os::unix::ffi::OsStrExt;
        config.password(p.as_bytes());
        return Ok(());
    }
    let named = passfile.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(PASSFILE_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    });
    let (file, named) = match named {
        Some(f) => (f, true),
        None => match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(home) => (PathBuf::from(home).join(".pgpass"), false),
            None => return Ok(()),
        },
    };
    let text = match read_private(&file, named) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(()),
        Err(why) if named => {
            return Err(Error::InvalidArgument(format!(
                "password file {}: {why}",
                file.display()
            )))
        }
        Err(why) => {
            tracing::warn!(file = %file.display(), "ignoring the password file: {why}");
            return Ok(());
        }
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let unix = matches!(config.get_hosts().first(), Some(Host::Unix(_)));
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    let want = [host.as_str(), port.as_str(), db, user];
    if let Some(pw) = lookup(&text, &want, unix) {
        config.password(pw);
    }
    Ok(())
}

/// The file's text; `None` if it does not exist and was not `named`; an error if it cannot be
/// read or others may read it (libpq ignores such a file).
fn read_private(file: &Path, named: bool) -> std::result::Result<Option<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = match std::fs::metadata(file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(
            "others may read it (mode must be 0600 or stricter: chmod 600 the file)".into(),
        );
    }
    std::fs::read_to_string(file)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The password of the first line `hostname:port:database:username:password` matching `want`
/// (`*` matches anything; `\:` and `\\` are a literal `:` and `\`; `#` starts a comment line).
/// `localhost` also matches a unix socket (`unix`).
fn lookup(text: &str, want: &[&str; 4], unix: bool) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = split(line);
            if fields.len() < 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(want)
                .enumerate()
                .all(|(i, (f, w))| f == "*" || f == w || (i == 0 && unix && f == "localhost"));
            matches.then(|| fields[4..].join(":"))
        })
}

/// The `:`-separated fields of a line, unescaped.
fn split(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(f)) = (chars.next(), fields.last_mut()) {
                    f.push(n);
                }
            }
            ':' => fields.push(String::new()),
            c => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines() {
        let text =
            "# comment\n\nother:5432:*:*:nope\n127.0.0.1:5433:db:u:p\\:w\\\\d\n*:*:*:u:any\n";
        let want = |h, p, d, u| [h, p, d, u];
        assert_eq!(
            lookup(text, &want("127.0.0.1", "5433", "db", "u"), false).as_deref(),
            Some("p:w\\d")
        );
        assert_eq!(
            lookup(text, &want("h", "1", "x", "u"), false).as_deref(),
            Some("any")
        );
        assert_eq!(lookup(text, &want("h", "1", "x", "v"), false), None);
        assert_eq!(
            lookup(
                "localhost:5432:d:u:sock\n",
                &want("/run/pg", "5432", "d", "u"),
                true
            )
            .as_deref(),
            Some("sock")
        );
        assert_eq!(lookup("a:b:c\n", &want("a", "b", "c", "d"), false), None);
    }
}

//! libpq's password rule (`PGPASSWORD`, then a `.pgpass` file), the ecosystem rule of
//! [`PostgresBuilder`](crate::PostgresBuilder): docs/postgres.md, *Credentials*, items 4 and 5.

use crate::builder::{first_host, parsed, PgSettings};
use distlock_core::conn::{EcosystemQuery, Password};
use distlock_core::{Error, Result};
use std::path::{Path, PathBuf};

/// The environment variable holding the password when neither the code nor the URL gives one
/// (libpq's).
pub const PASSWORD_ENV: &str = "PGPASSWORD";
/// The environment variable naming the password file when neither the code nor the URL does
/// (libpq's). Unset: `~/.pgpass`, if it exists.
pub const PASSFILE_ENV: &str = "PGPASSFILE";

/// The password by libpq's rule, for the target `q` describes; `None` when the URL's
/// `password=` (or the application's config) has one, which then stands.
///
/// # Errors
/// [`Error::InvalidArgument`] for a password file that was named (not the default
/// `~/.pgpass`) but does not exist, cannot be read or is readable by others; as the URL.
pub(crate) fn libpq(q: &EcosystemQuery<'_>) -> Result<Option<Password>> {
    let default = PgSettings::default();
    let x = q.settings.downcast_ref::<PgSettings>().unwrap_or(&default);
    let (config, p) = parsed(q.url, x)?;
    if config.get_password().is_some() {
        return Ok(None);
    }
    if let Some(pw) = q.env.var(PASSWORD_ENV) {
        return Ok(Some(Password::new(pw)));
    }
    let named = p
        .passfile
        .or_else(|| q.env.var(PASSFILE_ENV).map(PathBuf::from));
    let (file, named) = match named {
        Some(f) => (f, true),
        None => match q.env.var("HOME") {
            Some(home) => (PathBuf::from(home).join(".pgpass"), false),
            None => return Ok(None),
        },
    };
    let text = match read_private(&file, named) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(why) if named => {
            return Err(Error::InvalidArgument(format!(
                "password file {}: {why}",
                file.display()
            )))
        }
        Err(why) => {
            tracing::warn!(file = %file.display(), "ignoring the password file: {why}");
            return Ok(None);
        }
    };
    let (host, port, unix) = first_host(&config).unwrap_or(("localhost".into(), 5432, false));
    let port = port.to_string();
    let user = q.user.or(config.get_user()).unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    let want = [host.as_str(), port.as_str(), db, user];
    Ok(lookup(&text, &want, unix).map(Password::new))
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
            let field = |(i, (f, w)): (usize, (&String, &&str))| {
                f == "*" || f == w || (i == 0 && unix && f == "localhost")
            };
            let matches = fields.len() >= 5 && fields[..4].iter().zip(want).enumerate().all(field);
            matches.then(|| fields[4..].join(":"))
        })
}

/// The `:`-separated fields of a line, unescaped.
fn split(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut chars) = (Vec::new(), String::new(), line.chars());
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.extend(chars.next()),
            ':' => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
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

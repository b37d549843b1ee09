//! Checks on lock names and owner ids, shared by every backend.

use crate::error::{Error, Result};

/// Longest lock name accepted, in bytes. Backends with smaller limits map names (hashing)
/// rather than reject them.
pub const MAX_NAME_LEN: usize = 512;

/// Longest owner id accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 256;

/// Checks a lock name: not empty, at most [`MAX_NAME_LEN`] bytes, no control characters.
///
/// ```
/// assert!(distlock_core::validate_name("orders:42").is_ok());
/// assert!(distlock_core::validate_name("").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<()> {
    check("lock name", name, MAX_NAME_LEN)
}

/// Checks an owner id: not empty, at most [`MAX_OWNER_LEN`] bytes, no control characters.
pub fn validate_owner(owner: &str) -> Result<()> {
    check("owner id", owner, MAX_OWNER_LEN)
}

fn check(what: &str, s: &str, max: usize) -> Result<()> {
    if s.is_empty() {
        return Err(Error::invalid(format!("the {what} is empty")));
    }
    if s.len() > max {
        return Err(Error::invalid(format!(
            "the {what} is {} bytes long; the limit is {max} bytes (hash long names yourself if you need them)",
            s.len()
        )));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "the {what} `{}` contains the control character {c:?}; use printable characters only",
            s.escape_debug()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("a").is_ok());
        assert!(validate_name("stock:{sku-1}/π").is_ok());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        let e = validate_name(&"x".repeat(MAX_NAME_LEN + 1)).unwrap_err();
        assert!(e.to_string().contains("limit is 512"), "{e}");
        assert!(validate_name("").unwrap_err().to_string().contains("empty"));
        assert!(validate_name("a\nb").is_err());
        assert!(validate_name("a\0b").is_err());
        assert!(validate_owner("").is_err());
        assert!(validate_owner(&"o".repeat(MAX_OWNER_LEN + 1)).is_err());
    }
}

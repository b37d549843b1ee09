//! A strict parser of the Prometheus text exposition format (0.0.4), for tests of
//! `/metrics`: every line must be a comment, a `# HELP`/`# TYPE` line of a valid name and
//! type, or a sample `name{label="value",…} value [timestamp]` with valid names, escapes and
//! number; a family's `# TYPE` comes at most once and before its samples.

use std::collections::{BTreeMap, HashSet};

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn number(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

/// The family a sample belongs to (a summary's or histogram's `_sum`, `_count`, `_bucket`
/// samples belong to the family without the suffix, when that family was typed).
fn family<'a>(name: &'a str, typed: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_sum", "_count", "_bucket"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if typed
                .get(base)
                .is_some_and(|t| t == "summary" || t == "histogram")
            {
                return base;
            }
        }
    }
    name
}

/// The samples of `text`, or the first line that breaks the format and why.
///
/// # Errors
/// `line N: what is wrong`.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut seen_samples: HashSet<String> = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let err = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.trim_start().splitn(3, ' ');
            match words.next() {
                Some("HELP") => {
                    let name = words.next().unwrap_or("");
                    if !valid_name(name) {
                        return Err(err("bad metric name in HELP"));
                    }
                }
                Some("TYPE") => {
                    let name = words.next().unwrap_or("");
                    let ty = words.next().unwrap_or("").trim();
                    if !valid_name(name) {
                        return Err(err("bad metric name in TYPE"));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty) {
                        return Err(err("unknown type"));
                    }
                    if typed.insert(name.to_owned(), ty.to_owned()).is_some() {
                        return Err(err("a second TYPE for the family"));
                    }
                    if seen_samples.contains(name) {
                        return Err(err("TYPE after the family's samples"));
                    }
                }
                _ => {}
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| err("no value"))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err("bad metric name"));
        }
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let consumed = loop {
                while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
                    chars.next();
                }
                if let Some(&(j, '}')) = chars.peek() {
                    break j + 1;
                }
                let mut lname = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    lname.push(c);
                }
                if !valid_name(&lname) || lname.contains(':') {
                    return Err(err("bad label name"));
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    return Err(err("label value not quoted"));
                }
                let mut value = String::new();
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            _ => return Err(err("bad escape in a label value")),
                        },
                        '"' => {
                            closed = true;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                if !closed {
                    return Err(err("unterminated label value"));
                }
                if labels.insert(lname, value).is_some() {
                    return Err(err("a label twice"));
                }
            };
            rest = &r[consumed..];
        }
        let mut parts = rest.split_whitespace();
        let value = parts
            .next()
            .and_then(number)
            .ok_or_else(|| err("bad value"))?;
        if let Some(ts) = parts.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp"))?;
        }
        if parts.next().is_some() {
            return Err(err("trailing text"));
        }
        seen_samples.insert(family(name, &typed).to_owned());
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_samples_and_refuses_broken_lines() {
        let s = parse(
            "# HELP a_total A.\n# TYPE a_total counter\na_total{b=\"x\\\"y\",c=\"\"} 3\nq 1.5e3 17\n",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["b"], "x\"y");
        assert_eq!(s[1].value, 1500.0);
        for bad in [
            "a b",
            "1a 1",
            "a{b=x} 1",
            "a{b=\"x} 1",
            "# TYPE a countr",
            "a 1\n# TYPE a gauge",
            "a{b=\"\\q\"} 1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

//! `dlock man [SUBCOMMAND]`: the man pages, from the clap definitions.
//!
//! clap_mangen renders the title, NAME, DESCRIPTION, OPTIONS and SUBCOMMANDS sections; this
//! module adds what it lacks: a SYNOPSIS that shows each option's value (`-w DURATION`), the
//! long help text (after the options in `--help`) set as paragraphs, bullet lists and
//! literal blocks instead of lines re-filled into ragged ones, and the EXIT STATUS,
//! ENVIRONMENT and EXAMPLES sections.

use std::fmt::Write as _;

/// Where dlock's exit codes are explained for the whole program (the top page).
const EXIT_CODES: &[(&str, &str)] = &[
    ("0", "Success (run, elect, once: the command's own status, which may be any code)."),
    ("1", "An error dlock cannot wait out: a bad URL, refused credentials, a server of another kind, a kind of lock the backend lacks; doctor: an unsafe finding; release: an unknown name."),
    ("2", "A command line dlock cannot use."),
    ("69", "The lock service could not be reached (within --connect-timeout, or on the last try of --wait)."),
    ("75", "The lock was not acquired within --wait, or on the one try of -n (-E CODE changes it); once: skipped, the job runs elsewhere."),
    ("76", "The lock (or leadership) was lost before the command ended."),
    ("79", "once: skipped, the job ran in this interval already."),
    ("126, 127", "The command could not be started (not executable, not found)."),
    ("128+N", "The command died of signal N."),
];

/// The environment dlock reads (or sets for the command), and which pages name it.
const ENVIRONMENT: &[(&str, &[&str], &str)] = &[
    ("DLOCK_BACKEND", &[], "The lock service URL when --backend is not given (file://DIR, redis://HOST:PORT, etcd://, zk://, postgres://, mysql://, redlock://…). Unset: file:// in a directory of this host, so the lock covers this host only (run, elect, once, hold and doctor say so)."),
    ("DLOCK_LOG, RUST_LOG", &[], "Tracing filter directives for the lines on stderr (e.g. distlock_redis=debug); DLOCK_LOG wins over RUST_LOG; -v sets the level of dlock's and the library's own."),
    ("DLOCK_REDIS_PASSWORD, DLOCK_REDIS_PASSWORD_FILE, DLOCK_REDIS_USER", &[], "The Redis password (or a file whose first line is it) and ACL user, when the URL has none."),
    ("PGPASSWORD, PGPASSFILE", &[], "The PostgreSQL password, or a password file in libpq's format, when the URL has none."),
    ("MYSQL_PWD", &[], "The MySQL/MariaDB password when the URL has none."),
    ("DLOCK_ETCD_USER, DLOCK_ETCD_PASSWORD, DLOCK_ETCD_PASSWORD_FILE", &[], "etcd credentials when the URL has none."),
    ("DLOCK_ZK_USER, DLOCK_ZK_PASSWORD, DLOCK_ZK_PASSWORD_FILE", &[], "ZooKeeper digest credentials when the URL has none."),
    ("DLOCK_CGROUP", &["run", "elect", "once"], "off (or 0, no, false): the command gets no cgroup of its own (its processes are still found as descendants)."),
    ("DLOCK_NAME, DLOCK_OWNER, DLOCK_FENCING_TOKEN", &["run", "elect", "once"], "Set for the command: the lock's name, the owner id dlock holds it as, and the fencing token to pass with every write the command makes."),
    ("DLOCK_LEADER_VALUE", &["elect"], "Set for the command: the value advertised with --value."),
];

/// Examples: (page, what it does, the command line).
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("", "Run a nightly job on one host of a fleet at a time, waiting up to 10 minutes:", "dlock --backend redis://locks:6379 run -w 10m nightly -- /usr/local/bin/backup"),
    ("", "See who holds it, and every lock in use:", "dlock inspect nightly; dlock list"),
    ("run", "Skip this run if the last one still goes on (cron; flock -n):", "dlock run -n report -- ./report.sh"),
    ("run", "A shell command line, 30 s at most to get the lock, exit 3 if not:", "dlock run -w 30 -E 3 deploy -c 'make deploy && make smoke'"),
    ("run", "Readers together, writers alone (flock -s and -x):", "dlock run -s catalog -- ./read.sh\ndlock run -x catalog -- ./rebuild.sh"),
    ("run", "Pass the fencing token to what the command writes:", "dlock run orders -- sh -c 'psql -c \"UPDATE jobs SET token = $DLOCK_FENCING_TOKEN\"'"),
    ("run", "A summary for scripts (last line of stdout):", "dlock run --json sync -- ./sync.sh | tail -n 1"),
    ("once", "On every host, every 15 minutes; the job runs once per quarter hour:", "*/15 * * * *  dlock once --every 15m --at-least 1m sync -- /usr/local/bin/sync"),
    ("hold", "One lock across several commands of a script (bash):", "coproc HOLD { dlock hold -w 10 nightly; }\nread -r token <&\"${HOLD[0]}\"\nstep-one --token \"$token\" && step-two --token \"$token\"\nexec {HOLD[1]}>&-; wait $HOLD_PID"),
    ("elect", "A hot standby: start it on every host; one leads and runs the service:", "dlock elect --value \"$(hostname)\" scheduler -- /usr/local/bin/scheduler"),
    ("leader", "Who leads, as each change happens:", "dlock leader --watch --json scheduler"),
    ("inspect", "Holders, lease left and last fencing token (the kind is found by itself):", "dlock inspect --json pool"),
    ("list", "Every lock whose name starts with orders:", "dlock list --prefix orders:"),
    ("release", "Remove a stuck holder, advancing the fencing token (asks first):", "dlock release --force nightly"),
    ("doctor", "Check a Redis deployment for settings that break locks:", "dlock --backend redis://locks:6379 doctor"),
    ("completions", "Install bash completions:", "dlock completions bash > /etc/bash_completion.d/dlock"),
    ("man", "Read the page of a subcommand:", "dlock man run | man -l -"),
];

/// The man page of `cmd` (built), `dlock` itself when `sub` is `None`, else its subcommand
/// `sub`.
pub fn page(cmd: &clap::Command, sub: Option<&str>) -> std::io::Result<Vec<u8>> {
    let version = env!("CARGO_PKG_VERSION");
    let (page_cmd, title, page) = match sub {
        None => (cmd.clone(), "dlock".to_owned(), ""),
        Some(name) => match cmd.find_subcommand(name) {
            Some(s) => (s.clone(), format!("dlock-{name}"), name),
            None => return Err(std::io::Error::other(format!("no subcommand `{name}`"))),
        },
    };
    let man = clap_mangen::Man::new(page_cmd.clone())
        .title(title)
        .source(format!("dlock {version}"))
        .manual("dlock manual");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    let mut roff = String::new();
    synopsis(&mut roff, &page_cmd, sub.is_some());
    out.extend_from_slice(roff.as_bytes());
    man.render_description_section(&mut out)?;
    let long = page_cmd
        .get_after_long_help()
        .map(ToString::to_string)
        .unwrap_or_default();
    let (text, exit_status) = split_exit_status(&long);
    let mut roff = String::new();
    blocks(&mut roff, &text);
    out.extend_from_slice(roff.as_bytes());
    if page_cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if page_cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    let mut roff = String::new();
    roff.push_str(".SH \"EXIT STATUS\"\n");
    match exit_status {
        Some(text) => exit_list(&mut roff, &text),
        None if sub.is_none() => {
            for (code, what) in EXIT_CODES {
                let _ = writeln!(roff, ".TP\n\\fB{}\\fR\n{}", esc(code), esc(what));
            }
        }
        None => roff.push_str(
            ".TP\n\\fB0\\fR\nSuccess.\n.TP\n\\fB1\\fR\nAn error (one line on stderr says which).\n\
             .TP\n\\fB2\\fR\nA command line dlock cannot use.\n",
        ),
    }
    roff.push_str(".SH ENVIRONMENT\n");
    for (name, pages, what) in ENVIRONMENT {
        if sub.is_none() || pages.is_empty() || pages.contains(&page) {
            let _ = writeln!(roff, ".TP\n\\fB{}\\fR\n{}", esc(name), esc(what));
        }
    }
    let examples: Vec<_> = EXAMPLES.iter().filter(|(p, ..)| *p == page).collect();
    if !examples.is_empty() {
        roff.push_str(".SH EXAMPLES\n");
        for (_, what, line) in examples {
            let _ = writeln!(roff, ".PP\n{}\n.PP\n.RS 4\n.nf", esc(what));
            for l in line.lines() {
                let _ = writeln!(roff, "{}", esc_line(l));
            }
            roff.push_str(".fi\n.RE\n");
        }
    }
    if sub.is_some() {
        let _ = writeln!(roff, ".SH \"SEE ALSO\"\n\\fBdlock\\fR(1)");
    }
    let _ = writeln!(roff, ".SH VERSION\nv{version}");
    out.extend_from_slice(roff.as_bytes());
    Ok(ascii(&String::from_utf8_lossy(&out)).into_bytes())
}

/// `roff` with every non-ASCII character as a groff escape (`…` as `\[u2026]`): troff reads
/// its input as Latin-1 unless told otherwise.
fn ascii(roff: &str) -> String {
    let mut out = String::with_capacity(roff.len());
    for c in roff.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let _ = write!(out, "\\[u{:04X}]", u32::from(c));
        }
    }
    out
}

/// Escapes text for roff: backslashes, and hyphens as the minus signs of options.
fn esc(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

/// [`esc`] for a line of its own: a leading `.` or `'` would be read as a request.
fn esc_line(s: &str) -> String {
    let e = esc(s);
    if e.starts_with('.') || e.starts_with('\'') {
        format!("\\&{e}")
    } else {
        e
    }
}

/// SYNOPSIS: the command, each visible option with its value placeholder
/// (`[-w|--wait DURATION]`), then the positional arguments.
fn synopsis(roff: &mut String, cmd: &clap::Command, is_sub: bool) {
    let name = if is_sub {
        format!("dlock {}", cmd.get_name())
    } else {
        "dlock".to_owned()
    };
    let _ = write!(roff, ".SH SYNOPSIS\n\\fB{}\\fR", esc(&name));
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if arg.is_positional() {
            continue;
        }
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(s), Some(l)) => format!("\\fB\\-{s}\\fR|\\fB\\-\\-{}\\fR", esc(l)),
            (Some(s), None) => format!("\\fB\\-{s}\\fR"),
            (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", esc(l)),
            (None, None) => continue,
        };
        let value = placeholder(arg)
            .map(|v| format!(" \\fI{}\\fR", esc(&v)))
            .unwrap_or_default();
        let more = if matches!(arg.get_action(), clap::ArgAction::Count) {
            "..."
        } else {
            ""
        };
        let _ = write!(roff, " [{flag}{value}]{more}");
    }
    for arg in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let v = placeholder(arg).unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
        let many = matches!(arg.get_num_args(), Some(r) if r.max_values() > 1);
        let shown = format!("\\fI{}\\fR{}", esc(&v), if many { "..." } else { "" });
        if arg.is_required_set() {
            let _ = write!(roff, " {shown}");
        } else {
            let _ = write!(roff, " [{shown}]");
        }
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        roff.push_str(" \\fISUBCOMMAND\\fR");
    }
    roff.push('\n');
}

/// The value an argument takes (`DURATION`), if it takes one.
fn placeholder(arg: &clap::Arg) -> Option<String> {
    if !arg.get_action().takes_values() {
        return None;
    }
    Some(match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        None => arg.get_id().to_string().to_uppercase(),
    })
}

/// `text` without its `Exit status: …` paragraph, and that paragraph's text.
fn split_exit_status(text: &str) -> (String, Option<String>) {
    let mut rest = Vec::new();
    let mut exit = None;
    for para in text.split("\n\n") {
        match para.trim_start().strip_prefix("Exit status:") {
            Some(e) => exit = Some(e.split_whitespace().collect::<Vec<_>>().join(" ")),
            None => rest.push(para),
        }
    }
    (rest.join("\n\n"), exit)
}

/// The long help text as roff: paragraphs filled by the formatter, `  - ` items as a bullet
/// list (their continuation lines indented four spaces), other lines indented two spaces as
/// literal blocks (commands, crontab lines).
fn blocks(roff: &mut String, text: &str) {
    #[derive(PartialEq)]
    enum Open {
        None,
        Text,
        Item,
        Literal,
    }
    let mut open = Open::None;
    for line in text.lines() {
        if line.trim().is_empty() {
            if open == Open::Literal {
                roff.push_str(".fi\n.RE\n");
            }
            open = Open::None;
            continue;
        }
        if let Some(item) = line.strip_prefix("  - ") {
            if open == Open::Literal {
                roff.push_str(".fi\n.RE\n");
            }
            let _ = writeln!(roff, ".IP \\(bu 2\n{}", esc_line(item.trim()));
            open = Open::Item;
        } else if line.starts_with("    ") && open == Open::Item {
            let _ = writeln!(roff, "{}", esc_line(line.trim()));
        } else if line.starts_with("  ") {
            if open != Open::Literal {
                roff.push_str(".PP\n.RS 4\n.nf\n");
                open = Open::Literal;
            }
            let _ = writeln!(roff, "{}", esc_line(line.trim_start()));
        } else {
            match open {
                Open::Text => {}
                Open::Literal => roff.push_str(".fi\n.RE\n.PP\n"),
                _ => roff.push_str(".PP\n"),
            }
            let _ = writeln!(roff, "{}", esc_line(line.trim()));
            open = Open::Text;
        }
    }
    if open == Open::Literal {
        roff.push_str(".fi\n.RE\n");
    }
}

/// The `Exit status:` paragraph of a subcommand's help (`the command's …; 75 if …; 69 if …`)
/// as a list: one entry per `;`-separated part that starts with a code (a parenthesis right
/// after the code goes with it), the others as paragraphs.
fn exit_list(roff: &mut String, text: &str) {
    for part in split_top_level(text.trim_end_matches('.'), ';') {
        let part = part.trim();
        let mut tag_end = part
            .find(|c: char| !(c.is_ascii_digit() || c == '/' || c == '+'))
            .unwrap_or(part.len());
        if tag_end > 0 && part[tag_end..].trim_start().starts_with('(') {
            if let Some(close) = part[tag_end..].find(')') {
                tag_end += close + 1;
            }
        }
        let (tag, what) = part.split_at(tag_end);
        let what = what.trim();
        let what = ["if ", "for "]
            .iter()
            .find_map(|p| what.strip_prefix(p))
            .unwrap_or(what);
        let mut chars = what.chars();
        let what = match chars.next() {
            Some(first) => format!("{}{}.", first.to_uppercase(), chars.as_str()),
            None => continue,
        };
        if tag.is_empty() {
            let _ = writeln!(roff, ".PP\n{}", esc(&what));
        } else {
            let _ = writeln!(roff, ".TP\n\\fB{}\\fR\n{}", esc(tag.trim()), esc(&what));
        }
    }
}

/// `s` split at `sep` outside parentheses.
fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_text_becomes_paragraphs_lists_and_literal_blocks() {
        let mut roff = String::new();
        blocks(
            &mut roff,
            "Intro line one\nand two:\n  - first item\n    goes on\n  - second\n\n  cmd --flag\n\nAfter.",
        );
        assert_eq!(
            roff,
            ".PP\nIntro line one\nand two:\n.IP \\(bu 2\nfirst item\ngoes on\n.IP \\(bu 2\nsecond\n\
             .PP\n.RS 4\n.nf\ncmd \\-\\-flag\n.fi\n.RE\n.PP\nAfter.\n"
        );
    }

    #[test]
    fn exit_status_paragraph_becomes_a_list() {
        let (rest, exit) = split_exit_status("Text.\n\nExit status: the command's (128+N if\nsignal N); 75 if not (a; b); 1 other errors.");
        assert_eq!(rest, "Text.");
        let mut roff = String::new();
        exit_list(&mut roff, &exit.expect("exit status"));
        assert_eq!(
            roff,
            ".PP\nThe command's (128+N if signal N).\n.TP\n\\fB75\\fR\nNot (a; b).\n\
             .TP\n\\fB1\\fR\nOther errors.\n"
        );
        let mut roff = String::new();
        exit_list(&mut roff, "75 (or -E CODE) if not acquired");
        assert_eq!(roff, ".TP\n\\fB75 (or \\-E CODE)\\fR\nNot acquired.\n");
        assert_eq!(ascii("a…b"), "a\\[u2026]b");
    }
}

//! A tiny RESP2 client, just enough to drive a test server over a raw
//! [`TcpStream`].

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest bulk string accepted from a server (protects against garbage).
const MAX_BULK: usize = 64 * 1024 * 1024;
/// Largest array accepted from a server.
const MAX_ARRAY: usize = 1024 * 1024;
/// Deepest array nesting accepted from a server.
const MAX_DEPTH: usize = 32;

/// One RESP2 reply, as returned by [`RedisServer::command_reply`](crate::RedisServer::command_reply).
///
/// Its [`Display`](fmt::Display) rendering is what
/// [`RedisServer::command`](crate::RedisServer::command) returns:
///
/// | reply                | rendering                                  |
/// |----------------------|--------------------------------------------|
/// | simple string `+OK`  | `OK`                                       |
/// | error `-ERR boom`    | `-ERR boom` (the leading `-` is kept)      |
/// | integer `:42`        | `42`                                       |
/// | bulk string          | its bytes (lossy UTF-8)                    |
/// | null bulk / array    | `(nil)`                                    |
/// | array                | the rendered elements, joined by `\n`      |
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A simple string (`+...`), without the `+`.
    Simple(String),
    /// An error (`-...`), without the `-`, e.g. `NOAUTH Authentication required.`.
    Error(String),
    /// An integer (`:...`).
    Integer(i64),
    /// A bulk string (`$...`); `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// An array (`*...`); `None` for the null array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => f.write_str(s),
            Reply::Error(e) => write!(f, "-{e}"),
            Reply::Integer(i) => write!(f, "{i}"),
            Reply::Bulk(None) | Reply::Array(None) => f.write_str("(nil)"),
            Reply::Bulk(Some(b)) => f.write_str(&String::from_utf8_lossy(b)),
            Reply::Array(Some(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

/// Encodes one command as a RESP array of bulk strings.
pub(crate) fn encode<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_line<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by server",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("RESP line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(bytes: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            invalid(format!(
                "bad RESP integer {:?}",
                String::from_utf8_lossy(bytes)
            ))
        })
}

/// Reads one reply.
pub(crate) fn read_reply<R: BufRead>(r: &mut R) -> io::Result<Reply> {
    read_reply_depth(r, 0)
}

fn read_reply_depth<R: BufRead>(r: &mut R, depth: usize) -> io::Result<Reply> {
    if depth > MAX_DEPTH {
        return Err(invalid("RESP reply nested too deeply"));
    }
    let line = read_line(r)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err(invalid("empty RESP line"));
    };
    match kind {
        b'+' => Ok(Reply::Simple(String::from_utf8_lossy(rest).into_owned())),
        b'-' => Ok(Reply::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Reply::Integer(parse_int(rest)?)),
        b'$' => {
            let len = parse_int(rest)?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let len = usize::try_from(len).map_err(|_| invalid("bulk length overflow"))?;
            if len > MAX_BULK {
                return Err(invalid(format!("bulk string of {len} bytes is too large")));
            }
            let mut buf = vec![0u8; len + 2];
            r.read_exact(&mut buf)?;
            if !buf.ends_with(b"\r\n") {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            buf.truncate(len);
            Ok(Reply::Bulk(Some(buf)))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Reply::Array(None));
            }
            let n = usize::try_from(n).map_err(|_| invalid("array length overflow"))?;
            if n > MAX_ARRAY {
                return Err(invalid(format!("array of {n} elements is too large")));
            }
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                items.push(read_reply_depth(r, depth + 1)?);
            }
            Ok(Reply::Array(Some(items)))
        }
        other => Err(invalid(format!(
            "unexpected RESP type byte {:?}",
            char::from(other)
        ))),
    }
}

/// A blocking RESP connection with timeouts on every operation.
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects with `timeout` used for connect, reads and writes.
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply.
    pub(crate) fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// Sends one command without reading anything.
    pub(crate) fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        let buf = encode(args);
        let stream = self.reader.get_mut();
        stream.write_all(&buf)?;
        stream.flush()
    }

    /// Reads the next reply (or pushed message, in subscribed mode).
    pub(crate) fn read(&mut self) -> io::Result<Reply> {
        read_reply(&mut self.reader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut io::Cursor::new(bytes.to_vec()))
    }

    #[test]
    fn encodes_commands() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }

    #[test]
    fn parses_and_renders() {
        let cases: &[(&[u8], Reply, &str)] = &[
            (b"+OK\r\n", Reply::Simple("OK".into()), "OK"),
            (
                b"-ERR boom\r\n",
                Reply::Error("ERR boom".into()),
                "-ERR boom",
            ),
            (b":-7\r\n", Reply::Integer(-7), "-7"),
            (
                b"$3\r\na\r\n\r\n",
                Reply::Bulk(Some(b"a\r\n".to_vec())),
                "a\r\n",
            ),
            (b"$-1\r\n", Reply::Bulk(None), "(nil)"),
            (b"*-1\r\n", Reply::Array(None), "(nil)"),
            (
                b"*2\r\n$1\r\nx\r\n:1\r\n",
                Reply::Array(Some(vec![
                    Reply::Bulk(Some(b"x".to_vec())),
                    Reply::Integer(1),
                ])),
                "x\n1",
            ),
        ];
        for (bytes, reply, text) in cases {
            let got = parse(bytes).expect("parse");
            assert_eq!(&got, reply);
            assert_eq!(got.to_string(), *text);
        }
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse(b"").is_err());
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$5\r\nab\r\n").is_err());
        assert!(parse(b":12x\r\n").is_err());
        assert!(parse(b"+OK\n").is_err());
    }
}

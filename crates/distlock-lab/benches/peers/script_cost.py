#!/usr/bin/env python3
"""The server's cost of the Redis mutex scripts alone, next to rslock's protocol (issue 28).

    script_cost.py count DIR LAYOUT   instructions per acquire+release pair: redis-server under
                                      callgrind, the difference of 1,200 and 200 pairs (parsing
                                      and running the requests: processInputBuffer, inclusive)
    script_cost.py time OLD_DIR NEW_DIR
                                      server time per pair (INFO commandstats usec), OLD_DIR's
                                      scripts, NEW_DIR's and rslock's in alternating blocks on one
                                      redis-server (30 blocks of 500 pairs each)

DIR is a copy of crates/distlock-redis/scripts (for the old layout: `git show
main:crates/distlock-redis/scripts/X.lua` of fence, queue, acquire, release into a directory).
LAYOUT: `old` (KEYS hash, counter, queue, waiters, end record; ARGV attempt, owner, lease,
waiter ttl, fair, wake, counter lifetime / release: 4 keys, attempt, token, channel, mode,
threshold), `new` (KEYS hash, end record; ARGV attempt, owner, lease, TTL:FAIR:WAKE / release:
the hash; attempt, token, threshold), `rslock` (SET NX PX + compare-and-delete), `exp` (DIR/acq.lua
and DIR/rel.lua with new's arguments: for stripped-down experiments), `min` (the same with one
key and one argument). The client is a plain RESP socket, one command at a time, as dlock sends
them (EVALSHA, the token of the acquire's reply in the release). Needs valgrind and redis-server
on PATH; a bench, not a test.

The same for one Redlock node (crates/distlock-redis/scripts/quorum_*.lua: a vote and a
release per pair, the uncontended path, as src/quorum/mod.rs sends them; rslock's per-node
protocol is `rslock` above):

    script_cost.py count DIR qold|qnew    instructions per vote+release pair on one node
    script_cost.py qtime OLD_DIR NEW_DIR  server time per pair: OLD_DIR's quorum scripts with
                                          `qold` arguments, NEW_DIR's with `qnew`, and rslock's

DIR holds fence.lua, fence_next.lua and the quorum scripts (for the old layout: `git show
main:crates/distlock-redis/scripts/X.lua` of those into a directory). `qold`: the layout before
issue 28's lean vote (8 KEYS, 8 ARGV, a 5-element table reply; release 4 KEYS, 4 ARGV, a pair);
`qnew`: KEYS the hold, the end record and the node epoch, ARGV attempt, lease, epoch, owner (a
try: no waiter argument), an integer reply; release KEYS the hold, ARGV attempt and token (no
mode: a grant's release), an integer. The node's epoch is set (quarantine over) before the
pairs, whose lease is 30 s."""
import os, random, socket, subprocess, sys, time

OWNER, BASE = "host-1234-abcd", "dlock:{bench}"
RSLOCK_UNLOCK = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end"


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def __call__(self, *args):
        enc = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        self.s.sendall(b"*%d\r\n" % len(enc) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in enc))
        return self.read()

    def read(self):
        line = self.f.readline()
        t, r = line[:1], line[1:-2]
        if t == b":":
            return int(r)
        if t == b"+":
            return r.decode()
        if t == b"-":
            raise RuntimeError(r.decode())
        if t == b"$":
            n = int(r)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if t == b"*":
            return [self.read() for _ in range(int(r))]
        raise RuntimeError(f"reply {line!r}")


def source(d, *files):
    """The files of `d` concatenated; "@" stands for the line that sets the fencing margin."""
    text = ""
    for name in files:
        if name == "@":
            text += "local FENCE_MARGIN_MS = 3600000\n"
            continue
        with open(os.path.join(d, name)) as f:
            text += f.read()
    return text


def scripts(d):
    """The mutex acquire and release as src/scripts.rs builds them (a directory without
    fence_next.lua: the layout from before the uncontended paths moved around the prelude)."""
    if not os.path.exists(os.path.join(d, "fence_next.lua")):
        return source(d, "@", "fence.lua", "queue.lua", "acquire.lua"), source(d, "@", "fence.lua", "release.lua")
    return (source(d, "@", "fence.lua", "acquire.lua", "fence_next.lua", "queue.lua", "acquire_wait.lua"),
            source(d, "release.lua", "@", "fence.lua", "fence_next.lua", "release_handoff.lua"))


EPOCH = "0123456789abcdef:0:runid"


def quorum_scripts(d):
    """The Redlock vote and release as src/quorum/mod.rs builds them (a directory with
    quorum_acquire_wait.lua: the vote's uncontended path before the rest of the prelude)."""
    step = "local QUORUM_FLOOR_STEP_US = 100000\n"
    if os.path.exists(os.path.join(d, "quorum_acquire_wait.lua")):
        return (step + source(d, "@", "fence.lua", "quorum_acquire.lua", "fence_next.lua", "quorum_acquire_wait.lua"),
                source(d, "quorum_release.lua"))
    return step + source(d, "@", "fence.lua", "fence_next.lua", "quorum_acquire.lua"), source(d, "quorum_release.lua")


def quorum_pairs(cmd, d, layout, n):
    acquire, release = quorum_scripts(d)
    sa, sr = cmd("SCRIPT", "LOAD", acquire), cmd("SCRIPT", "LOAD", release)
    ns = "dlock"
    cmd("SET", ns + ":redlock:epoch", EPOCH)
    for i in range(n):
        a = f"{i + 1:016x}"
        if layout == "qold":
            v = cmd("EVALSHA", sa, 8, BASE, BASE + ":fence", ns + ":redlock:epoch", ns + ":redlock:horizon",
                    BASE + ":rlq", BASE + ":rlq:ttl", BASE + ":ended:" + a, BASE + ":waiters",
                    a, 30000, EPOCH, OWNER, "0", "0", BASE + ":released", "")
            assert v[0] == 1 and v[3] == 0, v
            r = cmd("EVALSHA", sr, 4, BASE, BASE + ":rlq", BASE + ":rlq:ttl", BASE + ":waiters",
                    a, v[1], BASE + ":released", "release")
            assert r[0] == 1, r
        else:
            t = cmd("EVALSHA", sa, 3, BASE, BASE + ":ended:" + a, ns + ":redlock:epoch", a, 30000, EPOCH, OWNER)
            assert isinstance(t, int) and t > 0, t
            r = cmd("EVALSHA", sr, 1, BASE, a, t)
            assert r == 1, r


def pairs(cmd, d, layout, n):
    if layout in ("qold", "qnew"):
        return quorum_pairs(cmd, d, layout, n)
    if layout == "rslock":
        sha = cmd("SCRIPT", "LOAD", RSLOCK_UNLOCK)
        for i in range(n):
            v = f"{i:032x}"
            assert cmd("SET", "rsl", v, "NX", "PX", 30000) == "OK"
            assert cmd("EVALSHA", sha, 1, "rsl", v) == 1
        return
    if layout in ("exp", "min"):
        with open(os.path.join(d, "acq.lua")) as a, open(os.path.join(d, "rel.lua")) as r:
            sa, sr = cmd("SCRIPT", "LOAD", a.read()), cmd("SCRIPT", "LOAD", r.read())
    else:
        acquire, release = scripts(d)
        sa, sr = cmd("SCRIPT", "LOAD", acquire), cmd("SCRIPT", "LOAD", release)
    for i in range(n):
        a = f"{i + 1:016x}"
        if layout == "min":
            cmd("EVALSHA", sa, 1, BASE, a)
            cmd("EVALSHA", sr, 1, BASE, a)
        elif layout == "old":
            keys = [BASE, BASE + ":fence", BASE + ":queue", BASE + ":waiters"]
            t = cmd("EVALSHA", sa, 5, *keys, BASE + ":ended:" + a, a, OWNER, 30000, 30000, 0, "wake:chan", 3630000)
            assert t > 0, t
            r = cmd("EVALSHA", sr, 4, *keys, a, t, BASE + ":released", "release", "5")
            assert r == 1, r
        else:
            t = cmd("EVALSHA", sa, 2, BASE, BASE + ":ended:" + a, a, OWNER, 30000, "30000:0:wake:chan")
            assert t > 0 or layout == "exp", t
            r = cmd("EVALSHA", sr, 1, BASE, a, t, "5")
            assert r == 1 or layout == "exp", r


def server(port, *wrap):
    p = subprocess.Popen([*wrap, "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            return p, Conn(port)
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


def count(d, layout):
    total = {}
    for n in (200, 1200):
        port = random.randint(20000, 40000)
        out = f"/tmp/script_cost.{os.getpid()}.{n}"
        p, cmd = server(port, "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
        pairs(cmd, d, layout, n)
        try:
            cmd("SHUTDOWN", "NOSAVE")
        except (RuntimeError, OSError):
            pass
        p.wait()
        # The requests' own cost: parsing and running them (processInputBuffer, inclusive), not
        # the event loop's timers, whose share grows with the wall time a loaded machine takes.
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                             capture_output=True, text=True, check=True).stdout
        total[n] = next(int(l.split()[0].replace(",", "")) for l in ann.splitlines() if ":processInputBuffer " in l)
        os.remove(out)
    print(f"{layout}: {(total[1200] - total[200]) // 1000} instructions per pair")


def server_time(old, new, blocks=30, per=500, quorum=False):
    port = random.randint(20000, 40000)
    p, cmd = server(port)
    usec = {"old": 0, "new": 0, "rslock": 0}
    names = {"old": "qold", "new": "qnew", "rslock": "rslock"} if quorum else {}
    for _ in range(blocks):
        for layout, d in (("old", old), ("new", new), ("rslock", old)):
            layout_of = names.get(layout, layout)
            cmd("CONFIG", "RESETSTAT")
            pairs(cmd, d, layout_of, per)
            info = cmd("INFO", "commandstats")
            for line in info.splitlines():
                name, _, rest = line.partition(":")
                # Top-level commands only: a script's usec covers the calls it makes; rslock's
                # SET NX PX is its one direct command (its script runs GET and DEL).
                if name in ("cmdstat_evalsha", "cmdstat_set") and not (name == "cmdstat_set" and layout != "rslock"):
                    usec[layout] += int(dict(kv.split("=") for kv in rest.split(","))["usec"])
    p.terminate()
    p.wait()
    n = blocks * per
    for k, v in usec.items():
        print(f"{k}: {v / n:.2f} µs of server time per pair")
    print(f"old {usec['old'] / usec['rslock']:.2f}× rslock, new {usec['new'] / usec['rslock']:.2f}× rslock")


if __name__ == "__main__":
    if sys.argv[1:2] == ["count"] and len(sys.argv) == 4:
        count(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["time"] and len(sys.argv) == 4:
        server_time(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["qtime"] and len(sys.argv) == 4:
        server_time(sys.argv[2], sys.argv[3], quorum=True)
    else:
        sys.exit(__doc__)

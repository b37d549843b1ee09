// node-redlock (npm `redlock`, with ioredis) through one scenario of the peer bench, under its
// rules: each client its own Redlock and connections, critical section = GET + SET of a
// counter on node 0, an acquire re-tried (`lock()` again) until 10 s have passed, then a
// give-up. Prints one JSON object. Run by benches/peers/node.rs:
//   node node_redlock.js '{"scenario":"uncontended"|"contended","urls":[...],"clients":N,
//                          "run_ms":N,"name":"...","warm_up":N}'
const Redis = require("ioredis");
const Redlock = require("redlock");

const cfg = JSON.parse(process.argv[2]);
const TTL = 30000;
const DEADLINE_MS = 10000;

function client() {
  const conns = cfg.urls.map((u) => new Redis(u, { enableOfflineQueue: true }));
  return { conns, redlock: new Redlock(conns) };
}

async function acquire(c, name) {
  const start = Date.now();
  for (;;) {
    try {
      return await c.redlock.lock(name, TTL);
    } catch (e) {
      if (!(e instanceof Redlock.LockError)) throw e;
      if (Date.now() - start >= DEADLINE_MS) return null;
    }
  }
}

function nowUs() {
  const [s, ns] = process.hrtime();
  return s * 1e6 + ns / 1e3;
}

function cpuUs() {
  const u = process.cpuUsage();
  return u.user + u.system;
}

async function uncontended() {
  const c = client();
  for (let i = 0; i < cfg.warm_up; i++) {
    const l = await acquire(c, cfg.name);
    await l.unlock();
  }
  const samples = [];
  const t0 = nowUs();
  const cpu0 = cpuUs();
  while (nowUs() - t0 < cfg.run_ms * 1000) {
    const t = nowUs();
    const l = await acquire(c, cfg.name);
    if (l === null) throw new Error("uncontended acquire gave up");
    await l.unlock();
    samples.push(nowUs() - t);
  }
  const out = { elapsed_us: nowUs() - t0, cpu_us: cpuUs() - cpu0, samples_us: samples };
  c.conns.forEach((x) => x.disconnect());
  return out;
}

async function contended() {
  const clients = [];
  for (let i = 0; i < cfg.clients; i++) {
    const c = client();
    c.counter = new Redis(cfg.urls[0]);
    const l = await acquire(c, cfg.name);
    await l.unlock();
    clients.push(c);
  }
  const key = cfg.name + "-counter";
  let inside = 0;
  let overlaps = 0;
  const start = nowUs() + 100000;
  const end = start + cfg.run_ms * 1000;
  const runs = await Promise.all(
    clients.map(async (c) => {
      while (nowUs() < start) await new Promise((r) => setTimeout(r, 1));
      const me = { waits_us: [], in_run: 0, sections: 0, give_ups: 0 };
      while (nowUs() < end) {
        const t = nowUs();
        const l = await acquire(c, cfg.name);
        if (l === null) {
          me.give_ups++;
          continue;
        }
        me.waits_us.push(nowUs() - t);
        if (inside++ !== 0) overlaps++;
        const v = Number((await c.counter.get(key)) || 0);
        await c.counter.set(key, v + 1);
        inside--;
        me.sections++;
        if (nowUs() <= end) me.in_run++;
        try {
          await l.unlock();
        } catch (e) {
          // An unlock that found the lock gone (lease ran out): counted as a section anyway.
        }
      }
      return me;
    })
  );
  const counter = Number((await clients[0].counter.get(key)) || 0);
  const sections = runs.reduce((a, r) => a + r.sections, 0);
  clients.forEach((c) => {
    c.conns.forEach((x) => x.disconnect());
    c.counter.disconnect();
  });
  return {
    per_client: runs.map((r) => r.in_run),
    waits_us: runs.flatMap((r) => r.waits_us),
    give_ups: runs.reduce((a, r) => a + r.give_ups, 0),
    sections,
    lost: Math.abs(sections - counter),
    overlaps,
  };
}

(cfg.scenario === "uncontended" ? uncontended() : contended())
  .then((r) => {
    // Exit once the whole reply is written (a pipe takes it in 64 KiB pieces).
    process.stdout.write(JSON.stringify(r) + "\n", () => process.exit(0));
  })
  .catch((e) => {
    process.stderr.write(String((e && e.stack) || e) + "\n");
    process.exit(1);
  });

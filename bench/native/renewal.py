#!/usr/bin/env python3
"""Server CPU per renewed mutex lease: lockflight's batch renewal script against the
compare-and-set that Valkey 8.1+ and Redis 8.4+ offer natively (SET ... IFEQ).

Starts a private valkey-server (scripts/valkey installs it) on a loopback port,
holds N mutex leases (a lock key per lease, nobody waiting), and renews all of them
once per round in four ways, alternating their order from round to round:

  renew_batch.lua    the script lockflight sends: 500 leases per EVALSHA
  SET IFEQ + EXISTS  per lease, pipelined: the compare-and-renew, and whether a
                     queue exists (what the holder must learn for the handoff)
  SET IFEQ           the compare-and-renew alone
  PEXPIRE            a floor: no comparison at all

and prints the server's main-thread CPU (INFO cpu) per lease, median of the rounds,
and each way's ratio to the script. Then it fills the server past `maxmemory`
(noeviction) and shows which of the ways still renew there.

Two more ways bound what the script could save, 500 leases per EVALSHA each:

  floor script       the least a script can do for what renewal must learn: one
                     MGET of the locks, one EXISTS of their queues, a PEXPIRE per
                     lease whose value is its token
  floor, no queue    the same without the EXISTS (the holder would no longer
                     learn that others wait)
  floor, batch args  the floor script called with renew_batch.lua's arguments
                     (three keys and a kind per lease) and reply (two values per
                     lease): what the layout costs, apart from the script's logic

    python3 bench/native/renewal.py [N] [ROUNDS]
    SERVER=redis python3 bench/native/renewal.py [N] [ROUNDS]   # redis-server from
                     PATH (before 8.4: no SET ... IFEQ, so those ways are skipped)
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LUA = os.path.join(ROOT, "src", "backend", "redis", "lua")
PARTS = ["queue.lua", "sem_common.lua", "renew.lua", "renew_batch.lua"]
TTL_MS = 3000


class Conn:
    """A RESP client just large enough for pipelines."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)

    def pipe(self, commands):
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        return [self.read() for _ in commands]

    def cpu_seconds(self):
        info = self.pipe([["INFO", "cpu"]])[0].decode()
        fields = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
        return float(fields["used_cpu_user_main_thread"]) + float(fields["used_cpu_sys_main_thread"])


# KEYS: the locks; ARGV: the TTL, then each lock's token, then each lock's queue.
FLOOR = """
local n = #KEYS
local values = redis.call('MGET', unpack(KEYS))
local queued = redis.call('EXISTS', unpack(ARGV, 2 + n, 1 + 2 * n))
local out = {}
for i = 1, n do
  if values[i] == ARGV[1 + i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# The floor with renew_batch.lua's arguments and reply shape.
FLOOR_BATCH_ARGS = """
local n = tonumber(ARGV[2])
local owned, queues = {}, {}
for i = 1, n do
  owned[i], queues[i] = KEYS[3 * i - 2], KEYS[3 * i - 1]
end
local values = redis.call('MGET', unpack(owned))
local queued = redis.call('EXISTS', unpack(queues))
local out = {}
for i = 1, n do
  if values[i] == ARGV[4 + 2 * i] then
    redis.call('PEXPIRE', owned[i], ARGV[3])
    out[2 * i - 1], out[2 * i] = 1, 0
  else
    out[2 * i - 1], out[2 * i] = 0, 0
  end
end
return out
"""

# The same without the queues' EXISTS.
FLOOR_NO_QUEUE = FLOOR.replace("local queued = redis.call('EXISTS', unpack(ARGV, 2 + n, 1 + 2 * n))\n", "")
assert FLOOR_NO_QUEUE != FLOOR, "the floor's EXISTS line changed: update FLOOR_NO_QUEUE"


def token(i):
    return "%032x" % (i * 7919 + 1)


def key(i):
    return "lf:{k%d}" % i


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    if os.environ.get("SERVER") == "redis":
        server = "redis-server"
    else:
        server = subprocess.run([os.path.join(ROOT, "scripts", "valkey")], check=True,
                                capture_output=True, text=True).stdout.strip()
    port = 27000 + os.getpid() % 2000
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", tempfile.mkdtemp()],
                            stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                conn = Conn(port)
                break
            except OSError:
                time.sleep(0.05)
        version = conn.pipe([["INFO", "server"]])[0].decode()
        lines = dict(l.split(":", 1) for l in version.splitlines() if ":" in l)
        version = "valkey " + lines["valkey_version"] if "valkey_version" in lines else "redis " + lines["redis_version"]
        print("server: %s, %d leases, %d rounds" % (version, n, rounds))
        run(conn, n, rounds)
    finally:
        proc.terminate()


def run(conn, n, rounds):
    script = "".join(open(os.path.join(LUA, p)).read() for p in PARTS)
    sha = conn.pipe([["SCRIPT", "LOAD", script]])[0].decode()
    floor = conn.pipe([["SCRIPT", "LOAD", FLOOR]])[0].decode()
    no_queue = conn.pipe([["SCRIPT", "LOAD", FLOOR_NO_QUEUE]])[0].decode()
    batch_args = conn.pipe([["SCRIPT", "LOAD", FLOOR_BATCH_ARGS]])[0].decode()
    info = conn.pipe([["INFO", "server"]])[0].decode()
    ifeq = "valkey_version" in info or tuple(
        int(x) for x in info.split("redis_version:")[1].split()[0].split(".")[:2]) >= (8, 4)
    for b in range(0, n, 1000):
        conn.pipe([["SET", key(i), token(i), "PX", 600000] for i in range(b, min(n, b + 1000))])

    def per_lease(build, check):
        for b in range(0, n, 1000):
            replies = conn.pipe([c for i in range(b, min(n, b + 1000)) for c in build(i)])
            check(replies)

    def script_way(sha=sha):
        commands = []
        for b in range(0, n, 500):
            ids = range(b, min(n, b + 500))
            keys, args = [], ["me", len(ids), TTL_MS, 60000]
            for i in ids:
                keys += [key(i), key(i) + ":q", key(i) + ":qe"]
                args += ["m", token(i)]
            commands.append(["EVALSHA", sha, len(keys)] + keys + args)
        for r in conn.pipe(commands):
            assert isinstance(r, list) and r[0] == b"1", r

    def floor_way(sha_, queues):
        commands = []
        for b in range(0, n, 500):
            ids = range(b, min(n, b + 500))
            commands.append(["EVALSHA", sha_, len(ids)] + [key(i) for i in ids] + [TTL_MS]
                            + [token(i) for i in ids]
                            + ([key(i) + ":q" for i in ids] if queues else []))
        for r in conn.pipe(commands):
            assert isinstance(r, list) and r[0] == b"1", r

    def ok(replies):
        assert replies[0] == b"OK", replies[0]

    ways = [
        ("renew_batch.lua", script_way),
        ("floor, batch args", lambda: script_way(batch_args)),
        ("floor script", lambda: floor_way(floor, True)),
        ("floor, no queue", lambda: floor_way(no_queue, False)),
        ("SET IFEQ + EXISTS", lambda: per_lease(
            lambda i: [["SET", key(i), token(i), "IFEQ", token(i), "PX", TTL_MS], ["EXISTS", key(i) + ":q"]], ok)),
        ("SET IFEQ", lambda: per_lease(
            lambda i: [["SET", key(i), token(i), "IFEQ", token(i), "PX", TTL_MS]], ok)),
        ("PEXPIRE", lambda: per_lease(lambda i: [["PEXPIRE", key(i), TTL_MS]], lambda r: None)),
    ]
    if not ifeq:
        ways = [w for w in ways if "IFEQ" not in w[0]]
    results = {name: [] for name, _ in ways}
    for r in range(rounds):
        for name, way in (ways if r % 2 == 0 else ways[::-1]):
            before = conn.cpu_seconds()
            way()
            results[name].append((conn.cpu_seconds() - before) / n * 1e6)
    base = sorted(results[ways[0][0]])[rounds // 2]
    print("%-18s %10s %16s %9s" % ("way", "µs/lease", "(min–max)", "÷ script"))
    for name, _ in ways:
        v = sorted(results[name])
        print("%-18s %10.2f %16s %9.2f" % (name, v[rounds // 2], "(%.2f–%.2f)" % (v[0], v[-1]), v[rounds // 2] / base))

    # Past maxmemory (noeviction): which ways still renew?
    conn.pipe([["SET", "ballast", "x" * 4_000_000]])
    conn.pipe([["CONFIG", "SET", "maxmemory-policy", "noeviction"], ["CONFIG", "SET", "maxmemory", "1mb"]])
    print("past maxmemory:")
    print("  renew_batch.lua  ->", conn.pipe([["EVALSHA", sha, 3, key(0), key(0) + ":q", key(0) + ":qe",
                                                "me", 1, TTL_MS, 60000, "m", token(0)]])[0])
    if ifeq:
        print("  SET IFEQ         ->", conn.pipe([["SET", key(1), token(1), "IFEQ", token(1), "PX", TTL_MS]])[0])
    print("  PEXPIRE          ->", conn.pipe([["PEXPIRE", key(2), TTL_MS]])[0])
    conn.pipe([["CONFIG", "SET", "maxmemory", "0"]])


if __name__ == "__main__":
    main()

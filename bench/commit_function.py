"""The step commit as a Valkey function with tenant accounts (issue 32) against the Lua script it replaced.

    .venv/bin/python bench/commit_function.py [--commits N]

Both run in the same Valkey, on the same commits: a micro-batch of a few units, each with its record,
entries appended downstream, a consumed stream trimmed and backlog counters moved, as an executor's
step commits them. The baseline is the script of the previous version (EVALSHA, fencing and the writes
only); ours is ``streamtopo_commit`` of streamtopo/valkey_library.py, without limits (``streamtopo
run``'s own Valkey) and with the platform's (the reads and writes of the accounts, the entry ids carrying
byte offsets, the trims' credit). Reported: Valkey's own CPU
microseconds per commit (INFO commandstats) and the client's wall time per commit, median of rounds.

Writes the "Step commit: function vs script" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from report import header, markdown, write_section  # noqa: E402

from streamtopo import valkey_library  # noqa: E402
from streamtopo.runtime.embedded import EmbeddedValkey  # noqa: E402

SCRIPT = """
local nu, na, nt, ni = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = ARGV[5]
local a = 6
for i = 1, nu do
  local epoch = redis.call('HGET', KEYS[i], 'epoch')
  if epoch ~= ARGV[a] then return {0, KEYS[i], epoch or ''} end
  a = a + 2
end
local k = 1
a = 6
for i = 1, nu do
  redis.call('HSET', KEYS[k], 'rec', ARGV[a + 1], 'committed_at', now)
  k = k + 1; a = a + 2
end
for i = 1, na do
  local nf = tonumber(ARGV[a])
  local args = {}
  for f = 1, nf do args[f] = ARGV[a + f] end
  redis.call('XADD', KEYS[k], '*', unpack(args))
  k = k + 1; a = a + 1 + nf
end
for i = 1, nt do
  redis.call('XTRIM', KEYS[k], 'MINID', ARGV[a])
  k = k + 1; a = a + 1
end
for i = 1, ni do
  redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
  k = k + 1; a = a + 2
end
return {1}
"""
"""The commit script before issue 32 (state_store.py's _COMMIT), the baseline."""

UNITS, APPENDS, ENTRY = 4, 8, 4096


def commit_args(prefix: str, step: int, last: dict[str, str]) -> tuple[list[str], list[object]]:
    """One step: UNITS records, APPENDS entries of ENTRY bytes, a trim of each stream to its newest entry
    of the previous step, a backlog counter per stream."""
    streams = [f"{prefix}:s:a->b:{i}" for i in range(APPENDS)]
    keys: list[str] = [f"{prefix}:u:b/{i}" for i in range(UNITS)]
    args: list[object] = [UNITS, APPENDS, len(last), APPENDS, repr(time.time())]
    for _ in range(UNITS):
        args += ["1", b"r" * 512]
    for stream in streams:
        keys.append(stream)
        args += [4, b"p", b"a/0", b"d", bytes([step % 256]) * ENTRY]
    for stream, entry in last.items():
        keys.append(stream)
        args.append(entry)
    for stream in streams:
        keys.append(f"{prefix}:backlog")
        args += [stream, 1]
    return keys, args


def run(client: redis.Redis, call, prefix: str, commits: int) -> float:
    for i in range(UNITS):
        client.hset(f"{prefix}:u:b/{i}", "epoch", "1")
    last: dict[str, str] = {}
    started = time.perf_counter()
    for step in range(commits):
        keys, args = commit_args(prefix, step, last)
        assert int(call(keys, args)[0]) == 1
        last = {
            s: client.xrevrange(s, count=1)[0][0].decode()
            for s in [f"{prefix}:s:a->b:{i}" for i in range(APPENDS)]
        }
    return (time.perf_counter() - started) / commits


def server_usec(client: redis.Redis, command: str) -> tuple[int, float]:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {"calls": 0, "usec": 0})
    return int(stats["calls"]), float(stats["usec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    load = os.getloadavg()[0]
    names = ["script (EVALSHA)", "function, no limits (a local run)", "function, platform limits"]
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with EmbeddedValkey() as valkey:
        client = redis.Redis.from_url(valkey.url)
        platform = valkey_library.Limits(account_bytes=2**40, entry_bytes=2**24, stream_entries=10**9)
        script = client.register_script(SCRIPT)
        fcall = ("fcall", lambda k, a: client.fcall("streamtopo_commit", len(k), *k, *a))
        calls = {
            names[0]: (valkey_library.Limits(), ("evalsha", lambda k, a: script(keys=k, args=a))),
            names[1]: (valkey_library.Limits(), fcall),
            names[2]: (platform, fcall),
        }
        for round_ in range(options.rounds):
            for name, (limits, (command, call)) in calls.items():
                client.flushall()
                valkey_library.ensure(client, limits)
                script = client.register_script(SCRIPT)
                client.config_resetstat()
                wall = run(client, call, f"st:{{bench-{round_}}}", options.commits)
                n, usec = server_usec(client, command)
                rows[name].append((usec / max(n, 1), wall * 1e6))
    table = [
        (name, statistics.median(u for u, _ in samples), statistics.median(w for _, w in samples))
        for name, samples in rows.items()
    ]
    base = table[0][1]
    lines = [
        *header(
            f"python bench/commit_function.py --commits {options.commits} --rounds {options.rounds}",
            f"load average {load:.1f} at the start (a shared machine: the ratio is what compares)",
        ),
        "",
        f"One commit: {UNITS} unit records of 512 B, {APPENDS} entries of {ENTRY} B appended, the previous "
        f"step's {APPENDS} streams trimmed, {APPENDS} backlog counters; medians of {options.rounds} rounds "
        f"of {options.commits} commits each, both in one embedded Valkey.",
        "",
        *markdown(
            ["commit", "Valkey CPU us/commit", "client wall us/commit", "Valkey CPU vs script"],
            [(n, u, w, f"{u / base:.2f}x") for n, u, w in table],
            digits=1,
        ),
    ]
    print("\n".join(lines))
    write_section("Step commit: function vs script", lines)


if __name__ == "__main__":
    main()

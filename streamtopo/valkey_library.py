"""The Valkey function library every write of a topology goes through, and the limits it keeps.

Tenants never run scripts of their own (no EVAL: one endless Lua loop makes every tenant's commands fail
with BUSY) and have no raw write command (one SET of a large value, or XADDs to made-up streams, would
fill the server for everyone). The operator loads this library (``FUNCTION LOAD``, with the platform's
limits written into it) and a topology's ACL user may only ``FCALL`` its functions and read its own keys
(controller/transport_acl.py). The functions are bounded loops over their arguments, refuse what exceeds
the limits before writing anything, and keep an account of the bytes each tenant holds:

- ``streamtopo_commit``: a micro-batch's effects, all or nothing (runtime/state_store.py, the protocol
  in docs/exactly-once.md): epoch fencing of every unit, then the unit records, the appended stream
  entries, the trims of consumed streams and the backlog counters;
- ``streamtopo_acquire``/``streamtopo_release``: unit ownership and its fencing epoch; an acquisition
  names the state layout it reads with and is refused a unit whose state another layout wrote;
- ``streamtopo_append``: one entry from a program outside a topology (a producer of a named stream);
- ``streamtopo_mark``: heartbeats, readiness and the topology's start time (small, expiring strings);
- ``streamtopo_log``: a hand-over record on the topology's capped ``pauses`` list;
- ``streamtopo_trim``/``streamtopo_drop``: the operator's trims and deletions of named streams (and an
  upgrade's removed streams and units), so the account follows them (replies: entries trimmed, keys
  deleted);
- ``streamtopo_version``: what is loaded (the operator reloads when the version or limits differ).

Accounts (with :attr:`Limits.account_bytes` set; a Valkey of one's own runs without). Every key belongs
to one account by its name: a topology's keys (``st:{<ns>/<name>}:*``) to
the hash ``st:{<ns>/<name>}:quota``, a namespace's named streams (``<ns>/<stream>``) to ``<ns>/#quota``
(``#`` is in no stream name). An account's ``used`` counts the bytes of its stream entries that are still
in their streams, its unit records, and a fixed overhead per stream and unit. A write that
would take ``used`` past :attr:`Limits.account_bytes` is refused whole (reply ``{3, account, used,
needed}``); a consumer's trims in the same commit are credited first, so a full account still drains.
To know what a trim frees without reading the entries, an entry's id is ``<ms>-<offset>``: Valkey's
clock in milliseconds (never going back) and the stream's total bytes appended before the entry, so a
trim to an entry frees the difference of its offset and the offset counted from. This is the cooperative
bound (executors wait at it); a tenant's raw writes are measured by the operator (transport_acl.py).
bench/commit_function.py measures the cost: 1.0-1.2x the old script's Valkey CPU per commit without
limits, 1.8-2.1x with them (about 100 microseconds more per commit of 4 units and 8 streams).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LIBRARY = "streamtopo"
VERSION = "2"
"""Bumped with every change of the functions' contract; the operator replaces an older library."""

FULL = 3
"""The commit's reply code when an account would exceed its limit (0: fenced, 1: done, 2: too large)."""
TOO_LARGE = 2
LAYOUT_CHANGED = -1
"""The acquisition's reply code when the unit's state was written under another layout (reply ``{-1,
stored layout}``; runtime/state_store.py's ``LayoutChanged``)."""


@dataclass(frozen=True)
class Limits:
    """What one tenant may hold in the platform's Valkey; 0 is no limit (a local run's own Valkey)."""

    account_bytes: int = 0
    """Bytes one account (a topology's keys, or a namespace's named streams) may hold."""
    entry_bytes: int = 0
    """Bytes of one stream entry or one unit record."""
    stream_entries: int = 0
    """Entries one stream may hold: a commit that would pass it waits (a consumer drains the stream)."""
    keys_per_call: int = 65536
    """Keys one function call may name (a commit's units, streams and counters)."""
    account_keys: int = 100_000
    """Keys one account may hold (units, streams, marks): more is no pipeline's doing."""
    marks_per_window: int = 10000
    """New heartbeat and readiness keys per topology per ten minutes (the longest a mark lives)."""

    def tag(self) -> str:
        return (
            f"{VERSION}:{self.account_bytes}:{self.entry_bytes}:{self.stream_entries}:{self.keys_per_call}:"
            f"{self.marks_per_window}"
        )


_SOURCE = r"""#!lua name=streamtopo
local TAG = '@TAG@'
local ACCOUNT_BYTES = @ACCOUNT_BYTES@
local ENTRY_BYTES = @ENTRY_BYTES@
local STREAM_ENTRIES = @STREAM_ENTRIES@
local KEYS_PER_CALL = @KEYS_PER_CALL@
local MARKS_PER_WINDOW = @MARKS_PER_WINDOW@
local MARK_MS = 600000
local STREAM_COST, UNIT_COST = 256, 256

local function account(key)
  local prefix = string.match(key, '^(st:{[^}]*}):')
  if prefix then return prefix .. ':quota' end
  local namespace = string.match(key, '^([^/]+)/')
  if namespace then return namespace .. '/#quota' end
  return '#quota'
end

local function offset_of(id)
  return tonumber(string.match(id, '%-(%d+)$')) or 0
end

local function too_many(keys)
  if #keys > KEYS_PER_CALL then
    return redis.error_reply('ERR streamtopo: more than ' .. KEYS_PER_CALL .. ' keys in one call')
  end
end

local function entry_size(args, from, count)
  local size = 0
  for f = 1, count do size = size + #args[from + f - 1] end
  return size
end

-- A stream's account fields, read once per call (``states``): bytes appended in all (n), the offset the
-- account counts from (b), the last entry's milliseconds (m); ``dirty`` once changed.
local function stream_state(states, stream)
  local s = states[stream]
  if s then return s end
  local acct = account(stream)
  local got = redis.call('HMGET', acct, 'n:' .. stream, 'b:' .. stream, 'm:' .. stream)
  s = {acct = acct, seen = got[1] and true or false, n = tonumber(got[1] or '0'),
       b = tonumber(got[2] or '0'), m = tonumber(got[3] or '')}
  states[stream] = s
  return s
end

local function save_states(states)
  for stream, s in pairs(states) do
    if s.dirty then
      redis.call('HSET', s.acct, 'n:' .. stream, string.format('%d', s.n), 'b:' .. stream,
        string.format('%d', s.b), 'm:' .. stream, string.format('%d', s.m or 0))
    end
  end
end

-- Bytes a trim of ``stream`` to ``minid`` frees, and the offset the account then counts from: an
-- executor trims to an entry it read, whose id carries the stream's bytes before it (no entry is read
-- here). A made-up id can only misstate the caller's own account, which the operator's sweep measures.
local function freed(states, stream, minid)
  local s = stream_state(states, stream)
  local after = math.min(offset_of(minid), s.n)
  if after > s.b then return after - s.b, after end
  return 0, s.b
end

local function trim(states, stream, minid, accounting)
  local bytes, base = 0, 0
  if accounting then bytes, base = freed(states, stream, minid) end
  local removed = redis.call('XTRIM', stream, 'MINID', minid)
  if bytes > 0 then
    local s = states[stream]
    s.b = base
    s.dirty = true
  end
  return bytes, removed
end

-- Append an entry; with accounting its id is <ms>-<bytes appended before it> (ms never going back).
local function append(states, clock, stream, args, from, count, size, accounting)
  local fields = {}
  for f = 1, count do fields[f] = args[from + f - 1] end
  if not accounting then return redis.call('XADD', stream, '*', unpack(fields)) end
  local s = stream_state(states, stream)
  if s.m == nil then
    -- first append through the library: start after whatever the stream holds
    s.m = 0
    local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if #newest > 0 then s.m = tonumber(string.match(newest[1][1], '^(%d+)')) + 1 end
  end
  if not clock.ms then
    local now = redis.call('TIME')
    clock.ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  local ms = math.max(clock.ms, s.m)
  local id = redis.call('XADD', stream, string.format('%d-%d', ms, s.n), unpack(fields))
  s.n, s.m, s.seen, s.dirty = s.n + size, ms, true, true
  return id
end

-- The accounts' ``used`` bytes (read once into ``used``); the refusal {3, account, used, needed} when a
-- positive change would pass the limit.
local function over(changes, used)
  for acct, change in pairs(changes) do
    used[acct] = tonumber(redis.call('HGET', acct, 'used') or '0')
    if change > 0 and used[acct] + change > ACCOUNT_BYTES then return {3, acct, used[acct], change} end
  end
  return nil
end

local function settle(changes, used)
  for acct, change in pairs(changes) do
    if change ~= 0 then
      local after = (used[acct] or tonumber(redis.call('HGET', acct, 'used') or '0')) + change
      if after < 0 then after = 0 end
      redis.call('HSET', acct, 'used', string.format('%d', after))
    end
  end
end

local function commit(keys, args)
  local refused = too_many(keys)
  if refused then return refused end
  local nu, na, nt, ni = tonumber(args[1]), tonumber(args[2]), tonumber(args[3]), tonumber(args[4])
  local now = args[5]
  local accounting = ACCOUNT_BYTES > 0
  local a = 6
  for i = 1, nu do
    local epoch = redis.call('HGET', keys[i], 'epoch')
    if epoch ~= args[a] then return {0, keys[i], epoch or ''} end
    a = a + 2
  end
  -- What the commit would change, read before anything is written.
  local changes, states, used, lengths, sizes = {}, {}, {}, {}, {}
  local function add(key, bytes) local acct = account(key); changes[acct] = (changes[acct] or 0) + bytes end
  local k = 1
  a = 6
  for i = 1, nu do
    local rec = args[a + 1]
    if ENTRY_BYTES > 0 and #rec > ENTRY_BYTES then return {2, keys[k], #rec, ENTRY_BYTES} end
    if accounting then add(keys[k], #rec - redis.call('HSTRLEN', keys[k], 'rec')) end
    k = k + 1; a = a + 2
  end
  for i = 1, na do
    local nf = tonumber(args[a])
    sizes[i] = entry_size(args, a + 1, nf)
    if ENTRY_BYTES > 0 and sizes[i] > ENTRY_BYTES then return {2, keys[k], sizes[i], ENTRY_BYTES} end
    if STREAM_ENTRIES > 0 then
      lengths[keys[k]] = (lengths[keys[k]] or redis.call('XLEN', keys[k])) + 1
      if lengths[keys[k]] > STREAM_ENTRIES then return {3, keys[k], lengths[keys[k]] - 1, 1} end
    end
    if accounting then
      local s = stream_state(states, keys[k])
      add(keys[k], sizes[i] + ((s.seen or s.charged) and 0 or STREAM_COST))
      s.charged = true
    end
    k = k + 1; a = a + 1 + nf
  end
  for i = 1, nt do
    if accounting then
      local bytes, base = freed(states, keys[k], args[a])
      states[keys[k]].trimmed_to = base
      add(keys[k], -bytes)
    end
    k = k + 1; a = a + 1
  end
  k = k + ni  -- counters: one field per stream of the topology, within its streams' overhead
  if accounting then
    local full = over(changes, used)
    if full then return full end
  end
  -- The writes, all of them or (above) none.
  local clock = {}
  k = 1
  a = 6
  for i = 1, nu do
    redis.call('HSET', keys[k], 'rec', args[a + 1], 'committed_at', now)
    k = k + 1; a = a + 2
  end
  for i = 1, na do
    local nf = tonumber(args[a])
    append(states, clock, keys[k], args, a + 1, nf, sizes[i], accounting)
    k = k + 1; a = a + 1 + nf
  end
  for i = 1, nt do
    redis.call('XTRIM', keys[k], 'MINID', args[a])
    local s = states[keys[k]]
    if s and s.trimmed_to and s.trimmed_to > s.b then s.b, s.dirty = s.trimmed_to, true end
    k = k + 1; a = a + 1
  end
  for i = 1, ni do
    redis.call('HINCRBY', keys[k], args[a], args[a + 1])
    k = k + 1; a = a + 2
  end
  if accounting then
    save_states(states)
    settle(changes, used)
  end
  return {1}
end

local function acquire(keys, args)
  local layout = args[3] or ''
  if layout ~= '' then
    local stored = redis.call('HGET', keys[1], 'layout')
    if stored and stored ~= layout and redis.call('HEXISTS', keys[1], 'rec') == 1 then return {-1, stored} end
  end
  if ACCOUNT_BYTES > 0 and redis.call('EXISTS', keys[1]) == 0 then
    local changes, used = {[account(keys[1])] = UNIT_COST}, {}
    local full = over(changes, used)
    if full then return full end
    settle(changes, used)
  end
  local epoch = redis.call('HINCRBY', keys[1], 'epoch', 1)
  redis.call('HSET', keys[1], 'owner', args[1], 'acquired_at', args[2])
  if layout ~= '' then redis.call('HSET', keys[1], 'layout', layout) end
  return {epoch, redis.call('HGET', keys[1], 'rec') or false}
end

local function release(keys, args)
  if redis.call('HGET', keys[1], 'epoch') ~= args[1] then return 0 end
  redis.call('HSET', keys[1], 'owner', '', 'released_at', args[2])
  return 1
end

local function append_one(keys, args)
  if #keys ~= 1 or #args == 0 or #args % 2 ~= 0 then
    return redis.error_reply('ERR streamtopo: one stream, and fields in pairs')
  end
  local size = entry_size(args, 1, #args)
  if ENTRY_BYTES > 0 and size > ENTRY_BYTES then
    return redis.error_reply('ERR streamtopo: entry of ' .. size .. ' bytes, the limit is ' .. ENTRY_BYTES)
  end
  if STREAM_ENTRIES > 0 and redis.call('XLEN', keys[1]) >= STREAM_ENTRIES then
    return redis.error_reply('ERR streamtopo: ' .. keys[1] .. ' holds ' .. STREAM_ENTRIES .. ' entries')
  end
  local accounting, states, used = ACCOUNT_BYTES > 0, {}, {}
  local changes = {}
  if accounting then
    local s = stream_state(states, keys[1])
    changes[s.acct] = size + (s.seen and 0 or STREAM_COST)
    local full = over(changes, used)
    if full then return redis.error_reply('ERR streamtopo: ' .. full[2] .. ' is full (' .. full[3] .. ' bytes)') end
  end
  local id = append(states, {}, keys[1], args, 1, #args, size, accounting)
  if accounting then
    save_states(states)
    settle(changes, used)
  end
  return id
end

-- Heartbeats and readiness (expiring, at most MARK_MS) and the topology's start time (set once).
local function mark(keys, args)
  local key, value, ttl, only_new = keys[1], args[1], tonumber(args[2] or ''), args[3] == 'nx'
  local prefix, kind = string.match(key, '^(st:{[^}]*}):([%w_]+)')
  if #value > 256 then return redis.error_reply('ERR streamtopo: a mark holds at most 256 bytes') end
  if kind == 't0' then
    if key ~= prefix .. ':t0' or not only_new or ttl then
      return redis.error_reply('ERR streamtopo: the start time is set once, without expiry')
    end
    return redis.call('SET', key, value, 'NX')
  end
  if (kind ~= 'hb' and kind ~= 'ready') or not ttl or ttl <= 0 or ttl > MARK_MS then
    return redis.error_reply('ERR streamtopo: a mark is a heartbeat or readiness key expiring within 10 minutes')
  end
  if redis.call('EXISTS', key) == 0 and MARKS_PER_WINDOW > 0 then
    local counter = prefix .. ':marks'
    local made = redis.call('INCR', counter)
    if made == 1 then redis.call('PEXPIRE', counter, MARK_MS) end
    if made > MARKS_PER_WINDOW then
      return redis.error_reply('ERR streamtopo: more than ' .. MARKS_PER_WINDOW .. ' new marks in 10 minutes')
    end
  end
  return redis.call('SET', key, value, 'PX', ttl)
end

local function log(keys, args)
  if not string.match(keys[1], '^st:{[^}]*}:pauses$') or #args[1] > 4096 then
    return redis.error_reply('ERR streamtopo: a log record is at most 4096 bytes on a pauses list')
  end
  local length = redis.call('RPUSH', keys[1], args[1])
  if length > 1000 then redis.call('LTRIM', keys[1], -1000, -1) end
  return length
end

local function trim_one(keys, args)
  local states = {}
  local bytes, removed = trim(states, keys[1], args[1], ACCOUNT_BYTES > 0)
  save_states(states)
  settle({[account(keys[1])] = -bytes}, {})
  return removed
end

-- Delete streams and unit records with their account's bytes (the operator's sweep of a deleted
-- topology's named streams, an upgrade's removed streams and units).
local function drop(keys, args)
  local refused = too_many(keys)
  if refused then return refused end
  local dropped = 0
  for i = 1, #keys do
    local acct = account(keys[i])
    local got = redis.call('HMGET', acct, 'n:' .. keys[i], 'b:' .. keys[i])
    if got[1] then
      local held = tonumber(got[1]) - tonumber(got[2] or '0') + STREAM_COST
      settle({[acct] = -held}, {})
      redis.call('HDEL', acct, 'n:' .. keys[i], 'b:' .. keys[i], 'm:' .. keys[i])
    elseif ACCOUNT_BYTES > 0 and string.match(keys[i], '^st:{[^}]*}:u:') and redis.call('EXISTS', keys[i]) == 1 then
      settle({[acct] = -(UNIT_COST + redis.call('HSTRLEN', keys[i], 'rec'))}, {})
    end
    dropped = dropped + redis.call('UNLINK', keys[i])
  end
  return dropped
end

redis.register_function('streamtopo_commit', commit)
redis.register_function('streamtopo_acquire', acquire)
redis.register_function('streamtopo_release', release)
redis.register_function('streamtopo_append', append_one)
redis.register_function('streamtopo_mark', mark)
redis.register_function('streamtopo_log', log)
redis.register_function('streamtopo_trim', trim_one)
redis.register_function('streamtopo_drop', drop)
redis.register_function{function_name='streamtopo_version', callback=function() return TAG end, flags={'no-writes'}}
"""


def source(limits: Limits) -> str:
    """The library's Lua text with ``limits`` written in."""
    values = {
        "@TAG@": limits.tag(),
        "@ACCOUNT_BYTES@": str(int(limits.account_bytes)),
        "@ENTRY_BYTES@": str(int(limits.entry_bytes)),
        "@STREAM_ENTRIES@": str(int(limits.stream_entries)),
        "@KEYS_PER_CALL@": str(int(limits.keys_per_call)),
        "@MARKS_PER_WINDOW@": str(int(limits.marks_per_window)),
    }
    text = _SOURCE
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def loaded(client: Any) -> str | None:
    """The tag of the library loaded in ``client``'s Valkey (version and limits), None when none is."""
    try:
        tag = client.fcall_ro("streamtopo_version", 0)
    except Exception as error:  # noqa: BLE001 - redis-py's ResponseError: "Function not found"
        if "function not found" in str(error).lower() or "no such function" in str(error).lower():
            return None
        raise
    return tag.decode() if isinstance(tag, bytes) else str(tag)


def ensure_loaded(client: Any, limits: Limits | None = None) -> None:
    """Load the library with ``limits`` (none by default: a Valkey of one's own, ``streamtopo run``,
    tests) unless one is loaded; a platform's library, with its limits, is never replaced here, only by
    :func:`ensure`."""
    if loaded(client) is None:
        client.function_load(source(limits or Limits()), replace=True)


def ensure(admin: Any, limits: Limits) -> bool:
    """Load the library with ``limits`` unless exactly that is loaded (an admin connection: tenants may
    not load functions). True when it was (re)loaded."""
    if loaded(admin) == limits.tag():
        return False
    admin.function_load(source(limits), replace=True)
    return True

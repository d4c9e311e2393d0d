-- Shared prelude of lockflight's scripts (prepended to each of them).
--
-- The waiter queue of a key is two sorted sets with the same members, the ids of the
-- waiting instances: the queue itself (score: enqueue time in µs, the FIFO order)
-- and its expiry index (score: the entry's expiry in ms). Entries expire so that a
-- crashed instance cannot block the queue; both sets carry a TTL so an abandoned
-- queue leaves no key behind. Every queue operation is O(log n) and a constant
-- number of commands, whatever the number of waiting instances; a script that finds
-- the queue empty (one ZCARD) touches nothing else of it.
--
-- The server clock (TIME) is read only where it is used: to mint a fencing epoch,
-- and to expire or stamp queue entries when the queue is not empty.
--
-- A script is not rolled back when a command fails half-way. So every script does all
-- the reads that can fail (a key holding a value of another type) before its first
-- write: a foreign value is reported with nothing changed.

local clock
-- The server's time, read once per script and only when needed: { ms, us }.
local function now()
  if clock == nil then
    local time = redis.call('TIME')
    clock = {
      ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000),
      us = tonumber(time[1]) * 1000000 + tonumber(time[2]),
    }
  end
  return clock
end

-- `redis.call(cmd, key, ...)`, but a value of the wrong type at `key` raises a
-- WRONGTYPE error that names the key's role.
local function read(role, cmd, key, ...)
  local reply = redis.pcall(cmd, key, ...)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      error({ err = 'WRONGTYPE the ' .. role .. ' key holds a value of another type' })
    end
    error(reply)
  end
  return reply
end

-- Reads the queue (`queue`, and its expiry index `expiry`). Returns a table with
-- `others`: the number of live entries other than `me`, `mine`: the enqueue time of
-- `me`'s live entry (or nil), `expired`: the ids of expired entries (for `purge`),
-- and, with `want_head`, `head`: the earliest live entry (other than `me` when
-- `skip_me`). With `for_write`, the expiry index is type-checked even when the queue
-- is empty (the caller will write it).
local function read_queue(queue, expiry, me, want_head, skip_me, for_write)
  local q = { others = 0, expired = {} }
  local size = read('queue', 'ZCARD', queue)
  if size == 0 then
    if for_write then
      read('queue expiry', 'ZCARD', expiry)
    end
    return q
  end
  q.expired = read('queue expiry', 'ZRANGEBYSCORE', expiry, '-inf', now().ms)
  local dead = {}
  for _, id in ipairs(q.expired) do
    dead[id] = true
  end
  local mine = redis.call('ZSCORE', queue, me)
  if mine and not dead[me] then
    q.mine = mine
  end
  q.others = math.max(0, size - #q.expired - (q.mine and 1 or 0))
  if want_head and q.others + (q.mine and 1 or 0) > 0 then
    -- The head is among the first #expired + 2 entries (expired ones and `me` skipped).
    local first = redis.call('ZRANGE', queue, 0, #q.expired + 1)
    for _, id in ipairs(first) do
      if not dead[id] and (id ~= me or not skip_me) then
        q.head = id
        break
      end
    end
  end
  return q
end

-- Drops the expired entries `read_queue` found.
local function purge(queue, expiry, q)
  if #q.expired > 0 then
    redis.call('ZREM', queue, unpack(q.expired))
    redis.call('ZREM', expiry, unpack(q.expired))
  end
end

-- (Re)queues `me`: at `at` µs in the queue (with `at` nil, an entry keeps its place),
-- expiring `entry_ttl` ms from now; both sets then live at least `entry_ttl` ms.
local function enqueue(queue, expiry, me, at, entry_ttl)
  if at ~= nil then
    redis.call('ZADD', queue, string.format('%.0f', at), me)
  end
  redis.call('ZADD', expiry, string.format('%.0f', now().ms + entry_ttl), me)
  if redis.call('PTTL', queue) < entry_ttl then
    redis.call('PEXPIRE', queue, entry_ttl)
    redis.call('PEXPIRE', expiry, entry_ttl)
  end
end

-- Adds `member` to the sorted set `set` at `score`; the set then lives at least
-- `ttl` ms.
local function add_living(set, score, member, ttl)
  redis.call('ZADD', set, string.format('%.0f', score), member)
  if redis.call('PTTL', set) < ttl then
    redis.call('PEXPIRE', set, ttl)
  end
end

-- Removes `me`'s entry.
local function dequeue(queue, expiry, me)
  redis.call('ZREM', queue, me)
  redis.call('ZREM', expiry, me)
end

-- Gives `head` a claim of `claim_ttl` ms and publishes the wake-up message on its channel.
-- If the PUBLISH is refused (an ACL without that channel), takes the claim back, so
-- that nobody waits out the claim of an instance that was never told, and returns
-- the error; else returns nil.
local function wake(head, claim, claim_ttl, channel, raw_key)
  redis.call('SET', claim, head, 'PX', claim_ttl)
  local reply = redis.pcall('PUBLISH', channel, raw_key)
  if type(reply) == 'table' and reply.err then
    redis.call('DEL', claim)
    return reply.err
  end
  return nil
end

-- The release record of a lease (see release.lua): the token when a release deleted
-- the lease, '0' when a release found nothing to delete. A retried release whose
-- first attempt's reply was lost finds the token and reports the release, not a
-- loss; and an acquire that finds either value is a late copy, refused (a token is
-- never granted again once a release of it was sent, even if the release landed
-- before the acquire it meant to undo).
--
-- Reads: whether an earlier attempt of this release deleted the lease; asked only
-- when the lease is not `held` now.
local function released_before(held, record)
  if held then
    return false
  end
  local r = read('release record', 'GET', record)
  return r ~= false and r ~= '0'
end

-- Writes, after the delete, never before (memory pressure): records the release of a
-- `held` lease for `ttl_ms` ms, or retires a token that holds nothing (best effort:
-- under memory pressure the retirement is skipped, and a late copy of an acquire
-- could then hold the lock until its TTL, as before).
-- Returns 1 when this release or an earlier attempt of it deleted the lease, else 0.
local function settle_release(held, previous, record, token, ttl_ms)
  if held then
    redis.call('SET', record, token, 'PX', tonumber(ttl_ms))
    return 1
  end
  if previous then
    return 1
  end
  redis.pcall('SET', record, '0', 'NX', 'PX', tonumber(ttl_ms))
  return 0
end

-- Whether a waiter's grant entry may be granted now (release.lua grants the mutex,
-- rw_release.lua the write lease, under the same rule): its ask arrived `at` (ms,
-- the server's clock) asking for `ttl` ms, in an entry that lives `life` ms. The
-- window is the shorter of the two; the ask must be younger than half of it and
-- than `max_age` (a release record's lifetime), no release record `record` may
-- stand for its token, and the server must not be in a restart's quarantine (the
-- life key `life_key`; a value of another type there means no grant).
-- Returns the window and the ask's age in ms, or nil.
local function grantable(ttl, at, life, max_age, record, life_key)
  local window = math.min(tonumber(ttl), tonumber(life))
  local age = now().ms - tonumber(at)
  if age < 0 or age >= math.min(window / 2, tonumber(max_age)) then
    return nil
  end
  if redis.call('EXISTS', record) == 1 then
    return nil
  end
  local lived = redis.pcall('GET', life_key)
  if type(lived) == 'string' then
    local quarantine = tonumber(string.match(lived, '^%d+ (%d+)$') or '0')
    if now().ms < quarantine then
      return nil
    end
  elseif lived then
    return nil
  end
  return window, age
end

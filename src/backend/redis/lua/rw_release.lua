-- read-write lock: release a read or write lease (or withdraw a waiting writer)
--
-- KEYS[1] read leases   KEYS[2] write lease   KEYS[3] waiting writers
-- KEYS[4] waiting instances   KEYS[5] this lease's release record
-- KEYS[6] write fence   KEYS[7] the server's life key (see life.lua)
-- ARGV[1] "r" (read), "w" (write) or "g" (give back a write grant nobody here took,
-- see below)  ARGV[2] token  ARGV[3] channel prefix
-- ARGV[4] the wake-up message (a lock-kind tag byte + the key, built in Rust)  ARGV[5] release record ttl ms
-- ARGV[6] "1" when this backend grants (see Grants below), "" when it never does
--
-- Returns { released, writers [, publish error [, granted]] }: released = 1 if the
-- token held a live lease of that kind, now deleted, or if its release record shows
-- that an earlier attempt of this release deleted it (a retry after a lost reply);
-- 0 if not (nothing of it was live). As in release.lua, the deletes are the first
-- writes and the record is written after them, so a release works under `maxmemory`
-- / `noeviction`. `writers`: the live waiting writers left. granted: 1 when the
-- write lease was granted to a waiting writer. For "w", the token's waiting-writer
-- entry and grant entry are removed too (a writer that gives up). When this frees
-- the lock for someone who waits (no write lease is left, and no live read lease is
-- left, or a writer withdrew and none waits any more), the script grants the write
-- lease to a waiting writer (below) or, if it does not, every live waiting instance
-- gets the wake-up message on its channel (channel prefix .. instance id) and the
-- waiting set is deleted: the woken instances ask again (and register again if still
-- refused). A refused PUBLISH is reported.
--
-- "g", the give-back of an unwanted write grant (the instance it was granted to
-- has nobody waiting with its token): a write release of the token, but only while
-- the write lease is still that token's and the grant's mark is still there (no
-- ask with the token took the lease since: "already yours" deletes the mark, as
-- leave.lua requires for the mutex); otherwise nothing changes and { 0, writers }
-- is returned. A lease the token's own ask took is its holder's, however late a
-- copy of the grant message arrives.
--
-- Grants: when no write lease and no live read lease is left, grants are on
-- (ARGV[6]) and a writer waits, the writer whose live waiting entry is earliest
-- (its last ask the oldest) may be given the write lease itself, on the server,
-- under the mutex's conditions (`grantable`, queue.lua): its grant entry (rw_write.lua
-- writes `<write lease>:g:<token>` = "<token> <ttl ms> <arrival ms> <entry ttl ms>
-- <send stamp> <instance id>" at each of its asks) is younger than half the
-- window (the lesser of the lease TTL and the entry's lifetime) and than a release
-- record's lifetime, its token has no release record, and the server is not in a
-- restart's quarantine. The grant mints a write epoch as rw_write.lua does, sets
-- the write lease for the token until the window ends (`PX window - age`),
-- removes its waiting-writer entry and its instance's waiting entry (as an
-- acquire does), marks the grant entry "granted <token>" and publishes the grant
-- on the writer's instance channel: tag 0xF8, the token's 32 hex digits, the
-- epoch, a space, the live waiting writers left, a space, the window in ms, a
-- space, '-' (the read-write lock has no fair mode), a space, the ask's send
-- stamp, a space, the key. A refused PUBLISH is reported; the grant stands (the
-- writer finds it at its next ask: "already yours").
--
-- A grant wakes nobody else. The other waiting instances (readers, and the other
-- writers) would only be answered busy by the write lease just set; they stay in
-- the waiting set, so the release that frees the lock again (the granted lease's,
-- or the expiry of a grant nobody took, which their own asks at the lease's PTTL
-- find) wakes them, and their asks keep their entries alive meanwhile. Readers
-- before writes, and the grant after the delete and the record, as above: the
-- grant's writes only follow the release's own.
local readers, writer, writers, waiting, record, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local kind, token = ARGV[1], ARGV[2]
local grants = ARGV[6] == '1'

-- Reads.
local holder = read('write lease', 'GET', writer)
local lease = read('read leases', 'ZSCORE', readers, token)
local entry = read('waiting writers', 'ZSCORE', writers, token)
read('waiting instances', 'ZCARD', waiting)
local t = now()
local ms = string.format('%.0f', t.ms)
if kind == 'g' then
  if holder ~= token or redis.pcall('GET', writer .. ':g:' .. token) ~= 'granted ' .. token then
    return { 0, redis.call('ZCOUNT', writers, '(' .. ms, '+inf') }
  end
  kind = 'w'
end
local held = (kind == 'w' and holder == token) or (kind ~= 'w' and lease and tonumber(lease) > t.ms)
local previous = released_before(held, record)

-- Writes: the deletes first, then the record.
local changed = false
if kind == 'w' then
  if holder == token then
    redis.call('DEL', writer)
    holder, changed = false, true
  end
  if entry then
    redis.call('ZREM', writers, token)
    changed = true
  end
  redis.call('DEL', writer .. ':g:' .. token)
elseif lease then
  redis.call('ZREM', readers, token)
  changed = true
end
local released = settle_release(held, previous, record, token, ARGV[5])
local writers_left = redis.call('ZCOUNT', writers, '(' .. ms, '+inf')

-- Gives the write lease to the earliest live waiting writer if its grant entry
-- allows it (see Grants above); returns true if it did, and the PUBLISH's error if
-- that was refused.
local function grant()
  local first = redis.call('ZRANGEBYSCORE', writers, '(' .. ms, '+inf', 'LIMIT', 0, 1)
  if first[1] == nil then
    return false
  end
  local entry_key = writer .. ':g:' .. first[1]
  local value = redis.pcall('GET', entry_key)
  if type(value) ~= 'string' then
    return false
  end
  local tok, ttl, at, life, stamp, id =
    string.match(value, '^(%x+) (%d+) (%d+) (%d+) (%d+) (%S+)$')
  if tok == nil or string.len(tok) ~= 32 or tok ~= first[1] then
    return false
  end
  -- That token's release record: this lease's record (KEYS[5]) less its token.
  local window, age =
    grantable(ttl, at, life, ARGV[5], string.sub(record, 1, -33) .. tok, KEYS[7])
  if window == nil then
    return false
  end
  -- The write epoch, as rw_write.lua mints it; a fence of another type means no
  -- grant.
  local last = redis.pcall('GET', fence)
  if type(last) == 'table' then
    return false
  end
  local epoch = math.max((tonumber(last or '0') or 0) + 1, t.us)
  redis.call('SET', fence, string.format('%.0f', epoch), 'PX', math.max(tonumber(ttl) * 10, 60000))
  redis.call('SET', writer, tok, 'PX', window - age)
  redis.call('ZREM', writers, tok)
  redis.call('ZREM', waiting, id)
  -- The entry becomes the grant's mark until the window ends or the token asks
  -- ("already yours" deletes it).
  redis.call('SET', entry_key, 'granted ' .. tok, 'PX', window - age)
  writers_left = math.max(0, writers_left - 1)
  local message = string.char(248) .. tok .. string.format('%.0f', epoch) .. ' '
    .. string.format('%d', writers_left) .. ' ' .. string.format('%d', window) .. ' - '
    .. stamp .. ' ' .. string.sub(ARGV[4], 2)
  local reply = redis.pcall('PUBLISH', ARGV[3] .. id, message)
  if type(reply) == 'table' and reply.err then
    return true, reply.err
  end
  return true, nil
end

local refused
local granted = false
if changed and holder == false then
  local readers_left = redis.call('ZCOUNT', readers, '(' .. ms, '+inf')
  if grants and readers_left == 0 and writers_left > 0 then
    granted, refused = grant()
  end
  if not granted and (readers_left == 0 or (kind == 'w' and writers_left == 0)) then
    local ids = redis.call('ZRANGEBYSCORE', waiting, '(' .. ms, '+inf')
    redis.call('DEL', waiting)
    for _, id in ipairs(ids) do
      local reply = redis.pcall('PUBLISH', ARGV[3] .. id, ARGV[4])
      if type(reply) == 'table' and reply.err then
        refused = reply.err
      end
    end
  end
end
if granted then
  return { released, writers_left, refused or false, 1 }
end
return { released, writers_left, refused }

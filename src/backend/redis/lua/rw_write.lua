-- read-write lock: acquire (or re-arm) the write lease, or wait as a writer
--
-- KEYS[1] read leases (zset: token -> expiry ms)   KEYS[2] write lease (string, PX)
-- KEYS[3] waiting writers (zset: token -> expiry ms)   KEYS[4] write fence
-- KEYS[5] waiting instances (zset: instance id -> expiry ms)
-- KEYS[6] the release record of this token (see rw_release.lua)
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] instance id  ARGV[4] waiting entry ttl ms
-- ARGV[5] "1" to wait (register as a waiting writer and for the wake-up), "0" not to
-- ARGV[6] fence ttl ms
-- ARGV[7] (optional) the request's send stamp, a number on the caller's own clock
-- that the script never reads, only keeps in the grant entry for the grant
-- message to echo (as acquire.lua does; see Grants)
--
-- Returns:
--   { 1, epoch, others }    granted (or re-armed: the token held it), with a fresh
--                           epoch max(last + 1, server TIME in µs); `others`: the other
--                           live waiting writers
--   { 0, wait_ms, others }  busy: another write lease, or live read leases; with
--                           ARGV[5] "1" the token is (re-)registered as a waiting writer
--                           until now + ARGV[4], so no new read lease is granted
--   { -2 }                  the write lease is a string without a TTL (foreign)
--   { -3 }                      this token's release was recorded: a late copy of an
--                               acquire; nothing changed
--
-- Grants: a writer that waits (ARGV[5] "1", busy) also writes its grant entry,
-- `<write lease>:g:<token>` = "<token> <ttl ms> <TIME ms> <entry ttl ms> <send
-- stamp> <instance id>", living as long as its waiting-writer entry; a release
-- that frees the lock may then give it the write lease on the server
-- (rw_release.lua). A grant turns the entry into its mark, "granted <token>";
-- an acquire that takes or re-arms the write lease with the token deletes it.
local readers, writer, writers, fence, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, ttl, me = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local entry_ttl, fence_ttl = tonumber(ARGV[4]), tonumber(ARGV[6])

-- Reads.
-- A token is never granted again once a release of it was recorded (KEYS[6]): a
-- request that finds its record is a late copy of an acquire (delayed on the wire,
-- or re-sent after a timeout) that must not take a lease its holder gave up.
if redis.call('EXISTS', KEYS[6]) == 1 then
  return { -3 }
end
local holder = read('write lease', 'GET', writer)
local last = read('write fence', 'GET', fence)
local entry = read('waiting writers', 'ZSCORE', writers, token)
read('waiting instances', 'ZCARD', waiting)
local t = now()
local ms = string.format('%.0f', t.ms)
local live_readers = read('read leases', 'ZCOUNT', readers, '(' .. ms, '+inf')
local others = redis.call('ZCOUNT', writers, '(' .. ms, '+inf')
if entry and tonumber(entry) > t.ms then
  others = others - 1
end

if holder == token or (holder == false and live_readers == 0) then
  -- Writes.
  if holder == token then
    redis.call('PEXPIRE', writer, ttl)
  else
    redis.call('SET', writer, token, 'PX', ttl)
  end
  if entry then
    redis.call('ZREM', writers, token)
  end
  if entry or holder == token then
    -- Its grant entry, or a grant's mark: the token holds the lease now.
    redis.call('DEL', writer .. ':g:' .. token)
  end
  redis.call('ZREMRANGEBYSCORE', writers, '-inf', ms)
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', ms)
  redis.call('ZREM', waiting, me)
  local epoch = math.max((tonumber(last or '0') or 0) + 1, t.us)
  redis.call('SET', fence, string.format('%.0f', epoch), 'PX', fence_ttl)
  return { 1, epoch, others }
end

local wait_ms
if holder then
  wait_ms = redis.call('PTTL', writer)
  if wait_ms == -1 then
    return { -2 }
  end
else
  local first = redis.call('ZRANGEBYSCORE', readers, '(' .. ms, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  wait_ms = tonumber(first[2]) - t.ms
end
if wait_ms < 0 then
  wait_ms = 0
end

-- Writes.
redis.call('ZREMRANGEBYSCORE', writers, '-inf', ms)
if ARGV[5] == '1' then
  add_living(writers, t.ms + entry_ttl, token, entry_ttl)
  add_living(waiting, t.ms + entry_ttl, me, entry_ttl)
  -- What a release needs to grant the write lease to this token on the server
  -- (see rw_release.lua): its TTL, its arrival by the server's clock, the send
  -- stamp to echo and the instance to tell. Rewritten by every ask.
  redis.call('SET', writer .. ':g:' .. token, token .. ' ' .. ARGV[2] .. ' ' .. ms .. ' '
    .. ARGV[4] .. ' ' .. (ARGV[7] or '-') .. ' ' .. me, 'PX', entry_ttl)
end
return { 0, wait_ms, others }

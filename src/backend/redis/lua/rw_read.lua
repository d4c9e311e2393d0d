-- read-write lock: acquire (or re-arm) a read lease
--
-- KEYS[1] read leases (zset: token -> expiry ms)   KEYS[2] write lease (string, PX)
-- KEYS[3] waiting writers (zset: token -> expiry ms)   KEYS[4] write fence
-- KEYS[5] waiting instances (zset: instance id -> expiry ms)
-- KEYS[6] the release record of this token (see rw_release.lua)
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] instance id  ARGV[4] waiting entry ttl ms
-- ARGV[5] "1" to register for the wake-up when busy, "0" not to  ARGV[6] fence ttl ms
-- ARGV[7] (optional) the send stamp rw_write.lua keeps for a write grant; unread here
--
-- Returns:
--   { 1, last_write, 0 }        granted (or re-armed: the token already had a live
--                               lease); last_write is the write fence (0 if none)
--   { 0, wait_ms, writers }     refused: a write lease is held, or `writers` live
--                               writers wait (writer preference); ask again within
--                               wait_ms (the write lease's PTTL, or the earliest
--                               waiting writer's expiry)
--   { -2 }                      the write lease is a string without a TTL (foreign)
--   { -3 }                      this token's release was recorded: a late copy of an
--                               acquire; nothing changed
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
local mine = read('read leases', 'ZSCORE', readers, token)
local last = read('write fence', 'GET', fence)
read('waiting instances', 'ZCARD', waiting)
local t = now()
local ms = string.format('%.0f', t.ms)
local live_writers = read('waiting writers', 'ZCOUNT', writers, '(' .. ms, '+inf')
local rearm = mine and tonumber(mine) > t.ms

local wait_ms
if holder then
  wait_ms = redis.call('PTTL', writer)
  if wait_ms == -1 then
    return { -2 }
  end
elseif live_writers > 0 and not rearm then
  local first = redis.call('ZRANGEBYSCORE', writers, '(' .. ms, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  wait_ms = tonumber(first[2]) - t.ms
end

-- Writes.
if wait_ms then
  if wait_ms < 0 then
    wait_ms = 0
  end
  redis.call('ZREMRANGEBYSCORE', writers, '-inf', ms)
  if ARGV[5] == '1' then
    add_living(waiting, t.ms + entry_ttl, me, entry_ttl)
  end
  return { 0, wait_ms, live_writers }
end
redis.call('ZREMRANGEBYSCORE', readers, '-inf', ms)
add_living(readers, t.ms + ttl, token, ttl)
if last then
  redis.call('PEXPIRE', fence, fence_ttl)
end
redis.call('ZREM', waiting, me)
return { 1, tonumber(last or '0') or 0, 0 }

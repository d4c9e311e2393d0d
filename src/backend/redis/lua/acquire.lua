-- acquire-or-enqueue
--
-- KEYS[1] lock   KEYS[2] fence   KEYS[3] queue   KEYS[4] claim   KEYS[5] release tombstone
-- KEYS[6] queue expiry index
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] instance id  ARGV[4] queue entry ttl ms
-- ARGV[5] fence ttl ms  ARGV[6] "1" to join the queue when busy, "0" not to (try_lock)
--
-- Returns:
--   { 1, epoch, others }   acquired, or already ours (TTL re-armed); either way with a
--                          fresh epoch max(last + 1, server TIME in µs), because a token
--                          may be reused by a new leader after a failed release
--   { 0, wait_ms, others } busy (queued if ARGV[6] is "1"); ask again within wait_ms
--                          (the lock's or the claim's PTTL)
--   { -1 }                 the lock key holds a value of another type
--   { -2 }                 the lock key holds a string without a TTL (not ours)
--
-- Fast path (the lock free, no claim, nobody queued): GET lock, GET claim, GET fence,
-- GET tombstone, ZCARD queue, SET lock, TIME, SET fence.
local lock, fence, queue, claim, tombstone, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, ttl, me = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local entry_ttl, fence_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])

-- Reads.
local current = redis.pcall('GET', lock)
if type(current) == 'table' and current.err then
  if string.sub(current.err, 1, 9) == 'WRONGTYPE' then
    return { -1 }
  end
  error(current)
end
local claimant = false
if current == false then
  claimant = read('claim', 'GET', claim)
end

if current == token or (current == false and (claimant == false or claimant == me)) then
  local last = read('fence', 'GET', fence)
  local released = read('tombstone', 'GET', tombstone)
  local q = read_queue(queue, expiry, me, false, false, false)

  -- Writes.
  if current == token then
    redis.call('PEXPIRE', lock, ttl)
  else
    redis.call('SET', lock, token, 'PX', ttl)
  end
  if claimant == me then
    redis.call('DEL', claim)
  end
  if released == token then
    -- The token is reused: its earlier release no longer speaks for it.
    redis.call('DEL', tombstone)
  end
  if q.mine then
    dequeue(queue, expiry, me)
  end
  purge(queue, expiry, q)
  local epoch = math.max((tonumber(last or '0') or 0) + 1, now().us)
  redis.call('SET', fence, string.format('%.0f', epoch), 'PX', fence_ttl)
  return { 1, epoch, q.others }
end

local wait_ms
if current == false then
  wait_ms = redis.call('PTTL', claim)
else
  wait_ms = redis.call('PTTL', lock)
  if wait_ms == -1 then
    return { -2 }
  end
end
if wait_ms < 0 then
  wait_ms = 0
end
local join = ARGV[6] == '1'
local q = read_queue(queue, expiry, me, false, false, join)

-- Writes.
purge(queue, expiry, q)
if join then
  -- Queue (or refresh) this instance, keeping its place.
  local t = now()
  if not q.mine then
    redis.call('ZADD', queue, string.format('%.0f', t.us), me)
  end
  redis.call('ZADD', expiry, string.format('%.0f', t.ms + entry_ttl), me)
  if redis.call('PTTL', queue) < entry_ttl then
    redis.call('PEXPIRE', queue, entry_ttl)
    redis.call('PEXPIRE', expiry, entry_ttl)
  end
end
return { 0, wait_ms, q.others }

-- acquire-or-enqueue
--
-- KEYS[1] lock   KEYS[2] fence   KEYS[3] queue   KEYS[4] claim
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] instance id  ARGV[4] queue entry ttl ms
-- ARGV[5] fence ttl ms  ARGV[6] "1" to join the queue when busy, "0" not to (try_lock)
--
-- Returns:
--   { 1, epoch, others }  acquired (or already ours: TTL re-armed, same epoch)
--   { 0, wait_ms, others } busy: queued; ask again within wait_ms (lock or claim PTTL)
--   { -1 }                 the lock key holds a value of another type
--   { -2 }                 the lock key holds a string without a TTL (not ours)
local lock, fence, queue, claim = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl, me = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local entry_ttl, fence_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])

local kind = redis.call('TYPE', lock)['ok']
if kind ~= 'none' and kind ~= 'string' then
  return { -1 }
end

local function mint()
  local last = tonumber(redis.call('GET', fence) or '0') or 0
  local epoch = math.max(last + 1, now_us)
  redis.call('SET', fence, string.format('%.0f', epoch), 'PX', fence_ttl)
  return epoch
end

local current = redis.call('GET', lock)
if current == token then
  -- A retry after an ambiguous reply: the lease is already ours.
  redis.call('PEXPIRE', lock, ttl)
  local epoch = tonumber(redis.call('GET', fence) or '')
  if epoch == nil then
    epoch = mint()
  end
  redis.call('HDEL', queue, me)
  local _, others = scan_queue(queue, me)
  return { 1, epoch, others }
end

local head, others = scan_queue(queue, me)
local wait_ms
if current == false then
  local claimant = redis.call('GET', claim)
  if claimant == false or claimant == me then
    redis.call('SET', lock, token, 'PX', ttl)
    if claimant then
      redis.call('DEL', claim)
    end
    redis.call('HDEL', queue, me)
    return { 1, mint(), others }
  end
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
if ARGV[6] ~= '1' then
  return { 0, wait_ms, others }
end

-- Queue (or refresh) this instance, keeping its place.
local entry = redis.call('HGET', queue, me)
local enq = entry and string.match(entry, '^(%d+) ') or string.format('%.0f', now_us)
redis.call('HSET', queue, me, enq .. ' ' .. string.format('%.0f', now_ms + entry_ttl))
if redis.call('PTTL', queue) < entry_ttl then
  redis.call('PEXPIRE', queue, entry_ttl)
end
return { 0, wait_ms, others }

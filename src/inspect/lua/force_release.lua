-- force release: frees a key whatever holds it (the mutex holder, the write lease,
-- the read leases, the semaphore's permits) and advances its fences, for an
-- operator (`lockflight release --force`). Not part of the lease protocol: no
-- lease token is needed.
--
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] claim  KEYS[4] write lease
-- KEYS[5] write fence  KEYS[6] read leases  KEYS[7] queue  KEYS[8] rw wake queue
-- KEYS[9] permit set  KEYS[10] permit count  KEYS[11] semaphore waiting set
-- ARGV[1] channel prefix (`<prefix>:inst:`)  ARGV[2] the mutex's wake-up message
-- ARGV[3] the read-write lock's wake-up message  ARGV[4] the shortest fence TTL (ms)
-- ARGV[5] the semaphore's wake-up message
--
-- Returns { holder, writer, readers, epoch, write_epoch, woken, permits }: the
-- mutex holder's and the write lease's tokens (or false), how many read leases
-- were dropped, the new epochs of both fences, how many instances were woken, how
-- many permits were dropped (expired ones included: they were never counted).
--
-- Safety: each new epoch is max(last + 1, TIME µs), the rule of every grant, and
-- is written into the fence key every later grant reads, so every later token of
-- the key is greater than it, and it is greater than every earlier one: tokens
-- stay strictly increasing. The freed holders' renewals find their leases gone
-- ("not the owner": a loss at once) and their releases report LeaseLost.
-- Reads first (a value of another type raises WRONGTYPE with nothing changed).
local lock, fence, claim, writer, wfence, readers, queue, rwqueue =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local permits, count, semqueue = KEYS[9], KEYS[10], KEYS[11]
local holder = redis.call('GET', lock)
local last = redis.call('GET', fence)
local wtoken = redis.call('GET', writer)
local wlast = redis.call('GET', wfence)
local nreaders = redis.call('ZCARD', readers)
local head = redis.call('ZRANGE', queue, 0, 0)
local waking = redis.call('ZRANGE', rwqueue, 0, 99)
redis.call('GET', claim)
local npermits = redis.call('ZCARD', permits)
local stored = redis.call('GET', count)
-- The semaphore's waiting instances, oldest first (expired entries are woken too:
-- a spurious wake-up costs an instance one request).
local semwaiting = redis.call('ZRANGE', semqueue, 0, 99)
local time = redis.call('TIME')
local t = tonumber(time[1]) * 1000000 + tonumber(time[2])
local min_ttl = tonumber(ARGV[4])

local function advance(key, previous)
  local epoch = math.max((tonumber(previous or '0') or 0) + 1, t)
  local ttl = math.max(redis.call('PTTL', key), min_ttl)
  redis.call('SET', key, string.format('%.0f', epoch), 'PX', ttl)
  return string.format('%.0f', epoch)
end

redis.call('DEL', lock, claim, writer, readers, permits)
if stored and #semwaiting == 0 then
  -- No permit and no waiting entry left: the count goes, as sem_release does.
  redis.call('DEL', count)
end
local epoch = advance(fence, last)
local wepoch = advance(wfence, wlast)
local woken = 0
if head[1] then
  redis.pcall('PUBLISH', ARGV[1] .. head[1], ARGV[2])
  woken = woken + 1
end
for _, instance in ipairs(waking) do
  redis.pcall('PUBLISH', ARGV[1] .. instance, ARGV[3])
  woken = woken + 1
end
if #waking > 0 then
  redis.call('DEL', rwqueue)
end
-- Every permit is free now: wake the waiting instances (each asks again).
for _, instance in ipairs(semwaiting) do
  redis.pcall('PUBLISH', ARGV[1] .. instance, ARGV[5])
  woken = woken + 1
end
return { holder, wtoken, nreaders, epoch, wepoch, woken, npermits }

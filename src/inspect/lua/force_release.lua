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
-- Returns { holder, writer, readers, epoch, write_epoch, woken, permits, told,
-- receivers }: the mutex holder's and the write lease's tokens (or false), how
-- many read leases were dropped, the new epochs of both fences, how many
-- instances were woken, how many permits were dropped (expired ones included:
-- they were never counted), how many loss messages were published (one per
-- dropped lease whose token is 32 hex digits; a refused PUBLISH is not counted)
-- and how many subscribers received them (as PUBLISH counts them: on a Cluster,
-- only those connected to this node).
--
-- Loss messages: for every lease it deletes (the mutex holder, the write lease,
-- each read lease, each permit) the script tells the holder's instance, on its
-- channel (`<prefix>:inst:` + the token's first 16 hex digits, the instance id
-- `LeaseToken::for_instance` puts there), with the tag byte 0xFB, the token's 32
-- hex digits and the key (`backend/redis/notify.rs`). That instance marks exactly
-- that lease lost at once, so it starts no new local section on it (a handoff, a
-- cached lease, a reader joining a shared read lease) and its holders' releases
-- report LeaseLost. An older instance reads the message as a bare key nobody
-- watches (nothing is woken). They are published before the wake-ups.
--
-- Safety: each new epoch is max(last + 1, TIME µs), the rule of every grant, and
-- is written into the fence key every later grant reads, so every later token of
-- the key is greater than it, and it is greater than every earlier one: tokens
-- stay strictly increasing. The freed holders learn of the loss from the loss
-- message, or, if it is lost, at their next renewal ("not the owner": a loss at
-- once); their releases report LeaseLost.
-- Reads first (a value of another type raises WRONGTYPE with nothing changed).
local lock, fence, claim, writer, wfence, readers, queue, rwqueue =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local permits, count, semqueue = KEYS[9], KEYS[10], KEYS[11]
local holder = redis.call('GET', lock)
local last = redis.call('GET', fence)
local wtoken = redis.call('GET', writer)
local wlast = redis.call('GET', wfence)
local rtokens = redis.call('ZRANGE', readers, 0, -1)
local head = redis.call('ZRANGE', queue, 0, 0)
local waking = redis.call('ZRANGE', rwqueue, 0, 99)
redis.call('GET', claim)
local ptokens = redis.call('ZRANGE', permits, 0, -1)
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
-- Tell each deleted lease's instance (the key: the mutex's wake-up message
-- without its tag byte).
local key = string.sub(ARGV[2], 2)
local told, receivers = 0, 0
local function tell(token)
  if type(token) ~= 'string' or #token ~= 32 or not string.match(token, '^%x+$') then
    return
  end
  local n = redis.pcall('PUBLISH', ARGV[1] .. string.sub(token, 1, 16),
    string.char(251) .. token .. key)
  if type(n) == 'number' then
    told = told + 1
    receivers = receivers + n
  end
end
tell(holder)
tell(wtoken)
for _, token in ipairs(rtokens) do
  tell(token)
end
for _, token in ipairs(ptokens) do
  tell(token)
end
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
return { holder, wtoken, #rtokens, epoch, wepoch, woken, #ptokens, told, receivers }

-- Shared helpers of the semaphore scripts (prepended to each of them, after the
-- prelude of queue.lua, whose read_queue / purge / dequeue keep the key's waiting
-- set: the same two sorted sets as a lock's queue, under the semaphore's names).
--
-- A semaphore key has three things beside its waiting set, all under one hash tag:
-- the permit set (a sorted set: token -> expiry in ms, server TIME), and the count
-- key holding N. The count key lives as long as any permit or waiting entry does:
-- every write that adds or re-arms one keeps the count (and the set it wrote)
-- alive at least as long, and the script that finds both sets empty deletes it.
-- Expired permits are never counted and are purged by the next script that writes.

-- Reads the permit set: { size, live, expired } (expired: the tokens whose expiry
-- is not after now). Only the commands of the documented ACL rules are used
-- (ZRANGEBYSCORE and ZREM, no ZCOUNT or ZREMRANGEBYSCORE).
local function read_permits(permits)
  local p = { size = read('permit set', 'ZCARD', permits), expired = {} }
  if p.size > 0 then
    p.expired = redis.call('ZRANGEBYSCORE', permits, '-inf', now().ms)
  end
  p.live = p.size - #p.expired
  return p
end

-- Drops the expired permits `read_permits` found (in chunks: unpack has a limit).
local function purge_permits(permits, p)
  local chunk = 1000
  for i = 1, #p.expired, chunk do
    redis.call('ZREM', permits, unpack(p.expired, i, math.min(i + chunk - 1, #p.expired)))
  end
end

-- Keeps `key` (if it exists) alive for at least `ms` from now.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Up to `k` live waiting instances, oldest first, skipping `skip` (an id, or nil).
-- `q` is the waiting set as read by read_queue.
local function heads(queue, q, k, skip)
  local out = {}
  if k <= 0 or q.others + (q.mine and 1 or 0) == 0 then
    return out
  end
  local dead = {}
  for _, id in ipairs(q.expired) do
    dead[id] = true
  end
  -- Enough entries to find k live ones: the expired ones and `skip` may come first.
  local first = redis.call('ZRANGE', queue, 0, #q.expired + k)
  for _, id in ipairs(first) do
    if not dead[id] and id ~= skip then
      out[#out + 1] = id
      if #out >= k then
        break
      end
    end
  end
  return out
end

-- Publishes the wake-up message on the channel of each instance of `ids`. Returns how many
-- were told, and the error of the first refused PUBLISH (an ACL without the
-- channel), after which nobody else is tried.
local function notify(ids, channel_prefix, raw_key)
  local told = 0
  for _, id in ipairs(ids) do
    local reply = redis.pcall('PUBLISH', channel_prefix .. id, raw_key)
    if type(reply) == 'table' and reply.err then
      return told, reply.err
    end
    told = told + 1
  end
  return told, nil
end

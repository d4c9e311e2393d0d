-- Shared prelude of lockflight's scripts (prepended to each of them).
--
-- The waiter queue of a key is a hash: field = instance id, value = "<enqueued µs> <expires ms>".
-- Entries expire so that a crashed instance cannot block the queue; the hash itself
-- carries a TTL so an abandoned queue leaves no key behind.

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- Drops expired entries; returns the head (earliest enqueued live instance) and the
-- number of live entries other than `me`.
local function scan_queue(queue, me)
  local all = redis.call('HGETALL', queue)
  local head, head_enq, others = nil, nil, 0
  for i = 1, #all, 2 do
    local id = all[i]
    local enq, exp = string.match(all[i + 1], '^(%d+) (%d+)$')
    enq, exp = tonumber(enq), tonumber(exp)
    if exp == nil or exp <= now_ms then
      redis.call('HDEL', queue, id)
    else
      if id ~= me then
        others = others + 1
      end
      if head == nil or enq < head_enq then
        head, head_enq = id, enq
      end
    end
  end
  return head, others
end

-- If the lock is free and nobody holds a claim, gives the head of the queue a claim
-- of `claim_ttl` ms and publishes the raw key on the head's channel. Returns the
-- number of live entries other than `me`.
local function wake_next(lock, queue, claim, me, claim_ttl, channel_prefix, raw_key)
  local head, others = scan_queue(queue, me)
  if head ~= nil and redis.call('EXISTS', lock) == 0 and redis.call('EXISTS', claim) == 0 then
    redis.call('SET', claim, head, 'PX', claim_ttl)
    redis.call('PUBLISH', channel_prefix .. head, raw_key)
  end
  return others
end

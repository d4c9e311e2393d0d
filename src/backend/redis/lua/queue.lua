-- Shared prelude of lockflight's scripts (prepended to each of them).
--
-- The waiter queue of a key is a hash: field = instance id, value = "<enqueued µs> <expires ms>".
-- Entries expire so that a crashed instance cannot block the queue; the hash itself
-- carries a TTL so an abandoned queue leaves no key behind.
--
-- A script is not rolled back when a command fails half-way. So every script does all
-- the reads that can fail (a key holding a value of another type) before its first
-- write: a foreign value is reported with nothing changed.

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- `redis.call(cmd, key)`, but a value of the wrong type at `key` raises a WRONGTYPE
-- error that names the key's role.
local function read(role, cmd, key)
  local reply = redis.pcall(cmd, key)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      error({ err = 'WRONGTYPE the ' .. role .. ' key holds a value of another type' })
    end
    error(reply)
  end
  return reply
end

-- Reads the queue. Returns a table with `head`: the earliest live entry (other than
-- `me` when `skip_me`), `others`: the number of live entries other than `me`,
-- `mine`: the enqueue time of `me`'s live entry (or nil), and `expired`: the ids of
-- expired entries, for `purge`.
local function read_queue(queue, me, skip_me)
  local all = read('queue', 'HGETALL', queue)
  local q = { others = 0, expired = {} }
  local head_enq
  for i = 1, #all, 2 do
    local id = all[i]
    local enq, exp = string.match(all[i + 1], '^(%d+) (%d+)$')
    if enq == nil or tonumber(exp) <= now_ms then
      q.expired[#q.expired + 1] = id
    else
      if id == me then
        q.mine = enq
      else
        q.others = q.others + 1
      end
      if (id ~= me or not skip_me) and (head_enq == nil or tonumber(enq) < head_enq) then
        q.head, head_enq = id, tonumber(enq)
      end
    end
  end
  return q
end

-- Drops the expired entries `read_queue` found.
local function purge(queue, q)
  for _, id in ipairs(q.expired) do
    redis.call('HDEL', queue, id)
  end
end

-- Gives `head` a claim of `claim_ttl` ms and publishes the raw key on its channel.
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

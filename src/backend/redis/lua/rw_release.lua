-- read-write lock: release a read or write lease (or withdraw a waiting writer)
--
-- KEYS[1] read leases   KEYS[2] write lease   KEYS[3] waiting writers
-- KEYS[4] waiting instances
-- ARGV[1] "r" (read) or "w" (write)  ARGV[2] token  ARGV[3] channel prefix
-- ARGV[4] raw key (the wake-up message)
--
-- Returns { released, writers [, publish error] }: released = 1 if the token held a
-- live lease of that kind, now deleted; 0 if not (nothing of it was live). `writers`:
-- the live waiting writers left. For "w", the token's waiting-writer entry is removed
-- too (a writer that gives up). When this frees the lock for someone who waits (no
-- write lease is left, and no live read lease is left, or a writer withdrew and none
-- waits any more), every live waiting instance gets the raw key on its channel
-- (channel prefix .. instance id) and the waiting set is deleted: the woken instances
-- ask again (and register again if still refused). A refused PUBLISH is reported.
local readers, writer, writers, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local kind, token = ARGV[1], ARGV[2]

-- Reads.
local holder = read('write lease', 'GET', writer)
local lease = read('read leases', 'ZSCORE', readers, token)
local entry = read('waiting writers', 'ZSCORE', writers, token)
read('waiting instances', 'ZCARD', waiting)
local t = now()
local ms = string.format('%.0f', t.ms)

-- Writes.
local released, changed = 0, false
if kind == 'w' then
  if holder == token then
    redis.call('DEL', writer)
    released, holder, changed = 1, false, true
  end
  if entry then
    redis.call('ZREM', writers, token)
    changed = true
  end
elseif lease then
  redis.call('ZREM', readers, token)
  changed = true
  if tonumber(lease) > t.ms then
    released = 1
  end
end
local writers_left = redis.call('ZCOUNT', writers, '(' .. ms, '+inf')
local refused
if changed and holder == false then
  local readers_left = redis.call('ZCOUNT', readers, '(' .. ms, '+inf')
  if readers_left == 0 or (kind == 'w' and writers_left == 0) then
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
return { released, writers_left, refused }

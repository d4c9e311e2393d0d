-- read-write lock: release a read or write lease (or withdraw a waiting writer)
--
-- KEYS[1] read leases   KEYS[2] write lease   KEYS[3] waiting writers
-- KEYS[4] waiting instances   KEYS[5] this lease's release record
-- ARGV[1] "r" (read) or "w" (write)  ARGV[2] token  ARGV[3] channel prefix
-- ARGV[4] the wake-up message (a lock-kind tag byte + the key, built in Rust)  ARGV[5] release record ttl ms
--
-- Returns { released, writers [, publish error] }: released = 1 if the token held a
-- live lease of that kind, now deleted, or if its release record shows that an
-- earlier attempt of this release deleted it (a retry after a lost reply); 0 if not
-- (nothing of it was live). As in release.lua, the delete is the first write and the
-- record is written after it, so a release works under `maxmemory` / `noeviction`. `writers`:
-- the live waiting writers left. For "w", the token's waiting-writer entry is removed
-- too (a writer that gives up). When this frees the lock for someone who waits (no
-- write lease is left, and no live read lease is left, or a writer withdrew and none
-- waits any more), every live waiting instance gets the wake-up message on its channel
-- (channel prefix .. instance id) and the waiting set is deleted: the woken instances
-- ask again (and register again if still refused). A refused PUBLISH is reported.
local readers, writer, writers, waiting, record = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local kind, token = ARGV[1], ARGV[2]

-- Reads.
local holder = read('write lease', 'GET', writer)
local lease = read('read leases', 'ZSCORE', readers, token)
local entry = read('waiting writers', 'ZSCORE', writers, token)
read('waiting instances', 'ZCARD', waiting)
local t = now()
local ms = string.format('%.0f', t.ms)
local held = (kind == 'w' and holder == token) or (kind ~= 'w' and lease and tonumber(lease) > t.ms)
local previous = released_before(held, record)

-- Writes: the deletes first, then the record.
local changed = false
if kind == 'w' then
  if holder == token then
    redis.call('DEL', writer)
    holder, changed = false, true
  end
  if entry then
    redis.call('ZREM', writers, token)
    changed = true
  end
elseif lease then
  redis.call('ZREM', readers, token)
  changed = true
end
local released = settle_release(held, previous, record, token, ARGV[5])
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

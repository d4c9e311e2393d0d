-- renew_batch: renew many leases, of any kinds, in one call
--
-- ARGV[1] instance id   ARGV[2] n, the number of leases   ARGV[3] lease ttl ms
-- ARGV[4] fence ttl ms (every lease of one call has the same TTL)
-- then 2 arguments per lease: its kind ("m" mutex, "r" read, "w" write, "p"
-- permit; "M", "R", "W": the same, and the lease's fence is due: re-armed to the
-- fence ttl), and its token
-- KEYS, per lease in the same order: a mutex's lock, queue, queue expiry index;
-- a read or write lease's read leases, write lease, waiting writers; a permit's
-- permit set and count; then the fence (the mutex's, the write fence) of a lease
-- whose fence is due. A lease whose fence is not due leaves its TTL as it is.
-- A cluster node's batch (leases of many slots of one node; see `renew.rs`)
-- declares no keys: the same key names follow the leases' arguments in ARGV, and
-- the script is flagged `allow-cross-slot-keys`. A lease whose slot the node does
-- not serve (a stale slot map, a migration) fails alone, before any write of its
-- own, with Redis' "non local key" error; the caller renews it on its own.
--
-- Returns two values per lease, in order (flat: { code1, value1, code2, value2, … }):
-- the reply of its single renewal script (renew_lock.lua, rw_renew.lua,
-- sem_renew.lua run the same functions) unpacked, a permit's { n } as n, 0; or
-- -1, error when its renewal raised an error (a value of another type, an ACL
-- refusal): the leases around it are renewed all the same. Each lease does its
-- reads before its writes, so one that fails wrote nothing. READONLY (this node is
-- a replica now) is raised for the whole call: every single renewal here would be
-- refused the same way, and the caller treats it as a loss.
--
-- The common case, a mutex or write lease that its token holds and that nobody
-- waits for, takes a shorter path with the same reply: one MGET reads every such
-- lease's key and one EXISTS every such lease's queue (mutex) or waiting writers
-- (write lease) for the whole batch, and the lease costs one PEXPIREAT (the
-- server's TIME, read once, plus the TTL: never later than a PEXPIRE during the
-- call would set; a second command when its fence is due). A lease whose MGET
-- value is not its token (lost, or a value of another type, which MGET reads as
-- nil), or whose queue exists, runs its single renewal's function, which gives the
-- exact reply or error. An absent queue is one the function would count as empty
-- (its ZCARD is 0). With undeclared keys (a cluster node's batch), or when the
-- MGET or EXISTS is refused (an ACL), every lease runs its function: a flagged
-- script may touch keys of many slots, but each command only keys of one (an
-- MGET across slots is refused as a "non local key"), so a node's batch would
-- need a GET per slot, what the function does already.
local me, n, ttl, fence_ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local K, k = KEYS, 1
if #KEYS == 0 then
  K, k = ARGV, 5 + n * 2
end

-- Each lease's kind ("m", "r", "w", "p"), keys (`at`: where they start; `fence`:
-- its fence's name when due), and the shared reads of the short path (`slot`: its
-- place in `owned` and `queues`).
local due_kinds = { M = 'm', R = 'r', W = 'w' }
local kinds, at, fences, owned, queues, slot = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local kind = ARGV[3 + 2 * i]
  local due = due_kinds[kind]
  if due then
    kind = due
  end
  kinds[i], at[i] = kind, k
  if kind == 'm' then
    owned[#owned + 1], queues[#queues + 1], slot[i] = K[k], K[k + 1], #owned + 1
    k = k + 3
  elseif kind == 'w' then
    owned[#owned + 1], queues[#queues + 1], slot[i] = K[k + 1], K[k + 2], #owned + 1
    k = k + 3
  elseif kind == 'r' then
    k = k + 3
  elseif kind == 'p' then
    k = k + 2
  else
    return redis.error_reply('ERR renew_batch: unknown lease kind ' .. tostring(kind))
  end
  if due and kind ~= 'p' then
    fences[i] = K[k]
    k = k + 1
  end
end
local values, queued
if #KEYS > 0 and #owned > 0 then
  values = redis.pcall('MGET', unpack(owned))
  queued = redis.pcall('EXISTS', unpack(queues))
  if type(values) ~= 'table' or values.err or type(queued) ~= 'number' then
    values = nil
  end
end

-- The message of a raised error or of an error reply.
local function message_of(e)
  return type(e) == 'table' and e.err or tostring(e)
end

local out = {}
local ttl_ms = tonumber(ttl)
local at_ms = values and string.format('%.0f', now().ms + ttl_ms)
for i = 1, n do
  local kind, token, k, fence = kinds[i], ARGV[4 + 2 * i], at[i], fences[i]
  -- "0": the fence is not due (see renew.lua).
  local its_fence_ttl = fence and fence_ttl or '0'
  local ok, reply
  local s = slot[i]
  if values and s and values[s] == token
    and (queued == 0 or redis.call('EXISTS', queues[s]) == 0) then
    -- The short path: held by `token`, nobody waiting; the lease's key and fence.
    reply = redis.pcall('PEXPIREAT', owned[s], at_ms)
    if type(reply) ~= 'table' and fence then
      reply = redis.pcall('PEXPIRE', fence, tonumber(fence_ttl))
    end
    ok = type(reply) ~= 'table'
    if ok then
      reply = nil
      out[2 * i - 1], out[2 * i] = 1, 0
    end
  elseif kind == 'm' then
    ok, reply = pcall(renew_lock, K[k], fence, K[k + 1], K[k + 2], token, ttl,
      its_fence_ttl, me)
  elseif kind == 'r' or kind == 'w' then
    ok, reply = pcall(renew_rw, K[k], K[k + 1], K[k + 2], fence, kind, token, ttl,
      its_fence_ttl)
  else
    ok, reply = pcall(renew_permit, K[k], K[k + 1], token, ttl)
  end
  if not ok then
    local message = message_of(reply)
    if string.find(message, 'READONLY', 1, true) then
      -- As a reply of its own, so that it keeps its code (a raised string is ERR).
      return redis.error_reply(message)
    end
    reply = { -1, message }
  end
  if reply then
    out[2 * i - 1], out[2 * i] = reply[1], reply[2] or 0
  end
end
return out

-- renew_batch: renew many leases, of any kinds, in one call
--
-- ARGV[1] instance id   ARGV[2] n, the number of leases
-- then 4 arguments per lease: its kind ("m" mutex, "r" read, "w" write, "p" permit),
-- token, lease ttl ms, fence ttl ms (not used by a permit)
-- KEYS, per lease in the same order: a mutex's lock, fence, queue, queue expiry
-- index; a read or write lease's read leases, write lease, waiting writers, write
-- fence; a permit's permit set and count.
-- A cluster node's batch (leases of many slots of one node; see `renew.rs`)
-- declares no keys: the same key names follow the leases' arguments in ARGV, and
-- the script is flagged `allow-cross-slot-keys`. A lease whose slot the node does
-- not serve (a stale slot map, a migration) fails alone, before any write of its
-- own, with Redis' "non local key" error; the caller renews it on its own.
--
-- Returns one reply per lease, in order: the reply of its single renewal script
-- (renew_lock.lua, rw_renew.lua, sem_renew.lua run the same functions), or
-- { -1, error } when its renewal raised an error (a value of another type, an ACL
-- refusal): the leases around it are renewed all the same. Each lease does its
-- reads before its writes, so one that fails wrote nothing. READONLY (this node is
-- a replica now) is raised for the whole call: every single renewal here would be
-- refused the same way, and the caller treats it as a loss.
local me, n = ARGV[1], tonumber(ARGV[2])
local out = {}
local K, k = KEYS, 1
if #KEYS == 0 then
  K, k = ARGV, 3 + n * 4
end
for i = 1, n do
  local a = 2 + (i - 1) * 4
  local kind, token, ttl, fence_ttl = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local ok, reply
  if kind == 'm' then
    ok, reply = pcall(renew_lock, K[k], K[k + 1], K[k + 2], K[k + 3], token, ttl,
      fence_ttl, me)
    k = k + 4
  elseif kind == 'r' or kind == 'w' then
    ok, reply = pcall(renew_rw, K[k], K[k + 1], K[k + 2], K[k + 3], kind, token, ttl,
      fence_ttl)
    k = k + 4
  elseif kind == 'p' then
    ok, reply = pcall(renew_permit, K[k], K[k + 1], token, ttl)
    k = k + 2
  else
    return redis.error_reply('ERR renew_batch: unknown lease kind ' .. tostring(kind))
  end
  if not ok then
    local message = type(reply) == 'table' and reply.err or tostring(reply)
    if string.find(message, 'READONLY', 1, true) then
      -- As a reply of its own, so that it keeps its code (a raised string is ERR).
      return redis.error_reply(message)
    end
    reply = { -1, message }
  end
  out[i] = reply
end
return out

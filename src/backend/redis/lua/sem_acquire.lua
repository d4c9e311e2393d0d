-- semaphore acquire-or-wait: up to k permits in one round trip
--
-- KEYS[1] permit set   KEYS[2] count (N)   KEYS[3] waiting set
-- KEYS[4] waiting set expiry index   KEYS[5..] the release record of each token (see
-- sem_release.lua), in the order of the tokens
-- ARGV[1] N   ARGV[2] permit ttl ms   ARGV[3] instance id   ARGV[4] waiting entry ttl ms
-- ARGV[5] "1" to wait (join the waiting set when not given everything), "0" not to
-- ARGV[6..] the k tokens, in the order permits are to be granted
--
-- Returns:
--   { granted, wait_ms, others }
--                         the first `granted` tokens are permits now (a token that
--                         already was a live permit is re-armed and counts: a retry
--                         after a lost reply is safe); when granted < k, ask again
--                         within wait_ms (the earliest expiry of a live permit);
--                         `others` other instances are in the waiting set (the
--                         caller's local handoff budget follows it)
--   { -3, stored }        the key has `stored` permits, not N: nothing changed
--   { -4 }                a token's release was recorded: a late copy of a request
--                         (delayed on the wire, or re-sent after a timeout) whose
--                         permits were released; nothing changed
--
-- An instance given fewer than k (with ARGV[5] "1") joins the waiting set, or stays
-- in it; if it was given some, it moves to the back (the instances take turns). An
-- instance given all k leaves the waiting set.
local permits, count, queue, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n, ttl, me = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local entry_ttl, join = tonumber(ARGV[4]), ARGV[5] == '1'
local k = #ARGV - 5

-- Reads.
-- A token is never granted again once a release of it was recorded.
for i = 1, k do
  if KEYS[4 + i] and redis.call('EXISTS', KEYS[4 + i]) == 1 then
    return { -4 }
  end
end
local stored = read('permit count', 'GET', count)
if stored and tonumber(stored) ~= n then
  return { -3, tonumber(stored) or 0 }
end
local p = read_permits(permits)
local held = {}
if p.live > 0 then
  for i = 1, k do
    local score = redis.call('ZSCORE', permits, ARGV[5 + i])
    if score and tonumber(score) > now().ms then
      held[i] = true
    end
  end
end
local q = read_queue(queue, expiry, me, false, false, join)

-- Writes.
purge_permits(permits, p)
local free = n - p.live
local granted = 0
local expires = string.format('%.0f', now().ms + ttl)
for i = 1, k do
  if held[i] then
    redis.call('ZADD', permits, 'XX', expires, ARGV[5 + i])
  elseif free > 0 then
    redis.call('ZADD', permits, expires, ARGV[5 + i])
    free = free - 1
  else
    break
  end
  granted = i
end
if granted > 0 then
  if not stored then
    redis.call('SET', count, n)
  end
  keep(permits, ttl)
  keep(count, ttl)
end

local wait_ms = 0
if granted < k then
  local first = redis.call('ZRANGE', permits, 0, 0, 'WITHSCORES')
  if first[2] then
    wait_ms = math.max(0, tonumber(first[2]) - now().ms)
  end
end

purge(queue, expiry, q)
if join then
  if granted < k then
    local t = now()
    if granted > 0 or not q.mine then
      redis.call('ZADD', queue, string.format('%.0f', t.us), me)
    end
    redis.call('ZADD', expiry, string.format('%.0f', t.ms + entry_ttl), me)
    if not stored and granted == 0 then
      redis.call('SET', count, n)
    end
    keep(queue, entry_ttl)
    keep(expiry, entry_ttl)
    keep(count, entry_ttl)
  elseif q.mine then
    dequeue(queue, expiry, me)
  end
end
return { granted, wait_ms, q.others }

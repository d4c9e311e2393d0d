-- acquire-or-enqueue
--
-- KEYS[1] lock   KEYS[2] fence   KEYS[3] queue   KEYS[4] claim
-- KEYS[5] the release record of this token (see release.lua)
-- KEYS[6] queue expiry index
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] instance id  ARGV[4] queue entry ttl ms
-- ARGV[5] fence ttl ms  ARGV[6] "1" to join the queue when busy, "0" not to (try_lock)
-- Default mode: ARGV[7] channel prefix  ARGV[8] the wake-up message (a lock-kind tag
-- byte + the key, built in Rust).
-- Fair mode: ARGV[7] the caller's age in µs (how long ago its instance's oldest local
-- waiter arrived)  ARGV[8] claim ttl ms  ARGV[9] channel prefix  ARGV[10] the wake-up
-- message.
-- Last in both modes (ARGV[9], fair ARGV[11]): the request's send stamp, a number on
-- the caller's own clock that the script never reads, only keeps in the grant
-- entry for the grant message to echo (see Grants).
--
-- Revocation: a caller that joins the queue anew while the lock is held, or a try
-- (ARGV[6] "0") that finds it held, publishes a revocation (the wake-up message with the tag byte 0xFC) on the holder's instance
-- channel; the holder's instance is the first 16 hex digits of its token (see
-- `LeaseToken::for_instance`). An instance that keeps the lease cached and idle
-- releases it at once; one that uses it ignores the message. A refused PUBLISH is
-- ignored (the cached lease ends at its linger anyway).
--
-- Fair mode: the queue entry is scored TIME µs − age (the arrival time), rewritten on
-- every busy ask; a free lock (no holder, no claim for another instance) goes only to
-- a caller that arrived no later than every other live entry, else the caller is busy
-- (queued with ARGV[6]) and, if nobody holds a claim (a TTL expiry), the earliest
-- entry is given a claim window and one message, so it takes the lock at once.
--
-- Returns:
--   { 1, epoch, others [, earliest] }
--                          acquired, or already ours (TTL re-armed); either way with a
--                          fresh epoch max(last + 1, server TIME in µs) (a re-sent acquire
--                          whose first copy landed re-arms its own grant); in fair
--                          mode `earliest` is the age in µs of the earliest other live
--                          entry (its arrival time's distance from now), -1 with none
--   { 0, wait_ms, others } busy (queued if ARGV[6] is "1"); ask again within wait_ms
--                          (the lock's or the claim's PTTL)
--   { -1 }                 the lock key holds a value of another type
--   { -2 }                 the lock key holds a string without a TTL (not ours)
--   { -3 }                 this token's release was recorded (KEYS[5] exists): a late
--                          copy of an acquire; nothing changed
--
-- Grants: a caller that joins the queue (or refreshes its entry) also writes its
-- grant entry, `<lock>:g:<instance id>` = "<token> <ttl ms> <TIME ms> <entry ttl
-- ms> <send stamp>", living as long as its queue entry; a release may then give it the lock on the server
-- (release.lua). An acquire that takes the lock deletes its own grant entry.
--
-- Fast path (the lock free, no claim, nobody queued): the life gate's TIME and GET
-- life (`life_gate.lua`), EXISTS record, GET lock, GET claim, ZCARD queue, SET fence …
-- GET (reads the last epoch and writes the new one in one call), SET lock: 8 commands
-- (fair mode: the same).
local lock, fence, queue, claim, record, expiry = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, ttl, me = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local entry_ttl, fence_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local fair = ARGV[10] ~= nil
local channel_prefix, message, stamp = ARGV[7], ARGV[8], ARGV[9]
if fair then
  channel_prefix, message, stamp = ARGV[9], ARGV[10], ARGV[11]
end
local join = ARGV[6] == '1'

-- Reads.
-- A token is never granted again once a release of it was recorded: a request
-- that finds its record is a late copy of an acquire (delayed on the wire, or
-- re-sent after a timeout) that must not take the lock for a lease its holder has
-- already given up.
if redis.call('EXISTS', record) == 1 then
  return { -3 }
end
local current = redis.pcall('GET', lock)
if type(current) == 'table' and current.err then
  if string.sub(current.err, 1, 9) == 'WRONGTYPE' then
    return { -1 }
  end
  error(current)
end
local claimant = false
if current == false then
  claimant = read('claim', 'GET', claim)
end

local free = current == token or (current == false and (claimant == false or claimant == me))
local q
local behind = false
if fair and free and current ~= token and claimant ~= me then
  -- Fair: a free lock, nobody told to take it; it is ours only if nobody else
  -- arrived earlier.
  q = read_queue(queue, expiry, me, true, true, join)
  if q.head ~= nil then
    local head_at = tonumber(redis.call('ZSCORE', queue, q.head))
    behind = now().us - tonumber(ARGV[7]) > head_at
    free = not behind
  end
end

if free then
  if q == nil then
    -- Fair: with the earliest other entry, whose age the reply reports.
    q = read_queue(queue, expiry, me, fair, true, false)
  end
  local earliest = -1
  if fair and q.head ~= nil then
    earliest = math.max(0, now().us - tonumber(redis.call('ZSCORE', queue, q.head)))
  end

  -- Writes. The first one mints the epoch, max(last + 1, TIME µs): SET … GET
  -- type-checks the fence key as it writes it (a value of another type fails the call
  -- before anything is written) and returns the last epoch; in the rare case that the
  -- last epoch is not below the server time (a clock stepped back), the fence is set
  -- again to last + 1.
  local t = now().us
  local last = read('fence', 'SET', fence, string.format('%.0f', t), 'PX', fence_ttl, 'GET')
  local epoch = math.max((tonumber(last or '0') or 0) + 1, t)
  if epoch ~= t then
    redis.call('SET', fence, string.format('%.0f', epoch), 'PX', fence_ttl)
  end
  if current == token then
    redis.call('PEXPIRE', lock, ttl)
    -- A grant's mark (release.lua), if this is a granted token asking: it holds
    -- the lock now, so the grant can no longer be given back.
    redis.call('DEL', lock .. ':g:' .. me)
  else
    redis.call('SET', lock, token, 'PX', ttl)
  end
  if claimant == me then
    redis.call('DEL', claim)
  end
  if q.mine then
    dequeue(queue, expiry, me)
    redis.call('DEL', lock .. ':g:' .. me)
  end
  purge(queue, expiry, q)
  if fair then
    return { 1, epoch, q.others, math.floor(earliest) }
  end
  return { 1, epoch, q.others }
end

local wait_ms
if current == false then
  wait_ms = redis.call('PTTL', claim)
else
  wait_ms = redis.call('PTTL', lock)
  if wait_ms == -1 then
    return { -2 }
  end
end
if wait_ms < 0 then
  wait_ms = 0
end
if q == nil then
  q = read_queue(queue, expiry, me, false, false, join)
end

-- Writes.
purge(queue, expiry, q)
if join then
  -- Queue (or refresh) this instance, keeping its place; in fair mode its place is
  -- the arrival time of the waiter it speaks for now.
  local at
  if fair then
    at = now().us - tonumber(ARGV[7])
  elseif not q.mine then
    at = now().us
  end
  enqueue(queue, expiry, me, at, entry_ttl)
  -- What a release needs to grant the lock to this instance on the server (see
  -- release.lua): this request's token and TTL and its arrival by the server's
  -- clock. Rewritten by every ask, so it always names the latest one.
  redis.call('SET', lock .. ':g:' .. me, token .. ' ' .. ARGV[2] .. ' '
    .. string.format('%.0f', now().ms) .. ' ' .. ARGV[4] .. ' ' .. (stamp or '-'),
    'PX', entry_ttl)
end
if behind then
  -- Fair, the lock free and nobody told to take it (it expired, or its holder's
  -- release found nobody queued yet): wake the earliest waiter, and ask again after
  -- its claim window at the latest.
  wait_ms = tonumber(ARGV[8])
  wake(q.head, claim, wait_ms, channel_prefix .. q.head, message)
end
if current and not (join and q.mine) then
  -- New in the queue of a held lock, or a try that found it held: ask the holder
  -- to let go if it is idle.
  redis.pcall('PUBLISH', channel_prefix .. string.sub(current, 1, 16),
    string.char(252) .. string.sub(message, 2))
end
return { 0, wait_ms, q.others }

-- release-and-wake-next
--
-- KEYS[1] lock   KEYS[2] queue   KEYS[3] claim   KEYS[4] this lease's release record
-- KEYS[5] queue expiry index
-- ARGV[1] token  ARGV[2] instance id  ARGV[3] claim ttl ms  ARGV[4] channel prefix
-- ARGV[5] the wake-up message (a lock-kind tag byte + the key, built in Rust)  ARGV[6] release record ttl ms
-- KEYS[6] fence   KEYS[7] the server's life key (see life.lua)
-- ARGV[7] "1" when this backend grants (see Grants below), "" when it never does
-- Fair mode only, when this instance has another local waiter: ARGV[8] that waiter's
-- age in µs, ARGV[9] queue entry ttl ms. The instance is (re)queued at the waiter's
-- arrival time (TIME µs − age) before the head is chosen, so the claim goes to it if
-- it arrived before every other waiting instance.
--
-- Grants: when the lock is free afterwards, nobody holds a claim and the head of the
-- queue has a grant entry (acquire.lua writes `<lock>:g:<id>` = "<token> <ttl ms>
-- <arrival ms> <entry ttl ms> <send stamp>" at each of its asks), the script gives the head the
-- lock itself, instead of a claim and a wake-up. The grant's window is the
-- lesser of the lease TTL and the queue entry's lifetime, counted from the ask's
-- arrival: the lock is set for that token until then, no longer than the queue
-- presumes a silent waiter alive, so a waiter whose process died holds the key at
-- most as long as its queue entry would have lived. The script grants if (the
-- rule is `grantable` in queue.lua, which rw_release.lua shares)
--   * that token has no release record (a token whose release was sent is never
--     granted, as the acquire refuses it with { -3 }),
--   * the entry is younger than half the window and than a release record's
--     lifetime (the waiter keeps at least half its window, and a release of that
--     token that landed after the entry was written still has its record now), and
--   * the server is not in a restart's quarantine (life.lua: grants wait; the
--     entry itself was written in this life, by an acquire that passed the gate).
-- The grant mints an epoch as acquire.lua does (the fence living 10 TTLs, at least
-- a minute) and sets the lock. The message echoes the ask's send stamp: the
-- waiter's validity counts the window from that ask's send, which was earlier
-- than the arrival the server's expiry counts from (never from a later ask's: a
-- grant message may be read after the grant expired and a newer ask of the same
-- token was answered busy); it renews within a third of the window to keep the
-- lease. The script removes the
-- head's queue and grant entries and publishes the grant (tag 0xF9, the token's
-- 32 hex digits, the epoch, a space, the live waiters left, a space, the window
-- in ms, a space, when the earliest entry left arrived in µs after the
-- grantee's ask (negative: before it; '-': nobody left), a space, the ask's send
-- stamp, a space, the key) on the head's channel. A refused
-- PUBLISH is reported as for a wake-up; the grant stands (the waiter finds it at
-- its next ask: "already yours").
--
-- Returns { released, others [, publish error [, granted]] } (granted: 1 when the
-- key was granted to the head). released = 1 if the lock was ours and
-- is deleted now, or if this lease's release record shows that an earlier attempt of
-- this release deleted it (a retry after a lost reply, whatever other instances did
-- with the key meanwhile: the record is per lease, not per key); 0 if it was not ours
-- (nothing deleted).
-- If the lock is free afterwards and nobody holds a claim, the head of the queue gets
-- a claim window and one message on its channel; a refused PUBLISH takes the claim
-- back and is reported as the third element.
--
-- The delete is the script's first write and the record is written after it: under
-- `maxmemory` with `noeviction` Redis refuses a script's first write if it may grow
-- memory (SET does, DEL does not) but never a later one, so a release frees the lock
-- even when the server is out of memory.
--
-- Fast path (ours, nobody queued): GET lock, ZCARD queue, DEL lock, SET record: 4
-- commands. While the lock is held there
-- is no claim (a claim is only ever set on a free lock, and taking the lock deletes it),
-- so the claim key is read only when the script may write it: when the lock is not
-- ours, or when someone is queued.
local lock, queue, claim, record, expiry, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, me = ARGV[1], ARGV[2]
local grants = ARGV[7] == '1'
local requeue = ARGV[8] ~= nil

-- Reads.
local current = read('lock', 'GET', lock)
local ours = current == token
local previous = released_before(ours, record)
local q = read_queue(queue, expiry, me, true, requeue, requeue)
local mine_at
if requeue then
  mine_at = now().us - tonumber(ARGV[8])
  if q.head == nil or mine_at <= tonumber(redis.call('ZSCORE', queue, q.head)) then
    q.head = me
  end
end
local claimant = false
if not ours or q.head ~= nil then
  claimant = read('claim', 'GET', claim)
end

-- Writes: the delete first (see above), then the record.
if ours then
  redis.call('DEL', lock)
  current = false
end
local released = settle_release(ours, previous, record, token, ARGV[6])
purge(queue, expiry, q)
if requeue then
  enqueue(queue, expiry, me, mine_at, tonumber(ARGV[9]))
end
-- Gives the lock to `head` if its grant entry allows it (see Grants above); returns
-- true if it did, and the PUBLISH's error if that was refused.
local function grant(head)
  local entry_key = lock .. ':g:' .. head
  local entry = redis.pcall('GET', entry_key)
  if type(entry) ~= 'string' then
    return false
  end
  local tok, ttl, at, life, stamp = string.match(entry, '^(%x+) (%d+) (%d+) (%d+) (%d+)$')
  if tok == nil or string.len(tok) ~= 32 then
    return false
  end
  local window, age = grantable(ttl, at, life, ARGV[6], lock .. ':rel:' .. tok, KEYS[7])
  if window == nil then
    return false
  end
  -- The epoch, as acquire.lua mints it; a fence of another type means no grant.
  local fence_ttl = math.max(tonumber(ttl) * 10, 60000)
  local t = now().us
  local last = redis.pcall('SET', fence, string.format('%.0f', t), 'PX', fence_ttl, 'GET')
  if type(last) == 'table' and last.err then
    return false
  end
  local epoch = math.max((tonumber(last or '0') or 0) + 1, t)
  if epoch ~= t then
    redis.call('SET', fence, string.format('%.0f', epoch), 'PX', fence_ttl)
  end
  redis.call('SET', lock, tok, 'PX', window - age)
  dequeue(queue, expiry, head)
  -- The entry becomes the grant's mark, "granted <token>", until the window ends or
  -- the token asks ("already yours" deletes it): leave.lua gives back a grant
  -- nobody took only while the mark is there.
  redis.call('SET', entry_key, 'granted ' .. tok, 'PX', window - age)
  -- The live waiters the new holder leaves behind: the others, less itself, plus
  -- this instance when it queued again just now.
  local left = q.others
  if head ~= me then
    left = left - 1
    if requeue then
      left = left + 1
    end
  end
  left = math.max(0, left)
  -- When the earliest entry left arrived (its queue score, µs), counted from the
  -- grantee's ask (rounded up to the next ms, so never later than it was): who
  -- the new holder may hand the lease to in fair mode. '-': nobody left.
  local earliest = '-'
  if left > 0 then
    local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if first[2] then
      earliest = string.format('%.0f', tonumber(first[2]) - (tonumber(at) + 1) * 1000)
    end
  end
  local message = string.char(249) .. tok .. string.format('%.0f', epoch) .. ' '
    .. string.format('%d', left) .. ' ' .. string.format('%d', window) .. ' '
    .. earliest .. ' ' .. stamp .. ' ' .. string.sub(ARGV[5], 2)
  local reply = redis.pcall('PUBLISH', ARGV[4] .. head, message)
  if type(reply) == 'table' and reply.err then
    return true, reply.err
  end
  return true, nil
end

local refused
local granted = false
if current == false and claimant == false and q.head ~= nil then
  if grants then
    granted, refused = grant(q.head)
  end
  if not granted then
    refused = wake(q.head, claim, tonumber(ARGV[3]), ARGV[4] .. q.head, ARGV[5])
  end
end
if granted then
  return { released, q.others, refused or false, 1 }
end
return { released, q.others, refused }

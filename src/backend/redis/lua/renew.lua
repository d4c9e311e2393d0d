-- Renewal of one lease of each kind, as functions: the single renewal scripts
-- (renew_lock.lua, rw_renew.lua, sem_renew.lua) call one of them once, the batch
-- renewal script (renew_batch.lua) once per lease, so a lease renewed in a batch
-- gets exactly the reply its own script would give. Prepended after queue.lua and
-- sem_common.lua. Each does all its reads before its first write.

-- The fence of a lease (the mutex's, a read-write lock's write fence) is re-armed
-- only when `fence_ttl_ms` is not "0": the batch renewal's caller asks for it when
-- the fence is due (see `lease/renewal.rs`), a single renewal always does.

-- The mutex: compare-and-PEXPIRE.
--
-- Returns { 1, others } when renewed, { 0, 0 } when `token` does not own the lock.
local function renew_lock(lock, fence, queue, expiry, token, ttl_ms, fence_ttl_ms, me)
  -- Reads.
  if read('lock', 'GET', lock) ~= token then
    return { 0, 0 }
  end
  local q = read_queue(queue, expiry, me, false, false, false)

  -- Writes.
  redis.call('PEXPIRE', lock, tonumber(ttl_ms))
  if fence_ttl_ms ~= '0' then
    redis.call('PEXPIRE', fence, tonumber(fence_ttl_ms))
  end
  purge(queue, expiry, q)
  return { 1, q.others }
end

-- A read (`kind` "r") or write ("w") lease of a read-write lock.
--
-- Returns { 1, writers } when re-armed (`writers`: the live waiting writers, other
-- than this token), { 0, 0 } when the token holds no live lease of that kind.
local function renew_rw(readers, writer, writers, fence, kind, token, ttl_ms, fence_ttl_ms)
  local ttl = tonumber(ttl_ms)

  -- Reads.
  local t = now()
  local ms = string.format('%.0f', t.ms)
  if kind == 'w' then
    if read('write lease', 'GET', writer) ~= token then
      return { 0, 0 }
    end
  else
    local lease = read('read leases', 'ZSCORE', readers, token)
    if not lease or tonumber(lease) <= t.ms then
      return { 0, 0 }
    end
  end
  local live_writers = read('waiting writers', 'ZCOUNT', writers, '(' .. ms, '+inf')

  -- Writes.
  if kind == 'w' then
    redis.call('PEXPIRE', writer, ttl)
  else
    redis.call('ZADD', readers, 'XX', string.format('%.0f', t.ms + ttl), token)
    if redis.call('PTTL', readers) < ttl then
      redis.call('PEXPIRE', readers, ttl)
    end
  end
  if fence_ttl_ms ~= '0' then
    redis.call('PEXPIRE', fence, tonumber(fence_ttl_ms))
  end
  return { 1, live_writers }
end

-- One permit of a semaphore: compare-and-re-arm.
--
-- Returns { 1 } when re-armed, { 0 } when the token is no live permit (expired or
-- removed): the permit is lost.
local function renew_permit(permits, count, token, ttl_ms)
  -- Reads.
  local score = read('permit set', 'ZSCORE', permits, token)
  if not score or tonumber(score) <= now().ms then
    return { 0 }
  end
  read('permit count', 'GET', count)

  -- Writes.
  local ttl = tonumber(ttl_ms)
  redis.call('ZADD', permits, 'XX', string.format('%.0f', now().ms + ttl), token)
  keep(permits, ttl)
  keep(count, ttl)
  return { 1 }
end

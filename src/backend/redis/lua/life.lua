-- The server's life (see `redis/life.rs`): which run of the server this is, and
-- until when it grants nothing, after an instance that knew an earlier run saw
-- that the data of that run is gone.
--
-- KEYS: the life key (`<prefix>:life`), a string "<started µs>" or
-- "<started µs> <quarantined until ms>". `started` is the server TIME of the first
-- lockflight script of this run of the server (of this data set: a restart
-- without persistence or a FLUSHALL starts a new one).
--
-- life_gate(key, seen, grace) reads the life (writing it when there is none yet)
-- and returns `started` and how long grants still wait (ms, 0: none):
--   seen   the life the calling instance saw last ('' if it saw none yet)
--   grace  the calling instance's longest lease TTL in ms
-- When `seen` is an earlier life, every lease of that life is gone with it, but
-- its holders may not know yet: grants wait until `started` + `grace`, when
-- every lease the caller knew of would have expired anyway. The quarantine only grows.
-- A caller that never asked for a lease (grace 0) writes no quarantine: it reports the
-- restart at its first grant instead, with its lease TTL (`Inner::check_life`).
local function life_gate(key, seen, grace)
  local t = now()
  local stored = redis.call('GET', key)
  local started, quarantine
  if stored then
    started, quarantine = string.match(stored, '^(%d+) ?(%d*)$')
  end
  if not started then
    started, quarantine = string.format('%.0f', t.us), ''
    redis.call('SET', key, started)
  end
  quarantine = tonumber(quarantine) or 0
  if seen ~= '' and seen ~= started and grace > 0 then
    local until_ms = math.floor(tonumber(started) / 1000) + grace
    if until_ms > quarantine then
      quarantine = until_ms
      redis.call('SET', key, started .. ' ' .. string.format('%.0f', quarantine))
    end
  end
  if t.ms < quarantine then
    return started, quarantine - t.ms
  end
  return started, 0
end

-- The life gate of every script that grants a lease (`redis/life.rs`), run before
-- the script's own body, which then sees its usual KEYS and ARGV:
--   ARGV[1] the life the instance saw last ('' none yet; '-' no gate: a cluster)
--   ARGV[2] the instance's longest lease TTL in ms
--   KEYS[1] the life key (only when ARGV[1] is not '-')
-- Returns { -5, started, wait_ms } instead of running the body when grants wait
-- (wait_ms > 0) or when the caller has not seen this life (it must learn of a
-- restart before anything is granted to it, and of the life it is granted in).
local life_seen = table.remove(ARGV, 1)
local life_grace = tonumber(table.remove(ARGV, 1)) or 0
if life_seen ~= '-' then
  local started, wait = life_gate(table.remove(KEYS, 1), life_seen, life_grace)
  if wait > 0 or life_seen ~= started then
    return { -5, started, wait }
  end
end

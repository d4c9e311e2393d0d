-- The gate of every script that grants a lease (`redis/life.rs`), run before the
-- script's own body, which then sees its usual KEYS and ARGV:
--   ARGV[1] the life the instance saw last ('' none yet; '-' no life: a cluster)
--   ARGV[2] the instance's longest lease TTL in ms
--   ARGV[3] the server time (ms) after which this request is too late to apply
--           ('' none): a lower bound of the server's clock when the request was
--           sent, plus the lifetime of a release record
--   KEYS[1] the life key (only when ARGV[1] is not '-')
-- Returns, instead of running the body:
--   { -6, now_ms }               the request arrived after ARGV[3]: a copy delayed
--                                on the wire for longer than a release record
--                                lives, whose lease may have been released and its
--                                record expired meanwhile; nothing changed
--   { -5, started, wait_ms, now_ms }
--                                grants wait (wait_ms > 0), or the caller has not
--                                seen this life (it must learn of a restart before
--                                anything is granted to it, and of the life it is
--                                granted in)
local life_seen = table.remove(ARGV, 1)
local life_grace = tonumber(table.remove(ARGV, 1)) or 0
local not_after = tonumber(table.remove(ARGV, 1))
if not_after and now().ms > not_after then
  return { -6, now().ms }
end
if life_seen ~= '-' then
  local started, wait = life_gate(table.remove(KEYS, 1), life_seen, life_grace)
  if wait > 0 or life_seen ~= started then
    return { -5, started, wait, now().ms }
  end
end

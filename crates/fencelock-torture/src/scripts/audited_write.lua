-- The torture resource's fenced write with its audit (fencelock's fence rule,
-- docs/design.md §2.4, exactly as fencelock's fenced_write.lua applies it to the
-- same hash fields; `fencelock::fence_accepts` states it).
--
-- KEYS[1] the resource hash (fields fence, holder, value)
-- KEYS[2] its audit list: one JSON entry per accepted write, appended in
--         this same script, so the audit is exactly what the hash accepted
-- ARGV[1] the writer's fence (canonical decimal)
-- ARGV[2] the writer's token (the holder id is derived here, as fencelock does)
-- ARGV[3] operation id   ARGV[4] worker   ARGV[5] the value the writer read
-- ARGV[6] the value to write
-- ARGV[7] the TTL in ms the two keys get when they have none (the run
--         refreshes it while it lives, so a killed run leaves nothing for
--         longer)
--
-- Returns {1, seq} when accepted, {0, stored_fence} when refused as stale.
local fence = ARGV[1]
local holder = string.sub(redis.sha1hex(ARGV[2]), 1, 16)
local cur = redis.call('HMGET', KEYS[1], 'fence', 'holder', 'value')
local stored, stored_holder = cur[1], cur[2]
local ok
if not stored then
  ok = true
else
  local s = string.match(stored, '^0*(%d.*)$') or stored
  if #fence ~= #s then
    ok = #fence > #s
  elseif fence ~= s then
    ok = fence > s
  else
    ok = (stored_holder ~= false and stored_holder == holder)
  end
end
if not ok then return {0, stored} end
local before = cur[3] or '0'
redis.call('HSET', KEYS[1], 'fence', fence, 'holder', holder, 'value', ARGV[6])
local seq = redis.call('RPUSH', KEYS[2], cjson.encode({
  op = ARGV[3], worker = ARGV[4], fence = fence, holder = holder,
  read = ARGV[5], before = before, after = ARGV[6]}))
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ARGV[7]) end
end
return {1, seq}

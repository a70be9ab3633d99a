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
-- ARGV[8] 'seal' for a revoke's seal (fencelock's Sealable rule): fence
--         ARGV[1] is recorded with the holder 'revoked' (ARGV[2] unused)
--         iff nothing is stored or the stored fence is at most it (an
--         equal fence from any holder included), keeping the value; the
--         audit entry has the holder 'revoked' and read = before = after.
-- ARGV[9] a semaphore slot ('' or absent: none): the write then uses that
--         slot's fields value:SLOT, fence:SLOT and holder:SLOT, exactly as
--         fencelock's slot view (FencedHash::slot) does, and its audit entry
--         carries the slot.
--
-- Returns {1, seq} when accepted, {0, stored_fence} when refused as stale;
-- a seal returns {1, seq, nil} or {0, stored_fence, stored_holder}.
local fence = ARGV[1]
local seal = ARGV[8] == 'seal'
local slot = ARGV[9]
if slot == '' then slot = nil end
local sfx = ''
if slot then sfx = ':' .. slot end
local F, H, V = 'fence' .. sfx, 'holder' .. sfx, 'value' .. sfx
local holder
if seal then
  holder = 'revoked'
else
  holder = string.sub(redis.sha1hex(ARGV[2]), 1, 16)
end
local cur = redis.call('HMGET', KEYS[1], F, H, V)
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
    ok = seal or (stored_holder ~= false and stored_holder == holder)
  end
end
if not ok then
  if seal then return {0, stored, stored_holder} end
  return {0, stored}
end
local before = cur[3] or '0'
local after = ARGV[6]
if seal then after = before end
redis.call('HSET', KEYS[1], F, fence, H, holder, V, after)
local seq = redis.call('RPUSH', KEYS[2], cjson.encode({
  op = ARGV[3], worker = ARGV[4], fence = fence, holder = holder,
  read = seal and before or ARGV[5], before = before, after = after,
  slot = slot}))
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ARGV[7]) end
end
if seal then return {1, seq, false} end
return {1, seq}

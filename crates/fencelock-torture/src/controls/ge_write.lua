-- NEGATIVE CONTROL `ge-check`: the guide's resource check, `fence >=
-- stored`, without the holder. Otherwise as the torture resource's audited
-- write (scripts/audited_write.lua).
-- KEYS[1] hash, KEYS[2] audit list; ARGV[1] fence, ARGV[2] token,
-- ARGV[3] op, ARGV[4] worker, ARGV[5] read, ARGV[6] value to write, or ''
-- to register the fence only.
-- Returns {1, seq-or-0} accepted, {0, stored} refused.
local fence = ARGV[1]
local holder = string.sub(redis.sha1hex(ARGV[2]), 1, 16)
local cur = redis.call('HMGET', KEYS[1], 'fence', 'holder', 'value')
local stored = cur[1]
local ok
if not stored then
  ok = true
else
  local s = string.match(stored, '^0*(%d.*)$') or stored
  if #fence ~= #s then ok = #fence > #s else ok = fence >= s end
end
if not ok then return {0, stored} end
if ARGV[6] == '' then
  redis.call('HSET', KEYS[1], 'fence', fence, 'holder', holder)
  return {1, 0}
end
local before = cur[3] or '0'
redis.call('HSET', KEYS[1], 'fence', fence, 'holder', holder, 'value', ARGV[6])
local seq = redis.call('RPUSH', KEYS[2], cjson.encode({
  op = ARGV[3], worker = ARGV[4], fence = fence, holder = holder,
  read = ARGV[5], before = before, after = ARGV[6]}))
return {1, seq}

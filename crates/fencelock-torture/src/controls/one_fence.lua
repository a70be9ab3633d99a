-- NEGATIVE CONTROL `one-fence`: a semaphore's permit writes its slot's
-- partition (value:SLOT) but is fenced by ONE (fence, holder) pair for all
-- permits, the hash's own `fence` and `holder` fields (a mutex's resource),
-- instead of its slot's pair. Otherwise fencelock's rule exactly, audited as
-- the torture resource's write (scripts/audited_write.lua).
-- KEYS[1] hash, KEYS[2] audit list; ARGV[1] fence, ARGV[2] token,
-- ARGV[3] op, ARGV[4] worker, ARGV[5] read, ARGV[6] value to write, or ''
-- to register the fence only, ARGV[7] the keys' TTL in ms, ARGV[8] slot.
-- Returns {1, seq-or-0} accepted, {0, stored} refused.
local fence = ARGV[1]
local holder = string.sub(redis.sha1hex(ARGV[2]), 1, 16)
local V = 'value:' .. ARGV[8]
local cur = redis.call('HMGET', KEYS[1], 'fence', 'holder', V)
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
    ok = stored_holder ~= false and stored_holder == holder
  end
end
if not ok then return {0, stored} end
if ARGV[6] == '' then
  redis.call('HSET', KEYS[1], 'fence', fence, 'holder', holder)
  return {1, 0}
end
local before = cur[3] or '0'
redis.call('HSET', KEYS[1], 'fence', fence, 'holder', holder, V, ARGV[6])
local seq = redis.call('RPUSH', KEYS[2], cjson.encode({
  op = ARGV[3], worker = ARGV[4], fence = fence, holder = holder,
  read = ARGV[5], before = before, after = ARGV[6], slot = ARGV[8]}))
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ARGV[7]) end
end
return {1, seq}

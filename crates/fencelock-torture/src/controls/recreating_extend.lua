-- NEGATIVE CONTROL `recreating-renewal`: a renewal that re-creates an
-- absent lock (redlock-rb #36) instead of reporting it lost.
-- KEYS[1] lock key; ARGV[1] the exact lock value; ARGV[2] ttl in ms.
-- Returns 1 extended (or re-created), -1 another holder's.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1

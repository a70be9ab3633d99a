-- Negative controls' lock, correct part: compare-and-pexpire.
-- KEYS[1] lock key; ARGV[1] the exact lock value; ARGV[2] ttl in ms.
-- Returns 1 extended, 0 absent, -1 another holder's.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return -1 end
return 0

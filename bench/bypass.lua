-- bench/bypass.lua: GETs, which the module lets through untouched.
--   wrk ... -s bench/bypass.lua URL
-- No request() function: wrk sends one precomputed request (its fast path).

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

setup = common.setup
done = common.done

wrk.method = "GET"
wrk.headers["X-Bench-Expect"] = "bypass"

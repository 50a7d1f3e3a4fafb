--[[
job_submit/lua example: let gpuplace choose the nodes of jobs that ask for it.

A job asks with `--comment=gpuplace` (whole nodes: `-N` of them) or
`--comment=gpuplace:job=/path/to/job.yaml` (a gpuplace job file). For such a job the plugin runs
`gpuplace slurm pick` on a state file kept fresh by `gpuplace slurm sync` (e.g. every minute from
cron), bounded by a timeout, and sets req_nodes to the answer. This covers every way a job is
submitted, including slurmrestd, which cannot pin nodes itself ("Disabled key:
required_nodes"). On a timeout, an error or an empty answer the job keeps Slurm's own choice and
the reason is logged; the submission is never refused because of gpuplace.

The plugin must not call sinfo/squeue/scontrol: it runs inside slurmctld, which would wait on
itself. Hence the state file.

Install: copy next to slurm.conf as job_submit.lua and set JobSubmitPlugins=lua. Settings come
from slurmctld's environment (defaults in brackets):
  GPUPLACE_BIN      command to run gpuplace            [gpuplace]
  GPUPLACE_STATE    state file from `gpuplace slurm sync`  [/var/lib/gpuplace/state.json]
  GPUPLACE_TIMEOUT  seconds before falling back          [5]
]]

local NO_VAL = 4294967294

local function setting(name, default)
   local value = os.getenv(name)
   if value == nil or value == "" then
      return default
   end
   return value
end

local function quote(text)
   return "'" .. string.gsub(text, "'", "'\\''") .. "'"
end

-- Runs the pick command; returns the node list or nil and the reason.
local function pick(args)
   local bin = setting("GPUPLACE_BIN", "gpuplace")
   local state = setting("GPUPLACE_STATE", "/var/lib/gpuplace/state.json")
   local timeout = tonumber(setting("GPUPLACE_TIMEOUT", "5")) or 5
   local command = string.format("timeout %d %s slurm pick --state %s %s 2>&1; echo \"rc=$?\"",
                                 timeout, bin, quote(state), args)
   local pipe = io.popen(command)
   if pipe == nil then
      return nil, "cannot start " .. bin
   end
   local output = pipe:read("*a")
   pipe:close()
   local body, rc = string.match(output, "^(.-)\n?rc=(%d+)%s*$")
   if rc == nil then
      return nil, "unexpected output: " .. output
   end
   if rc == "124" then
      return nil, string.format("no answer within %d s", timeout)
   end
   if rc ~= "0" then
      return nil, "exit " .. rc .. ": " .. string.gsub(body, "\n", " ")
   end
   local nodes = string.match(body, "^%s*([%w%.%-_,%[%]]+)%s*$")
   if nodes == nil then
      return nil, "unexpected answer: " .. body
   end
   return nodes, nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local comment = job_desc.comment
   if comment == nil or string.sub(comment, 1, 8) ~= "gpuplace" then
      return slurm.SUCCESS
   end
   local args
   local job_file = string.match(comment, "^gpuplace:job=(%S+)")
   if job_file ~= nil then
      args = "--job " .. quote(job_file)
   elseif job_desc.min_nodes ~= nil and job_desc.min_nodes ~= NO_VAL and job_desc.min_nodes > 0 then
      args = "--nodes " .. tostring(job_desc.min_nodes)
   else
      slurm.log_info("gpuplace: job %s asks for gpuplace but gives neither -N nor job=FILE; "
                     .. "falling back to Slurm's choice", tostring(job_desc.name))
      return slurm.SUCCESS
   end
   local nodes, reason = pick(args)
   if nodes == nil then
      slurm.log_info("gpuplace: falling back to Slurm's choice for job %s: %s",
                     tostring(job_desc.name), reason)
      return slurm.SUCCESS
   end
   job_desc.req_nodes = nodes
   slurm.log_info("gpuplace: job %s pinned to %s", tostring(job_desc.name), nodes)
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

slurm.log_info("gpuplace job_submit plugin loaded")
return slurm.SUCCESS

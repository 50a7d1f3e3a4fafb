--[[
job_submit/lua plugin: gpuplace chooses the nodes of the jobs that ask for it, and the order of
their ranks, by asking the running `gpuplace serve` over its Unix socket.

A job asks with `--comment=gpuplace`:
  sbatch -N 4 --comment=gpuplace job.sh            whole nodes (-N of them)
  sbatch --comment='gpuplace:tp=8,pp=2,dp=4' job.sh a job given inline (tp, cp, ep, dp, pp)
  sbatch --comment=gpuplace job.sh                 with the job document in the batch script,
                                                    on lines starting with "#GPUPLACE ", e.g.
      #GPUPLACE parallelism: {tp: 8, pp: 4, dp: 2}
      #GPUPLACE model: {params: 70e9, layers: 80, hidden: 8192, seq_len: 8192, micro_batch: 1}

For such a job the plugin sends the request (partition, -C features, reservation, QOS, time
limit, user and account, -N or the job document) to the service, which places it on its live
state, holds the nodes for this job until it runs or ends (so a second tagged job submitted at
once gets other nodes), and answers with the nodes and the host of each rank. The plugin then
sets:
  req_nodes, min_nodes, max_nodes  the nodes gpuplace chose;
  num_tasks, ntasks_per_node       one task per rank, as many per node as the plan puts there,
                                   unless the job set its own;
  tres_per_node, shared            --gres=gpu:k (the plan takes k GPUs on every node, which is
                                   what Slurm can grant) unless the job gave its own, and
                                   --exclusive when the plan fills its nodes;
  admin_comment                    gpuplace:hold=<token> (how the service recognises the job);
  environment (batch jobs)         GPUPLACE_HOLD, GPUPLACE_RANK_HOSTS (host of rank r, in rank
                                   order), GPUPLACE_RANK_DEVICES, GPUPLACE_PER_RANK_CUDA=1 when
                                   ranks do not fill their nodes;
  script (sh/bash/zsh/ksh)         two lines after the #! line that write the rank order to a
                                   file in $TMPDIR on the batch node and export SLURM_HOSTFILE
                                   (and GPUPLACE_RANKS: rank host device per line), so a plain
                                   `srun` starts rank r on gpuplace's host for rank r.
slurmctld has no other way to set a task layout: srun reads the arbitrary distribution only
from SLURM_HOSTFILE (a file) or -w, and SLURM_ARBITRARY_NODELIST alone is refused without -n.

Nothing here opens a file on a user's behalf or starts a process: one request over the socket,
bounded by GPUPLACE_TIMEOUT. On a timeout, an error or a refusal the job keeps Slurm's own choice,
the reason goes to slurmctld's log and to the user (sbatch prints it); a submission is never
refused because of gpuplace.

Install: copy next to slurm.conf as job_submit.lua, set JobSubmitPlugins=lua, install LuaSocket
for Lua 5.1 (Debian/Ubuntu: lua-socket). Settings come from slurmctld's environment:
  GPUPLACE_SOCKET   the service's socket            [/run/gpuplace/gpuplace.sock]
  GPUPLACE_TIMEOUT  seconds before falling back     [2]
  GPUPLACE_CLUSTER  cluster name in the service     [the service's first]
]]

local NO_VAL = 4294967294
local NO_VAL16 = 65534

local ok_socket, unix = pcall(require, "socket.unix")

local function setting(name, default)
   local value = os.getenv(name)
   if value == nil or value == "" then
      return default
   end
   return value
end

local function json_string(text)
   local escaped = string.gsub(text, '[%c"\\]', function(c)
      local known = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
      return known[c] or string.format("\\u%04x", string.byte(c))
   end)
   return '"' .. escaped .. '"'
end

local function json_object(fields)
   local parts = {}
   for key, value in pairs(fields) do
      if type(value) == "number" then
         table.insert(parts, json_string(key) .. ":" .. string.format("%d", value))
      elseif value ~= nil then
         table.insert(parts, json_string(key) .. ":" .. json_string(tostring(value)))
      end
   end
   return "{" .. table.concat(parts, ",") .. "}"
end

local function set_or_nil(value)
   if value == nil or value == "" or value == NO_VAL or value == NO_VAL16 then
      return nil
   end
   return value
end

-- The job document from "#GPUPLACE " lines of the batch script, if any.
local function script_spec(script)
   if script == nil then
      return nil
   end
   local lines = {}
   for line in string.gmatch(script, "[^\n]*") do
      local body = string.match(line, "^#GPUPLACE (.*)$")
      if body ~= nil then
         table.insert(lines, body)
      end
   end
   if #lines == 0 then
      return nil
   end
   return table.concat(lines, "\n")
end

-- POST the request to the service; returns a table of its answer or nil and the reason.
local function ask(body)
   if not ok_socket then
      return nil, "LuaSocket (socket.unix) is not installed for Lua 5.1"
   end
   local path = setting("GPUPLACE_SOCKET", "/run/gpuplace/gpuplace.sock")
   local timeout = tonumber(setting("GPUPLACE_TIMEOUT", "2")) or 2
   local conn = unix()
   conn:settimeout(timeout)
   local ok, err = conn:connect(path)
   if not ok then
      conn:close()
      return nil, "cannot reach gpuplace serve at " .. path .. ": " .. tostring(err)
   end
   local request = "POST /v1/slurm/job_submit HTTP/1.1\r\nHost: gpuplace\r\n"
      .. "Content-Type: application/json\r\nAccept: text/plain\r\nConnection: close\r\n"
      .. "Content-Length: " .. #body .. "\r\n\r\n" .. body
   ok, err = conn:send(request)
   if not ok then
      conn:close()
      return nil, "sending to gpuplace serve failed: " .. tostring(err)
   end
   local answer, rerr, partial = conn:receive("*a")
   conn:close()
   answer = answer or partial
   if answer == nil or answer == "" then
      return nil, "no answer from gpuplace serve within " .. timeout .. " s (" .. tostring(rerr) .. ")"
   end
   local status = tonumber(string.match(answer, "^HTTP/1%.%d (%d%d%d)"))
   local payload = string.match(answer, "\r\n\r\n(.*)$") or ""
   local fields = {}
   for line in string.gmatch(payload, "[^\n]+") do
      local key, value = string.match(line, "^(%S+) (.*)$")
      if key ~= nil then
         fields[key] = value
      end
   end
   if status ~= 200 then
      return nil, "gpuplace serve refused (" .. tostring(status) .. "): " .. (fields.error or payload)
   end
   return fields, nil
end

local SHELLS = { sh = true, bash = true, zsh = true, ksh = true, dash = true }

-- The script with the rank order written out at the top (after its #! line), or nil when the
-- script is not a shell script we know how to prefix.
local function with_rank_order(script, rank_hosts, rank_devices)
   if script == nil then
      return nil
   end
   local first, rest = string.match(script, "^(#![^\n]*\n)(.*)$")
   if first == nil then
      return nil
   end
   local shell = string.match(first, "([%w]+)%s*\n$") or ""
   local env_shell = string.match(first, "env%s+([%w]+)")
   if not SHELLS[shell] and not SHELLS[env_shell or ""] then
      return nil
   end
   local hosts, rows = {}, {}
   local rank = 0
   for host in string.gmatch(rank_hosts, "[^,]+") do
      if not string.match(host, "^[%w%.%-_]+$") then
         return nil
      end
      table.insert(hosts, host)
   end
   for device in string.gmatch(rank_devices, "[^,]+") do
      if hosts[rank + 1] == nil or not string.match(device, "^%d+$") then
         return nil
      end
      table.insert(rows, "'" .. rank .. " " .. hosts[rank + 1] .. " " .. device .. "'")
      rank = rank + 1
   end
   local prefix = "# gpuplace job_submit plugin: ranks in gpuplace's order for srun\n"
      .. "GPUPLACE_HOSTFILE=$(mktemp \"${TMPDIR:-/tmp}/gpuplace-hosts.XXXXXX\") && printf '%s\\n' "
      .. table.concat(hosts, " ") .. " > \"$GPUPLACE_HOSTFILE\" && export SLURM_HOSTFILE=\"$GPUPLACE_HOSTFILE\"\n"
      .. "GPUPLACE_RANKS=$(mktemp \"${TMPDIR:-/tmp}/gpuplace-ranks.XXXXXX\") && printf '%s\\n' "
      .. table.concat(rows, " ") .. " > \"$GPUPLACE_RANKS\" && export GPUPLACE_RANKS\n"
   return first .. prefix .. rest
end

local function fall_back(job_desc, reason)
   slurm.log_info("gpuplace: falling back to Slurm's choice for job %s: %s",
                  tostring(job_desc.name), reason)
   slurm.log_user("gpuplace: Slurm chooses the nodes (%s)", reason)
   return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local comment = job_desc.comment
   if comment == nil or string.sub(comment, 1, 8) ~= "gpuplace" then
      return slurm.SUCCESS
   end
   if string.match(comment, "^gpuplace:job=") then
      return fall_back(job_desc, "job=FILE is not read inside slurmctld; put the job in "
                       .. "#GPUPLACE lines of the script or in the comment (gpuplace:tp=8,dp=2)")
   end
   local spec = string.match(comment, "^gpuplace:(.+)$") or script_spec(job_desc.script)
   local min_nodes = set_or_nil(job_desc.min_nodes)
   if spec == nil and min_nodes == nil then
      return fall_back(job_desc, "give -N or the job (#GPUPLACE lines or gpuplace:tp=..,dp=..)")
   end
   -- GPUs per node the job asked for itself (--gres=gpu:[type:]k), honoured by the plan.
   local asked_gres = nil
   local tres = set_or_nil(job_desc.tres_per_node)
   if tres ~= nil then
      asked_gres = tonumber(string.match(tres, "gpu:[%w_%-]*:?(%d+)"))
   end
   local body = json_object({
      cluster = setting("GPUPLACE_CLUSTER", nil),
      job_name = job_desc.name,
      user = job_desc.user_name,
      account = set_or_nil(job_desc.account),
      partition = set_or_nil(job_desc.partition),
      constraint = set_or_nil(job_desc.features),
      reservation = set_or_nil(job_desc.reservation),
      qos = set_or_nil(job_desc.qos),
      time_limit = set_or_nil(job_desc.time_limit),
      min_nodes = spec == nil and min_nodes or nil,
      gres_per_node = asked_gres,
      -- the service holds nothing for a request it answers after the plugin gave up
      timeout_ms = math.floor((tonumber(setting("GPUPLACE_TIMEOUT", "2")) or 2) * 800),
      spec = spec,
   })
   local answer, reason = ask(body)
   if answer == nil then
      return fall_back(job_desc, reason)
   end
   local count = 0
   for _ in string.gmatch(answer.nodes or "", "[^,]+") do
      count = count + 1
   end
   if count == 0 or answer.token == nil then
      return fall_back(job_desc, "unexpected answer from gpuplace serve")
   end
   job_desc.req_nodes = answer.nodes
   job_desc.min_nodes = count
   job_desc.max_nodes = count
   if set_or_nil(job_desc.num_tasks) == nil and set_or_nil(job_desc.ntasks_per_node) == nil then
      -- One task per rank, as many on each node as the plan puts there (Slurm would
      -- otherwise fill the first node's CPUs and starve the next job of them).
      job_desc.num_tasks = tonumber(answer.ntasks)
      job_desc.ntasks_per_node = math.floor(tonumber(answer.ntasks) / count)
   end
   -- Slurm must hand the job the GPUs gpuplace counted on: k per node (GRES), or the nodes
   -- whole (a cluster without GPU GRES, or a plan that fills its nodes).
   if tres == nil and tonumber(answer.gres_per_node) ~= nil then
      job_desc.tres_per_node = "gres:gpu:" .. answer.gres_per_node
   end
   if answer.exclusive == "1" then
      job_desc.shared = 0
   end
   local tag = "gpuplace:hold=" .. answer.token
   local admin = job_desc.admin_comment
   job_desc.admin_comment = (admin ~= nil and admin ~= "") and (admin .. " " .. tag) or tag
   if job_desc.script ~= nil then
      job_desc.environment.GPUPLACE_HOLD = answer.token
      job_desc.environment.GPUPLACE_RANK_HOSTS = answer.rank_hosts
      job_desc.environment.GPUPLACE_RANK_DEVICES = answer.rank_devices
      if answer.whole ~= "1" then
         job_desc.environment.GPUPLACE_PER_RANK_CUDA = "1"
      end
      local script = with_rank_order(job_desc.script, answer.rank_hosts, answer.rank_devices)
      if script ~= nil then
         job_desc.script = script
      else
         slurm.log_info("gpuplace: job %s: not a shell script, ranks follow Slurm's order "
                        .. "(GPUPLACE_RANK_HOSTS has gpuplace's)", tostring(job_desc.name))
      end
   end
   slurm.log_info("gpuplace: job %s pinned to %s (hold %s)", tostring(job_desc.name),
                  answer.nodes, answer.token)
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

slurm.log_info("gpuplace job_submit plugin loaded (LuaSocket: %s)", ok_socket and "yes" or "no")
return slurm.SUCCESS

"""SLURM, as a job and a sweep see it: torch-free helpers that read the job's environment and ask the scheduler.

- In a job: `job_info` (job id, attempt, nodes, log) for the sweep job's record; `job_nodes`, `node_address` and
  `job_port` for a run over several nodes (harness.launch.Machine).
- From the sweep's side (harness.slurm_launcher): `states` asks the scheduler how each submitted job stands,
  from `scontrol show job` (in the controller's memory while the job runs and MinJobAge after) and else `sacct`
  (accounting, when the cluster has it); a job neither knows is gone. No state query depends on sacct: without
  accounting a job that died without a result still ends the sweep (submitit's own watcher would wait for ever).
- The launcher's resources: `resources` turns the placement into the job's request (the Hydra resolvers of
  conf/hydra/launcher/slurm.yaml), `request_problems` checks it against `sinfo` before anything is submitted, and
  `sbatch_problem` names the field behind an sbatch refusal.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, field

from harness.errors import Problem

#: a job in one of these states is over: its result pickle exists now, or never will
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                   "DEADLINE", "REVOKED", "SPECIAL_EXIT", "GONE"})
#: PREEMPTED and REQUEUED pass: with PreemptMode=REQUEUE (or a requeue) the job is PENDING again a moment later
GONE = "GONE"  # neither scontrol nor sacct knows the job (purged from the controller, no accounting)


def _run(*cmd: str, timeout: float = 30) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a SLURM client command; 127 when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: not found"
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", str(exc)
    return p.returncode, p.stdout, p.stderr


# --- inside a job


def job_id(env=None) -> str | None:
    """The job's id as squeue and scontrol name it: `<array job>_<task>` for a task of an array (a sweep)."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def task_rank(env=None) -> int:
    """This process's task among the job's (SLURM_PROCID; 0 outside SLURM): task 0 writes the sweep job's record."""
    env = os.environ if env is None else env
    return int(env.get("SLURM_PROCID", "0") or 0)


def job_info(env=None) -> dict | None:
    """What a sweep job's record keeps of the SLURM job running it: None unless this process is one job of a
    submitit sweep on SLURM (hydra/launcher=slurm), not a sweep that runs its jobs inside one allocation."""
    env = os.environ if env is None else env
    jid = job_id(env)
    if jid is None or env.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    info = {"job_id": jid, "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            "nodes": env.get("SLURM_JOB_NODELIST"), "partition": env.get("SLURM_JOB_PARTITION")}
    folder = env.get("SUBMITIT_FOLDER")
    if folder:  # submitit's log of task 0 (its paths replace %j with the job id, %t with the task)
        info["log"] = folder.replace("%j", jid) + f"/{jid}_0_log.err"
    return info


def job_nodes(env=None) -> list[str]:
    """The job's node names in order (SLURM_JOB_NODELIST expanded: `n[1-2]` -> n1, n2)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    code, out, _ = _run("scontrol", "show", "hostnames", nodelist)
    if code == 0 and out.split():
        return out.split()
    return expand_nodelist(nodelist)


def expand_nodelist(nodelist: str) -> list[str]:
    """`n[1-3,5],gpu7` -> [n1, n2, n3, n5, gpu7] (what `scontrol show hostnames` prints), zero padding kept."""
    out = []
    for group in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.fullmatch(r"(.*?)\[([^\]]*)\](.*)", group)
        out += [f"{m.group(1)}{k}{m.group(3)}" for k in _ranges(m.group(2))] if m else [group]
    return out


def _ranges(spec: str) -> list[str]:
    """`1-3,5` -> [1, 2, 3, 5]; `01-02` -> [01, 02] (SLURM's range lists: node names, array tasks)."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += [str(k).zfill(len(lo)) for k in range(int(lo), int(hi or lo) + 1)]
    return out


def node_address(name: str) -> str:
    """The address the ranks meet at on node `name`: SLURM's NodeAddr for it, resolved when it is a host name
    (on a cluster whose node names are not host names, e.g. several slurmd on one host, only NodeAddr works)."""
    code, out, _ = _run("scontrol", "show", "node", "-o", name)
    m = re.search(r"\bNodeAddr=(\S+)", out) if code == 0 else None
    host = m.group(1) if m else name
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def job_port(jid: str) -> int:
    """The port machine 0 listens on, the same on every node of the job and different for jobs that share a
    node (derived from the job id: 20000-39999)."""
    digits = re.sub(r"\D", "", jid) or "0"
    return 20000 + int(digits) % 20000


# --- from the sweep's side: how each submitted job stands


@dataclass
class JobState:
    job_id: str
    state: str  # SLURM's JobState (first word), or GONE
    exit_code: str | None = None  # SLURM's "code:signal"
    restarts: int | None = None  # requeues so far (scontrol only)
    reason: str | None = None
    nodes: str | None = None  # where it runs (scontrol's NodeList)
    source: str = "scontrol"

    @property
    def final(self) -> bool:
        return self.state in FINAL


def parse_scontrol_jobs(text: str) -> dict[str, JobState]:
    """`scontrol show job -o` (one line per job) -> {job id: JobState}, an array task under `<array>_<task>` too."""
    out = {}
    for line in text.splitlines():
        kv = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" not in kv:
            continue
        st = JobState(kv["JobId"], kv.get("JobState", "UNKNOWN"), kv.get("ExitCode"),
                      int(kv["Restarts"]) if kv.get("Restarts", "").isdigit() else None, kv.get("Reason"),
                      kv.get("NodeList") if kv.get("NodeList") not in (None, "(null)") else None)
        out[kv["JobId"]] = st
        tasks = kv.get("ArrayTaskId", "").split("%")[0]  # one task, or a pending array's `0-3%2` (every task)
        if kv.get("ArrayJobId") and re.fullmatch(r"[\d,-]+", tasks):
            for t in _ranges(tasks):
                out[f"{kv['ArrayJobId']}_{t}"] = st
    return out


def parse_sacct(text: str) -> dict[str, JobState]:
    """`sacct -X -n -P -o JobID,State,ExitCode` -> {job id: JobState}; a pending array's `12_[0-3%2]` row stands for
    each of its tasks."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        jid, state, code = parts[0], (parts[1].split() or ["UNKNOWN"])[0], parts[2]
        m = re.fullmatch(r"(\d+)_\[([^\]%]*)(?:%\d+)?\]", jid)
        for i in [f"{m.group(1)}_{t}" for t in _ranges(m.group(2))] if m else [jid]:
            out[i] = JobState(i, state, code, source="sacct")
    return out


def states(job_ids: list[str]) -> dict[str, JobState]:
    """How each job stands: scontrol for what the controller holds (one call per array: a sweep is one), sacct for
    the rest, GONE for what neither knows. When the controller does not answer there is no verdict ({}): ask again
    later."""
    got: dict[str, JobState] = {}
    for base in sorted({j.split("_")[0] for j in job_ids}):
        code, out, err = _run("scontrol", "show", "job", "-o", base)
        if code != 0 and "invalid job id" not in err.lower():
            return {}
        got.update(parse_scontrol_jobs(out) if code == 0 else {})
    got = {j: got[j] for j in job_ids if j in got}
    rest = [j for j in job_ids if j not in got]
    if rest:
        code, out, _ = _run("sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode",
                            "-j", ",".join(sorted({j.split("_")[0] for j in rest})))
        acct = parse_sacct(out) if code == 0 else {}
        for j in rest:
            got[j] = acct.get(j) or JobState(j, GONE, source="none")
    return got


# --- the request the launcher makes


def _per_process(device: str, value, gpu_default: int, cpu_default: int) -> int:
    if value not in (None, "None", "null", ""):
        return int(value)
    return cpu_default if str(device) == "cpu" else gpu_default


def cpus_per_task(device: str, num_processes, cpus_per_process) -> int:
    """CPUs of the one driver task per node: num_processes x cpus_per_process (8 per GPU rank, 1 per CPU rank)."""
    return int(num_processes) * _per_process(device, cpus_per_process, 8, 1)


def mem_gb(device: str, num_processes, mem_gb_per_process) -> int:
    """Memory per node in GB: num_processes x mem_gb_per_process (32 per GPU rank, 4 per CPU rank)."""
    return int(num_processes) * _per_process(device, mem_gb_per_process, 32, 4)


def gpus_per_node(device: str, num_processes):
    """One GPU per rank unless the placement runs on the CPU (placement.device=cpu): then none is asked."""
    return None if str(device) == "cpu" else int(num_processes)


def python_bin() -> str:
    """The folder of this Python (the project's .venv/bin): put first on the job's PATH by the launcher's setup."""
    import sys

    return os.path.dirname(sys.executable)


RESOLVERS = {"harness.slurm_cpus": cpus_per_task, "harness.slurm_mem_gb": mem_gb,
             "harness.slurm_gpus": gpus_per_node, "harness.python_bin": python_bin}


def register_resolvers() -> None:
    """The resolvers conf/hydra/launcher/slurm*.yaml use (idempotent)."""
    from omegaconf import OmegaConf

    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


@dataclass
class Partition:
    name: str
    nodes: int
    cpus: int  # per node, at most
    mem_mb: int  # per node, at most
    gres: list[str] = field(default_factory=list)
    default: bool = False


def partitions() -> dict[str, Partition] | None:
    """The cluster's partitions from sinfo (None when sinfo does not answer: nothing is checked then)."""
    code, out, _ = _run("sinfo", "-h", "-o", "%P|%D|%c|%m|%G")
    if code != 0:
        return None
    parts: dict[str, Partition] = {}
    for line in out.splitlines():
        bits = line.split("|")
        if len(bits) != 5:
            continue
        name, default = bits[0].rstrip("*"), bits[0].endswith("*")
        num = lambda s: int(re.sub(r"\D.*", "", s) or 0)  # noqa: E731  ("2+" or "1000+" on mixed nodes)
        p = parts.setdefault(name, Partition(name, 0, 0, 0, [], default))
        p.nodes += num(bits[1])
        p.cpus, p.mem_mb = max(p.cpus, num(bits[2])), max(p.mem_mb, num(bits[3]))
        p.gres += [g for g in bits[4].split(",") if g and g != "(null)"]
    return parts


def request_problems(params: dict, parts: dict[str, Partition] | None, via: dict) -> list[Problem]:
    """What of the launcher's request (hydra.launcher params) no node of its partition can meet, each named by the
    field that set it (`via`: launcher key -> the placement field behind its value)."""
    if not parts:
        return []
    name = params.get("partition") or next((p.name for p in parts.values() if p.default), None)
    if name is None:
        return []
    if name not in parts:
        return [Problem("hydra.launcher.partition", name, f"the cluster has no such partition (sinfo: "
                        f"{', '.join(sorted(parts))})", f"set hydra.launcher.partition to one of {', '.join(sorted(parts))}")]
    p, out = parts[name], []
    nodes = int(params.get("nodes") or 1)
    if nodes > p.nodes:
        out.append(Problem(via.get("nodes", "hydra.launcher.nodes"), nodes, f"partition {name} has {p.nodes} node(s)",
                           f"ask for at most {p.nodes}, or use a larger partition (hydra.launcher.partition)"))
    cpus = int(params.get("cpus_per_task") or 1) * int(params.get("tasks_per_node") or 1)
    if p.cpus and cpus > p.cpus:
        out.append(Problem(via.get("cpus_per_task", "hydra.launcher.cpus_per_task"), params.get("cpus_per_task"),
                           f"asks {cpus} CPUs per node; the nodes of partition {name} have at most {p.cpus}",
                           f"ask for at most {p.cpus} (hydra.launcher.cpus_per_task, or placement.cpus_per_process "
                           "x placement.num_processes)"))
    mem = params.get("mem_gb")
    if mem and p.mem_mb and int(mem) * 1024 > p.mem_mb:
        out.append(Problem(via.get("mem_gb", "hydra.launcher.mem_gb"), mem, f"asks {mem} GB per node; the nodes of "
                           f"partition {name} have {p.mem_mb} MB",
                           f"ask for at most {p.mem_mb // 1024} GB (hydra.launcher.mem_gb, or "
                           "placement.mem_gb_per_process x placement.num_processes)"))
    gpus = params.get("gpus_per_node")
    if gpus and not any(g.startswith("gpu") for g in p.gres):
        out.append(Problem(via.get("gpus_per_node", "hydra.launcher.gpus_per_node"), gpus,
                           f"partition {name} offers no GPUs (gres: {', '.join(p.gres) or 'none'})",
                           "set placement.device=cpu (then no GPU is asked) or use hydra/launcher=slurm_cpu on a CPU "
                           "cluster; or pick a GPU partition with hydra.launcher.partition"))
    return out


_SBATCH_FIELDS = (  # (pattern of sbatch's error, the field behind it, the fix), the first match wins
    (r"invalid partition", "hydra.launcher.partition", "use a partition `sinfo` lists"),
    (r"invalid account|account", "hydra.launcher.account",
     "set hydra.launcher.account to an account of yours (`sacctmgr show assoc`)"),
    (r"qos", "hydra.launcher.qos", "set hydra.launcher.qos to a QOS of yours"),
    (r"gres|generic resource", "hydra.launcher.gpus_per_node",
     "set placement.device=cpu (no GPU is asked), use hydra/launcher=slurm_cpu, or pick a GPU partition"),
    (r"memory specification", "hydra.launcher.mem_gb", "lower placement.mem_gb_per_process or hydra.launcher.mem_gb"),
    (r"time limit", "hydra.launcher.timeout_min", "lower hydra.launcher.timeout_min to the partition's MaxTime"),
    (r"node configuration|node count|cpu count", "hydra.launcher.cpus_per_task",
     "ask for what one node has: placement.cpus_per_process x placement.num_processes CPUs, placement.num_machines "
     "nodes (`sinfo -N -l` lists them)"),
)


def sbatch_problem(message: str, params: dict) -> Problem:
    """sbatch's refusal as a Problem naming the launcher field behind it."""
    text = " ".join(message.split())[:600]
    for pattern, fld, fix in _SBATCH_FIELDS:
        if re.search(pattern, text, re.IGNORECASE):
            return Problem(fld, params.get(fld.rpartition(".")[2]), f"sbatch refused the job: {text}", fix)
    return Problem("hydra.launcher", {k: params.get(k) for k in ("partition", "nodes", "cpus_per_task", "mem_gb",
                                                                   "gpus_per_node")},
                   f"sbatch refused the job: {text}", "check hydra.launcher.* against `sinfo` and your cluster's limits")

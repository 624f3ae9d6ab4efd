#!/usr/bin/env bash
# A real two-node SLURM cluster on this machine, for the `slurm` tests and for trying hydra/launcher=slurm_cpu by hand:
#   scripts/slurm_local.sh up       install slurm-wlm + munge (+ slurmdbd + mariadb for accounting) with apt when
#                                   missing, then start munged (unless one answers), slurmctld and slurmd n1, n2
#                                   (+ mariadbd and slurmdbd for accounting)
#   scripts/slurm_local.sh down     cancel the cluster's jobs, stop exactly the daemons `up` started
#   scripts/slurm_local.sh status   the daemons and `sinfo`; exit 0 when both nodes answer, 3 otherwise
#   scripts/slurm_local.sh env      the line to eval: export SLURM_CONF=... (the client tools read the cluster from it)
# Idempotent: `up` on a running cluster checks it and returns; `down` on a stopped one does nothing.
# Settings (environment): HARNESS_SLURM_DIR (default /tmp/harness-slurm: configs, state, logs, pids),
# HARNESS_SLURM_ACCOUNTING=0 (default: no slurmdbd, so `sacct` fails, as on a cluster without accounting: the
# harness's sweeps must not need it; 1 adds slurmdbd + MariaDB, ~15 s more the first time, for `sacct` by hand),
# HARNESS_SLURM_CPUS (CPUs per node, default: this machine's cores / 2, at least 1).
# Two nodes on localhost: n1 and n2 are two slurmd (ports 17001, 17002) with NodeAddr 127.0.0.1. Partitions: `debug`
# (default, preemptible: PreemptMode=REQUEUE, GraceTime 20 s) and `high` (higher PriorityTier: a job there preempts
# debug's jobs); preempt_send_user_signal sends a job's --signal (submitit's USR2) at once on preemption.
# Needs root (apt, daemons as root). Nothing here is used by a run: a real cluster has its own slurm.conf.
set -euo pipefail
cmd="${1:-status}"
dir="${HARNESS_SLURM_DIR:-/tmp/harness-slurm}"
accounting="${HARNESS_SLURM_ACCOUNTING:-0}"
cpus="${HARNESS_SLURM_CPUS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}"
conf="$dir/etc/slurm.conf"
export SLURM_CONF="$conf"
pids="$dir/pids"
ctld_port=6817 dbd_port=6819 db_port=13306

say() { echo "[slurm_local] $*" >&2; }
die() { say "error: $*"; exit 1; }

alive() {  # alive NAME: the daemon we started under NAME is still running
  local f="$pids/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

start() {  # start NAME CMD...: run CMD in the foreground mode of the daemon, detached, its pid kept under NAME
  local name="$1"; shift
  alive "$name" && return 0
  setsid "$@" >"$dir/log/$name.out" 2>&1 < /dev/null &
  echo $! > "$pids/$name.pid"
}

install_missing() {
  local want=()
  command -v slurmctld >/dev/null || want+=(slurmctld)
  command -v slurmd >/dev/null || want+=(slurmd)
  command -v sbatch >/dev/null || want+=(slurm-client)
  command -v munged >/dev/null || want+=(munge)
  if [ "$accounting" = 1 ]; then
    command -v slurmdbd >/dev/null || want+=(slurmdbd)
    command -v mariadbd >/dev/null || want+=(mariadb-server)
  fi
  [ "${#want[@]}" -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "needs root to install ${want[*]} (apt-get); run it as root or install them yourself"
  command -v apt-get >/dev/null || die "no apt-get: install ${want[*]} yourself"
  say "installing ${want[*]} with apt (~20 s)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null || die "apt-get install ${want[*]} failed"
}

write_confs() {
  mkdir -p "$dir"/{etc,state,log,spool,pids,db,run}
  local acct=""
  if [ "$accounting" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
JobAcctGatherType=jobacct_gather/linux"
    cat > "$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=root
LogFile=$dir/log/slurmdbd.log
PidFile=$dir/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$dir/etc/slurmdbd.conf"
  fi
  local mem=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 4 / 10 ))  # MB per node: 40% of RAM
  cat > "$conf" <<EOF
# written by scripts/slurm_local.sh: a two-node cluster on localhost for the harness's slurm tests
ClusterName=harness
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$acct
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17002 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20
PartitionName=high Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=2
EOF
  # the client tools' default path, for a shell without SLURM_CONF: only when no other cluster's config is there
  if [ ! -e /etc/slurm/slurm.conf ] || [ "$(readlink /etc/slurm/slurm.conf)" = "$conf" ]; then
    mkdir -p /etc/slurm && ln -sfn "$conf" /etc/slurm/slurm.conf
  fi
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi  # a munged already answers (ours or the system's)
  [ -f /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing (Debian's munge package creates it)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge: /run/munge /var/log/munge /var/lib/munge
  start munged runuser -u munge -- /usr/sbin/munged -F
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "munged did not answer (log: $dir/log/munged.out)"
}

start_accounting() {
  [ "$accounting" = 1 ] || return 0
  if [ ! -d "$dir/db/mysql" ]; then
    mariadb-install-db --user=root --datadir="$dir/db" --auth-root-authentication-method=normal \
      >"$dir/log/mariadb-install.out" 2>&1 || die "mariadb-install-db failed (log: $dir/log/mariadb-install.out)"
  fi
  start mariadbd mariadbd --user=root --datadir="$dir/db" --bind-address=127.0.0.1 --port=$db_port \
    --socket="$dir/run/mysql.sock" --pid-file="$dir/run/mariadb.pid" --skip-name-resolve
  local sql="mariadb --protocol=socket --socket=$dir/run/mysql.sock -uroot"
  for _ in $(seq 100); do $sql -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  $sql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
           CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
    || die "mariadb did not answer (log: $dir/log/mariadbd.out)"
  start slurmdbd slurmdbd -D  # reads slurmdbd.conf beside $SLURM_CONF
  for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  sacctmgr -n list cluster format=cluster%30 | grep -qw harness || sacctmgr -i add cluster harness >/dev/null \
    || die "sacctmgr could not add the cluster (log: $dir/log/slurmdbd.log)"
}

nodes_idle() { [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$')" -ge 2 ]; }

up() {
  install_missing
  write_confs
  start_munge
  start_accounting
  start slurmctld slurmctld -D -f "$conf"
  for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
  start slurmd-n1 slurmd -D -N n1 -f "$conf"
  start slurmd-n2 slurmd -D -N n2 -f "$conf"
  for _ in $(seq 150); do nodes_idle && break; sleep 0.2; done
  nodes_idle || { sinfo -N >&2 || true; die "the nodes did not come up (logs: $dir/log/)"; }
  # a node left DOWN/DRAIN by an earlier test (state is kept under $dir/state) serves again
  scontrol update nodename=n1,n2 state=resume >/dev/null 2>&1 || true
  say "up: nodes $(sinfo -h -N -o %N | sort -u | paste -sd, -), partitions $(sinfo -h -o %R | paste -sd, -)" \
      "(SLURM_CONF=$conf; logs: $dir/log)"
}

down() {
  if alive slurmctld; then  # the jobs first, while slurmd can still end their processes
    scancel --partition=debug,high >/dev/null 2>&1 || true
    for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  stop slurmd-n1 slurmd-n2  # in tiers, each tier's daemons at once (each takes a second or two to exit)
  stop slurmctld slurmdbd
  stop mariadbd munged
  say "down"
}

stop() {  # stop NAME...: SIGTERM to each daemon's process group (setsid: munged sits under runuser), then wait
  local name pid live=()
  for name in "$@"; do
    alive "$name" && { pid="$(cat "$pids/$name.pid")"; kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null; live+=("$pid"); }
    rm -f "$pids/$name.pid"
  done
  for pid in "${live[@]}"; do
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 -- "-$pid" 2>/dev/null || true
  done
}

status() {
  local name
  for name in munged mariadbd slurmdbd slurmctld slurmd-n1 slurmd-n2; do
    if alive "$name"; then echo "$name: running (pid $(cat "$pids/$name.pid"))"; else echo "$name: not started here"; fi
  done
  alive slurmctld || return 3  # sinfo would wait ~10 s for a controller that is not there
  sinfo -N 2>/dev/null || echo "sinfo: no answer from slurmctld"
  nodes_idle || return 3
}

mkdir -p "$dir"/{pids,log}
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) die "usage: $0 up|down|status|env" ;;
esac

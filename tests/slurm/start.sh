#!/usr/bin/env bash
# Start a private one-machine Slurm cluster (munged, slurmctld, slurmd) for the tests.
#
#   tests/slurm/start.sh DIR     # DIR: a new or empty folder; everything the cluster writes goes there
#   . DIR/env                    # SLURM_CONF for sbatch/srun/squeue/scancel
#   tests/slurm/stop.sh DIR      # stops the daemons by the PIDs in DIR/pids/
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge with apt-get when they are missing
# (needs root). The daemons listen on free ports chosen here and keep their state, logs, pid
# files and munge socket in DIR, so several clusters (or a system one) can run side by side.
# Exits 0 once the node is idle; on failure prints the daemons' logs and exits non-zero.
# Machine facts behind the slurm.conf below: ../../docs/slurm.md and ENVIRONMENT.md.
set -euo pipefail

dir=${1:?usage: start.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "start.sh: needs root (daemons run as root/munge)" >&2
  exit 3
fi

# 1. Install what is missing (about 15-45 s on a fresh machine).
missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "start.sh: missing ${missing[*]} and no apt-get to install them" >&2
    exit 3
  fi
  echo "start.sh: installing ${missing[*]} with apt-get" >&2
  start=$(date +%s)
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >"$dir/apt.log" 2>&1 \
    || { apt-get update -q >>"$dir/apt.log" 2>&1 \
         && apt-get install -y -q "${missing[@]}" >>"$dir/apt.log" 2>&1; } \
    || { echo "start.sh: apt-get install failed:" >&2; tail -20 "$dir/apt.log" >&2; exit 3; }
  echo "start.sh: installed in $(( $(date +%s) - start )) s" >&2
fi
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi

# 2. Layout. munged runs as the munge user and checks that its folders are private to it; the
# top folder must be traversable so it can reach its own.
chmod 755 "$dir"
mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/pids" "$dir/munge"
chown munge:munge "$dir/munge"
chmod 755 "$dir/munge"   # munged wants its socket folder searchable by all

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}
ctld_port=$(free_port)
slurmd_port=$(free_port)
while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
host=$(hostname -s)
node=$(slurmd -C | head -1)   # NodeName=<host> CPUs=... RealMemory=...
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")

cat >"$dir/slurm.conf" <<CONF
# Written by tests/slurm/start.sh for a private one-machine test cluster.
ClusterName=minitrainer
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again after this many seconds (default 120).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/pids/slurmctld.pid
SlurmdPidFile=$dir/pids/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: Linux process tracking, no task binding, no cgroup.conf.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
# sched_interval: a requeued job starts within a second of its eligible time (default 60 s).
SchedulerParameters=sched_interval=1
# Keep finished jobs visible to squeue for 10 minutes: the Snakemake plugin polls squeue here
# (there is no slurmdbd for sacct) and needs MinJobAge >= 120 s.
MinJobAge=600
MailProg=/bin/true
ReturnToService=2
KillWait=30
$node State=UNKNOWN
# DefMemPerCPU: a job without a memory request takes 1 GiB per CPU instead of the whole node.
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=1024
CONF
sed -i '/^UpTime=/d' "$dir/slurm.conf"
printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf" >"$dir/env"
export SLURM_CONF="$dir/slurm.conf"

# The Snakemake Slurm plugin's job step drops every SLURM_* variable (SLURM_CONF too) before it
# runs srun inside a job, so that srun reads the default /etc/slurm/slurm.conf. Point the default
# at this cluster, unless a real (not symlinked) configuration is there; stop.sh removes the link.
default_conf=/etc/slurm/slurm.conf
if [ ! -e "$default_conf" ] || [ -L "$default_conf" ]; then
  if [ -L "$default_conf" ] && [ -e "$default_conf" ]; then
    echo "start.sh: warning: $default_conf pointed to $(readlink "$default_conf"); now to this cluster" >&2
  fi
  mkdir -p /etc/slurm
  ln -sfn "$dir/slurm.conf" "$default_conf"
else
  echo "start.sh: warning: $default_conf is a real file; Snakemake's Slurm plugin will use it" >&2
fi

fail() {
  echo "start.sh: $*" >&2
  for f in "$dir"/log/*.log "$dir"/munge/munged.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}

# 3. Daemons, each writing its pid file into $dir (stop.sh kills exactly those PIDs).
runuser -u munge -- munged \
  --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
  --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
  || fail "munged did not start"
cp "$dir/munge/munged.pid" "$dir/pids/munged.pid"
slurmctld -i -f "$dir/slurm.conf" || fail "slurmctld did not start"
slurmd -f "$dir/slurm.conf" || fail "slurmd did not start"

# 4. Wait until the node is idle (usually under a second).
for _ in $(seq 1 100); do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  if [ "$state" = idle ]; then
    echo "start.sh: cluster up in $dir (node $host, $cpus CPUs; . $dir/env)" >&2
    exit 0
  fi
  sleep 0.2
done
fail "node not idle after 20 s (state: ${state:-none})"

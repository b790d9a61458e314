#!/usr/bin/env bash
# Stop the cluster that tests/slurm/start.sh DIR started: SIGTERM to the PIDs in DIR/pids/
# (slurmd, slurmctld, munged), then SIGKILL to any still alive after 10 s. Never by name.
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
dir=$(cd "$dir" 2>/dev/null && pwd) || exit 0
if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$dir/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf   # the default-config link start.sh made
fi
pids=()
for name in slurmd slurmctld munged; do
  file="$dir/pids/$name.pid"
  [ -s "$file" ] || continue
  pid=$(tr -dc 0-9 <"$file")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid" && pids+=("$pid"); }
done
for _ in $(seq 1 50); do
  alive=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  [ ${#alive[@]} -eq 0 ] && exit 0
  sleep 0.2
done
echo "stop.sh: still running after 10 s, killing: ${alive[*]}" >&2
kill -KILL "${alive[@]}" 2>/dev/null
exit 0

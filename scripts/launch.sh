#!/usr/bin/env bash
# Starts a multi-process Loom job on this machine: P copies of a command, rank r with
#   LOOM_RANK=r LOOM_WORLD=P LOOM_RENDEZVOUS=<address> LOOM_DEVICE=r
# (see RankEnvironment::from_environment in runtime/bootstrap.hpp). NVLink multicast stays off in
# every rank. Each output line (stdout and stderr) is prefixed with "[rank r] ". Waits for every
# rank; when one fails, stops the others and exits with the failed rank's status.
#
#   scripts/launch.sh -n P [--rendezvous file:/path|tcp:127.0.0.1:PORT] -- command args...
#
# Default rendezvous: file:<fresh temporary directory>/rendezvous, removed afterwards.
set -euo pipefail

usage() {
  echo "usage: $0 -n P [--rendezvous file:/path|tcp:HOST:PORT] -- command args..." >&2
  exit 2
}

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "launch.sh: needs bash 5.1 or newer (wait -n -p), found $BASH_VERSION" >&2
  exit 2
fi

world=""
rendezvous=""
while (($# > 0)); do
  case "$1" in
    -n) (($# >= 2)) || usage; world="$2"; shift 2 ;;
    --rendezvous) (($# >= 2)) || usage; rendezvous="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unexpected argument '$1'" >&2; usage ;;
  esac
done
(($# > 0)) || { echo "launch.sh: no command after --" >&2; usage; }
[[ "$world" =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: -n needs a positive rank count, got '$world'" >&2; usage; }

# NVLink multicast can take the host's GPUs down: off in every rank, whatever the caller set.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

scratch="$(mktemp -d "${TMPDIR:-/tmp}/loom-launch.XXXXXX")"
[ -n "$rendezvous" ] || rendezvous="file:$scratch/rendezvous"

declare -a ranks=()    # pid (= process group) of each rank's command, by rank
declare -a printers=() # pid of each rank's line prefixer
declare -A rank_of=()  # pid -> rank

live_ranks() {
  local pid
  for pid in "${ranks[@]}"; do [ -z "$pid" ] || echo "$pid"; done
}
any_rank_alive() {
  local pid
  for pid in $(live_ranks); do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
# TERM to every rank's process group (the rank and whatever it started); KILL to those still there after 5 seconds.
stop_ranks() {
  local pid tries
  for pid in $(live_ranks); do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for ((tries = 0; tries < 50; ++tries)); do
    any_rank_alive || return 0
    sleep 0.1
  done
  for pid in $(live_ranks); do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
cleanup() {
  stop_ranks
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'echo "launch.sh: interrupted; stopping every rank" >&2; exit 130' INT TERM

for ((r = 0; r < world; ++r)); do
  fifo="$scratch/out.$r"
  mkfifo "$fifo"
  sed -u "s/^/[rank $r] /" <"$fifo" &
  printers[r]=$!
  # setsid: the rank leads its own process group (its pid), so it can be stopped with its children.
  LOOM_RANK=$r LOOM_WORLD=$world LOOM_RENDEZVOUS="$rendezvous" LOOM_DEVICE=$r \
    setsid "$@" >"$fifo" 2>&1 </dev/null &
  ranks[r]=$!
  rank_of[$!]=$r
done

status=0
while true; do
  mapfile -t live < <(live_ranks)
  ((${#live[@]} > 0)) || break
  finished=""
  rc=0
  wait -n -p finished "${live[@]}" || rc=$?
  [ -n "$finished" ] || break  # nothing left to wait for
  r="${rank_of[$finished]}"
  ranks[r]=""
  if ((rc != 0)); then
    echo "launch.sh: rank $r exited with status $rc; stopping the other ranks" >&2
    status=$rc
    stop_ranks
    break
  fi
done

# Collect the stopped ranks (their status no longer matters) and let the prefixers drain.
for pid in $(live_ranks); do
  wait "$pid" 2>/dev/null || true
done
for pid in "${printers[@]}"; do
  wait "$pid" 2>/dev/null || true
done
exit "$status"

# shellcheck shell=sh
# Shared by prolog.sh, epilog.sh and healthcheck.sh (sourced, not run): netmon's pause file,
# held by any number of holders. Each holder (a job, the health check) leaves a marker file in
# $NETMON_PAUSE_HOLDERS; the pause file exists while any marker does. Markers are added and
# removed under one lock, so a prolog and an epilog running at once on the node cannot lose a
# pause, and no one asks slurmctld which jobs are still running.

NETMON_PAUSE_FILE=${NETMON_PAUSE_FILE:-/run/netmon/pause}
NETMON_PAUSE_HOLDERS=${NETMON_PAUSE_HOLDERS:-$(dirname "$NETMON_PAUSE_FILE")/pause.d}
NETMON_LOCK_TIMEOUT=${NETMON_LOCK_TIMEOUT:-30}

netmon_log() {
  echo "netmon-slurm: $*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t netmon-slurm -- "$*" || true
  fi
}

# Runs "$@" while holding the holders' lock.
netmon_locked() {
  mkdir -p "$NETMON_PAUSE_HOLDERS" || return 1
  (
    if ! flock -w "$NETMON_LOCK_TIMEOUT" 9; then
      netmon_log "could not lock $NETMON_PAUSE_HOLDERS.lock in ${NETMON_LOCK_TIMEOUT}s"
      exit 1
    fi
    "$@"
  ) 9>"$NETMON_PAUSE_HOLDERS.lock"
}

netmon_holders_left() {
  for marker in "$NETMON_PAUSE_HOLDERS"/*; do
    [ -e "$marker" ] && return 0
  done
  return 1
}

# True when a job (not the health check) holds the pause.
netmon_jobs_running() {
  for marker in "$NETMON_PAUSE_HOLDERS"/job-*; do
    [ -e "$marker" ] && return 0
  done
  return 1
}

_netmon_add() {
  : >"$NETMON_PAUSE_HOLDERS/$1" && : >"$NETMON_PAUSE_FILE"
}

_netmon_remove() {
  rm -f "$NETMON_PAUSE_HOLDERS/$1" || return 1
  if ! netmon_holders_left; then
    rm -f "$NETMON_PAUSE_FILE"
  fi
}

# netmon_pause_acquire HOLDER: pause netmon on behalf of HOLDER.
netmon_pause_acquire() {
  mkdir -p "$(dirname "$NETMON_PAUSE_FILE")" && netmon_locked _netmon_add "$1"
}

# netmon_pause_release HOLDER: drop HOLDER's pause; unpause when no one else holds one.
netmon_pause_release() {
  netmon_locked _netmon_remove "$1"
}

#!/bin/sh
# shellcheck source-path=SCRIPTDIR
# Slurm HealthCheckProgram: measure the node's interconnect with `netmon probe --min-busbw` and
# drain the node, with the reason, when it is too slow or the probe cannot finish.
# It judges the node by netmon's own probe only: never by netmon's verdicts, and so never by the
# jobs' own collectives (probe="jobs", which a job's files can say anything in).
#
#   slurm.conf:  HealthCheckProgram=/opt/netmon/slurm/healthcheck.sh
#                HealthCheckInterval=3600
#                HealthCheckNodeState=IDLE     # never while jobs run
#
# Settings: the environment, or /etc/netmon/slurm-healthcheck.conf (sourced, shell syntax):
#   NETMON_MIN_BUSBW        required: busbw at the largest size, decimal suffixes (150G)
#   NETMON_HEALTHCHECK_ARGS netmon probe flags (default: --sizes 1G --timeout 300s)
#   NETMON_BIN              netmon executable (default: /opt/netmon/bin/netmon)
#   NETMON_SLURM_NODENAME   Slurm's name of this node (default: $SLURMD_NODENAME or hostname -s)
#   NETMON_PAUSE_SETTLE     seconds for the daemon to stop its probe after the pause (default 5)
set -u
# shellcheck source=netmon-pause.sh
. "$(dirname "$0")/netmon-pause.sh"
NETMON_HEALTHCHECK_CONF=${NETMON_HEALTHCHECK_CONF:-/etc/netmon/slurm-healthcheck.conf}
if [ -r "$NETMON_HEALTHCHECK_CONF" ]; then
  # shellcheck source=/dev/null
  . "$NETMON_HEALTHCHECK_CONF"
fi

NETMON_BIN=${NETMON_BIN:-/opt/netmon/bin/netmon}
NETMON_HEALTHCHECK_ARGS=${NETMON_HEALTHCHECK_ARGS:---sizes 1G --timeout 300s}
NETMON_PAUSE_SETTLE=${NETMON_PAUSE_SETTLE:-5}
node=${NETMON_SLURM_NODENAME:-${SLURMD_NODENAME:-$(hostname -s)}}

if [ -z "${NETMON_MIN_BUSBW:-}" ]; then
  netmon_log "healthcheck: NETMON_MIN_BUSBW is not set; not checking"
  exit 0
fi
if netmon_jobs_running; then
  netmon_log "healthcheck: a job runs on $node; not probing"
  exit 0
fi

drain() {
  # One line, no quotes, short enough for sinfo -R.
  reason=$(printf '%s' "$1" | tr -d '"\n' | cut -c1-120)
  netmon_log "healthcheck: draining $node: $reason"
  scontrol update nodename="$node" state=drain reason="$reason"
}

output=$(mktemp) || exit 0
# The daemon stops its own probes while we measure, so the two do not share the links.
netmon_pause_acquire healthcheck || netmon_log "healthcheck: could not pause the daemon"
sleep "$NETMON_PAUSE_SETTLE"
# NETMON_HEALTHCHECK_ARGS is a list of flags: split on purpose.
# shellcheck disable=SC2086
"$NETMON_BIN" probe --quiet --min-busbw "$NETMON_MIN_BUSBW" $NETMON_HEALTHCHECK_ARGS \
  >"$output" 2>&1
status=$?
netmon_pause_release healthcheck || netmon_log "healthcheck: could not release the pause"
last=$(grep -v '^[[:space:]]*$' "$output" | tail -n 1)
last=${last#netmon: }
rm -f "$output"

if [ "$status" -ne 0 ] && netmon_jobs_running; then
  # A job started while we probed: its traffic may be why. Judge again next time.
  netmon_log "healthcheck: a job started during the probe; result (status $status) discarded"
  exit 0
fi
case "$status" in
  0) ;;
  1) drain "netmon: $last" ;;
  3) drain "netmon: probe failed: $last" ;;
  *)
    # 2 is a usage error: the check is misconfigured, not the node.
    netmon_log "healthcheck: netmon probe exited $status (not draining): $last"
    ;;
esac
exit 0

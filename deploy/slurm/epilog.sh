#!/bin/sh
# shellcheck source-path=SCRIPTDIR
# Slurm Epilog: this job no longer holds netmon's pause, of the node or of its GPUs; netmon
# resumes once no other job on the node (and no health check) holds one.
#
#   slurm.conf:  Epilog=/opt/netmon/slurm/epilog.sh
#
# It also marks the job's NCCL Inspector directory ended (netmon-inspector.sh): netmon reads the
# job's last dump and removes the directory once the mark is `inspector.grace` old.
#
# Like the prolog it never fails: Slurm would drain the node.
set -u
# shellcheck source=netmon-pause.sh
. "$(dirname "$0")/netmon-pause.sh"
# shellcheck source=netmon-inspector.sh
. "$(dirname "$0")/netmon-inspector.sh"

if [ -z "${SLURM_JOB_ID:-}" ]; then
  netmon_log "epilog: SLURM_JOB_ID is not set; nothing to release"
elif ! netmon_pause_release "job-$SLURM_JOB_ID"; then
  netmon_log "epilog: could not release netmon's pause for job $SLURM_JOB_ID"
fi
netmon_inspector_end
exit 0

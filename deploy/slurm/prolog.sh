#!/bin/sh
# shellcheck source-path=SCRIPTDIR
# Slurm Prolog: pause netmon on this node while a job runs (netmon stops a running probe and
# starts none until the job's pause is gone). With NETMON_PAUSE_PER_GPU=1 (netmon-pause.sh), a
# job with GPUs pauses only its GPUs, so netmon goes on probing the node's others.
#
#   slurm.conf:  Prolog=/opt/netmon/slurm/prolog.sh
#                PrologFlags=Alloc    # run at allocation, before the job's first step
#
# Slurm drains a node whose prolog fails, so this never fails: if the pause cannot be set, it
# logs why and the job starts anyway (netmon's own idle check still stops a probe that meets a
# job's process on a GPU).
#
# With NCCL Inspector's plugin installed (netmon-inspector.sh), it also makes the job its dump
# directory, $NETMON_INSPECTOR_DIR/$SLURM_JOB_ID, the job's user's and 0700 (never through a
# symlink), which task_prolog.sh points NCCL at; without it the job runs with Inspector off.
set -u
# shellcheck source=netmon-pause.sh
. "$(dirname "$0")/netmon-pause.sh"
# shellcheck source=netmon-inspector.sh
. "$(dirname "$0")/netmon-inspector.sh"

# The job's GPUs, or nothing for the whole node (the safe side when they cannot be told).
job_gpus() {
  [ "$NETMON_PAUSE_PER_GPU" = 1 ] || return 0
  if ! gpus=$(netmon_job_gpus); then
    netmon_log "prolog: job $SLURM_JOB_ID pauses the whole node"
    return 0
  fi
  printf '%s\n' "# job $SLURM_JOB_ID: SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-}" "$gpus"
}

if [ -z "${SLURM_JOB_ID:-}" ]; then
  netmon_log "prolog: SLURM_JOB_ID is not set; not pausing"
elif ! netmon_pause_acquire "job-$SLURM_JOB_ID" "$(job_gpus)"; then
  netmon_log "prolog: could not pause netmon for job $SLURM_JOB_ID"
fi
netmon_inspector_prepare
exit 0

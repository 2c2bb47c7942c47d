#!/bin/sh
# shellcheck source-path=SCRIPTDIR
# Slurm TaskProlog: NCCL Inspector in every task, when its plugin is installed and the prolog
# made the job its dump directory (netmon-inspector.sh). Runs as the job's user, before each
# task, in the task's environment; Slurm adds each `export NAME=value` line it prints to it:
#   NCCL_PROFILER_PLUGIN=$NETMON_INSPECTOR_PLUGIN NCCL_INSPECTOR_ENABLE=1
#   NCCL_INSPECTOR_PROM_DUMP=1 NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=30000000
#   NCCL_INSPECTOR_DUMP_DIR=$NETMON_INSPECTOR_DIR/$SLURM_JOB_ID
# A job that sets NCCL_PROFILER_PLUGIN itself (another profiler, or "none") gets none of them.
#
#   slurm.conf:  TaskProlog=/opt/netmon/slurm/task_prolog.sh
#
# It never fails, and prints nothing else on stdout: messages go to stderr (and syslog).
set -u
# shellcheck source=netmon-pause.sh
. "$(dirname "$0")/netmon-pause.sh"
# shellcheck source=netmon-inspector.sh
. "$(dirname "$0")/netmon-inspector.sh"

netmon_inspector_exports
exit 0

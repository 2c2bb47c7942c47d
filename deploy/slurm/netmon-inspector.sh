# shellcheck shell=sh
# Shared by prolog.sh, epilog.sh and task_prolog.sh (sourced after netmon-pause.sh, which reads
# $NETMON_SLURM_CONF): NCCL Inspector in every job when its plugin is installed, its dumps in a
# directory per job that netmon reads (`inspector.dir`, docs/INSPECTOR.md):
#   prolog (root)          makes $NETMON_INSPECTOR_DIR/$SLURM_JOB_ID, the job's user's, 0700,
#                          and marks $NETMON_INSPECTOR_DIR as netmon's (.netmon-inspector)
#   task_prolog (the user) points NCCL at the plugin and at that directory
#   epilog (root)          marks the directory ended (.ended); netmon reads the job's last dump
#                          and removes the directory once the mark is `inspector.grace` old
#
# Settings: as netmon-pause.sh's (the environment, or $NETMON_SLURM_CONF):
#   NETMON_INSPECTOR_DIR     netmon's inspector.dir (default /var/lib/netmon-inspector): made by
#                            the site, root's and writable by no one else, or Inspector stays off
#   NETMON_INSPECTOR_PLUGIN  NCCL Inspector's plugin, libnccl-profiler-inspector.so (NCCL's
#                            ext-profiler/inspector; default
#                            /opt/netmon/lib/libnccl-profiler-inspector.so). Absent: Inspector
#                            stays off, and the prolog makes no directory

NETMON_INSPECTOR_DIR=${NETMON_INSPECTOR_DIR:-/var/lib/netmon-inspector}
NETMON_INSPECTOR_PLUGIN=${NETMON_INSPECTOR_PLUGIN:-/opt/netmon/lib/libnccl-profiler-inspector.so}
NETMON_INSPECTOR_ENDED=.ended # netmon's mark of an ended job (netmon/inspector/files.py)
# The root's mark: a directory made for NCCL Inspector, whose ended jobs' directories netmon may
# remove (netmon/inspector/jobdirs.py); the daemon refuses to start without it.
NETMON_INSPECTOR_MARKER=.netmon-inspector
# The plugin's dump interval: its textfile mode takes no less than 30 s.
NETMON_INSPECTOR_INTERVAL_US=30000000

# The job's dump directory, $NETMON_INSPECTOR_DIR/$SLURM_JOB_ID; fails when SLURM_JOB_ID is not a
# job id (a path must not come of it).
netmon_inspector_job_dir() {
  case ${SLURM_JOB_ID:-} in
    '' | *[!0-9]*) return 1 ;;
  esac
  printf '%s/%s\n' "${NETMON_INSPECTOR_DIR%/}" "$SLURM_JOB_ID"
}

# True when the plugin is installed: Inspector is on for the jobs.
netmon_inspector_installed() {
  [ -f "$NETMON_INSPECTOR_PLUGIN" ]
}

# True when root may work on job directories in $NETMON_INSPECTOR_DIR: a directory (not a
# symlink: netmon opens none), root's, and writable by no one else, so no user can plant or swap
# a job's name in it under root's hands. Says why not.
netmon_inspector_dir_safe() {
  base=$NETMON_INSPECTOR_DIR
  if [ -L "$base" ] || [ ! -d "$base" ]; then
    netmon_log "$base (NETMON_INSPECTOR_DIR) is not a directory; NCCL Inspector stays off"
    return 1
  fi
  if [ -n "$(find "$base" -prune \( ! -user 0 -o -perm -020 -o -perm -002 \) -print)" ]; then
    netmon_log "$base (NETMON_INSPECTOR_DIR) must be root's and writable by no one else;" \
      "NCCL Inspector stays off"
    return 1
  fi
}

# The root's marker, when the site's setup did not write it yet. The root is safe (root's, no one
# else may write in it), so no user can have planted that name.
netmon_inspector_mark() {
  marker=${NETMON_INSPECTOR_DIR%/}/$NETMON_INSPECTOR_MARKER
  # `true`, not `:`: a failed redirection of a special builtin would end the script.
  if [ ! -e "$marker" ] && [ ! -L "$marker" ] && ! true 2>/dev/null >"$marker"; then
    netmon_log "could not write $marker; netmon refuses to start without it"
  fi
}

# DIR becomes root's and 0700: no one else can add, remove or rename a name in it. DIR is a
# directory, not a symlink, in a safe NETMON_INSPECTOR_DIR, so no one can swap it meanwhile.
netmon_inspector_lock() {
  chown -h 0:0 "$1" && chmod 0700 "$1"
}

# The job's directory, made for its user (prolog, as root). An existing one is taken again only
# when it is a real directory of this user's or root's (a job requeued under its id, whose
# epilog locked it): its .ended mark goes, or netmon would remove it under the job.
netmon_inspector_prepare() {
  dir=$(netmon_inspector_job_dir) || return 0
  netmon_inspector_installed || return 0
  netmon_inspector_dir_safe || return 0
  netmon_inspector_mark
  uid=${SLURM_JOB_UID:-}
  gid=${SLURM_JOB_GID:-}
  case "$uid:$gid" in
    *[!0-9:]* | :* | *:)
      netmon_log "job $SLURM_JOB_ID: SLURM_JOB_UID=$uid SLURM_JOB_GID=$gid are not ids;" \
        "no NCCL Inspector directory"
      return 0
      ;;
  esac
  if [ -L "$dir" ]; then
    netmon_log "$dir is a symlink: not following it; NCCL Inspector stays off for the job"
    return 0
  fi
  if [ ! -e "$dir" ]; then
    # mkdir makes the name or fails, whatever is there; root's and 0700 until it is the user's.
    if ! mkdir -m 0700 -- "$dir"; then
      netmon_log "could not make $dir; NCCL Inspector stays off for the job"
    elif ! chown -h -- "$uid:$gid" "$dir"; then
      netmon_log "could not give $dir to $uid:$gid; NCCL Inspector stays off for the job"
      rmdir -- "$dir"
    fi
    return 0
  fi
  if [ -z "$(find "$dir" -prune -type d \( -user "$uid" -o -user 0 \) -print)" ]; then
    netmon_log "$dir exists and is not the job's directory; NCCL Inspector stays off for the job"
    return 0
  fi
  # Locked (root's, 0700) while its mark goes, then the user's again.
  if ! netmon_inspector_lock "$dir" || ! rm -rf -- "${dir:?}/$NETMON_INSPECTOR_ENDED" ||
    ! chown -h -- "$uid:$gid" "$dir"; then
    netmon_log "could not take $dir again for job $SLURM_JOB_ID"
  fi
}

# The job ended (epilog, as root): the directory becomes root's and 0700, so the user can no
# longer plant a name in it, and gets a fresh .ended (whatever had that name is removed first,
# never followed). netmon reads what the job wrote and removes the directory after its grace.
netmon_inspector_end() {
  dir=$(netmon_inspector_job_dir) || return 0
  [ -e "$dir" ] || [ -L "$dir" ] || return 0 # Inspector was off for the job
  netmon_inspector_dir_safe || return 0
  if [ -L "$dir" ]; then
    netmon_log "$dir is a symlink: not following it"
    return 0
  fi
  if [ ! -d "$dir" ]; then
    netmon_log "$dir is not a directory; leaving it alone"
    return 0
  fi
  if ! netmon_inspector_lock "$dir" || ! rm -rf -- "${dir:?}/$NETMON_INSPECTOR_ENDED" ||
    ! : >"$dir/$NETMON_INSPECTOR_ENDED"; then
    netmon_log "could not mark $dir ended; netmon removes it once it is stale"
  fi
}

# The task's environment (task prolog, as the job's user): `export NAME=value` lines, which Slurm
# takes literally (no quotes). Nothing when the job chose a profiler plugin of its own, or when
# the job has no directory of its own to dump into.
netmon_inspector_exports() {
  if [ -n "${NCCL_PROFILER_PLUGIN+set}" ]; then
    netmon_log "task prolog: the job sets NCCL_PROFILER_PLUGIN=$NCCL_PROFILER_PLUGIN;" \
      "netmon does not turn NCCL Inspector on"
    return 0
  fi
  dir=$(netmon_inspector_job_dir) || return 0
  netmon_inspector_installed || return 0
  if [ -L "$dir" ] || [ ! -d "$dir" ] || [ ! -w "$dir" ]; then
    return 0 # the prolog made none (and said why): Inspector stays off
  fi
  printf 'export %s\n' \
    "NCCL_PROFILER_PLUGIN=$NETMON_INSPECTOR_PLUGIN" \
    "NCCL_INSPECTOR_ENABLE=1" \
    "NCCL_INSPECTOR_PROM_DUMP=1" \
    "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=$NETMON_INSPECTOR_INTERVAL_US" \
    "NCCL_INSPECTOR_DUMP_DIR=$dir"
}

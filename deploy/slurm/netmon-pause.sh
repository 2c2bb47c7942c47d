# shellcheck shell=sh
# Shared by prolog.sh, epilog.sh and healthcheck.sh (sourced, not run; task_prolog.sh takes its
# settings and netmon_log for netmon-inspector.sh): netmon's pause, held by
# any number of holders. Each holder (a job, the health check) leaves a marker file in
# $NETMON_PAUSE_HOLDERS, the directory netmon reads as its `pause_dir`. An empty marker pauses
# the whole node, and so does the pause file, which exists while any such marker does (for a
# netmon that reads only the pause file). A marker that lists GPU ids pauses only those GPUs.
# Markers are added and removed under one lock, so a prolog and an epilog running at once on the
# node cannot lose a pause, and no one asks slurmctld which jobs are still running.
#
# Settings: the environment, or $NETMON_SLURM_CONF (default /etc/netmon/slurm.conf; sourced,
# shell syntax, so what it sets wins over the environment):
#   NETMON_PAUSE_FILE           netmon's pause_file (default /run/netmon/pause)
#   NETMON_PAUSE_HOLDERS        netmon's pause_dir (default pause.d beside the pause file)
#   NETMON_PAUSE_PER_GPU        1: a job with GPUs pauses only its GPUs (default 0: the node)
#   NETMON_SLURM_GPU_NUMBERING  what SLURM_JOB_GPUS numbers are here: auto, index or minor
#   NETMON_NVIDIA_SMI           nvidia-smi to map them with (default: nvidia-smi on PATH)
#   NETMON_INSPECTOR_DIR, NETMON_INSPECTOR_PLUGIN: NCCL Inspector's, see netmon-inspector.sh

NETMON_SLURM_CONF=${NETMON_SLURM_CONF:-/etc/netmon/slurm.conf}
if [ -r "$NETMON_SLURM_CONF" ]; then
  # shellcheck source=/dev/null
  . "$NETMON_SLURM_CONF"
fi
NETMON_PAUSE_FILE=${NETMON_PAUSE_FILE:-/run/netmon/pause}
NETMON_PAUSE_HOLDERS=${NETMON_PAUSE_HOLDERS:-$(dirname "$NETMON_PAUSE_FILE")/pause.d}
NETMON_LOCK_TIMEOUT=${NETMON_LOCK_TIMEOUT:-30}
NETMON_PAUSE_PER_GPU=${NETMON_PAUSE_PER_GPU:-0}
NETMON_SLURM_GPU_NUMBERING=${NETMON_SLURM_GPU_NUMBERING:-auto}
NETMON_NVIDIA_SMI=${NETMON_NVIDIA_SMI:-nvidia-smi}

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

# True when MARKER names no GPU (empty, or comments only): netmon then pauses the whole node.
netmon_marker_whole_node() {
  ! sed 's/#.*//' "$1" 2>/dev/null | tr ',' ' ' | grep -q '[^[:space:]]'
}

# True when some marker pauses the whole node. Read as netmon reads them: regular files whose
# names do not start with "." (the glob skips those).
netmon_whole_node_held() {
  for marker in "$NETMON_PAUSE_HOLDERS"/*; do
    [ -f "$marker" ] && netmon_marker_whole_node "$marker" && return 0
  done
  return 1
}

# True when a job (not the health check) holds a pause, of the node or of some of its GPUs.
netmon_jobs_running() {
  for marker in "$NETMON_PAUSE_HOLDERS"/job-*; do
    [ -e "$marker" ] && return 0
  done
  return 1
}

# _netmon_add HOLDER [LINES...]: the marker holds the lines. It is written under a name netmon
# ignores and renamed into place, so netmon never reads half of it.
_netmon_add() {
  marker="$NETMON_PAUSE_HOLDERS/$1"
  shift
  printf '%s\n' "$@" | sed '/^$/d' >"$NETMON_PAUSE_HOLDERS/.new" &&
    mv -f "$NETMON_PAUSE_HOLDERS/.new" "$marker" || return 1
  if netmon_marker_whole_node "$marker"; then
    : >"$NETMON_PAUSE_FILE"
  fi
}

_netmon_remove() {
  rm -f "$NETMON_PAUSE_HOLDERS/$1" || return 1
  # A marker of some GPUs does not keep the node paused.
  if ! netmon_whole_node_held; then
    rm -f "$NETMON_PAUSE_FILE"
  fi
}

# netmon_pause_acquire HOLDER [LINES...]: pause netmon on behalf of HOLDER: the GPUs the lines
# name (ids, "#" comments; an argument may hold several lines), or the node when they name none.
netmon_pause_acquire() {
  mkdir -p "$(dirname "$NETMON_PAUSE_FILE")" && netmon_locked _netmon_add "$@"
}

# netmon_pause_release HOLDER: drop HOLDER's pause; unpause the node when no one else holds it.
netmon_pause_release() {
  netmon_locked _netmon_remove "$1"
}

# "index minor_number uuid" for each GPU, from nvidia-smi; empty when it cannot say.
netmon_gpu_table() {
  if command -v timeout >/dev/null 2>&1; then
    set -- timeout 10 "$NETMON_NVIDIA_SMI"
  else
    set -- "$NETMON_NVIDIA_SMI"
  fi
  "$@" --query-gpu=index,minor_number,uuid --format=csv,noheader 2>/dev/null |
    awk -F', *' 'NF == 3 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print $1, $2, $3 }'
}

# The GPUs of the job (SLURM_JOB_GPUS), one id a line, as netmon names them. Slurm numbers a
# node's GPUs in its gres.conf order: by PCI bus ID, as NVML does, with AutoDetect=nvml, and in
# the order of the File= device files otherwise (docs/FACTS.md, "Slurm's GPU numbers"). "auto"
# trusts a number only where both readings agree, or takes the UUIDs Slurm gave. When the GPUs
# cannot be told for sure, this says why and fails: the caller pauses the whole node.
netmon_job_gpus() {
  numbers=$(printf '%s' "${SLURM_JOB_GPUS:-}" | tr ',' ' ')
  case $numbers in
    *[!0-9\ ]*)
      netmon_log "SLURM_JOB_GPUS=$SLURM_JOB_GPUS is not a list of numbers"
      return 1
      ;;
    *[0-9]*) ;;
    *)
      netmon_log "job ${SLURM_JOB_ID:-?} has no GPUs (SLURM_JOB_GPUS is empty)"
      return 1
      ;;
  esac
  case ",${CUDA_VISIBLE_DEVICES:-}," in
    *,MIG-*)
      # Slurm then numbers MIG instances, not GPUs.
      netmon_log "job ${SLURM_JOB_ID:-?} has MIG instances ($CUDA_VISIBLE_DEVICES)"
      return 1
      ;;
  esac
  case $NETMON_SLURM_GPU_NUMBERING in
    index)
      # NVML's indexes, which netmon reads as they are. One number a word: split on purpose.
      # shellcheck disable=SC2086
      printf '%s\n' $numbers
      return 0
      ;;
    auto)
      netmon_slurm_uuids && return 0
      ;;
    minor) ;;
    *)
      netmon_log "NETMON_SLURM_GPU_NUMBERING=$NETMON_SLURM_GPU_NUMBERING: use auto, index or minor"
      return 1
      ;;
  esac
  table=$(netmon_gpu_table)
  if [ -z "$table" ]; then
    netmon_log "$NETMON_NVIDIA_SMI lists no GPU to map SLURM_JOB_GPUS=$SLURM_JOB_GPUS to"
    return 1
  fi
  by=$NETMON_SLURM_GPU_NUMBERING
  if ! mapped=$(printf '%s\n' "$table" | awk -v numbers="$numbers" -v by="$by" '
    { by_minor[$2] = $3; if ($1 != $2) mixed = 1 }
    END {
      if (by == "auto" && mixed) {
        print "NVML indexes and device minor numbers differ here;" \
          " set NETMON_SLURM_GPU_NUMBERING to index or minor"
        exit 1
      }
      count = split(numbers, wanted, " ")
      for (i = 1; i <= count; i++) {
        if (!(wanted[i] in by_minor)) {
          print "no GPU numbered " wanted[i] " here"
          exit 1
        }
        print by_minor[wanted[i]]
      }
    }'); then
    netmon_log "cannot map SLURM_JOB_GPUS=$SLURM_JOB_GPUS: $mapped"
    return 1
  fi
  printf '%s\n' "$mapped"
}

# Slurm 25.11 and later with AutoDetect=nvml give the prolog the allocated GPUs' UUIDs in
# CUDA_VISIBLE_DEVICES: exact, nothing to map. Prints them, or fails when they are not UUIDs.
netmon_slurm_uuids() {
  uuids=$(printf '%s' "${CUDA_VISIBLE_DEVICES:-}" | tr ',' ' ')
  [ -n "$uuids" ] || return 1
  for uuid in $uuids; do
    case $uuid in
      GPU-*) ;;
      *) return 1 ;; # indexes: an older Slurm, or gres.conf without AutoDetect
    esac
  done
  # shellcheck disable=SC2086
  printf '%s\n' $uuids
}

{{/* The objects' name: the release's, or release-netmon when it does not say netmon. */}}
{{- define "netmon.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "netmon.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "netmon.labels" -}}
{{ include "netmon.selectorLabels" . }}
app.kubernetes.io/component: exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "netmon.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* netmon.yaml: .Values.config, with idle.kubelet_socket while the guard is on, and the
sweep's secret while sweeps are on (the daemon takes a node's results sealed with it). */}}
{{- define "netmon.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.kubeletGuard.enabled -}}
{{- $config = merge $config (dict "idle" (dict "kubelet_socket" .Values.kubeletGuard.socket)) -}}
{{- end -}}
{{- if .Values.sweep.enabled -}}
{{- $config = merge $config (dict "sweep" (dict "secret_file" (include "netmon.sweepSecretFile" .))) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "netmon.sweepSecretFile" -}}
/var/run/secrets/netmon-sweep/secret
{{- end -}}

{{- define "netmon.sweepName" -}}
{{- printf "%s-sweep" (include "netmon.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "netmon.sweepLabels" -}}
{{ include "netmon.selectorLabels" . }}
app.kubernetes.io/component: sweep
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The sweep's netmon.yaml: sweep.settings over what the chart sets for Kubernetes. The
pairs' pods pull the image with the chart's imagePullSecrets, by name. */}}
{{- define "netmon.sweepConfig" -}}
{{- $s := .Values.sweep -}}
{{- $daemons := merge (fromYaml (include "netmon.selectorLabels" .)) (dict "app.kubernetes.io/component" "exporter") -}}
{{- $kube := dict "namespace" .Release.Namespace "queue" $s.queue "priority_class" $s.priorityClass "image" (include "netmon.image" .) "image_pull_policy" .Values.image.pullPolicy "node_selector" $s.nodeSelector "tolerations" $s.tolerations "config_map" (include "netmon.fullname" .) "daemon_labels" $daemons "host_network" $s.hostNetwork "max_pairs_per_jobset" $s.maxPairsPerJobSet -}}
{{- with .Values.runtimeClassName }}{{ $_ := set $kube "runtime_class" . }}{{ end -}}
{{- with $s.podPriorityClass.name }}{{ $_ := set $kube "pod_priority_class" . }}{{ end -}}
{{- with $s.rdmaResource }}{{ $_ := set $kube "rdma_resource" . }}{{ end -}}
{{- if $s.ipcLock }}{{ $_ := set $kube "ipc_lock" true }}{{ end -}}
{{- $pullSecrets := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $pullSecrets = append $pullSecrets .name -}}
{{- end -}}
{{- with $pullSecrets }}{{ $_ := set $kube "image_pull_secrets" . }}{{ end -}}
{{- $sweep := dict "scheduler" "kubernetes" "secret_file" (include "netmon.sweepSecretFile" .) "daemon_port" .Values.service.port "state_dir" "/var/lib/netmon-sweep" "kubernetes" $kube -}}
{{- $config := dict "state_dir" "/var/lib/netmon-sweep" "sweep" (merge (deepCopy $s.settings) $sweep) -}}
{{- with .Values.config.baseline }}{{ $_ := set $config "baseline" . }}{{ end -}}
{{- with .Values.config.logging }}{{ $_ := set $config "logging" . }}{{ end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The container runs as root for IPC_LOCK (rdma) or for the kubelet's socket. */}}
{{- define "netmon.root" -}}
{{- if or .Values.rdma.enabled (and .Values.kubeletGuard.enabled .Values.kubeletGuard.runAsRoot) -}}
true
{{- end -}}
{{- end -}}

{{/* Bytes in a netmon size: 8, "64K", "1G", "1GiB" (binary multiples, as netmon.bandwidth). */}}
{{- define "netmon.bytes" -}}
{{- $text := toString . | trim | upper | trimSuffix "B" | trimSuffix "I" -}}
{{- if not (regexMatch "^[0-9]+[KMGT]?$" $text) -}}
{{- fail (printf "memory: cannot read the size %q; set memory.largestSize" (toString .)) -}}
{{- end -}}
{{- $units := dict "K" 1024 "M" 1048576 "G" 1073741824 "T" 1099511627776 -}}
{{- $unit := regexFind "[KMGT]$" $text -}}
{{- $number := trimSuffix $unit $text | atoi -}}
{{- mul $number (get $units $unit | default 1) -}}
{{- end -}}

{{/* The largest size of config.probes in bytes, or memory.largestSize. */}}
{{- define "netmon.largestBytes" -}}
{{- $largest := 0 -}}
{{- if .Values.memory.largestSize -}}
{{- $largest = include "netmon.bytes" .Values.memory.largestSize | atoi -}}
{{- else -}}
{{- range (.Values.config.probes | default list) -}}
{{- $sizes := .sizes | default list -}}
{{- if kindIs "map" $sizes -}}
{{- $sizes = list $sizes.max -}}
{{- else if kindIs "string" $sizes -}}
{{- $sizes = splitList "," $sizes -}}
{{- else if not (kindIs "slice" $sizes) -}}
{{- $sizes = list $sizes -}}
{{- end -}}
{{- range $sizes -}}
{{- $largest = max $largest (include "netmon.bytes" . | atoi) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $largest -}}
{{- fail "memory: config.probes has no sizes; set memory.largestSize" -}}
{{- end -}}
{{- $largest -}}
{{- end -}}

{{/* ranks x (perRankMi + 2 x largest size), in Mi, the largest size rounded up to a Mi. */}}
{{- define "netmon.memory" -}}
{{- $largestMi := div (add (include "netmon.largestBytes" . | atoi) 1048575) 1048576 -}}
{{- printf "%dMi" (mul .Values.memory.ranks (add .Values.memory.perRankMi (mul 2 $largestMi))) -}}
{{- end -}}

{{/* sweep.settings.deadline in seconds (netmon's default: 1800): a number, or a duration as
netmon reads it ("90s", "30m", "1h"). */}}
{{- define "netmon.sweepDeadline" -}}
{{- $value := .Values.sweep.settings.deadline | default 1800 -}}
{{- $text := toString $value | trim | lower -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)?$" $text) -}}
{{- fail (printf "sweep.settings.deadline: cannot read the duration %q" (toString $value)) -}}
{{- end -}}
{{- $units := dict "ms" 0.001 "s" 1 "m" 60 "h" 3600 "d" 86400 -}}
{{- $unit := regexFind "(ms|s|m|h|d)$" $text | default "s" -}}
{{- mulf (trimSuffix $unit $text | float64) (get $units $unit) | ceil | int64 -}}
{{- end -}}

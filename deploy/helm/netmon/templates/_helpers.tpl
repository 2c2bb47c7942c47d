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

{{/* netmon.yaml: .Values.config, with idle.kubelet_socket while the guard is on. */}}
{{- define "netmon.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.kubeletGuard.enabled -}}
{{- $config = merge $config (dict "idle" (dict "kubelet_socket" .Values.kubeletGuard.socket)) -}}
{{- end -}}
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

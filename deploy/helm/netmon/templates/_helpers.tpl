{{/* The chart's name: nameOverride, else "netmon". It is the app.kubernetes.io/name label, so
the ServiceMonitor's job label too (NetmonTargetDown expects job="netmon"). */}}
{{- define "netmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release's, or release-netmon when the
release's name does not say netmon. */}}
{{- define "netmon.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "netmon.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "netmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "netmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "netmon.labels" -}}
{{ include "netmon.selectorLabels" . }}
app.kubernetes.io/component: exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* REGISTRY/REPOSITORY@DIGEST, or :TAG (the appVersion when empty) without a digest. */}}
{{- define "netmon.image" -}}
{{- $image := .Values.image -}}
{{- $name := $image.repository -}}
{{- with $image.registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "netmon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "netmon.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The one port: netmon's listen address, the containerPort, the Service's port, the probes,
the ServiceMonitor and the sweep's daemon_port all take service.port. */}}
{{- define "netmon.port" -}}
{{- .Values.service.port | int -}}
{{- end -}}

{{/* HOST:PORT that netmon listens on: the host of config.listen (0.0.0.0 without one) and
service.port. A config.listen on another port is refused rather than half-followed, and so is a
loopback host (netmon's own default is 127.0.0.1:19464): the kubelet's probes and Prometheus
connect to the pod's address, so every pod would fail its probes and restart. */}}
{{- define "netmon.listen" -}}
{{- $port := include "netmon.port" . -}}
{{- $host := "0.0.0.0" -}}
{{- with .Values.config.listen -}}
{{- $listen := toString . -}}
{{- if not (regexMatch "^(\\[[0-9A-Fa-f:]+\\]|[A-Za-z0-9_.:-]*):[0-9]{1,5}$" $listen) -}}
{{- fail (printf "config.listen: %q is not HOST:PORT like 0.0.0.0:%s" $listen $port) -}}
{{- end -}}
{{- $listenHost := regexReplaceAll ":[0-9]+$" $listen "" | trimPrefix "[" | trimSuffix "]" -}}
{{- if regexMatch "(?i)^(localhost\\.?|127\\.[0-9.]+|::1|(0+:){7}0*1|::ffff:127\\.[0-9.]+)$" $listenHost -}}
{{- fail (printf "config.listen (%s) is a loopback address, which the kubelet's probes and Prometheus cannot reach (they connect to the pod's address): set config.listen to 0.0.0.0:%s, or remove it (the chart then listens on 0.0.0.0:<service.port>)" $listen $port) -}}
{{- end -}}
{{- $given := regexFind "[0-9]+$" $listen -}}
{{- if ne $given $port -}}
{{- fail (printf "config.listen (%s) and service.port (%s) name different ports: service.port sets netmon's listen port, the containerPort, the Service, the probes and the ServiceMonitor; set service.port=%s and leave the port of config.listen equal to it (or unset config.listen)" $listen $port $given) -}}
{{- end -}}
{{- $host = regexReplaceAll ":[0-9]+$" $listen "" | default "0.0.0.0" -}}
{{- end -}}
{{- printf "%s:%s" $host $port -}}
{{- end -}}

{{/* With rdma (hostNetwork), netmon.yaml's wildcard listen is narrowed to the node's address
(status.hostIP, through NETMON_LISTEN): not every interface of the node, such as a public one. */}}
{{- define "netmon.listenOnNode" -}}
{{- if .Values.rdma.enabled -}}
{{- $host := regexReplaceAll ":[0-9]+$" (include "netmon.listen" .) "" -}}
{{- if has $host (list "0.0.0.0" "[::]" "::" "") -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* https when the web-config turns on TLS. */}}
{{- define "netmon.scheme" -}}
{{- ternary "https" "http" (and (not (empty .Values.webConfig.secretName)) .Values.webConfig.tls) -}}
{{- end -}}

{{- define "netmon.webConfigDir" -}}
/etc/netmon-web
{{- end -}}

{{/* netmon.yaml: .Values.config with the listen address of service.port, idle.kubelet_socket
while the guard is on, the sweep's public key while sweeps are on (the daemon takes only a
node's results signed with its private key; the shared secret with sweep.sharedSecret), and the inspector section while NCCL Inspector is on: its dir is
inspector.hostPath, mounted at the same path, the rest inspector.settings. */}}
{{- define "netmon.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $_ := set $config "listen" (include "netmon.listen" .) -}}
{{- if .Values.kubeletGuard.enabled -}}
{{- $config = merge $config (dict "idle" (dict "kubelet_socket" .Values.kubeletGuard.socket)) -}}
{{- end -}}
{{- if .Values.sweep.enabled -}}
{{- $file := ternary "secret_file" "verify_key_file" .Values.sweep.sharedSecret -}}
{{- $config = merge $config (dict "sweep" (dict $file (include "netmon.sweepDaemonKey" .))) -}}
{{- end -}}
{{- if .Values.inspector.enabled -}}
{{- $inspector := deepCopy (.Values.inspector.settings | default dict) -}}
{{- $_ := set $inspector "dir" .Values.inspector.hostPath -}}
{{- $_ := set $config "inspector" $inspector -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "netmon.sweepSecretFile" -}}
/var/run/secrets/netmon-sweep/secret
{{- end -}}

{{/* The file each side of a sweep report holds: the sweep signs with the private key, each
daemon verifies with the public key; with sweep.sharedSecret both seal with the secret. */}}
{{- define "netmon.sweepDaemonKey" -}}
{{- if .Values.sweep.sharedSecret -}}
{{- include "netmon.sweepSecretFile" . -}}
{{- else -}}
/var/run/secrets/netmon-sweep/ed25519.pub
{{- end -}}
{{- end -}}

{{- define "netmon.sweepSigningKey" -}}
{{- if .Values.sweep.sharedSecret -}}
{{- include "netmon.sweepSecretFile" . -}}
{{- else -}}
/var/run/secrets/netmon-sweep/ed25519.key
{{- end -}}
{{- end -}}

{{/* The Secret each side mounts: the private key's for the sweep, the public key's for the
daemons; refused where the two are one Secret, since the kubelet of every node running a
daemon may read what its pods mount, and root on a node can act as its kubelet. */}}
{{- define "netmon.sweepSecret" -}}
{{- $s := .root.Values.sweep -}}
{{- if $s.sharedSecret -}}
{{- $s.secretName -}}
{{- else -}}
{{- $signing := $s.signing | default dict -}}
{{- if or (not $signing.keySecretName) (not $signing.verifySecretName) -}}
{{- fail "sweep.signing: set keySecretName and verifySecretName (Secrets with an Ed25519 key pair: deploy/helm/netmon/values.yaml, sweep.signing), or sweep.sharedSecret=true to let any node forge any node's results" -}}
{{- end -}}
{{- if eq $signing.keySecretName $signing.verifySecretName -}}
{{- fail (printf "sweep.signing: keySecretName and verifySecretName are both %s: put the private key in a Secret of its own, which only the sweep's pod mounts" $signing.keySecretName) -}}
{{- end -}}
{{- ternary $signing.keySecretName $signing.verifySecretName (eq .side "sweep") -}}
{{- end -}}
{{- end -}}

{{/* The file in the Inspector root that says netmon may remove pods' directories in it
(docs/INSPECTOR.md); the pods' directories beside it are named by their pods' UIDs. */}}
{{- define "netmon.inspectorMarker" -}}
.netmon-inspector
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

{{/* The sweep's netmon.yaml: sweep.settings over what the chart sets for Kubernetes, except the
daemons' port, which is service.port. The pairs' pods pull the image with the chart's
imagePullSecrets, by name. */}}
{{- define "netmon.sweepConfig" -}}
{{- $s := .Values.sweep -}}
{{- $port := include "netmon.port" . | int -}}
{{- $settings := deepCopy ($s.settings | default dict) -}}
{{- if and (hasKey $settings "daemon_port") (ne (toString $settings.daemon_port) (toString $port)) -}}
{{- fail (printf "sweep.settings.daemon_port (%v) differs from service.port (%d), the port every daemon listens on: remove sweep.settings.daemon_port" $settings.daemon_port $port) -}}
{{- end -}}
{{- $daemons := merge (fromYaml (include "netmon.selectorLabels" .)) (dict "app.kubernetes.io/component" "exporter") -}}
{{- $kube := dict "namespace" .Release.Namespace "queue" $s.queue "priority_class" $s.priorityClass "image" (include "netmon.image" .) "image_pull_policy" .Values.image.pullPolicy "node_selector" ($s.nodeSelector | default dict) "tolerations" ($s.tolerations | default list) "config_map" (include "netmon.fullname" .) "daemon_labels" $daemons "host_network" $s.hostNetwork "max_pairs_per_jobset" $s.maxPairsPerJobSet -}}
{{- with .Values.runtimeClassName }}{{ $_ := set $kube "runtime_class" . }}{{ end -}}
{{- with $s.podPriorityClass.name }}{{ $_ := set $kube "pod_priority_class" . }}{{ end -}}
{{- with $s.rdmaResource }}{{ $_ := set $kube "rdma_resource" . }}{{ end -}}
{{- if $s.ipcLock }}{{ $_ := set $kube "ipc_lock" true }}{{ end -}}
{{- $pullSecrets := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $pullSecrets = append $pullSecrets .name -}}
{{- end -}}
{{- with $pullSecrets }}{{ $_ := set $kube "image_pull_secrets" . }}{{ end -}}
{{- $key := ternary "secret_file" "signing_key_file" $s.sharedSecret -}}
{{- $sweep := dict "scheduler" "kubernetes" $key (include "netmon.sweepSigningKey" .) "daemon_port" $port "state_dir" "/var/lib/netmon-sweep" "kubernetes" $kube -}}
{{- if eq (include "netmon.scheme" .) "https" }}{{ $_ := set $sweep "daemon_scheme" "https" }}{{ end -}}
{{- $config := dict "state_dir" "/var/lib/netmon-sweep" "sweep" (merge $settings $sweep) -}}
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

{{/* `base` with each key of `over` put in its place (not merged below the top level). Sprig's
mergeOverwrite would keep true where the operator wrote false. */}}
{{- define "netmon.overlay" -}}
{{- $out := deepCopy .base -}}
{{- range $key, $value := (.over | default dict) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The pod's securityContext: podSecurityContext over netmon's user, group and seccomp. */}}
{{- define "netmon.podSecurityContext" -}}
{{- $base := dict "runAsNonRoot" true "runAsUser" 10001 "runAsGroup" 10001 "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- if or .Values.sweep.enabled .Values.webConfig.secretName -}}
{{- /* The Secrets' files (the sweep's, the web-config's) readable by netmon's group. */ -}}
{{- $_ := set $base "fsGroup" 10001 -}}
{{- end -}}
{{- $given := .Values.podSecurityContext | default dict -}}
{{- $pod := include "netmon.overlay" (dict "base" $base "over" $given) | fromYaml -}}
{{- if and (eq (toString $pod.runAsUser) "0") (not (hasKey $given "runAsNonRoot")) -}}
{{- $_ := set $pod "runAsNonRoot" false -}}
{{- end -}}
{{- toYaml $pod -}}
{{- end -}}

{{/* The netmon container's securityContext: securityContext over the chart's (no privilege
escalation, a read-only root filesystem, every capability dropped), and root where
kubeletGuard.runAsRoot or rdma needs it, which securityContext cannot take away. */}}
{{- define "netmon.securityContext" -}}
{{- $root := include "netmon.root" . -}}
{{- $base := dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")) -}}
{{- if $root -}}
{{- $_ := set $base "runAsUser" 0 -}}
{{- $_ := set $base "runAsNonRoot" false -}}
{{- end -}}
{{- $given := .Values.securityContext | default dict -}}
{{- $container := include "netmon.overlay" (dict "base" $base "over" $given) | fromYaml -}}
{{- if $root -}}
{{- $why := ternary "rdma.enabled (IPC_LOCK)" "kubeletGuard.runAsRoot (the kubelet's socket is root's)" .Values.rdma.enabled -}}
{{- if ne (toString $container.runAsUser) "0" -}}
{{- fail (printf "securityContext.runAsUser is %v, but %s needs the netmon container to run as root (0): remove securityContext.runAsUser, or set kubeletGuard.runAsRoot=false (docs/DEPLOY.md, \"The socket is root's\")" $container.runAsUser $why) -}}
{{- end -}}
{{- if $container.runAsNonRoot -}}
{{- fail (printf "securityContext.runAsNonRoot is true, but %s needs the netmon container to run as root: remove securityContext.runAsNonRoot" $why) -}}
{{- end -}}
{{- else if and (eq (toString $container.runAsUser) "0") (not (hasKey $given "runAsNonRoot")) -}}
{{- $_ := set $container "runAsNonRoot" false -}}
{{- end -}}
{{- /* Whatever capabilities securityContext sets: RDMA pins NCCL's buffers (IPC_LOCK); the
jobs' NCCL Inspector directories are their pods' users', which netmon reads (DAC_READ_SEARCH)
and removes once ended (DAC_OVERRIDE). */ -}}
{{- $needed := list -}}
{{- if .Values.rdma.enabled -}}
{{- $needed = append $needed "IPC_LOCK" -}}
{{- end -}}
{{- if .Values.inspector.enabled -}}
{{- $needed = concat $needed (list "DAC_READ_SEARCH" "DAC_OVERRIDE") -}}
{{- end -}}
{{- if $needed -}}
{{- $caps := $container.capabilities | default dict -}}
{{- $add := $caps.add | default list -}}
{{- range $needed -}}
{{- if not (has . $add) -}}
{{- $add = append $add . -}}
{{- end -}}
{{- end -}}
{{- $_ := set $caps "add" $add -}}
{{- $_ := set $container "capabilities" $caps -}}
{{- end -}}
{{- toYaml $container -}}
{{- end -}}

{{/* uid:gid of the netmon container, which the init container hands /var/lib/netmon to. */}}
{{- define "netmon.owner" -}}
{{- if include "netmon.root" . -}}
0:0
{{- else -}}
{{- $pod := include "netmon.podSecurityContext" . | fromYaml -}}
{{- $container := include "netmon.securityContext" . | fromYaml -}}
{{- $uid := hasKey $container "runAsUser" | ternary $container.runAsUser $pod.runAsUser -}}
{{- $gid := hasKey $container "runAsGroup" | ternary $container.runAsGroup $pod.runAsGroup -}}
{{- printf "%v:%v" $uid ($gid | default 0) -}}
{{- end -}}
{{- end -}}

{{/* Bytes in a netmon size: 8, "64K", "1G", "1GiB" (binary multiples, as netmon.bandwidth). */}}
{{- define "netmon.bytes" -}}
{{- /* Numbers from a values file are float64 to Helm: 1073741824 would print as 1.073741824e+09. */ -}}
{{- $given := kindIs "float64" . | ternary (printf "%.0f" .) (toString .) -}}
{{- $text := $given | trim | upper | trimSuffix "B" | trimSuffix "I" -}}
{{- if not (regexMatch "^[0-9]+[KMGT]?$" $text) -}}
{{- fail (printf "memory: cannot read the size %q; set memory.largestSize" (toString .)) -}}
{{- end -}}
{{- $units := dict "K" 1024 "M" 1048576 "G" 1073741824 "T" 1099511627776 -}}
{{- $unit := regexFind "[KMGT]$" $text -}}
{{- $number := trimSuffix $unit $text | atoi -}}
{{- mul $number (get $units $unit | default 1) -}}
{{- end -}}

{{/* Bytes in a Kubernetes quantity of whole units (512Mi, 1G, 1073741824), or "" for one it
does not read (1.5Gi, 100m): only a quantity read here is compared. */}}
{{- define "netmon.quantityBytes" -}}
{{- $text := toString . | trim -}}
{{- if regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $text -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $unit := regexFind "(Ki|Mi|Gi|Ti|k|M|G|T)$" $text -}}
{{- mul (trimSuffix $unit $text | atoi) (get $units $unit | default 1) -}}
{{- end -}}
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

{{/* The netmon container's resources: the memory request is memory.request (what the daemon
holds between probes) or the limit where that is less (small probes on few ranks compute a limit
below the default 1Gi), the limit the computed figure (what a probe holds at its largest size);
resources.requests.memory and resources.limits.memory win. null is empty. */}}
{{- define "netmon.resources" -}}
{{- $resources := .Values.resources | default dict -}}
{{- $requests := deepCopy ($resources.requests | default dict) -}}
{{- $limits := deepCopy ($resources.limits | default dict) -}}
{{- $explicit := not (empty $requests.memory) -}}
{{- if not $explicit }}{{ $_ := set $requests "memory" .Values.memory.request }}{{ end -}}
{{- if not $limits.memory }}{{ $_ := set $limits "memory" (include "netmon.memory" .) }}{{ end -}}
{{- $request := include "netmon.quantityBytes" $requests.memory -}}
{{- $limit := include "netmon.quantityBytes" $limits.memory -}}
{{- if and $request $limit (gt ($request | atoi) ($limit | atoi)) -}}
{{- if $explicit -}}
{{- fail (printf "resources.requests.memory (%v) is above the memory limit (%v, computed from memory.* or resources.limits.memory): Kubernetes refuses such a pod; lower resources.requests.memory or raise the limit" $requests.memory $limits.memory) -}}
{{- end -}}
{{- $_ := set $requests "memory" $limits.memory -}}
{{- end -}}
{{- toYaml (dict "requests" $requests "limits" $limits) -}}
{{- end -}}

{{/* sweep.settings.deadline in seconds (netmon's default: 1800): a number, or a duration as
netmon reads it ("90s", "30m", "1h"). */}}
{{- define "netmon.sweepDeadline" -}}
{{- $value := (.Values.sweep.settings | default dict).deadline | default 1800 -}}
{{- $text := toString $value | trim | lower -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)?$" $text) -}}
{{- fail (printf "sweep.settings.deadline: cannot read the duration %q" (toString $value)) -}}
{{- end -}}
{{- $units := dict "ms" 0.001 "s" 1 "m" 60 "h" 3600 "d" 86400 -}}
{{- $unit := regexFind "(ms|s|m|h|d)$" $text | default "s" -}}
{{- mulf (trimSuffix $unit $text | float64) (get $units $unit) | ceil | int64 -}}
{{- end -}}

{{/* What the chart refuses to render, each with the value to set. */}}
{{- define "netmon.validate" -}}
{{- $port := include "netmon.port" . -}}
{{- if .Values.rdma.enabled -}}
{{- $group := .Values.config.group -}}
{{- $fix := printf "set config.group with name, members (each node as NODE_NAME:%d, e.g. [gpu-a1:%d, gpu-a2:%d]), secret_file: /var/run/secrets/netmon/secret (the Secret rdma.secretName, key \"secret\") and transport: ib, as docs/DEPLOY.md, \"The RDMA variant\" shows" (int .Values.rdma.port) (int .Values.rdma.port) (int .Values.rdma.port) -}}
{{- if not (kindIs "map" $group) -}}
{{- fail (printf "rdma.enabled needs config.group, the node group the pods probe across: %s" $fix) -}}
{{- end -}}
{{- range $key := list "name" "members" "secret_file" -}}
{{- if not (get $group $key) -}}
{{- fail (printf "rdma.enabled: config.group.%s is not set: %s" $key $fix) -}}
{{- end -}}
{{- end -}}
{{- if not (hasPrefix "/var/run/secrets/netmon/" (toString $group.secret_file)) -}}
{{- fail (printf "config.group.secret_file (%s) is outside /var/run/secrets/netmon, where the Secret rdma.secretName is mounted: use /var/run/secrets/netmon/secret" $group.secret_file) -}}
{{- end -}}
{{- $members := $group.members -}}
{{- if kindIs "string" $members }}{{ $members = splitList "," $members }}{{ end -}}
{{- range $members -}}
{{- if not (hasSuffix (printf ":%d" (int $.Values.rdma.port)) (trim (toString .))) -}}
{{- fail (printf "config.group.members: %s is not on rdma.port (%d): each pod names itself NODE_NAME:%d (NETMON_GROUP__SELF), so every member must use that port" (toString .) (int $.Values.rdma.port) (int $.Values.rdma.port)) -}}
{{- end -}}
{{- end -}}
{{- if eq (toString (int .Values.rdma.port)) $port -}}
{{- fail (printf "rdma.port and service.port are both %s: give the group's member port another one" $port) -}}
{{- end -}}
{{- if and (not .Values.webConfig.secretName) (not .Values.rdma.allowUnauthenticated) -}}
{{- fail "rdma.enabled serves /metrics on the node's own network (hostNetwork): set webConfig.secretName to a web-config with basic_auth_users (and TLS), or rdma.allowUnauthenticated=true to let anyone who reaches the node read it" -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraArgs -}}
{{- if or (eq (toString .) "--listen") (hasPrefix "--listen=" (toString .)) -}}
{{- fail "extraArgs: --listen would move netmon off service.port: set service.port instead" -}}
{{- end -}}
{{- if or (eq (toString .) "--web-config") (hasPrefix "--web-config=" (toString .)) (eq (toString .) "--config") (hasPrefix "--config=" (toString .)) -}}
{{- fail (printf "extraArgs: %s is the chart's: use webConfig.secretName for --web-config and config for --config" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if eq (toString .name) "NETMON_LISTEN" -}}
{{- fail "extraEnv: NETMON_LISTEN would move netmon off service.port: set service.port instead" -}}
{{- end -}}
{{- end -}}
{{- $web := .Values.webConfig -}}
{{- if and (not $web.secretName) (or $web.tls $web.requireClientCert) -}}
{{- fail "webConfig.tls and webConfig.requireClientCert describe the web-config file in webConfig.secretName: set webConfig.secretName" -}}
{{- end -}}
{{- /* The pod's labels are the chart's and podLabels in one mapping: a key in both is a
duplicate key, and the selector's or component's would part the pods from the DaemonSet, the
Service and the sweep's daemon_labels. */ -}}
{{- $charts := include "netmon.labels" . | fromYaml -}}
{{- range $key, $_ := (.Values.podLabels | default dict) -}}
{{- if hasKey $charts $key -}}
{{- fail (printf "podLabels: %s is one of the chart's own pod labels (%s; name and instance are the DaemonSet's selector): remove it from podLabels" $key (keys $charts | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- if and $web.requireClientCert (not $web.tls) -}}
{{- fail "webConfig.requireClientCert needs webConfig.tls: client certificates come with tls_server_config" -}}
{{- end -}}
{{- /* netmon.yaml's inspector section is the chart's: its dir must be the directory mounted. */ -}}
{{- $config := .Values.config | default dict -}}
{{- if and (hasKey $config "inspector") (not (kindIs "invalid" $config.inspector)) -}}
{{- fail "config.inspector: netmon.yaml's inspector section is the chart's, from inspector.hostPath (its dir, which the chart mounts) and inspector.settings (the rest): remove config.inspector, set inspector.enabled=true, inspector.hostPath to its dir and inspector.settings to its other keys" -}}
{{- end -}}
{{- $inspector := .Values.inspector -}}
{{- if hasKey ($inspector.settings | default dict) "dir" -}}
{{- fail (printf "inspector.settings.dir: the directory is inspector.hostPath (%s), which the chart mounts at the same path: remove inspector.settings.dir and set inspector.hostPath" $inspector.hostPath) -}}
{{- end -}}
{{- if $inspector.enabled -}}
{{- $path := $inspector.hostPath -}}
{{- range list "/etc/netmon" "/etc/netmon-web" "/var/lib/netmon" "/run/netmon" "/var/lib/kubelet/pod-resources" "/var/run/secrets" "/tmp" "/dev/shm" -}}
{{- if or (eq $path .) (hasPrefix (printf "%s/" .) $path) (hasPrefix (printf "%s/" $path) .) -}}
{{- fail (printf "inspector.hostPath (%s) overlaps %s, which the chart mounts in the netmon container: give the NCCL Inspector dumps a directory of their own, e.g. /var/lib/netmon-inspector" $path .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

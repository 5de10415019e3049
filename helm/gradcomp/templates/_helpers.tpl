{{/*
Named templates of the gradcomp chart. Every one takes the gradcomp chart's
context: `.` inside this chart, `.Subcharts.gradcomp` in a parent chart that
has gradcomp as a dependency (docs/operations.md, "Your own pods").

  gradcomp.podSpec        a pod spec with the sidecar added:
                            include "gradcomp.podSpec" (dict "gradcomp" $ctx "spec" $mySpec)
  gradcomp.container      the gradcompd container (one list item)
  gradcomp.volumes        the volumes it mounts (list items)
  gradcomp.podLabels      labels the pods must carry (the headless Service selects them)
  gradcomp.podAnnotations restart the pods when the daemon config changes
  gradcomp.serviceName    the headless Service, the StatefulSet's serviceName
*/}}

{{- define "gradcomp.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The StatefulSet whose pods are the ranks: its pods are <workload>-<ordinal>.
     At most 52 characters: the controller labels each pod with the name
     plus an 11-character revision hash, and a label value has at most 63. */}}
{{- define "gradcomp.workload" -}}
{{- default (include "gradcomp.fullname" . | trunc 52 | trimSuffix "-") .Values.workload.name -}}
{{- end -}}

{{- define "gradcomp.serviceName" -}}
{{- printf "%s-peers" (include "gradcomp.workload" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gradcomp.configMapName" -}}
{{- printf "%s-config" (include "gradcomp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gradcomp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gradcomp.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gradcomp.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gradcomp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gradcomp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gradcomp.podLabels" -}}
{{ include "gradcomp.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "gradcomp.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* host:port of every rank's peer endpoint, by rank: stable DNS names of the StatefulSet's pods. */}}
{{- define "gradcomp.peers" -}}
{{- $workload := include "gradcomp.workload" . -}}
{{- $service := include "gradcomp.serviceName" . -}}
{{- $peers := list -}}
{{- range $rank := until (int .Values.worldSize) -}}
{{- $peers = append $peers (printf "%s-%d.%s.%s.svc.%s:%d" $workload $rank $service $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.peer)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* The DaemonConfig (proto/gradcomp/v1/config.proto) as protobuf JSON. Rank is a flag: it differs per pod. */}}
{{- define "gradcomp.config" -}}
{{- $config := dict
  "listen" (printf "unix:%s" (include "gradcomp.socketPath" .))
  "metricsListen" (printf "0.0.0.0:%d" (int .Values.ports.metrics))
  "worldSize" (int .Values.worldSize)
  "peers" (splitList "," (include "gradcomp.peers" .))
  "seed" (int64 .Values.config.seed | toString)
  "errorSampleRate" .Values.config.errorSampleRate
  "maxTensorBytes" (int64 .Values.config.maxTensorBytes | toString)
  "policy" .Values.config.policy
-}}
{{- /* from_step is an int64, which proto JSON takes as a string. */ -}}
{{- with .Values.config.scheduledPolicies -}}
{{- $scheduled := list -}}
{{- range . -}}
{{- $scheduled = append $scheduled (dict "fromStep" (int64 .fromStep | toString) "policy" .policy) -}}
{{- end -}}
{{- $_ := set $config "scheduledPolicies" $scheduled -}}
{{- end -}}
{{- if .Values.config.allowClientShm -}}
{{- $_ := set $config "allowClientShm" true -}}
{{- end -}}
{{- /* Limits: a 0 is left out, so the daemon keeps its default. */ -}}
{{- $limits := .Values.config.limits -}}
{{- range $key := list "memoryBudgetBytes" "maxConcurrentJobs" "maxTensorsPerJob" "maxStateBytesPerJob" "maxQueuedRequests" "maxRpcThreads" -}}
{{- with get $limits $key -}}
{{- $_ := set $config $key (int64 . | toString) -}}
{{- end -}}
{{- end -}}
{{- /* memory_wait_seconds: unset keeps the default, and a 0 written out means no wait. */ -}}
{{- if not (kindIs "invalid" $limits.memoryWaitSeconds) -}}
{{- $_ := set $config "memoryWaitSeconds" (float64 $limits.memoryWaitSeconds) -}}
{{- end -}}
{{- toPrettyJson $config -}}
{{- end -}}

{{/*
The client API's unix socket, in an emptyDir that every container of the pod
mounts at the same path: the trainer connects to it, and its mode (0660,
group fsGroup) decides who may (docs/security.md, Client access).
*/}}
{{- define "gradcomp.socketDir" -}}/run/gradcomp{{- end -}}
{{- define "gradcomp.socketPath" -}}{{ include "gradcomp.socketDir" . }}/gradcomp.sock{{- end -}}

{{- define "gradcomp.podAnnotations" -}}
checksum/gradcomp-config: {{ include "gradcomp.config" . | sha256sum }}
{{- end -}}

{{- define "gradcomp.container" -}}
{{- /* Three servers, three ports: one port twice would pass every check
     and fail at start with "address in use". */}}
{{- $ports := list (int .Values.ports.api) (int .Values.ports.peer) (int .Values.ports.metrics) }}
{{- if ne (len (uniq $ports)) 3 }}
{{- fail (printf "ports.api (%d), ports.peer (%d) and ports.metrics (%d) must differ: each is a server of its own" (int .Values.ports.api) (int .Values.ports.peer) (int .Values.ports.metrics)) }}
{{- end }}
- name: gradcompd
  image: {{ include "gradcomp.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - --config=/etc/gradcomp/config/daemon.json
    - --rank=$(GRADCOMP_RANK)
    - --peer_listen=0.0.0.0:{{ int .Values.ports.peer }}
    # A daemon of another release reached at an address one of ours had
    # (a recycled pod IP) is refused at the handshake.
    - --peer_group={{ .Release.Namespace }}/{{ include "gradcomp.fullname" . }}
    # The kubelet's gRPC probes need TCP: this port serves health only; the
    # client API is not served on it.
    - --health_listen=0.0.0.0:{{ int .Values.ports.api }}
    - --collective_timeout={{ .Values.peerTimeouts.collective }}
    - --peer_startup_timeout={{ .Values.peerTimeouts.startup }}
    {{- if .Values.tls.enabled }}
    - --peer_tls_cert=/etc/gradcomp/tls/tls.crt
    - --peer_tls_key=/etc/gradcomp/tls/tls.key
    - --peer_tls_ca=/etc/gradcomp/tls/ca.crt
    {{- end }}
    {{- range .Values.sidecar.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: GRADCOMP_RANK
      valueFrom:
        fieldRef:
          fieldPath: {{ .Values.rank.fieldPath }}
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: api
      containerPort: {{ int .Values.ports.api }}
    - name: peer
      containerPort: {{ int .Values.ports.peer }}
    - name: metrics
      containerPort: {{ int .Values.ports.metrics }}
  # Health is NOT_SERVING until every peer is connected, so the startup probe
  # waits as long as the daemon itself waits for its peers.
  startupProbe:
    grpc:
      port: {{ int .Values.ports.api }}
    periodSeconds: 5
    failureThreshold: {{ include "gradcomp.startupProbeFailures" . }}
  readinessProbe:
    grpc:
      port: {{ int .Values.ports.api }}
    periodSeconds: {{ .Values.sidecar.probes.periodSeconds }}
    failureThreshold: {{ .Values.sidecar.probes.failureThreshold }}
  livenessProbe:
    grpc:
      port: {{ int .Values.ports.api }}
    periodSeconds: {{ .Values.sidecar.probes.periodSeconds }}
    failureThreshold: {{ .Values.sidecar.probes.failureThreshold }}
  {{- $resources := deepCopy .Values.sidecar.resources }}
  {{- if gt (int .Values.sidecar.gpus) 0 }}
  {{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" (int .Values.sidecar.gpus)) (default (dict) $resources.limits)) }}
  {{- end }}
  {{- with $resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  # The sidecar's own uid and gid: in a pod of yours whose securityContext
  # runs as root (common in GPU images) it would inherit uid 0, which the
  # kubelet refuses beside runAsNonRoot.
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ int (default 65532 .Values.podSecurityContext.runAsUser) }}
    runAsGroup: {{ int (default 65532 .Values.podSecurityContext.runAsGroup) }}
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
    # Its own, not only the chart's pod-level one: in a pod of yours the
    # sidecar would otherwise run Unconfined.
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: gradcomp-config
      mountPath: /etc/gradcomp/config
      readOnly: true
    - name: dshm
      mountPath: /dev/shm
    - name: gradcomp-socket
      mountPath: {{ include "gradcomp.socketDir" . }}
    {{- if .Values.tls.enabled }}
    - name: gradcomp-tls
      mountPath: /etc/gradcomp/tls
      readOnly: true
    {{- end }}
{{- end -}}

{{/* Startup probe attempts (every 5 s) covering the daemon's peer start-up timeout plus a minute. */}}
{{- define "gradcomp.startupProbeFailures" -}}
{{- $d := .Values.peerTimeouts.startup -}}
{{- $seconds := 0 -}}
{{- if hasSuffix "h" $d -}}{{- $seconds = mul (trimSuffix "h" $d | int) 3600 -}}
{{- else if hasSuffix "m" $d -}}{{- $seconds = mul (trimSuffix "m" $d | int) 60 -}}
{{- else -}}{{- $seconds = trimSuffix "s" $d | int -}}
{{- end -}}
{{- add (div (add $seconds 60) 5) 1 -}}
{{- end -}}

{{- define "gradcomp.volumes" -}}
- name: gradcomp-config
  configMap:
    name: {{ include "gradcomp.configMapName" . }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit }}
- name: gradcomp-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- if .Values.tls.enabled }}
- name: gradcomp-tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/*
A pod spec with the sidecar added: the gradcompd container appended to
.spec.containers, its volumes to .spec.volumes, and /dev/shm and the client
socket's directory mounted in every container from the chart's volumes
dshm and gradcomp-socket: a container that mounts them from a volume of
another name is switched to the chart's (that volume stays, for any other
use), and volumes named dshm or gradcomp-socket in the given spec are
replaced: the trainer and the daemon must share one /dev/shm and one
socket directory),
and the chart's podSecurityContext if the spec has none, or its fsGroup if
the spec's securityContext has none.
*/}}
{{- define "gradcomp.podSpec" -}}
{{- $gc := .gradcomp -}}
{{- $spec := deepCopy .spec -}}
{{- $containers := list -}}
{{- $socketDir := include "gradcomp.socketDir" $gc -}}
{{- range (default list $spec.containers) -}}
{{- $mounts := list -}}
{{- $hasShm := false -}}
{{- $hasSocket := false -}}
{{- range (default list .volumeMounts) -}}
{{- $mount := deepCopy . -}}
{{- if eq $mount.mountPath "/dev/shm" -}}
{{- $_ := set $mount "name" "dshm" -}}
{{- $hasShm = true -}}
{{- else if eq $mount.mountPath $socketDir -}}
{{- $_ := set $mount "name" "gradcomp-socket" -}}
{{- $hasSocket = true -}}
{{- end -}}
{{- $mounts = append $mounts $mount -}}
{{- end -}}
{{- if not $hasShm -}}
{{- $mounts = append $mounts (dict "name" "dshm" "mountPath" "/dev/shm") -}}
{{- end -}}
{{- if not $hasSocket -}}
{{- $mounts = append $mounts (dict "name" "gradcomp-socket" "mountPath" $socketDir) -}}
{{- end -}}
{{- $_ := set . "volumeMounts" $mounts -}}
{{- $containers = append $containers . -}}
{{- end -}}
{{- $containers = concat $containers (include "gradcomp.container" $gc | fromYamlArray) -}}
{{- $ours := include "gradcomp.volumes" $gc | fromYamlArray -}}
{{- $volumes := list -}}
{{- range (default list $spec.volumes) -}}
{{- if not (has .name (list "dshm" "gradcomp-socket")) -}}{{- $volumes = append $volumes . -}}{{- end -}}
{{- end -}}
{{- $_ := set $spec "containers" $containers -}}
{{- $_ := set $spec "volumes" (concat $volumes $ours) -}}
{{- if not (hasKey $spec "securityContext") -}}
{{- $_ := set $spec "securityContext" $gc.Values.podSecurityContext -}}
{{- else if and (not (hasKey $spec.securityContext "fsGroup")) (hasKey $gc.Values.podSecurityContext "fsGroup") -}}
{{- /* The sidecar reads its TLS secret (mode 0440) and the trainers reach
its socket (mode 0660) through the pod's fsGroup. */ -}}
{{- $_ := set $spec.securityContext "fsGroup" $gc.Values.podSecurityContext.fsGroup -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}

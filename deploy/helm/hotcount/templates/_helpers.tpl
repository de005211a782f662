{{/*
Names and labels.
*/}}
{{- define "hotcount.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hotcount.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hotcount.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hotcount.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hotcount.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hotcount.labels" -}}
helm.sh/chart: {{ include "hotcount.chart" . }}
{{ include "hotcount.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount the pool's pods, or the workload's pods that carry the
sidecar, run as.
*/}}
{{- define "hotcount.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hotcount.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hotcount.setupServiceAccountName" -}}
{{- if .Values.setup.serviceAccount.create }}
{{- default (printf "%s-setup" (include "hotcount.fullname" .)) .Values.setup.serviceAccount.name }}
{{- else }}
{{- required "setup.serviceAccount.name: name an existing ServiceAccount when setup.serviceAccount.create is false (the setup hooks run before this release's own ServiceAccount exists)" .Values.setup.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
hotcount.tokenFile: the lookup API's token file the pool reads, if any
(empty for a sidecar, or a pool with httpPublic).
*/}}
{{- define "hotcount.tokenFile" -}}
{{- if .Values.standalone.enabled }}
{{- get (include "hotcount.settings" . | fromYaml) "HOTCOUNT_HTTP_TOKEN_FILE" }}
{{- end }}
{{- end }}

{{- define "hotcount.lookupTokenSecret" -}}
{{- default (printf "%s-lookup-token" (include "hotcount.fullname" .)) .Values.lookupToken.existingSecret }}
{{- end }}

{{- define "hotcount.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
hotcount.settings: the settings hotcount runs with, as a YAML map of
HOTCOUNT_* variables to strings. Each key of .Values.hotcount becomes
HOTCOUNT_ and the key in snake case, in capitals (flushInterval:
HOTCOUNT_FLUSH_INTERVAL); http and httpTokenFile, when not given, follow the
mode: the pool listens on every interface behind the lookup token, a sidecar
on loopback for its own pod.
*/}}
{{- define "hotcount.settings" -}}
{{- $s := deepCopy .Values.hotcount }}
{{- if not (hasKey $s "http") }}
{{- $_ := set $s "http" (ternary ":8080" "127.0.0.1:8080" .Values.standalone.enabled) }}
{{- end }}
{{- if and .Values.standalone.enabled (not (hasKey $s "httpTokenFile")) (not (get $s "httpPublic")) }}
{{- $_ := set $s "httpTokenFile" "/var/run/secrets/hotcount/token" }}
{{- end }}
{{- $lines := list }}
{{- range $k, $v := $s }}
{{- if kindIs "float64" $v }}
{{- $v = int64 $v }}
{{- end }}
{{- $lines = append $lines (printf "HOTCOUNT_%s: %s" (snakecase $k | upper) (toString $v | quote)) }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}

{{/* The port of a listen address (host:port). */}}
{{- define "hotcount.port" -}}
{{- regexReplaceAll "^.*:" . "" }}
{{- end }}

{{- define "hotcount.adminPort" -}}
{{- include "hotcount.port" (.Values.hotcount.admin | default ":9091") }}
{{- end }}

{{- define "hotcount.httpPort" -}}
{{- include "hotcount.port" ((include "hotcount.settings" . | fromYaml).HOTCOUNT_HTTP) }}
{{- end }}

{{/*
hotcount.seconds: a Go duration ("25s", "1m30s", "500ms", "0") in seconds.
*/}}
{{- define "hotcount.seconds" -}}
{{- $units := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" (toString .) -1 }}
{{- $total = addf $total (mulf (regexFind "^[0-9.]+" . | float64) (get $units (regexReplaceAll "^[0-9.]+" . ""))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
hotcount.effectiveSettings: the settings, with hotcount's own defaults for
those the cross-field checks read and the values do not give.
*/}}
{{- define "hotcount.effectiveSettings" -}}
{{- $defaults := dict "HOTCOUNT_NATS_MODE" "core" "HOTCOUNT_ADMIN" ":9091" "HOTCOUNT_FLUSH_TIMEOUT" "5s" "HOTCOUNT_WRITE_TIMEOUT" "5s" "HOTCOUNT_CACHE_TTL" "1s" "HOTCOUNT_CACHE_STALE" "0" "HOTCOUNT_DRAIN_TIMEOUT" "5s" "HOTCOUNT_SHUTDOWN_TIMEOUT" "25s" "HOTCOUNT_HTTP_TOKEN_FILE" "" "HOTCOUNT_HTTP_PUBLIC" "false" }}
{{- merge (include "hotcount.settings" . | fromYaml) $defaults | toYaml }}
{{- end }}

{{/*
hotcount.checkGracePeriod: fails unless the pod's grace period covers
hotcount's shutdownTimeout plus 5 s for the process to exit; (list scope
seconds key), key naming the value that sets the grace period.
*/}}
{{- define "hotcount.checkGracePeriod" -}}
{{- $s := include "hotcount.effectiveSettings" (index . 0) | fromYaml }}
{{- $need := addf (include "hotcount.seconds" $s.HOTCOUNT_SHUTDOWN_TIMEOUT | float64) 5 }}
{{- if lt (index . 1 | float64) $need }}
{{- fail (printf "%s: %v s does not cover hotcount.shutdownTimeout (%s) plus 5 s for the process to exit: the kubelet would kill hotcount in its final flush; set it to at least %d" (index . 2) (index . 1) $s.HOTCOUNT_SHUTDOWN_TIMEOUT (ceil $need | int)) }}
{{- end }}
{{- end }}

{{/*
hotcount.validate: the values that pass the schema one by one but conflict,
refused at render with the key named, rather than by hotcount at start
(config.Validate's cross-field rules), and what the schema cannot say.
*/}}
{{- define "hotcount.validate" -}}
{{- $s := include "hotcount.effectiveSettings" . | fromYaml }}
{{- $loopback := "^(127\\.|localhost:|\\[::1\\]:)" }}
{{- if regexMatch $loopback $s.HOTCOUNT_ADMIN }}
{{- fail "hotcount.admin: the kubelet probes the pod's address, not its loopback: listen on every interface (:9091)" }}
{{- end }}
{{- if and .Values.standalone.enabled (regexMatch $loopback $s.HOTCOUNT_HTTP) }}
{{- fail "hotcount.http: the pool's lookup API is reached through its Service: listen on every interface (:8080), behind the lookup token" }}
{{- end }}
{{- if and (not (regexMatch $loopback $s.HOTCOUNT_HTTP)) (not $s.HOTCOUNT_HTTP_TOKEN_FILE) (ne $s.HOTCOUNT_HTTP_PUBLIC "true") }}
{{- fail (printf "hotcount.http: %s listens beyond the pod and hotcount.httpTokenFile is not set: every count would be open to anyone who reaches the pod; keep a sidecar on 127.0.0.1:8080, or set httpTokenFile (or httpPublic: true)" $s.HOTCOUNT_HTTP) }}
{{- end }}
{{- /* The same port: the same host, either on every interface, or both on loopback. */ -}}
{{- $hostOf := "^\\[?(.*?)\\]?:[^:]*$" }}
{{- $hh := regexReplaceAll $hostOf $s.HOTCOUNT_HTTP "${1}" }}
{{- $ah := regexReplaceAll $hostOf $s.HOTCOUNT_ADMIN "${1}" }}
{{- $every := list "" "0.0.0.0" "::" }}
{{- if and (eq (include "hotcount.port" $s.HOTCOUNT_HTTP) (include "hotcount.port" $s.HOTCOUNT_ADMIN)) (ne (include "hotcount.port" $s.HOTCOUNT_HTTP) "0") (or (eq $hh $ah) (has $hh $every) (has $ah $every)) }}
{{- fail (printf "hotcount.admin: %s and hotcount.http %s would bind the same port: give them different ports" $s.HOTCOUNT_ADMIN $s.HOTCOUNT_HTTP) }}
{{- end }}
{{- $ttl := include "hotcount.seconds" $s.HOTCOUNT_CACHE_TTL | float64 }}
{{- $stale := include "hotcount.seconds" $s.HOTCOUNT_CACHE_STALE | float64 }}
{{- if and (gt $stale 0.0) (lt $stale $ttl) }}
{{- fail (printf "hotcount.cacheStale: %s is shorter than hotcount.cacheTtl %s (0 means 10 × cacheTtl)" $s.HOTCOUNT_CACHE_STALE $s.HOTCOUNT_CACHE_TTL) }}
{{- end }}
{{- $shutdown := include "hotcount.seconds" $s.HOTCOUNT_SHUTDOWN_TIMEOUT | float64 }}
{{- if le (subf $shutdown (minf (divf $shutdown 10) 1)) (include "hotcount.seconds" $s.HOTCOUNT_DRAIN_TIMEOUT | float64) }}
{{- fail (printf "hotcount.shutdownTimeout: %s leaves no time for the final flush after hotcount.drainTimeout %s (and the reserve of a tenth, at most 1 s): make it longer" $s.HOTCOUNT_SHUTDOWN_TIMEOUT $s.HOTCOUNT_DRAIN_TIMEOUT) }}
{{- end }}
{{- if .Values.standalone.enabled }}
{{- include "hotcount.checkGracePeriod" (list . .Values.terminationGracePeriodSeconds "terminationGracePeriodSeconds") }}
{{- end }}
{{- range $i, $e := .Values.extraEnv }}
{{- if and (hasPrefix "HOTCOUNT_" $e.name) (ne $e.name "HOTCOUNT_NATS_TOKEN") }}
{{- fail (printf "extraEnv[%d]: %s would override the settings' ConfigMap past the schema's checks: set hotcount.%s instead (only HOTCOUNT_NATS_TOKEN, from a Secret, belongs in extraEnv)" $i $e.name ($e.name | trimPrefix "HOTCOUNT_" | lower | camelcase | untitle)) }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.podMonitor.enabled (not .Values.standalone.enabled) (not .Values.metrics.podMonitor.selector) }}
{{- fail "metrics.podMonitor.selector: without the pool, give the labels of the pods that carry the sidecar (matchLabels: {app.kubernetes.io/name: your-app})" }}
{{- end }}
{{- end }}

{{- define "hotcount.dataDir" -}}
{{- .Values.hotcount.dataDir | default "hotcount-data" }}
{{- end }}

{{/*
What the pool's and the sidecar's containers share: the command, the
settings (the ConfigMap through envFrom), the region, the data volume, the
admin port and the security context.
*/}}
{{- define "hotcount.containerCommon" -}}
image: {{ include "hotcount.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["run"]
envFrom:
  - configMapRef:
      name: {{ include "hotcount.fullname" . }}
{{- if or .Values.aws.region .Values.extraEnv }}
env:
  {{- with .Values.aws.region }}
  - name: AWS_REGION
    value: {{ . | quote }}
  {{- end }}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}

{{- define "hotcount.probe" -}}
{{- $probe := index . 0 }}
{{- $path := index . 1 -}}
httpGet:
  path: {{ $path }}
  port: admin
{{- with $probe }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
hotcount.sidecarContainer: hotcount as a native sidecar (an init container
with restartPolicy: Always, started before the app and stopped after it),
as one item of a pod's initContainers. Include it from the chart that has
this chart as a dependency, with this chart's scope:

  initContainers:
    {{- include "hotcount.sidecarContainer" .Subcharts.hotcount | nindent 8 }}
*/}}
{{- define "hotcount.sidecarContainer" -}}
{{- if .Values.standalone.enabled }}
{{- fail "hotcount.sidecarContainer: set hotcount.standalone.enabled=false in the values of the chart that includes it (its settings are then the sidecar's: the lookup API on loopback)" }}
{{- end -}}
- name: hotcount
  {{- include "hotcount.containerCommon" . | nindent 2 }}
  restartPolicy: Always
  volumeMounts:
    - name: hotcount-data
      mountPath: {{ include "hotcount.dataDir" . }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: admin
      containerPort: {{ include "hotcount.adminPort" . }}
  startupProbe:
    {{- include "hotcount.probe" (list .Values.sidecar.probes.startup "/healthz") | nindent 4 }}
  readinessProbe:
    {{- include "hotcount.probe" (list .Values.sidecar.probes.readiness "/readyz") | nindent 4 }}
  livenessProbe:
    {{- include "hotcount.probe" (list .Values.sidecar.probes.liveness "/healthz") | nindent 4 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
{{- end }}

{{/*
hotcount.sidecarVolumes: the sidecar's volumes, as items of the pod's
volumes:

  volumes:
    {{- include "hotcount.sidecarVolumes" .Subcharts.hotcount | nindent 8 }}
*/}}
{{- define "hotcount.sidecarVolumes" -}}
- name: hotcount-data
  emptyDir:
    sizeLimit: {{ .Values.dataVolume.sizeLimit }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
hotcount.sidecarPodAnnotations: for the workload's pod template: a checksum
of the settings (a change rolls the pods) and the scrape annotations of the
admin port.

  annotations:
    {{- include "hotcount.sidecarPodAnnotations" .Subcharts.hotcount | nindent 8 }}
*/}}
{{- define "hotcount.sidecarPodAnnotations" -}}
checksum/hotcount-config: {{ include "hotcount.settings" . | sha256sum }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ include "hotcount.adminPort" . | quote }}
prometheus.io/path: /metrics
{{- end }}

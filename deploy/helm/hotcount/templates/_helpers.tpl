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

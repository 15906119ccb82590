{{- define "offcpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "offcpu-exporter.fullname" -}}
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

{{- define "offcpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "offcpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "offcpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "offcpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "offcpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "offcpu-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether the exporter reads a web-config.yml, and whether the chart writes it. */}}
{{- define "offcpu-exporter.webConfig" -}}
{{- if or .Values.web.existingConfigSecret .Values.web.tls.enabled .Values.web.basicAuth.enabled }}true{{ end }}
{{- end }}
{{- define "offcpu-exporter.webConfigSecret" -}}
{{- default (printf "%s-web-config" (include "offcpu-exporter.fullname" .)) .Values.web.existingConfigSecret }}
{{- end }}
{{- define "offcpu-exporter.scheme" -}}
{{- if .Values.web.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* The exporter's command line. */}}
{{- define "offcpu-exporter.args" -}}
- serve
- --web.listen-address=:{{ .Values.web.port }}
- --attach={{ .Values.probe.attach }}
- --flush-interval={{ .Values.flushInterval }}
{{- if and .Values.securityContext.dropPrivileges (not .Values.securityContext.privileged) }}
- --drop-privileges
{{- end }}
{{- $t := .Values.targets }}
{{- range $t.pids }}
- --pid={{ . }}
{{- end }}
{{- with $t.comm }}
- --comm={{ . }}
{{- end }}
{{- with $t.cmdline }}
- --cmdline={{ . }}
{{- end }}
{{- range $t.namespaces }}
- --namespace={{ . }}
{{- end }}
{{- range $k, $v := $t.podLabels }}
- --pod-label={{ $k }}={{ $v }}
{{- end }}
{{- range $t.containers }}
- --container={{ . }}
{{- end }}
{{- if and $t.all (not (or $t.pids $t.comm $t.cmdline $t.namespaces $t.podLabels $t.containers)) }}
- --all
{{- end }}
{{- if .Values.kubernetesMetadata.enabled }}
- --kubernetes.refresh-interval={{ .Values.kubernetesMetadata.refreshInterval }}
{{- else }}
- --kubernetes.metadata=off
{{- end }}
{{- if include "offcpu-exporter.webConfig" . }}
- --web.config.file=/etc/offcpu-exporter/web/{{ .Values.web.existingConfigKey }}
{{- end }}
{{- with .Values.otlp }}
{{- if .endpoint }}
- --otlp.endpoint={{ .endpoint }}
- --otlp.protocol={{ .protocol }}
{{- if .insecure }}
- --otlp.insecure
{{- end }}
- {{ if .profiles }}--otlp.profiles{{ else }}--no-otlp.profiles{{ end }}
- {{ if .metrics }}--otlp.metrics{{ else }}--no-otlp.metrics{{ end }}
{{- end }}
{{- end }}
{{- with .Values.skywalking }}
{{- if .endpoint }}
- --skywalking.endpoint={{ .endpoint }}
{{- if .tls }}
- --skywalking.tls
{{- end }}
{{- if .agent }}
- --skywalking.agent
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
{{- end }}

{{/* TLS and basic auth of the ServiceMonitor/PodMonitor endpoint. */}}
{{- define "offcpu-exporter.monitorAuth" -}}
{{- if .Values.web.tls.enabled }}
tlsConfig:
  # The exporter's certificate is usually self-signed per cluster: give the CA with extra monitor
  # settings, or accept it as below.
  insecureSkipVerify: true
{{- end }}
{{- if and .Values.web.basicAuth.enabled .Values.web.basicAuth.scrapeSecret }}
basicAuth:
  username:
    name: {{ .Values.web.basicAuth.scrapeSecret }}
    key: username
  password:
    name: {{ .Values.web.basicAuth.scrapeSecret }}
    key: password
{{- end }}
{{- end }}

{{- define "qwen3-tts.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "qwen3-tts.fullname" -}}
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

{{- define "qwen3-tts.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "qwen3-tts.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: server
{{- end }}

{{- define "qwen3-tts.selectorLabels" -}}
app.kubernetes.io/name: {{ include "qwen3-tts.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "qwen3-tts.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "qwen3-tts.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port the kubelet's gRPC probes use: the plaintext health port when the main port speaks TLS. */}}
{{- define "qwen3-tts.probePort" -}}
{{- if .Values.tls.enabled }}{{ .Values.server.healthPort }}{{ else }}{{ .Values.server.port }}{{ end }}
{{- end }}

{{/* Where the server finds the checkpoint. */}}
{{- define "qwen3-tts.modelArg" -}}
{{- $model := .Values.model }}
{{- if eq $model.source "existingClaim" }}
{{- printf "/checkpoint/%s" $model.existingClaim.subPath | trimSuffix "/" }}
{{- else if eq $model.source "initDownload" }}
{{- "/models/checkpoint" }}
{{- else }}
{{- $model.repoId }}
{{- end }}
{{- end }}

{{/* Room for the preStop sleep, the server's drain, and the engine's stop after it. */}}
{{- define "qwen3-tts.terminationGracePeriodSeconds" -}}
{{- add .Values.preStopSleepSeconds .Values.server.drainTimeoutSeconds 15 }}
{{- end }}

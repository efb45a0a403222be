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

{{- define "qwen3-tts.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The port the kubelet's gRPC probes use: the plaintext health port when the main port speaks TLS. */}}
{{- define "qwen3-tts.probePort" -}}
{{- if .Values.tls.enabled }}{{ .Values.server.healthPort }}{{ else }}{{ .Values.server.port }}{{ end }}
{{- end }}

{{/* The gRPC Service port's appProtocol: a mesh must not parse the server's own TLS as plaintext gRPC. */}}
{{- define "qwen3-tts.appProtocol" -}}
{{- .Values.service.appProtocol | default (ternary "https" "grpc" .Values.tls.enabled) }}
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

{{/* The PromQL of the KEDA trigger: requests generating plus requests queued, in all replicas. */}}
{{- define "qwen3-tts.kedaQuery" -}}
{{- if .Values.autoscaling.keda.query }}
{{- .Values.autoscaling.keda.query }}
{{- else }}
{{- $selector := printf "namespace=%q, service=%q" .Release.Namespace (include "qwen3-tts.fullname" .) }}
{{- printf "sum(qwen3_tts_requests_running{%s}) + sum(qwen3_tts_requests_waiting{%s})" $selector $selector }}
{{- end }}
{{- end }}

{{/*
Checks that span several values, which values.schema.json cannot express; each message names the values.
*/}}
{{- define "qwen3-tts.validate" -}}
{{- $ports := dict }}
{{- $_ := set $ports "server.port" .Values.server.port }}
{{- if .Values.metrics.enabled }}{{ $_ := set $ports "metrics.port" .Values.metrics.port }}{{ end }}
{{- if .Values.http.enabled }}{{ $_ := set $ports "http.port" .Values.http.port }}{{ end }}
{{- if .Values.tls.enabled }}{{ $_ := set $ports "server.healthPort" .Values.server.healthPort }}{{ end }}
{{- $seen := dict }}
{{- range $name, $port := $ports }}
{{- $key := toString $port }}
{{- if hasKey $seen $key }}
{{- fail (printf "%s and %s are both %s: the server needs a port for each" (get $seen $key) $name $key) }}
{{- end }}
{{- $_ := set $seen $key $name }}
{{- end }}
{{- with .Values.autoscaling }}
{{- if and .enabled (lt (int .maxReplicas) (int .minReplicas)) }}
{{- fail (printf "autoscaling.maxReplicas (%d) is below autoscaling.minReplicas (%d)" (int .maxReplicas) (int .minReplicas)) }}
{{- end }}
{{- end }}
{{- end }}

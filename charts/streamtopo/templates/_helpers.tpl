{{/* Chart name, overridable. */}}
{{- define "streamtopo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, shortened when the release already contains the chart name. */}}
{{- define "streamtopo.fullname" -}}
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

{{- define "streamtopo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). */}}
{{- define "streamtopo.labels" -}}
helm.sh/chart: {{ include "streamtopo.chart" . }}
{{ include "streamtopo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamtopo
{{- end }}

{{/* Selector labels of the operator; stable across upgrades. */}}
{{- define "streamtopo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamtopo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of the optional Valkey; the component differs so selectors never overlap the operator's. */}}
{{- define "streamtopo.valkeyLabels" -}}
helm.sh/chart: {{ include "streamtopo.chart" . }}
{{ include "streamtopo.valkeySelectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: streamtopo
{{- end }}

{{- define "streamtopo.valkeySelectorLabels" -}}
app.kubernetes.io/name: {{ include "streamtopo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: valkey
{{- end }}

{{- define "streamtopo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "streamtopo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "streamtopo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "streamtopo.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) }}
{{- end }}

{{- define "streamtopo.valkeyName" -}}
{{- printf "%s-valkey" (include "streamtopo.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Transport URL: the chart's own Valkey when enabled, else the external URL (may be empty). */}}
{{- define "streamtopo.transportUrl" -}}
{{- if .Values.valkey.enabled }}
{{- printf "redis://%s.%s.svc:%d" (include "streamtopo.valkeyName" .) .Release.Namespace (int .Values.valkey.port) }}
{{- else }}
{{- .Values.transport.url }}
{{- end }}
{{- end }}

{{/* Secret holding the transport's admin password: with the chart's Valkey, valkey.existingSecret or the
generated one (valkey-auth.yaml). */}}
{{- define "streamtopo.transportSecret" -}}
{{- if .Values.valkey.enabled }}
{{- .Values.valkey.existingSecret | default (printf "%s-auth" (include "streamtopo.valkeyName" .)) }}
{{- else }}
{{- .Values.transport.existingSecret }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the operator watches only the listed namespaces. */}}
{{- define "streamtopo.namespaced" -}}
{{- if eq .Values.watchScope "namespaces" }}true{{ end }}
{{- end }}

{{/* NetworkPolicy rules of every topology's executors (JSON for the operator, which stamps them into a
NetworkPolicy per topology): ingress from the operator and networkPolicy.metricsFrom on the metrics port,
egress to the transport and DNS. */}}
{{- define "streamtopo.executorNetworkPolicy" -}}
{{- $operator := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "streamtopo.selectorLabels" . | fromYaml)) }}
{{- $ingress := list (dict "from" (concat (list $operator) .Values.networkPolicy.metricsFrom) "ports" (list (dict "port" (int .Values.executorMetrics.port) "protocol" "TCP"))) }}
{{- $transport := dict "to" .Values.networkPolicy.transportTo "ports" (list (dict "port" (int .Values.networkPolicy.transportPort) "protocol" "TCP")) }}
{{- if .Values.valkey.enabled }}
{{- $valkey := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "streamtopo.valkeySelectorLabels" . | fromYaml)) }}
{{- $transport = dict "to" (list $valkey) "ports" (list (dict "port" (int .Values.valkey.port) "protocol" "TCP")) }}
{{- end }}
{{- $dns := dict "to" .Values.networkPolicy.dnsTo "ports" (list (dict "port" 53 "protocol" "UDP") (dict "port" 53 "protocol" "TCP")) }}
{{- dict "ingress" $ingress "egress" (list $transport $dns) | toJson }}
{{- end }}

{{/* The full name: fullnameOverride, else the release name when it contains the chart's
name, else "<release>-<name>"; 63 characters at most (a DNS label). */}}
{{- define "gpushare.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpushare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: deploy/base's (name, part-of) plus Helm's. */}}
{{- define "gpushare.labels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/part-of: gpushare
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpushare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpushare.name" . }}
app.kubernetes.io/component: webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpushare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpushare.secretName" -}}
{{- default (printf "%s-tls" (include "gpushare.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}

{{- define "gpushare.policiesConfigMap" -}}
{{- default (printf "%s-policies" (include "gpushare.fullname" .)) .Values.policies.existingConfigMap -}}
{{- end -}}

{{/* The Certificate cert-manager's CA injector reads (cert-manager.io/inject-ca-from). */}}
{{- define "gpushare.certificateName" -}}
{{- printf "%s-serving" (include "gpushare.fullname" .) -}}
{{- end -}}

{{/* The policy files: policies.files, else the chart's files/policies/*.yaml. */}}
{{- define "gpushare.policyData" -}}
{{- if .Values.policies.files }}
{{- range $name, $text := .Values.policies.files }}
{{ $name }}: |
{{ $text | trimSuffix "\n" | indent 2 }}
{{- end }}
{{- else }}
{{- range $path, $_ := .Files.Glob "files/policies/*.yaml" }}
{{ base $path }}: |
{{ $.Files.Get $path | trimSuffix "\n" | indent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Labels on the MPS daemon's objects: as deploy/mps-daemon (part-of) plus Helm's; the
name label stays with the webhook's objects. */}}
{{- define "gpushare.mpsLabels" -}}
app.kubernetes.io/part-of: gpushare
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

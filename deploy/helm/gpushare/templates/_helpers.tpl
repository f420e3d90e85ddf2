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

{{/* An image reference from (list IMAGE APPVERSION), IMAGE a dict of repository, tag and
digest: <repository>@<digest> when a digest is set (kustomize's images[].digest writes the
same; every container runtime pulls it, and a tag beside it would only be ignored),
else <repository>:<tag, default the chart's appVersion>. */}}
{{- define "gpushare.imageRef" -}}
{{- $image := index . 0 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default (index . 1) $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The admission image: the webhook Deployment. */}}
{{- define "gpushare.image" -}}
{{- include "gpushare.imageRef" (list .Values.image .Chart.AppVersion) -}}
{{- end -}}

{{/* The cluster image (with the Kubernetes client): the MPS daemon, the DRA reconciler. */}}
{{- define "gpushare.clusterImage" -}}
{{- include "gpushare.imageRef" (list .Values.clusterImage .Chart.AppVersion) -}}
{{- end -}}

{{/* The certgen Jobs' image: certificates.certgen.image over clusterImage, field by field,
but for the digest, which belongs to the repository it was taken from. */}}
{{- define "gpushare.certgenImage" -}}
{{- $own := .Values.certificates.certgen.image | default dict -}}
{{- if or $own.repository $own.tag $own.digest -}}
{{- $image := dict "repository" ($own.repository | default .Values.clusterImage.repository) "tag" ($own.tag | default .Values.clusterImage.tag) "digest" ($own.digest | default "") -}}
{{- include "gpushare.imageRef" (list $image .Chart.AppVersion) -}}
{{- else -}}
{{- include "gpushare.clusterImage" . -}}
{{- end -}}
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

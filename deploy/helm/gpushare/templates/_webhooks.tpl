{{/* Pieces of the webhook configurations, each the template twin of a function in
webhook/install/webhook_config.py; tests/test_helm_chart.py holds the rendered objects equal
to `gpushare webhook-config`'s output. */}}

{{/* shared_gpu_pod_expression. Argument: the list of shared resource names. */}}
{{- define "gpushare.sharedPodExpression" -}}
{{- $checks := list -}}
{{- range . -}}
{{- $checks = append $checks (printf "(has(c.resources.limits) && '%s' in c.resources.limits) || (has(c.resources.requests) && '%s' in c.resources.requests)" . .) -}}
{{- end -}}
{{- $inner := join " || " $checks -}}
{{- $parts := list "has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)" -}}
{{- range list "containers" "initContainers" -}}
{{- $parts = append $parts (printf "has(object.spec.%s) && object.spec.%s.exists(c, has(c.resources) && (%s))" . . $inner) -}}
{{- end -}}
{{- $wrapped := list -}}
{{- range $parts -}}
{{- $wrapped = append $wrapped (printf "(%s)" .) -}}
{{- end -}}
{{- join " || " $wrapped -}}
{{- end -}}

{{/* excluded_namespaces: kube-system, the Service's namespace, then the policies' exact
names (sorted, as the generator sorts them); globs are left to the webhook. */}}
{{- define "gpushare.excludedNamespaces" -}}
{{- $names := list "kube-system" .Release.Namespace -}}
{{- range sortAlpha .Values.webhook.excludedNamespaces -}}
{{- if not (regexMatch "[*?\\[]" .) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $names) -}}
{{- end -}}

{{/* The metadata both configurations share. */}}
{{- define "gpushare.webhookMetadata" -}}
name: {{ include "gpushare.fullname" . }}
labels:
  {{- include "gpushare.labels" . | nindent 2 }}
{{- if eq .Values.certificates.mode "cert-manager" }}
annotations:
  # cert-manager's CA injector fills caBundle from the Certificate and keeps it current.
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "gpushare.certificateName" .) }}
{{- end }}
{{- end -}}

{{/* _common_webhook. Arguments: root, name, path, failurePolicy. */}}
{{- define "gpushare.commonWebhook" -}}
{{- $root := .root -}}
- name: {{ .name }}
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: {{ .failurePolicy }}
  timeoutSeconds: {{ $root.Values.webhook.timeoutSeconds }}
  matchPolicy: Equivalent
  clientConfig:
    service:
      name: {{ include "gpushare.fullname" $root }}
      namespace: {{ $root.Release.Namespace }}
      path: {{ .path }}
      port: {{ $root.Values.service.port }}
    {{- if eq $root.Values.certificates.mode "secret" }}
    caBundle: {{ $root.Values.certificates.secret.caBundle | b64enc }}
    {{- end }}
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values: {{ include "gpushare.excludedNamespaces" $root }}
      # Opt-out label for admins: `kubectl label ns X gpushare.io/webhook=exclude`.
      - key: gpushare.io/webhook
        operator: NotIn
        values: [exclude]
{{- end -}}

{{/* The admission check's pod spec, one for the post-install/post-upgrade hook Job and the
`helm test` pod (admission-check.yaml): `gpushare check-admission` as a non-root user on a
read-only root filesystem, with its ServiceAccount's token (it talks to the API). */}}
{{- define "gpushare.admissionCheckPodSpec" -}}
{{- $check := .Values.admissionCheck }}
{{- /* The image with the Kubernetes client: admissionCheck.image over clusterImage, field by
field, but for the digest (as gpushare.certgenImage). */ -}}
{{- $own := $check.image | default dict }}
{{- $image := include "gpushare.clusterImage" . }}
{{- if or $own.repository $own.tag $own.digest }}
{{- $ref := dict "repository" ($own.repository | default .Values.clusterImage.repository) "tag" ($own.tag | default .Values.clusterImage.tag) "digest" ($own.digest | default "") }}
{{- $image = include "gpushare.imageRef" (list $ref .Chart.AppVersion) }}
{{- end }}
serviceAccountName: {{ include "gpushare.fullname" . }}-admission-check
# It talks to the API: it needs its token.
automountServiceAccountToken: true
# A failed attempt's pod stays, with its log.
restartPolicy: Never
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: check
    image: {{ $image }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command:
      - gpushare
      - check-admission
      - --namespace={{ $check.namespace }}
      - --timeout={{ $check.timeoutSeconds }}
      {{- with $check.podImage }}
      - --image={{ . }}
      {{- end }}
    resources:
      {{- toYaml $check.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
{{- end -}}

{{/* The certgen pod template, one for the hook Jobs (certgen.yaml) and the renewal CronJob
(certgen-renew.yaml): `gpushare certs --in-cluster` as a non-root user on a read-only root
filesystem, with the ServiceAccount token it needs for its API calls (the one kind of gpushare
pod that talks to the API). Call with (dict "root" $ "serviceAccount" NAME "extraArgs" LIST). */}}
{{- define "gpushare.certgenPodTemplate" -}}
{{- $root := .root }}
{{- $certgen := $root.Values.certificates.certgen }}
{{- $fullname := include "gpushare.fullname" $root }}
{{- /* The cluster image (certgen talks to the API), or certgen.image: _helpers.tpl. */}}
{{- $image := include "gpushare.certgenImage" $root -}}
metadata:
  labels:
    app.kubernetes.io/name: {{ include "gpushare.name" $root }}
    app.kubernetes.io/component: certgen
    app.kubernetes.io/instance: {{ $root.Release.Name }}
spec:
  serviceAccountName: {{ .serviceAccount }}
  # The one gpushare pod that talks to the API: it needs its token.
  automountServiceAccountToken: true
  restartPolicy: OnFailure
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: certgen
      image: {{ $image }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command:
        - gpushare
        - certs
        - --in-cluster
        - --service={{ $fullname }}
        - --namespace={{ $root.Release.Namespace }}
        - --secret={{ include "gpushare.secretName" $root }}
        - --webhook-configuration={{ $fullname }}
        - --days={{ $certgen.validDays }}
        - --renew-before-days={{ $certgen.renewBeforeDays }}
        {{- range .extraArgs }}
        - {{ . }}
        {{- end }}
      resources:
        {{- toYaml $certgen.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
{{- end -}}

{{/*
Pieces of the bootstrap-mode certificate jobs: their RBAC and pod spec.
`metagpu certs bootstrap` runs three ways, with the same permissions
(certs.permissions.PERMISSIONS):
- pre-install/pre-upgrade hook: make sure the TLS Secret exists before the
  webhook Deployment mounts it (no --webhook-config: the configuration may not
  exist yet on install);
- post-install/post-upgrade hook: patch the CA into the webhook configuration;
- a CronJob: re-issue the serving certificate when it is due, without an upgrade.
*/}}

{{/* RBAC of one bootstrap ServiceAccount: (dict "root" $ "name" NAME "annotations" DICT). */}}
{{- define "metagpu.certs.rbac" -}}
{{- $root := .root -}}
{{- $meta := dict "labels" (include "metagpu.labels" (dict "root" $root "component" "certs") | fromYaml) -}}
{{- with .annotations }}{{ $_ := set $meta "annotations" . }}{{ end -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- toYaml $meta | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- toYaml $meta | nindent 2 }}
rules:
  # Create the webhook's TLS Secret on first install. RBAC cannot restrict
  # create by name (the object does not exist when it is authorized).
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
  # Read it (is the leaf due? is the CA there?) and re-issue the leaf into it;
  # this one Secret only.
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: [{{ include "metagpu.tlsSecretName" $root | quote }}]
    verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- toYaml $meta | nindent 2 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $root.Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  {{- toYaml $meta | nindent 2 }}
rules:
  # Patch the CA into this release's webhook configuration (cluster-scoped),
  # and nothing else's.
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["mutatingwebhookconfigurations"]
    resourceNames: [{{ include "metagpu.webhookConfigName" $root | quote }}]
    verbs: ["get", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  {{- toYaml $meta | nindent 2 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $root.Release.Namespace }}
{{- end -}}

{{/* Pod spec of one bootstrap run: (dict "root" $ "serviceAccount" NAME "patchWebhook" BOOL). */}}
{{- define "metagpu.certs.podSpec" -}}
{{- $root := .root -}}
serviceAccountName: {{ .serviceAccount }}
restartPolicy: Never
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "metagpu.restrictedPodSecurityContext" $root | nindent 2 }}
{{- with $root.Values.certs.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.certs.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "metagpu.clusterPodTolerations" (dict "root" $root "own" $root.Values.certs.tolerations) }}
containers:
  - name: bootstrap
    image: {{ include "metagpu.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args:
      - certs
      - bootstrap
      - --namespace
      - {{ $root.Release.Namespace }}
      - --service
      - {{ include "metagpu.webhook.fullname" $root }}
      - --secret
      - {{ include "metagpu.tlsSecretName" $root }}
      - --cluster-domain
      - {{ $root.Values.clusterDomain }}
      - --validity-days
      - {{ $root.Values.certs.bootstrap.validityDays | quote }}
      - --ca-validity-days
      - {{ $root.Values.certs.bootstrap.caValidityDays | quote }}
      {{- if .patchWebhook }}
      - --webhook-config
      - {{ include "metagpu.webhookConfigName" $root }}
      - --webhook
      - {{ include "metagpu.webhook.podsName" $root }}
      - --webhook
      - {{ include "metagpu.webhook.workloadsName" $root }}
      {{- end }}
      {{- include "metagpu.logArgs" $root | nindent 6 }}
    securityContext:
      {{- include "metagpu.restrictedContainerSecurityContext" $root | nindent 6 }}
    {{- with $root.Values.certs.bootstrap.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
volumes:
  - name: tmp
    emptyDir:
      medium: Memory
      sizeLimit: 8Mi
{{- end -}}

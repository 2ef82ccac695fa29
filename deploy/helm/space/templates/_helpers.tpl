{{/* The release's name for its objects: <release>-space, at most 63 characters. */}}
{{- define "space.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "space.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (control, node, postgresql, objectstore). */}}
{{- define "space.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "space.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "space.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name | default (include "space.fullname" .) }}{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{- define "space.clusterKeySecret" -}}{{ .Values.clusterKey.existingSecret | default (printf "%s-cluster" (include "space.fullname" .)) }}{{- end -}}
{{- define "space.adminSecret" -}}{{ .Values.adminToken.existingSecret | default (printf "%s-admin" (include "space.fullname" .)) }}{{- end -}}
{{- define "space.postgresSecret" -}}{{ .Values.postgresql.existingSecret | default (printf "%s-postgresql" (include "space.fullname" .)) }}{{- end -}}
{{- define "space.s3Secret" -}}{{ .Values.objectStore.existingSecret | default (printf "%s-objectstore" (include "space.fullname" .)) }}{{- end -}}

{{/* A secret value kept across upgrades: the existing Secret's, else a new random one. */}}
{{- define "space.keep" -}}
{{- $s := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $s $s.data (hasKey $s.data .key) -}}{{ index $s.data .key | b64dec }}{{- else -}}{{ .prefix }}{{ randAlphaNum .length }}{{- end -}}
{{- end -}}

{{/* The environment every SPACE process gets: shared state and secrets. */}}
{{- define "space.env" -}}
- name: SPACE_CLUSTER_KEY
  valueFrom: {secretKeyRef: {name: {{ include "space.clusterKeySecret" . }}, key: cluster-key}}
- name: SPACE_ADMIN_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "space.adminSecret" . }}, key: admin-token}}
{{- if .Values.postgresql.bundled }}
- name: SPACE_PG_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "space.postgresSecret" . }}, key: password}}
- name: SPACE_STORE
  value: {{ printf "postgres://space:$(SPACE_PG_PASSWORD)@%s-postgresql:5432/space?sslmode=disable" (include "space.fullname" .) | quote }}
{{- else }}
- name: SPACE_STORE
  valueFrom: {secretKeyRef: {name: {{ required "postgresql.existingSecret (key url) or postgresql.bundled" .Values.postgresql.existingSecret }}, key: url}}
{{- end }}
- name: SPACE_BLOB_STORE
{{- if .Values.objectStore.bundled }}
  value: {{ printf "s3://space/cluster?endpoint=http://%s-objectstore:7070&region=us-east-1" (include "space.fullname" .) | quote }}
{{- else }}
  value: {{ required "objectStore.url or objectStore.bundled" .Values.objectStore.url | quote }}
{{- end }}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ include "space.s3Secret" . }}, key: access-key-id}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ include "space.s3Secret" . }}, key: secret-access-key}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: SPACE_HEARTBEAT
  value: {{ .Values.heartbeat | quote }}
- name: SPACE_NODE_LOST_AFTER
  value: {{ .Values.nodeLostAfter | quote }}
{{- if .Values.tls.secretName }}
- name: SPACE_TLS_CERT
  value: /etc/space/tls/tls.crt
- name: SPACE_TLS_KEY
  value: /etc/space/tls/tls.key
{{- else }}
- name: SPACE_ALLOW_PLAIN_HTTP
  value: "true"
{{- end }}
{{- end -}}

{{- define "space.scheme" -}}{{ if .Values.tls.secretName }}https{{ else }}http{{ end }}{{- end -}}

{{/* The listeners and their ports, the same in every SPACE container. */}}
{{- define "space.ports" -}}
- {name: api, containerPort: 8080, protocol: TCP}
- {name: data-plane, containerPort: 8090, protocol: TCP}
- {name: e2b, containerPort: 3000, protocol: TCP}
{{- end -}}

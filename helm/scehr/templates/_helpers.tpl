{{/* Names and labels */}}
{{- define "scehr.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scehr.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "scehr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scehr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scehr.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "scehr.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "scehr.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scehr.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The service image: image.tag, else appVersion for the CUDA variant (gpu.enabled) and
appVersion-cpu for the CPU one. The Deployment, the batch Job and the helm test pod use it. */}}
{{- define "scehr.image" -}}
{{- $variant := ternary .Chart.AppVersion (printf "%s-cpu" .Chart.AppVersion) .Values.gpu.enabled -}}
{{- printf "%s:%s" .Values.image.repository (default $variant .Values.image.tag) -}}
{{- end -}}

{{/* Hardened security contexts: non-root, read-only root, no capabilities */}}
{{- define "scehr.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "scehr.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* GPU request and limit, only when enabled */}}
{{- define "scehr.resources" -}}
{{- $res := deepCopy .Values.resources -}}
{{- if .Values.gpu.enabled -}}
{{- $limits := default dict $res.limits -}}
{{- $_ := set $limits .Values.gpu.resourceName (.Values.gpu.count | int) -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* The API-key env var from an existing Secret */}}
{{- define "scehr.apiKeyEnv" -}}
{{- if .Values.apiKeys.existingSecret }}
- name: SCEHR_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.apiKeys.existingSecret }}
      key: {{ .Values.apiKeys.secretKey }}
{{- end }}
{{- end -}}

{{/* Model volume and mount for the chosen source (none for `image`) */}}
{{- define "scehr.modelVolumes" -}}
{{- if eq .Values.models.source "pvc" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.models.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.models.source "initImage" }}
- name: models
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "scehr.modelMounts" -}}
{{- if ne .Values.models.source "image" }}
- name: models
  mountPath: {{ .Values.models.mountPath }}
  readOnly: true
  {{- if and (eq .Values.models.source "pvc") .Values.models.pvc.subPath }}
  subPath: {{ .Values.models.pvc.subPath }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "scehr.modelInit" -}}
{{- if eq .Values.models.source "initImage" }}
- name: copy-models
  image: {{ printf "%s:%s" .Values.models.initImage.repository .Values.models.initImage.tag }}
  imagePullPolicy: {{ .Values.models.initImage.pullPolicy }}
  command: ["cp", "-R", "{{ .Values.models.initImage.path }}/.", "/target/"]
  securityContext:
    {{- include "scehr.containerSecurityContext" . | nindent 4 }}
  resources:
    requests:
      cpu: 100m
      memory: 64Mi
    limits:
      memory: 256Mi
  volumeMounts:
    - name: models
      mountPath: /target
{{- end }}
{{- end -}}

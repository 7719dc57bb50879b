{{- define "llmtrain.name" -}}llmtrain-operator{{- end -}}
{{- define "llmtrain.fullname" -}}{{ .Release.Name }}{{- end -}}
{{- define "llmtrain.labels" -}}
app.kubernetes.io/name: {{ include "llmtrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "llmtrain.selector" -}}
app.kubernetes.io/name: {{ include "llmtrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "llmtrain.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "llmtrain.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "llmtrain.name" -}}{{ default "llmtrain-operator" .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- /* Every object's name: the release name unless fullnameOverride says otherwise. */ -}}
{{- define "llmtrain.fullname" -}}{{ default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}
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

{{/* RBAC rules, shared by the ClusterRole and (with watchNamespace) the Role; see rbac.yaml. */}}
{{- define "llmtrain.rules.namespaced" -}}
# The jobs themselves, and their status subresource (written once per pass).
- apiGroups: [llmtrain.io]
  resources: [llmtrainjobs]
  verbs: [get, list, watch, patch, update, delete]
- apiGroups: [llmtrain.io]
  resources: [llmtrainjobs/status]
  verbs: [get, patch, update]
# Children: worker and rendezvous pods, their services and the rendered config.
- apiGroups: [""]
  resources: [pods, services, configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
# Each job's NetworkPolicy (networkPolicy.jobs.enabled); removed with its job by the
# garbage collector (ownerReferences). Watched even when off: the index is always there.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create]
# Checking that a referenced PVC exists before creating pods (a missing one: Invalid).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# A gang job's PodGroup (scheduling.gang): Volcano's or scheduler-plugins'. Granted even
# where neither is installed: the operator reads it to learn that, and says so.
- apiGroups: [scheduling.volcano.sh, scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, create, patch, delete]
# A queued job's Kueue Workload (label kueue.x-k8s.io/queue-name): the operator is the
# job kind's Kueue integration (docs/scheduling.md).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, create]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
{{- define "llmtrain.rules.secrets" -}}
# Checking that a job's S3 credentials Secret exists before creating pods (its data is
# never used by the operator). Only in a watched namespace's Role: cluster-wide it would
# mean reading every namespace's Secrets, so there the operator reports a missing Secret
# from the worker pods' CreateContainerConfigError instead.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- define "llmtrain.rules.cluster" -}}
# Node health for failure detection (read only).
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
# The placement of Kueue's ResourceFlavors (node labels, tolerations) for admitted jobs.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors]
  verbs: [get]
# kopf: resource discovery.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}

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
# Exactly the verbs the operator's code uses (tests/support/rights.py derives them from
# it and the chart tests compare, both ways).
# The jobs: watched; read when a stranded pod's job is looked up; spec.suspend patched
# (Kueue admission); deleted after ttlSecondsAfterFinished; the status patched per pass.
- apiGroups: [llmtrain.io]
  resources: [llmtrainjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [llmtrain.io]
  resources: [llmtrainjobs/status]
  verbs: [patch]
# Children: worker and rendezvous pods (read back to check their owner on a 409, patched
# to keep a failed one for its log, deleted), their Services (created, never changed)
# and the rendered config (replaced when the job's view of it changes).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
# Each job's token Secret (its rendezvous signed with it): created only, never read or
# listed (a 409 is taken as the job's own); removed with its job by the garbage collector.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# Each job's NetworkPolicy (networkPolicy.jobs.enabled); removed with its job by the
# garbage collector (ownerReferences). Watched even when off: the index is always there.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create]
# Checking that a referenced PVC exists before creating pods (a missing one: Invalid).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Events (core v1), a repeated one patched as a series.
- apiGroups: [""]
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
# Node health for failure detection (watched; read only).
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
# The placement of Kueue's ResourceFlavors (node labels, tolerations) for admitted jobs.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors]
  verbs: [get]
# kopf: resource discovery.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}

{{/*
Rules for what the operator does inside a namespace that holds StreamTopologies. Used by the ClusterRole
(cluster scope) or by one Role per watched namespace (namespaces scope). Every verb is one the operator
calls. Secrets: `create` and `patch` (each topology's transport Secret, written without reading any
Secret back), `get` on exactly rbac.secretNames (Prometheus basic auth named by topologies).
*/}}
{{- define "streamtopo.topologyRules" -}}
# kopf watches StreamTopologies and patches them (finalizers, progress annotations); the operator
# creates, re-owns and deletes the shared topologies of spec.sharing (controller/sharing.py).
- apiGroups: ["streamtopo.dev"]
  resources: ["streamtopologies"]
  verbs: ["get", "list", "watch", "patch", "create", "delete"]
# Status is written through the status subresource only.
- apiGroups: ["streamtopo.dev"]
  resources: ["streamtopologies/status"]
  verbs: ["get", "patch"]
# Owner references with blockOwnerDeletion on owned objects require update on the owner's finalizers.
- apiGroups: ["streamtopo.dev"]
  resources: ["streamtopologies/finalizers"]
  verbs: ["update"]
# Executor pods (one per PE), their metrics Services and the plan/routing ConfigMap.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Each topology's transport Secret (its own Valkey user), created or merge-patched, never read.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch"]
{{- if .Values.networkPolicy.enabled }}
# Each topology's executor NetworkPolicy.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
# ScalingReport / RebalanceReport events and kopf's handler events.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- with .Values.rbac.secretNames }}
# spec.metrics.prometheus.basicAuthSecret: one key of these Secrets, read each SPL.
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: {{ toJson . }}
  verbs: ["get"]
{{- end }}
{{- if and .Values.peering.enabled (include "streamtopo.namespaced" .) }}
# kopf peering between operator replicas, per watched namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

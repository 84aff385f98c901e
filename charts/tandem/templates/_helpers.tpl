{{/* Labels of every object: the same three as the Kustomize manifests, plus Helm's. */}}
{{- define "tandem.labels" -}}
app.kubernetes.io/name: tandem
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: tandem
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/* Labels of objects that belong to no one component (namespace, config). */}}
{{- define "tandem.commonLabels" -}}
app.kubernetes.io/name: tandem
app.kubernetes.io/part-of: tandem
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tandem.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end }}

{{- define "tandem.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repo }}{{ end -}}
{{- printf "%s:%s" $repo (include "tandem.tag" .) -}}
{{- end }}

{{- define "tandem.gpuImage" -}}
{{- $repo := .Values.image.gpuRepository -}}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repo }}{{ end -}}
{{- printf "%s:%s" $repo (include "tandem.tag" .) -}}
{{- end }}

{{/* kube-scheduler follows the cluster: vMAJOR.MINOR.PATCH of the API server, without
     providers' suffixes (v1.31.4-eks-1a2b3c -> v1.31.4), unless set explicitly. */}}
{{- define "tandem.kubeSchedulerImage" -}}
{{- $tag := .Values.kubeScheduler.image.tag -}}
{{- if not $tag -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- $tag = printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}
{{- printf "%s:%s" .Values.kubeScheduler.image.repository $tag -}}
{{- end }}

{{- define "tandem.agentTokenSecret" -}}
{{- .Values.tokens.agent.existingSecret | default "tandem-agent-token" -}}
{{- end }}

{{- define "tandem.signingKeySecret" -}}
{{- .Values.signingKey.existingSecret | default "tandem-signing-key" -}}
{{- end }}

{{- define "tandem.adminTokenSecret" -}}
{{- .Values.tokens.admin.existingSecret | default "tandem-admin-token" -}}
{{- end }}

{{/* The model store's volume source: modelStore, or agent.modelStore (its former name)
     when a user still sets it. Keys set to null are dropped: with no default under the
     former name, Helm keeps the null of `--set agent.modelStore.emptyDir=null`. */}}
{{- define "tandem.modelStore" -}}
{{- $source := dict -}}
{{- range $key, $value := (.Values.agent.modelStore | default .Values.modelStore) -}}
{{- if not (kindIs "invalid" $value) }}{{ $_ := set $source $key $value }}{{ end -}}
{{- end -}}
{{- toYaml $source -}}
{{- end }}

{{/* Refuse value combinations that would install something broken. */}}
{{- define "tandem.validate" -}}
{{- if not (has .Values.topology (list "sidecar" "standalone")) -}}
{{- fail (printf "topology must be \"sidecar\" or \"standalone\", not %q" (toString .Values.topology)) -}}
{{- end -}}
{{- if ne .Values.devicePlugin.enabled (eq (toString .Values.config.handoff.mode) "device-plugin") -}}
{{- fail "devicePlugin.enabled and config.handoff.mode: device-plugin go together: set both or neither" -}}
{{- end -}}
{{- if and .Values.queueGate.enabled .Values.config.queue.enabled -}}
{{- fail "queueGate.enabled and config.queue.enabled are both true: run the weighted-fair queue in one place only (each would release pods)" -}}
{{- end -}}
{{- if ne (toString .Values.config.predictor.model_store) "/srv/tandem" -}}
{{- fail "config.predictor.model_store must be /srv/tandem, where the pods mount modelStore" -}}
{{- end -}}
{{- if lt (int .Values.replicas) 1 -}}
{{- fail "replicas must be at least 1" -}}
{{- end -}}
{{- if ne (ne (toString .Values.pairPrior) "") (eq (toString (dig "learning" "pair_prior" "" .Values.config)) "pair-prior.yaml") -}}
{{- fail "pairPrior and config.learning.pair_prior: pair-prior.yaml go together: set both or neither" -}}
{{- end -}}
{{- end }}

{{- define "tandem.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "tandem.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "tandem.mpsSecurityContext" -}}
{{- /* root in the container for the MPS layout, with only the capabilities listed */ -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- with . }}
  add: [{{ join ", " . }}]
  {{- end }}
{{- end }}

{{- define "tandem.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef: {fieldPath: metadata.namespace}
{{- end }}

{{- define "tandem.antiAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: tandem
            app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "tandem.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Where a pod runs: priorityClassName, runtimeClassName, nodeSelector, affinity (the
     component's own, else the default given) and tolerations (the defaults given, then
     the component's). Called with (dict "v" <component values> "affinity" <default>
     "tolerations" <default list>). */}}
{{- define "tandem.placement" -}}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .v.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $affinity := .v.affinity | default .affinity }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $tolerations := concat (.tolerations | default list) (.v.tolerations | default list) }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* GPU nodes: the GPU Operator's, GPU Feature Discovery's, or labelled by hand. */}}
{{- define "tandem.gpuNodeAffinity" -}}
{{- /* Only nodes the admin opted in (nodeOptIn): never every GPU node, where NVIDIA's
device plugin may already hand the same GPUs out. */ -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - {key: {{ .Values.nodeOptIn.label | quote }}, operator: In, values: [{{ .Values.nodeOptIn.value | quote }}]}
{{- end }}

{{- define "tandem.perNodeIdentity" -}}
{{- $identity := toString (dig "reports" "identity" "shared-token" .Values.config) -}}
{{- if not (has $identity (list "service-account" "shared-token")) -}}
{{- fail (printf "config.reports.identity must be service-account or shared-token, not %q" $identity) -}}
{{- end -}}
{{- eq $identity "service-account" -}}
{{- end }}

{{- define "tandem.gpuTolerations" -}}
- {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
- {key: tandem.io/gpu, operator: Exists, effect: NoSchedule}
{{- end }}

{{/*
Names, labels and the pieces several templates share. Everything that two
components must agree on (config file paths, the webhook's names, the TLS
secret) is defined once here.
*/}}

{{- define "metagpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object-name prefix. Kept to 40 characters so "<prefix>-certs-renew" and
the CronJob's generated Job names stay within Kubernetes' limits. */}}
{{- define "metagpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "metagpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "webhook"). */}}
{{- define "metagpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "metagpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects: (dict "root" $ "component" "webhook"). */}}
{{- define "metagpu.labels" -}}
{{ include "metagpu.selectorLabels" . }}
app.kubernetes.io/part-of: metagpu
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "metagpu.chart" .root }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "metagpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------ names */}}
{{- define "metagpu.quotaMirror.leaseName" -}}{{ include "metagpu.fullname" . }}-quota-mirror{{- end -}}
{{- define "metagpu.webhook.fullname" -}}{{ include "metagpu.fullname" . }}-webhook{{- end -}}
{{- define "metagpu.plugin.fullname" -}}{{ include "metagpu.fullname" . }}-plugin{{- end -}}
{{- define "metagpu.agent.fullname" -}}{{ include "metagpu.fullname" . }}-agent{{- end -}}
{{- define "metagpu.certs.fullname" -}}{{ include "metagpu.fullname" . }}-certs{{- end -}}
{{- define "metagpu.scheduler.fullname" -}}{{ include "metagpu.fullname" . }}-scheduler{{- end -}}
{{/* The second scheduler's profile name (pods' spec.schedulerName) and its
leader-election lease (plugin.extender.permissions.LEASE_NAME). */}}
{{- define "metagpu.scheduler.name" -}}metagpu-scheduler{{- end -}}
{{- define "metagpu.scheduler.leaseName" -}}metagpu-scheduler{{- end -}}
{{- define "metagpu.scheduler.configFile" -}}/etc/metagpu/scheduler/scheduler.yaml{{- end -}}
{{- define "metagpu.extender.configFile" -}}/etc/metagpu/config/extender.yaml{{- end -}}

{{/* kube-scheduler's image: scheduler.image.tag, else the cluster's own version
(.Capabilities.KubeVersion without a vendor suffix such as "-eks-4d3c2f1", which
registry.k8s.io does not publish). A scheduler older or newer than the API server
by more than the skew policy allows is unsupported upstream. */}}
{{- define "metagpu.scheduler.image" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexReplaceAll "^(v[0-9]+\\.[0-9]+\\.[0-9]+).*$" .Capabilities.KubeVersion.Version "${1}" -}}
{{- end -}}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag -}}
{{- end -}}
{{- define "metagpu.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "metagpu.webhook.fullname" .)) .Values.certs.secretName -}}
{{- end -}}
{{/* The serving Certificate (cert-manager mode); its namespace/name goes into
cert-manager.io/inject-ca-from. */}}
{{/* The MutatingWebhookConfiguration (cluster-scoped): the release's full name,
which is also `metagpu certs bootstrap`'s default --webhook-config ("metagpu"). */}}
{{- define "metagpu.webhookConfigName" -}}{{ include "metagpu.fullname" . }}{{- end -}}
{{- define "metagpu.certificateName" -}}{{ include "metagpu.webhook.fullname" . }}{{- end -}}

{{/* The two webhooks of the MutatingWebhookConfiguration. Pods and workloads
are separate webhooks because their GPU requests live at different paths
(spec vs spec.template.spec), and matchConditions apply to every rule of a
webhook. Fixed names: `metagpu certs bootstrap --webhook` patches exactly these. */}}
{{- define "metagpu.webhook.podsName" -}}pods.metagpu.io{{- end -}}
{{- define "metagpu.webhook.workloadsName" -}}workloads.metagpu.io{{- end -}}

{{/* Where config files and the serving certificate are mounted. Sibling
directories, never one inside the other: a mount point cannot be created
inside a read-only ConfigMap volume. */}}
{{- define "metagpu.configDir" -}}/etc/metagpu/config{{- end -}}
{{- define "metagpu.webhook.configFile" -}}/etc/metagpu/config/webhook.yaml{{- end -}}
{{- define "metagpu.plugin.configFile" -}}/etc/metagpu/config/plugin.yaml{{- end -}}
{{- define "metagpu.plugin.simulatedGpusFileName" -}}simulated-gpus.yaml{{- end -}}
{{- define "metagpu.webhook.tlsDir" -}}/etc/metagpu/tls{{- end -}}

{{/* In-container paths of the kubelet directories. Fixed, so the config does
not change when the host's kubelet root does (the hostPath values). */}}
{{- define "metagpu.plugin.devicePluginsMount" -}}/var/lib/kubelet/device-plugins{{- end -}}
{{- define "metagpu.agent.podResourcesMount" -}}/var/lib/kubelet/pod-resources{{- end -}}
{{/* Where the agent reads the DRA plugin's CDI specs (host: dra.cdiDir): its
agent.dra_cdi_dir default, so the config file needs no DRA entry. */}}
{{- define "metagpu.agent.cdiMount" -}}/var/run/cdi{{- end -}}

{{/* ------------------------------------------------------- GPU nodes */}}
{{/* Where a GPU-node DaemonSet runs: (dict "root" $ "component" "plugin"|"agent").
Renders nodeSelector, affinity and tolerations (each only when not empty).
The device plugin gets plugin.nodeSelector, plugin.affinity and `tolerations`
(the ones the webhook gives GPU pods) + plugin.extraTolerations. The agent
must run wherever the plugin does, so by default it gets the same:
agent.nodeSelector and agent.affinity replace the plugin's only when set, and
agent.extraTolerations add to the plugin's tolerations. The device plugin keeps
off the DRA pool (dra.enabled); the agent does not: the DRA plugin runs on the
GPU nodes of dra.nodeSelector, a subset of the GPU node selection, and the agent
accounts its claims' shares there too (docs/dra.md, "The agent on DRA nodes"). */}}
{{- define "metagpu.gpuNodeScheduling" -}}
{{- $values := .root.Values -}}
{{- $nodeSelector := include "metagpu.gpuNodeSelector" .root | fromJson -}}
{{- $affinity := include "metagpu.gpuNodeAffinity" .root | fromJson -}}
{{- $tolerations := concat ($values.tolerations | default list) ($values.plugin.extraTolerations | default list) -}}
{{- if eq .component "agent" -}}
{{- $nodeSelector = $values.agent.nodeSelector | default $nodeSelector -}}
{{- $affinity = $values.agent.affinity | default $affinity -}}
{{- $tolerations = concat $tolerations ($values.agent.extraTolerations | default list) -}}
{{- else -}}
{{- $affinity = include "metagpu.dra.avoidPool" (dict "root" .root "affinity" $affinity) | fromJson -}}
{{- end -}}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations | uniq }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Tolerations of a pod that is not a GPU workload (the webhook, the scheduler,
the hook Jobs): (dict "root" $ "own" .Values.x.tolerations). Its own, plus, with
allNodesAreGpuNodes, the GPU node taints (`tolerations`): on a cluster whose every
node carries them, these pods would otherwise stay Pending, and a pre-install hook
Job that stays Pending makes `helm install` wait for its timeout. */}}
{{- define "metagpu.clusterPodTolerations" -}}
{{- $tolerations := .own | default list -}}
{{- if .root.Values.allNodesAreGpuNodes -}}
{{- $tolerations = concat $tolerations (.root.Values.tolerations | default list) -}}
{{- end -}}
{{- with $tolerations | uniq }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* GPU nodes by plugin.nodeSelection, as JSON: the hand-set label
(plugin.nodeSelector) or the label node-feature-discovery / GPU feature
discovery put on every node with an NVIDIA GPU. */}}
{{- define "metagpu.gpuNodeSelector" -}}
{{- $selection := .Values.plugin.nodeSelection -}}
{{- if eq $selection "nfd" -}}
{{- dict "feature.node.kubernetes.io/pci-10de.present" "true" | toJson -}}
{{- else if eq $selection "gfd" -}}
{{- dict "nvidia.com/gpu.present" "true" | toJson -}}
{{- else -}}
{{- .Values.plugin.nodeSelector | default dict | toJson -}}
{{- end -}}
{{- end -}}

{{/* plugin.affinity as JSON, plus, with plugin.layout owner, a required node
affinity that keeps the plugin and agent off nodes where the GPU Operator runs
NVIDIA's device plugin (nvidia.com/gpu.deploy.device-plugin=true): there both
would serve every GPU. NotIn also matches nodes without the label (no GPU
Operator). The expression is ANDed into every nodeSelectorTerm of the user's. */}}
{{- define "metagpu.gpuNodeAffinity" -}}
{{- $affinity := deepCopy (.Values.plugin.affinity | default dict) -}}
{{- if eq .Values.plugin.layout "owner" -}}
{{- $expression := dict "key" "nvidia.com/gpu.deploy.device-plugin" "operator" "NotIn" "values" (list "true") -}}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $anded := list -}}
{{- range $terms -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $expression) -}}
{{- $anded = append $anded $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $anded -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- $affinity | toJson -}}
{{- end -}}

{{/* The agent's PriorityClass: agent.priorityClassName when it is set (a
string, "" for none), else the plugin's. */}}
{{- define "metagpu.agent.priorityClassName" -}}
{{- if kindIs "string" .Values.agent.priorityClassName -}}
{{- .Values.agent.priorityClassName -}}
{{- else -}}
{{- .Values.plugin.priorityClassName -}}
{{- end -}}
{{- end -}}

{{/* Pod securityContext of the GPU-node pods (plugin and agent): root
containers, so no runAsNonRoot; on OpenShift the spc_t SELinux type, which lets
a non-privileged container use the kubelet's directories under SELinux
enforcement (allowed by the chart's SecurityContextConstraints). */}}
{{- define "metagpu.gpuNodePodSecurityContext" -}}
seccompProfile:
  type: RuntimeDefault
{{- if .Values.ocp }}
seLinuxOptions:
  type: spc_t
{{- end }}
{{- end -}}

{{/* ------------------------------------------------ resource contract */}}
{{/* Names of the resources the plugin advertises: resourceName + extras (JSON list). */}}
{{- define "metagpu.metagpuResourceNames" -}}
{{- $names := list .Values.resourceName -}}
{{- range .Values.plugin.extraResources -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- toJson ($names | uniq) -}}
{{- end -}}

{{/* Every resource name the webhook acts on (JSON list): the metagpu resources,
the fraction resource names, and nvidia.com/gpu, which the webhook always
inspects (a fraction there is invalid whether or not it converts it). The
matchConditions are built from this. */}}
{{- define "metagpu.gpuResourceNames" -}}
{{- $names := include "metagpu.metagpuResourceNames" . | fromJsonArray -}}
{{- $names = concat $names .Values.fractionResourceNames (list "nvidia.com/gpu") -}}
{{- /* The memory resource in both modes: device-plugin mode turns a memory-only ask
into units or refuses it, rather than leave a pod Pending on a resource no node has. */ -}}
{{- $names = append $names (include "metagpu.dra.memoryResourceName" .) -}}
{{- toJson ($names | uniq) -}}
{{- end -}}

{{/* Runtime classes whose pods the webhook must see (JSON list): it hides GPUs
(NVIDIA_VISIBLE_DEVICES=void) from containers that ask for none in pods under
runtimeClass.name, or under "nvidia" when the chart sets no runtime class. */}}
{{- define "metagpu.runtimeClassNames" -}}
{{- $names := list (default "nvidia" .Values.runtimeClass.name) -}}
{{- $names = concat $names .Values.webhook.extraRuntimeClassNames -}}
{{- toJson ($names | uniq) -}}
{{- end -}}

{{/* -------------------------------------------------------------- CEL */}}
{{/* A CEL list literal of single-quoted strings. Resource and runtime class
names cannot contain quotes (values.schema.json patterns). */}}
{{- define "metagpu.cel.list" -}}
{{- $quoted := list -}}
{{- range . -}}
{{- $quoted = append $quoted (printf "'%s'" .) -}}
{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/* "This pod spec mentions a GPU": (dict "root" $ "spec" "object.spec"
"lists" (list "containers" ...)). Pod templates cannot hold ephemeral
containers, so workloads pass only containers and initContainers.
Every field is guarded with has() before it is read: the API server calls
mutating webhooks before validation, so any optional field may be absent, and
an evaluation error under failurePolicy Fail would reject the request. */}}
{{- define "metagpu.cel.specMentionsGpu" -}}
{{- $s := .spec -}}
{{- $names := include "metagpu.cel.list" (include "metagpu.gpuResourceNames" .root | fromJsonArray) -}}
{{- $container := printf "(has(c.resources) && ((has(c.resources.limits) && %s.exists(r, r in c.resources.limits)) || (has(c.resources.requests) && %s.exists(r, r in c.resources.requests))))" $names $names -}}
{{- $clauses := list -}}
{{- range .lists -}}
{{- $clauses = append $clauses (printf "(has(%s.%s) && %s.%s.exists(c, %s))" $s . $s . $container) -}}
{{- end -}}
{{- $runtimeClasses := include "metagpu.runtimeClassNames" .root | fromJsonArray -}}
{{- $clauses = append $clauses (printf "(has(%s.runtimeClassName) && %s.runtimeClassName in %s)" $s $s (include "metagpu.cel.list" $runtimeClasses)) -}}
{{- if ne .root.Values.webhook.mode "dra" -}}
{{- /* Device-plugin mode: a pod or template still holding a claim DRA mode wrote
(gpu-<container> from a metagpu-<shape> template) is converted back into units
(webhook/leftovers.py), so it is sent too. */ -}}
{{- $clauses = append $clauses (printf "(has(%s.resourceClaims) && %s.resourceClaims.exists(e, has(e.name) && e.name.startsWith('gpu-') && has(e.resourceClaimTemplateName) && e.resourceClaimTemplateName.startsWith('%s-')))" $s $s (include "metagpu.dra.templatePrefix" .root)) -}}
{{- end -}}
{{- join "\n|| " $clauses -}}
{{- end -}}

{{/* Guards for every prefix of a dotted path: "has(object.spec) && has(object.spec.template)". */}}
{{- define "metagpu.cel.guards" -}}
{{- $parts := splitList "." . -}}
{{- $guards := list -}}
{{- $path := first $parts -}}
{{- range rest $parts -}}
{{- $path = printf "%s.%s" $path . -}}
{{- $guards = append $guards (printf "has(%s)" $path) -}}
{{- end -}}
{{- join " && " $guards -}}
{{- end -}}

{{- define "metagpu.cel.podMentionsGpu" -}}
{{ include "metagpu.cel.guards" "object.spec" }} && (
{{ include "metagpu.cel.specMentionsGpu" (dict "root" . "spec" "object.spec" "lists" (list "containers" "initContainers" "ephemeralContainers")) }}
) && (
{{ include "metagpu.cel.podUpdateIsOurs" . }}
)
{{- end -}}

{{/* Which pod UPDATEs the webhook sees: only a re-applied manifest (`kubectl
apply` of a Pod again), where one container holds the metagpu units the webhook
wrote AND asks for a GPU again (a fraction, or whole nvidia.com/gpu). A stored
pod never has both, so label, annotation and finalizer updates of GPU pods never
wait on the webhook. CREATE and the ephemeralcontainers subresource pass. */}}
{{- define "metagpu.cel.podUpdateIsOurs" -}}
{{- $metagpu := include "metagpu.cel.list" (include "metagpu.metagpuResourceNames" . | fromJsonArray) -}}
{{- $askedNames := concat .Values.fractionResourceNames (list "nvidia.com/gpu") -}}
{{- if eq .Values.webhook.mode "dra" -}}
{{- $askedNames = append $askedNames (include "metagpu.dra.memoryResourceName" .) -}}
{{- end -}}
{{- $asked := include "metagpu.cel.list" ($askedNames | uniq) -}}
{{- $holds := printf "(has(c.resources) && ((has(c.resources.limits) && %s.exists(r, r in c.resources.limits)) || (has(c.resources.requests) && %s.exists(r, r in c.resources.requests))))" $metagpu $metagpu -}}
{{- if eq .Values.webhook.mode "dra" -}}
{{- /* DRA mode: a stored pod holds the claim the webhook wrote (resources.claims
gpu-<container>) instead of units. */ -}}
{{- $holds = printf "(%s || (has(c.resources) && has(c.resources.claims) && c.resources.claims.exists(k, has(k.name) && k.name.startsWith('gpu-'))))" $holds -}}
{{- end -}}
{{- $asks := printf "(has(c.resources) && ((has(c.resources.limits) && %s.exists(r, r in c.resources.limits)) || (has(c.resources.requests) && %s.exists(r, r in c.resources.requests))))" $asked $asked -}}
request.operation != 'UPDATE'
|| (has(request.subResource) && request.subResource == 'ephemeralcontainers')
|| (has(object.spec.containers) && object.spec.containers.exists(c, {{ $holds }} && {{ $asks }}))
|| (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $holds }} && {{ $asks }}))
{{- end -}}

{{/* Workloads: the pod template of Deployments, StatefulSets, DaemonSets,
ReplicaSets, ReplicationControllers and Jobs, or a CronJob's job template. */}}
{{- define "metagpu.cel.workloadMentionsGpu" -}}
({{ include "metagpu.cel.guards" "object.spec.template.spec" }} && (
{{ include "metagpu.cel.specMentionsGpu" (dict "root" . "spec" "object.spec.template.spec" "lists" (list "containers" "initContainers")) }}
))
|| ({{ include "metagpu.cel.guards" "object.spec.jobTemplate.spec.template.spec" }} && (
{{ include "metagpu.cel.specMentionsGpu" (dict "root" . "spec" "object.spec.jobTemplate.spec.template.spec" "lists" (list "containers" "initContainers")) }}
))
{{- end -}}

{{/* ----------------------------------------------------------- configs */}}
{{/* The webhook's config file (webhook.config.WebhookConfig). listen and tls
come from flags (see the Deployment), so the file holds only policy. */}}
{{- define "metagpu.webhook.config" -}}
{{- $metagpu := include "metagpu.metagpuResourceNames" . | fromJsonArray -}}
{{- $config := dict
  "version" "v1"
  "resource_name" .Values.resourceName
  "extra_resource_names" (rest $metagpu)
  "units_per_gpu" .Values.unitsPerGpu
  "fraction_resource_names" .Values.fractionResourceNames
  "convert_whole_gpus" .Values.webhook.convertWholeGpus
  "max_gpus_per_container" .Values.webhook.maxGpusPerContainer
  "tolerations" .Values.tolerations
  "runtime_class_name" .Values.runtimeClass.name
  "default_compute_policy" .Values.defaultComputePolicy
  "visible_devices_policy" .Values.webhook.visibleDevicesPolicy
  "deny_privileged" .Values.webhook.denyPrivileged
  "void_non_gpu_containers" .Values.webhook.voidNonGpuContainers
  "kubernetes" (dict "enabled" true "namespace_lookup_timeout_s" .Values.webhook.namespaceLookupTimeoutS)
  "quota_mirror" (dict "enabled" .Values.quotaMirror.enabled "lease_name" (include "metagpu.quotaMirror.leaseName" .) "lease_namespace" .Release.Namespace)
  "drain_delay_s" .Values.webhook.drainDelayS
  "mps_host_directories" (include "metagpu.mps.hostDirectories" . | fromJsonArray)
  "connections" (dict
    "max_connections" .Values.webhook.connections.maxConnections
    "max_connections_per_client" .Values.webhook.connections.maxConnectionsPerClient
    "tls_handshake_timeout_s" .Values.webhook.connections.tlsHandshakeTimeoutS
    "header_timeout_s" .Values.webhook.connections.headerTimeoutS
    "body_timeout_s" .Values.webhook.connections.bodyTimeoutS
    "write_timeout_s" .Values.webhook.connections.writeTimeoutS
    "idle_timeout_s" .Values.webhook.connections.idleTimeoutS)
-}}
{{- if .Values.scheduler.enabled -}}
{{- $_ := set $config "scheduler_name" (include "metagpu.scheduler.name" .) -}}
{{- end -}}
{{- if not .Values.runtimeClass.name -}}
{{- $_ := set $config "runtime_class_name" nil -}}
{{- end -}}
{{- if eq .Values.webhook.mode "dra" -}}
{{- $_ := set $config "mode" "dra" -}}
{{- $_ := set $config "dra" (dict
  "device_class_name" (include "metagpu.dra.driver" .)
  "gpu_memory_mib" .Values.dra.gpuMemoryMiB
  "memory_step_mib" .Values.dra.memoryStepMiB
  "memory_min_mib" .Values.dra.memoryMinMiB
  "controller" true
  "lease_name" (include "metagpu.dra.leaseName" .)
  "explain_waiting" .Values.dra.explainWaiting
  "driver_name" (include "metagpu.dra.driver" .)) -}}
{{- else if .Values.dra.gpuMemoryMiB -}}
{{- /* Device-plugin mode sizes a memory-only ask (metagpu.io/gpu-memory, or a
claim DRA mode left) in units of this GPU (webhook/leftovers.py). */ -}}
{{- $_ := set $config "dra" (dict "gpu_memory_mib" .Values.dra.gpuMemoryMiB) -}}
{{- end -}}
{{- include "metagpu.mergeExtraConfig" (dict "base" $config "extra" .Values.webhook.extraConfig "where" "webhook.extraConfig") -}}
{{- toYaml $config -}}
{{- end -}}

{{/* kube-scheduler's KubeSchedulerConfiguration: one profile, metagpu-scheduler,
with the extender on localhost for filter, prioritize and bind. */}}
{{- define "metagpu.scheduler.config" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ include "metagpu.scheduler.leaseName" . }}
profiles:
  - schedulerName: {{ include "metagpu.scheduler.name" . }}
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.scheduler.extender.port }}
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    # Victims chosen by GPU, not by node totals (docs/scheduler.md, "Preemption").
    preemptVerb: preempt
    weight: {{ .Values.scheduler.extender.weight }}
    enableHTTPS: false
    httpTimeout: {{ .Values.scheduler.extender.httpTimeout }}
    nodeCacheCapable: true
    ignorable: false
    # Only pods that ask for resourceName are sent to the extender (the ledgers
    # describe that resource); the scheduler keeps counting it as usual.
    managedResources:
      - name: {{ .Values.resourceName }}
        ignoredByScheduler: false
{{- end -}}

{{/* The extender's config file (plugin.extender.config.ExtenderConfig); listen comes
from a flag. Its default placement policy is the device plugin's allocation policy,
so both choose the same GPU. */}}
{{- define "metagpu.extender.config" -}}
{{- $config := dict
  "version" "v1"
  "resource_name" .Values.resourceName
  "placement_policy" .Values.plugin.allocationPolicy
  "assume_timeout_s" .Values.scheduler.extender.assumeTimeoutS
-}}
{{- include "metagpu.mergeExtraConfig" (dict "base" $config "extra" .Values.scheduler.extender.extraConfig "where" "scheduler.extender.extraConfig") -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Host directories of the MPS daemon that no metagpu pod may mount from the host
(the webhook's mps_host_directories): CUDA's default pipe directory, the chart's,
and the supervised daemon's /dev/shm. */}}
{{- define "metagpu.mps.hostDirectories" -}}
{{- $dirs := list "/tmp/nvidia-mps" .Values.mps.pipeDirectory -}}
{{- if .Values.mps.supervise -}}
{{- $dirs = append $dirs .Values.mps.shmDirectory -}}
{{- end -}}
{{- $dirs | uniq | toJson -}}
{{- end -}}

{{/* The device plugin DaemonSets, as a JSON list of variants. One, unless MPS is on
for a node pool only (mps.nodeSelector): then the first serves every other GPU
node without MPS (kept off the pool by a NotIn node affinity), and a second,
<plugin>-mps (component plugin-mps), serves the pool with MPS, from its own
config key. The agent runs on both (its scheduling is the plugin's without the
split): it reads whichever plugin's board is on its node. */}}
{{- define "metagpu.plugin.variants" -}}
{{- $mps := .Values.mps -}}
{{- $variants := list -}}
{{- if and $mps.enabled (not (empty $mps.nodeSelector)) -}}
{{- $variants = append $variants (dict "suffix" "" "component" "plugin" "mps" false "supervise" false "configKey" "plugin.yaml" "avoidMps" true) -}}
{{- $variants = append $variants (dict "suffix" "-mps" "component" "plugin-mps" "mps" true "supervise" $mps.supervise "configKey" "plugin-mps.yaml" "avoidMps" false) -}}
{{- else -}}
{{- $variants = append $variants (dict "suffix" "" "component" "plugin" "mps" $mps.enabled "supervise" (and $mps.enabled $mps.supervise) "configKey" "plugin.yaml" "avoidMps" false) -}}
{{- end -}}
{{- toJson $variants -}}
{{- end -}}

{{/* Where one plugin variant runs: (dict "root" $ "variant" $v). The plugin's
scheduling (metagpu.gpuNodeScheduling), plus mps.nodeSelector for the MPS pool's
DaemonSet, or, for the other one, a required `NotIn` on that label added to every
required node selector term (a node without the label matches NotIn). */}}
{{- define "metagpu.plugin.variantScheduling" -}}
{{- $root := .root -}}
{{- $variant := .variant -}}
{{- $values := $root.Values -}}
{{- $nodeSelector := include "metagpu.gpuNodeSelector" $root | fromJson -}}
{{- $affinity := include "metagpu.gpuNodeAffinity" $root | fromJson -}}
{{- $tolerations := concat ($values.tolerations | default list) ($values.plugin.extraTolerations | default list) -}}
{{- if and $variant.mps (not (empty $values.mps.nodeSelector)) -}}
{{- $nodeSelector = merge (deepCopy $values.mps.nodeSelector) $nodeSelector -}}
{{- end -}}
{{- if $variant.avoidMps -}}
{{- $key := keys $values.mps.nodeSelector | first -}}
{{- $avoid := dict "key" $key "operator" "NotIn" "values" (list (get $values.mps.nodeSelector $key | toString)) -}}
{{- $affinity = deepCopy ($affinity | default dict) -}}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $withAvoid := list -}}
{{- range $terms -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $avoid) -}}
{{- $withAvoid = append $withAvoid $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $withAvoid -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- $affinity = include "metagpu.dra.avoidPool" (dict "root" $root "affinity" $affinity) | fromJson -}}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations | uniq }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The device plugin's and agent's config file (plugin.api.config.PluginConfig),
read by both DaemonSets: MPS as configured for every GPU node, or off when MPS is
for a node pool only (its DaemonSet reads metagpu.plugin.configFor, mps true). */}}
{{- define "metagpu.plugin.config" -}}
{{- include "metagpu.plugin.configFor" (dict "root" . "mps" (and .Values.mps.enabled (empty .Values.mps.nodeSelector))) -}}
{{- end -}}

{{/* The mps section of a plugin's config, as JSON: (dict "root" $ "mps" bool). One
definition for the device plugin and the DRA plugin (the same MpsConfig), so both
point clients at the same pipe directory and /dev/shm. */}}
{{- define "metagpu.mps.config" -}}
{{- $mpsOn := .mps -}}
{{- with .root -}}
{{- $mps := dict "enabled" $mpsOn "pipe_directory" .Values.mps.pipeDirectory "container_pipe_directory" .Values.mps.containerPipeDirectory -}}
{{- if and $mpsOn .Values.mps.supervise -}}
{{- $_ := set $mps "supervise" true -}}
{{- $_ := set $mps "shm_directory" .Values.mps.shmDirectory -}}
{{- end -}}
{{- toJson $mps -}}
{{- end -}}
{{- end -}}

{{/* The config of one plugin variant: (dict "root" $ "mps" bool). With mps.supervise
the plugin runs the MPS control daemon itself, with /dev/shm shared with its
clients through mps.shmDirectory. */}}
{{- define "metagpu.plugin.configFor" -}}
{{- $mpsOn := .mps -}}
{{- with .root -}}
{{- $mps := include "metagpu.mps.config" (dict "root" . "mps" $mpsOn) | fromJson -}}
{{- $resources := list (dict "name" .Values.resourceName "gpus" .Values.plugin.resourceGpus) -}}
{{- $resources = concat $resources .Values.plugin.extraResources -}}
{{- $agent := dict
  "socket_dir" .Values.agent.socketDir
  "pod_resources_socket" (printf "%s/kubelet.sock" (include "metagpu.agent.podResourcesMount" .))
  "interval_s" .Values.agent.intervalS
  "memory_enforcement" .Values.agent.memoryEnforcement
  "kill_grace_s" .Values.agent.killGraceS
  "label_node" .Values.agent.labelNode
  "install_mgctl" .Values.agent.installMgctl
  "metrics_listen" (include "metagpu.listen" (dict "host" .Values.agent.metricsHost "port" .Values.agent.metricsPort))
-}}
{{- include "metagpu.mergeExtraConfig" (dict "base" $agent "extra" .Values.agent.extraConfig "where" "agent.extraConfig") -}}
{{- $config := dict
  "version" "v1"
  "units_per_gpu" .Values.unitsPerGpu
  "resources" $resources
  "allocation_policy" .Values.plugin.allocationPolicy
  "device_id_strategy" .Values.plugin.deviceIdStrategy
  "device_list_strategy" .Values.plugin.deviceListStrategy
  "device_plugins_dir" (include "metagpu.plugin.devicePluginsMount" .)
  "fail_on_init_error" .Values.plugin.failOnInitError
  "health" (dict "enabled" .Values.plugin.healthChecks)
  "mps" $mps
  "agent" $agent
  "placement" (dict "honour_assignments" .Values.plugin.honourAssignments "extender" (dig "scheduler" "enabled" false .Values.AsMap))
-}}
{{- if .Values.plugin.simulatedGpus.enabled -}}
{{- $_ := set $config "gpus_file" (printf "%s/%s" (include "metagpu.configDir" .) (include "metagpu.plugin.simulatedGpusFileName" .)) -}}
{{- end -}}
{{- include "metagpu.mergeExtraConfig" (dict "base" $config "extra" .Values.plugin.extraConfig "where" "plugin.extraConfig") -}}
{{- toYaml $config -}}
{{- end -}}
{{- end -}}

{{/* Add an extraConfig map to a rendered config, in place: (dict "base" $config
"extra" .Values.x.extraConfig "where" "x.extraConfig"). extraConfig is for keys
the chart has no value for; a key the chart already renders from a value fails
the install and names that key, so one setting never has two sources (and a
`false` in extraConfig is never silently lost in a merge). Two levels deep,
which is as deep as the config files go. */}}
{{- define "metagpu.mergeExtraConfig" -}}
{{- $base := .base -}}
{{- $where := .where -}}
{{- range $key, $value := .extra -}}
{{- if not (hasKey $base $key) -}}
{{- $_ := set $base $key (deepCopy $value) -}}
{{- else if and (kindIs "map" (get $base $key)) (kindIs "map" $value) -}}
{{- $inner := get $base $key -}}
{{- range $k, $v := $value -}}
{{- if hasKey $inner $k -}}
{{- fail (printf "%s.%s.%s: this key is rendered from a chart value; set that value instead (see values.yaml)" $where $key $k) -}}
{{- end -}}
{{- $_ := set $inner $k (deepCopy $v) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "%s.%s: this key is rendered from a chart value; set that value instead (see values.yaml)" $where $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------- security contexts */}}
{{/* Pod securityContext of the non-root components (webhook, certificate jobs).
On OpenShift the restricted-v2 SCC assigns the UID/GID from the namespace's
range and rejects fixed ones, so they are left out there. */}}
{{- define "metagpu.restrictedPodSecurityContext" -}}
runAsNonRoot: true
{{- if not .Values.ocp }}
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "metagpu.restrictedContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
{{- end -}}

{{/* Common arguments of every metagpu command. */}}
{{- define "metagpu.logArgs" -}}
- --log-format
- {{ .Values.logFormat }}
- --log-level
- {{ .Values.logLevel }}
{{- end -}}

{{/* HOST:PORT for a listen address: (dict "host" "::" "port" 9400) -> [::]:9400 (an IPv6
address goes in brackets). */}}
{{- define "metagpu.listen" -}}
{{- if contains ":" (toString .host) -}}
{{- printf "[%s]:%d" .host (int .port) -}}
{{- else -}}
{{- printf "%s:%d" .host (int .port) -}}
{{- end -}}
{{- end -}}

{{/* -------------------------------------------------------------- DRA */}}
{{/* DRA mode (dra.enabled, docs/dra.md): the DRA kubelet plugin serves the GPUs of
one node pool (dra.nodeSelector, one label); the device plugin and the agent keep
off it, so no GPU ever has two plugins. The driver name is the one the fixtures
were captured with, and the DeviceClass is named after it. */}}
{{- define "metagpu.dra.fullname" -}}{{ include "metagpu.fullname" . }}-dra-plugin{{- end -}}
{{- define "metagpu.dra.driver" -}}gpu.metagpu.io{{- end -}}
{{/* The resource name a container asks for GPU memory with in DRA mode (the
webhook's dra.memory_resource_name default). */}}
{{- define "metagpu.dra.memoryResourceName" -}}metagpu.io/gpu-memory{{- end -}}
{{- define "metagpu.dra.configFile" -}}/etc/metagpu/config/dra-plugin.yaml{{- end -}}
{{/* ResourceClaimTemplate names' prefix (webhook dra.template_prefix, default
metagpu); webhook.extraConfig.dra.template_prefix overrides it. */}}
{{- define "metagpu.dra.templatePrefix" -}}
{{- $extra := default dict (index (default dict .Values.webhook.extraConfig) "dra") -}}
{{- default "metagpu" (index $extra "template_prefix") -}}
{{- end -}}

{{/* The claim-template controller's Lease (webhook dra.lease_name). */}}
{{- define "metagpu.dra.leaseName" -}}{{ include "metagpu.fullname" . }}-claim-templates{{- end -}}

{{/* An affinity (JSON) with one more required node selector expression ANDed into
every nodeSelectorTerm (a term-less affinity gets one term): (dict "affinity" $a
"expression" $e), as JSON. */}}
{{- define "metagpu.affinityAnd" -}}
{{- $affinity := deepCopy (.affinity | default dict) -}}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $anded := list -}}
{{- range $terms -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $.expression) -}}
{{- $anded = append $anded $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $anded -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- $affinity | toJson -}}
{{- end -}}

{{/* A device-plugin-mode pod's affinity (JSON) kept off the DRA pool: a required
NotIn on the dra.nodeSelector label (a node without the label matches NotIn), or
the affinity unchanged when DRA is off: (dict "root" $ "affinity" $a). */}}
{{- define "metagpu.dra.avoidPool" -}}
{{- $values := .root.Values -}}
{{- if $values.dra.enabled -}}
{{- $key := keys $values.dra.nodeSelector | first -}}
{{- $avoid := dict "key" $key "operator" "NotIn" "values" (list (get $values.dra.nodeSelector $key | toString)) -}}
{{- include "metagpu.affinityAnd" (dict "affinity" .affinity "expression" $avoid) -}}
{{- else -}}
{{- .affinity | default dict | toJson -}}
{{- end -}}
{{- end -}}

{{/* The DRA plugin's config file (plugin.dra.config.DraConfig). The kubelet's
directories are mounted at their host paths: the plugin reports its socket's
path to the kubelet, which dials it on the host. The memory request policy is the
one the webhook sizes its claims by (dra.memoryStepMiB, dra.memoryMinMiB). */}}
{{/* Whether the DRA plugin serves MPS ("true" or ""): mps.enabled for every GPU node.
MPS for a node pool (mps.nodeSelector) is the device plugin's only: the DRA pool is
one DaemonSet, so its nodes are all MPS or none. */}}
{{- define "metagpu.dra.mps" -}}
{{- if and .Values.mps.enabled (empty .Values.mps.nodeSelector) -}}true{{- end -}}
{{- end -}}

{{- define "metagpu.dra.config" -}}
{{- $dra := .Values.dra -}}
{{- $config := dict
  "version" "v1"
  "driver_name" (include "metagpu.dra.driver" .)
  "plugins_dir" $dra.pluginsDir
  "registry_dir" $dra.registryDir
  "cdi_dir" $dra.cdiDir
  "units_per_gpu" .Values.unitsPerGpu
  "memory" (dict "step_mib" $dra.memoryStepMiB "min_mib" $dra.memoryMinMiB "default_mib" $dra.memoryMinMiB)
  "health" (dict "enabled" .Values.plugin.healthChecks)
  "mps" (include "metagpu.mps.config" (dict "root" . "mps" (eq (include "metagpu.dra.mps" .) "true")) | fromJson)
  "agent_socket_dir" .Values.agent.socketDir
-}}
{{- if .Values.plugin.simulatedGpus.enabled -}}
{{- $_ := set $config "gpus_file" (printf "%s/%s" (include "metagpu.configDir" .) (include "metagpu.plugin.simulatedGpusFileName" .)) -}}
{{- end -}}
{{- include "metagpu.mergeExtraConfig" (dict "base" $config "extra" $dra.extraConfig "where" "dra.extraConfig") -}}
{{- toYaml $config -}}
{{- end -}}
